"""Small checks and helpers shared by the operator modules (private)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Collection, Mapping, Sequence

import numpy as np

from flowrl.metrics import AGENT_STEPS_SAMPLED_COUNTER, STEPS_SAMPLED_COUNTER, MetricsBinding, MetricsContext, Summary
from flowrl.sample_batch import DEFAULT_POLICY_ID, WEIGHTS_VERSION, AnyBatch, MultiAgentBatch, SampleBatch
from flowrl.validation import check_int

if TYPE_CHECKING:
    from flowrl.workers import WorkerSet

__all__ = ["check_batch", "check_int", "record_staleness", "staleness_info", "LearnerInfo", "weight_update_vars",
           "check_workers", "resolve_policies", "tree_mean", "check_learner_thread"]


class ReportSampled(MetricsBinding):
    """Counts each batch a source yields (``ParallelRollouts``' samples, ``ReadInput``'s rows):
    ``num_steps_sampled += count``, ``num_agent_steps_sampled += agent_steps()``."""

    def __call__(self, batch: AnyBatch) -> AnyBatch:
        check_batch(batch, self)
        self.metrics.counters[STEPS_SAMPLED_COUNTER] += batch.count
        self.metrics.counters[AGENT_STEPS_SAMPLED_COUNTER] += batch.agent_steps()
        return batch

    def __repr__(self) -> str:
        return "ReportSampled"


def check_batch(item: Any, op: object) -> AnyBatch:
    """``item`` if it is a SampleBatch or MultiAgentBatch; otherwise a ValueError naming ``op``."""
    if not isinstance(item, (SampleBatch, MultiAgentBatch)):
        raise ValueError(f"{op!r} consumes SampleBatch or MultiAgentBatch items, got {type(item).__name__}: "
                         f"{item!r:.80}; put it after a rollout or replay stage that yields batches")
    return item


def record_staleness(staleness: Summary, worker: Any, batch: AnyBatch,
                     policies: Collection[str] | None = None) -> None:
    """Adds to ``staleness``, per row of ``batch`` that carries the ``weights_version`` that sampled it, how many
    learner updates ``worker``'s weights of that policy (of ``policies``; ``None``: all) are ahead: the staleness
    of the data when ``worker`` learns on it now. Rows without a version (profiling off) cost one lookup."""
    if isinstance(batch, SampleBatch):
        if WEIGHTS_VERSION not in batch:
            return
        parts = {DEFAULT_POLICY_ID: batch}
    else:
        parts = {pid: part for pid, part in batch.policy_batches.items() if WEIGHTS_VERSION in part}
    version_of = getattr(worker, "weights_version", None)
    if not callable(version_of):
        return
    for pid, part in parts.items():
        if policies is None or pid in policies:
            staleness.add(version_of(pid) - np.asarray(part[WEIGHTS_VERSION], dtype=np.float64))


def staleness_info(staleness: Summary) -> dict[str, Any]:
    """``{"staleness": ...}`` for an operator's ``profile_info()`` once it measured any; ``{}`` before."""
    return {"staleness": staleness.to_data()} if staleness.count else {}


LearnerInfo = dict[str, dict[str, Any]]  # policy id -> that policy's learner info


def weight_update_vars(metrics: MetricsContext) -> dict[str, int]:
    """What every weight update carries."""
    return {"timestep": metrics.counters[STEPS_SAMPLED_COUNTER]}


def check_workers(workers: WorkerSet, op: str) -> WorkerSet:
    """``workers`` if it looks like a WorkerSet (``local_worker()`` and ``remote_workers()``); else a TypeError
    naming ``op``."""
    if not callable(getattr(workers, "local_worker", None)) or not callable(getattr(workers, "remote_workers", None)):
        raise TypeError(f"{op} needs a WorkerSet (local_worker() and remote_workers()), got "
                        f"{type(workers).__name__}; pass the plan's workers")
    return workers


def resolve_policies(workers: WorkerSet, policies: Collection[str] | None, op: str, *,
                     trained: bool) -> list[str]:
    """``policies`` as a list (``None``: the local worker's ``policies_to_train``).

    With ``trained=True`` every listed policy must be one the local worker trains."""
    to_train = list(workers.local_worker().policies_to_train)
    if policies is None:
        return to_train
    if isinstance(policies, (str, bytes)) or not isinstance(policies, Collection) or \
            not all(isinstance(p, str) for p in policies):
        raise ValueError(f"{op} policies={policies!r} must be a list of policy ids, e.g. ['{policies}'], "
                         f"or None for the local worker's policies_to_train")
    if trained:
        unknown = [p for p in policies if p not in to_train]
        if unknown:
            raise ValueError(f"{op} policies={list(policies)} names {unknown}, which the local worker does not "
                             f"train (policies_to_train={to_train}); list trainable policies or set "
                             f"policies_to_train in the config")
    return list(policies)


def tree_mean(trees: Sequence[Any], path: str = "grads") -> Any:
    """Leaf-by-leaf arithmetic mean of equally shaped nests of dicts, lists and tuples."""
    first = trees[0]
    if isinstance(first, Mapping):
        if any(not isinstance(t, Mapping) or t.keys() != first.keys() for t in trees):
            raise ValueError(f"AverageGradients: the gradients differ in structure at {path} (dict keys "
                             f"{sorted(first)}); average gradients of one model only")
        return {k: tree_mean([t[k] for t in trees], f"{path}[{k!r}]") for k in first}
    if isinstance(first, (list, tuple)):
        if any(type(t) is not type(first) or len(t) != len(first) for t in trees):
            raise ValueError(f"AverageGradients: the gradients differ in structure at {path} (a "
                             f"{type(first).__name__} of {len(first)}); average gradients of one model only")
        items = [tree_mean([t[i] for t in trees], f"{path}[{i}]") for i in range(len(first))]
        return items if isinstance(first, list) else tuple(items)
    if first is None:
        return None
    total = trees[0]
    for leaf in trees[1:]:
        total = total + leaf
    return total / len(trees)


def check_learner_thread(learner_thread: Any, op: str) -> Any:
    """``learner_thread`` if it has ``weights_updated`` and a ``weights_lock``; else a TypeError naming ``op``."""
    lock = getattr(learner_thread, "weights_lock", None)
    if not hasattr(learner_thread, "weights_updated") or not hasattr(lock, "__enter__"):
        raise TypeError(f"{op} needs a learner thread with a bool weights_updated and a threading.Lock "
                        f"weights_lock (flowrl.ops.concurrency.LearnerThread), got {type(learner_thread).__name__}")
    return learner_thread
