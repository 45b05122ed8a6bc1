"""Torch-free fakes: a deterministic worker, its config and policy, batches and a list iterator.

Nothing here imports torch or a model, so a fake worker actor starts in well under a second: operator tests
run against these. :class:`FakeWorker` and :class:`FakePolicy` keep the worker and policy contracts of
:mod:`flowrl.contracts` (mypy checks them below).

Examples:
    >>> ws = make_fake_workers(num_workers=0, rollout_fragment_length=5)
    >>> batch = ws.local_worker().sample()
    >>> batch.count, batch[WEIGHTS_VERSION].tolist()
    (5, [0, 0, 0, 0, 0])
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

import numpy as np

from flowrl.config import RolloutConfig
from flowrl.envs.base import EpisodeRecord
from flowrl.iter import LocalIterator, ParallelIteratorWorker
from flowrl.sample_batch import (ACTIONS, DEFAULT_POLICY_ID, OBS, REWARDS, TD_ERROR, WEIGHTS_VERSION, AnyBatch,
                                 MultiAgentBatch, SampleBatch)

if TYPE_CHECKING:
    from flowrl.contracts import PolicyLike, WorkerLike
    from flowrl.workers import WorkerSet

__all__ = ["iter_list", "plan_lines", "fake_batch", "FakeConfig", "FakePolicy", "FakeWorker", "make_fake_workers",
           "WEIGHTS_VERSION", "WORKER_INDEX", "SAMPLE_INDEX"]

T = TypeVar("T")

# Columns a FakeWorker stamps into every row it samples, besides WEIGHTS_VERSION (flowrl.sample_batch's: the
# version of the sampling worker's weights).
WORKER_INDEX = "worker_index"  # which worker sampled the row (0 = local)
SAMPLE_INDEX = "sample_index"  # the how-many-th sample() call of that worker produced it


def iter_list(items: Iterable[T]) -> LocalIterator[T]:
    """A local iterator over a list, named ``iter_list``.

    Examples:
        >>> iter_list([1, 2]).for_each(lambda x: x + 1).take(5)
        [2, 3]
    """
    return LocalIterator.from_iterable(list(items), name="iter_list")


def plan_lines(fn: Callable[..., Any]) -> int:
    """Non-blank lines of a plan function, signature included, docstring excluded.

    Examples:
        >>> def plan(workers, config):
        ...     'Doc.'
        ...
        ...     return workers
        >>> plan_lines(plan)
        2
    """
    import ast
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(fn))
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef)  # an internal invariant: fn is a plain function
    docstring_end = node.body[0].end_lineno or 0
    body = [line for line in source.splitlines()[docstring_end:] if line.strip()]
    signature = source.splitlines()[:node.body[0].lineno - 1]
    return len(body) + len(signature)


def fake_batch(count: int, *, start: int = 0, **columns: Any) -> SampleBatch:
    """A SampleBatch of ``count`` rows: ``obs`` = ``start, start+1, ...`` as float32, unit rewards,
    zero actions, plus any ``columns`` given (scalars are repeated).

    Examples:
        >>> fake_batch(3, start=10)[OBS].tolist()
        [10.0, 11.0, 12.0]
    """
    cols: dict[str, Any] = {OBS: np.arange(start, start + count, dtype=np.float32),
                            ACTIONS: np.zeros(count, np.int64), REWARDS: np.ones(count, np.float32)}
    for key, value in columns.items():
        cols[key] = np.full(count, value) if np.ndim(value) == 0 else np.asarray(value)
    return SampleBatch(cols)


@dataclass(frozen=True, kw_only=True)
class FakeConfig(RolloutConfig):
    """A rollout config for :class:`FakeWorker`; one sample is ``rollout_fragment_length x
    num_envs_per_worker`` rows, as for a real worker.

    Attributes:
        sample_delay_s: time one ``sample()`` spends (simulated work).
        learn_delay_s: time one ``learn_on_batch()`` spends (simulated work).
        episodes_per_sample: finished episodes a ``sample()`` reports (return = worker index + 1).
    """

    num_cpus_per_worker: float = 0
    sample_delay_s: float = 0.0
    learn_delay_s: float = 0.0
    episodes_per_sample: int = 1


class FakePolicy:
    """Records what operators ask of a policy: target updates and KL updates."""

    def __init__(self) -> None:
        self.target_updates = 0
        self.kl_updates: list[float] = []

    def update_target(self) -> None:
        self.target_updates += 1

    def update_kl(self, sampled_kl: float) -> None:
        self.kl_updates.append(float(sampled_kl))


class FakeWorker(ParallelIteratorWorker):
    """A deterministic stand-in for :class:`flowrl.workers.RolloutWorker` (same methods, no env, no torch).

    Weights are one integer *version* per policy. ``sample()`` stamps the current version, the worker
    index and the call number into every row; ``learn_on_batch``/``apply_gradients`` bump the version;
    ``set_weights`` adopts the sent versions and records ``(versions, global_vars)`` in
    ``set_weights_calls``. A remote fake is inspected with :meth:`get_record`.

    Args:
        policy_class: ignored (the fake has no model); accepted so that WorkerSet can build it.
        config: a :class:`FakeConfig` (or any RolloutConfig); ``config.policies`` makes it multi-agent,
            with every policy sampling ``sample_size`` rows per call.
        worker_index: 0 for the local worker.
    """

    def __init__(self, *, policy_class: Any = None, config: RolloutConfig, worker_index: int = 0) -> None:
        self.config, self.worker_index = config, worker_index
        self.policy_ids = list(config.policies) if config.policies is not None else [DEFAULT_POLICY_ID]
        self.policies_to_train = list(config.policies_to_train or self.policy_ids)
        self.versions = {pid: 0 for pid in self.policy_ids}
        self.policy_map = {pid: FakePolicy() for pid in self.policy_ids}
        self.sample_calls = 0
        self.learn_calls: list[int] = []  # the count of each batch learned on
        self.applied_gradients: list[Any] = []
        self.set_weights_calls: list[tuple[dict[str, int], Any]] = []
        self.global_vars: list[Any] = []
        super().__init__(self._sample_forever)

    def _sample_forever(self) -> Iterator[AnyBatch]:
        while True:
            yield self.sample()

    def sample(self) -> AnyBatch:
        delay = getattr(self.config, "sample_delay_s", 0.0)
        if delay:
            time.sleep(delay)  # simulated work
        n, k = self.config.sample_size, self.sample_calls
        self.sample_calls += 1
        per_policy = {pid: fake_batch(n, start=k * n, **{WEIGHTS_VERSION: self.versions[pid],
                                                          WORKER_INDEX: self.worker_index, SAMPLE_INDEX: k})
                      for pid in self.policy_ids}
        if self.config.policies is None:
            return per_policy[DEFAULT_POLICY_ID]
        return MultiAgentBatch(per_policy, n)

    def get_metrics(self) -> list[EpisodeRecord]:
        """``episodes_per_sample`` episodes per ``sample()`` since the last call."""
        per_sample = getattr(self.config, "episodes_per_sample", 1)
        count, self._reported = self.sample_calls - getattr(self, "_reported", 0), self.sample_calls
        ret = float(self.worker_index + 1)
        return [EpisodeRecord(env_index=0, episode_return=ret, episode_length=10,
                              policy_returns={pid: ret for pid in self.policy_ids})
                for _ in range(count * per_sample)]

    # -- learning ---------------------------------------------------------------------------------
    def _batches(self, batch: AnyBatch) -> dict[str, SampleBatch]:
        if not isinstance(batch, (SampleBatch, MultiAgentBatch)):
            raise ValueError(f"FakeWorker got {type(batch).__name__}, not a SampleBatch or MultiAgentBatch")
        return batch.as_multi_agent().policy_batches

    def learn_on_batch(self, batch: AnyBatch) -> dict[str, dict[str, Any]]:
        """Bumps each trained policy's version; stats ``loss`` = mean obs, ``kl`` = 0.01, plus
        ``td_error`` = obs (for priority updates)."""
        delay = getattr(self.config, "learn_delay_s", 0.0)
        if delay:
            time.sleep(delay)  # simulated work
        info = {}
        for pid, b in self._batches(batch).items():
            if pid in self.policies_to_train:
                self.versions[pid] += 1
                self.learn_calls.append(b.count)
                info[pid] = {"learner_stats": {"loss": float(np.mean(b[OBS])), "kl": 0.01},
                             TD_ERROR: np.asarray(b[OBS], np.float64)}
        return info

    def compute_gradients(self, batch: AnyBatch) -> tuple[dict[str, list[np.ndarray]], dict[str, Any]]:
        """Gradient of a policy = ``[full(2, mean obs), full(3, count)]``."""
        grads, infos = {}, {}
        for pid, b in self._batches(batch).items():
            if pid in self.policies_to_train:
                grads[pid] = [np.full(2, float(np.mean(b[OBS]))), np.full(3, float(b.count))]
                infos[pid] = {"learner_stats": {"grad_count": b.count}}
        return grads, infos

    def apply_gradients(self, grads: Mapping[str, Any]) -> None:
        self.applied_gradients.append(grads)
        for pid in grads:
            self.versions[pid] += 1

    # -- weights and state ------------------------------------------------------------------------
    def get_weights(self, policies: Sequence[str] | None = None) -> dict[str, dict[str, np.ndarray]]:
        return {pid: {"version": np.array(self.versions[pid])} for pid in (policies or self.policy_ids)}

    def set_weights(self, weights: Mapping[str, Mapping[str, np.ndarray]],
                    global_vars: Mapping[str, Any] | None = None) -> None:
        sent = {pid: int(w["version"]) for pid, w in weights.items()}
        self.versions.update(sent)
        self.set_weights_calls.append((sent, dict(global_vars) if global_vars is not None else None))
        if global_vars is not None:
            self.set_global_vars(global_vars)

    def set_global_vars(self, global_vars: Mapping[str, Any]) -> None:
        self.global_vars.append(dict(global_vars))

    def weights_version(self, policy_id: str = DEFAULT_POLICY_ID) -> int:
        """The version of a policy's weights: its learner updates, or the version it was last sent."""
        return self.versions[policy_id]

    def get_policy(self, policy_id: str = DEFAULT_POLICY_ID) -> FakePolicy:
        if policy_id not in self.policy_map:
            raise ValueError(f"no policy {policy_id!r}; this worker has {sorted(self.policy_map)}")
        return self.policy_map[policy_id]

    def get_state(self) -> dict[str, Any]:
        return {"versions": dict(self.versions), "sample_calls": self.sample_calls}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.versions, self.sample_calls = dict(state["versions"]), int(state["sample_calls"])

    def close_output(self) -> dict[str, Any]:
        return {}  # a fake worker records nothing

    def get_record(self) -> dict[str, Any]:
        """What this worker was asked to do: ``sample_calls``, ``versions``, ``set_weights_calls``,
        ``global_vars``, ``learn_calls``, ``applied_gradients``."""
        return {"sample_calls": self.sample_calls, "versions": dict(self.versions),
                "set_weights_calls": list(self.set_weights_calls), "global_vars": list(self.global_vars),
                "learn_calls": list(self.learn_calls), "applied_gradients": list(self.applied_gradients)}

    def apply(self, fn: Callable[[FakeWorker], T]) -> T:
        return fn(self)

    def ping(self) -> str:
        return "ok"


def make_fake_workers(num_workers: int = 2, **config: Any) -> WorkerSet:
    """A real :class:`~flowrl.workers.WorkerSet` of :class:`FakeWorker`; ``config`` are
    :class:`FakeConfig` fields (``rollout_fragment_length`` defaults to 100).

    Examples:
        >>> ws = make_fake_workers(0, rollout_fragment_length=3)
        >>> ws.local_worker().sample()[OBS].tolist()
        [0.0, 1.0, 2.0]
    """
    from flowrl.workers import WorkerSet  # imports torch; the fake actors themselves never do

    cfg = FakeConfig(**{"rollout_fragment_length": 100, **config, "num_workers": num_workers})
    return WorkerSet(policy_class=None, config=cfg, worker_class=FakeWorker)


if TYPE_CHECKING:
    def _conforms(worker: FakeWorker, policy: FakePolicy) -> tuple[WorkerLike, PolicyLike]:
        return worker, policy  # mypy checks here that the fakes keep the worker and policy contracts
