"""Train operators: learn on batches, apply and average gradients, broadcast weights, update targets.

Each operator does one job. ``TrainOneStep`` keeps the paper's meaning, learn then
broadcast, and is built from :class:`LearnOnBatch` and :class:`BroadcastWeights`, each usable alone.
Every broadcast follows one rule: one ``ray.put``, that
reference sent to each recipient with ``global_vars = {"timestep": num_steps_sampled}``, fire and
forget (``WorkerSet.put_weights`` / ``WorkerSet.send_weights``).

Examples:
    >>> from flowrl.testing import fake_batch, make_fake_workers
    >>> workers = make_fake_workers(0)
    >>> it = iter_list([fake_batch(4), fake_batch(4, start=4)]).for_each(TrainOneStep(workers))
    >>> it
    LocalIterator[iter_list.for_each(TrainOneStep)]
    >>> [info["default_policy"]["learner_stats"]["loss"] for _, info in it]
    [1.5, 5.5]
    >>> it.metrics.counters["num_steps_trained"]
    8
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Collection, Mapping, Sequence

import numpy as np
import torch

from flowrl.metrics import (AGENT_STEPS_TRAINED_COUNTER, APPLY_GRADS_TIMER, COMPUTE_GRADS_TIMER, LAST_TARGET_UPDATE_TS,
                            LEARN_ON_BATCH_TIMER, LEARNER_INFO, LEARNER_STATS_KEY, LOAD_BATCH_TIMER,
                            NUM_LEARNER_UPDATES, NUM_TARGET_UPDATES, NUM_WEIGHT_BROADCASTS, NUM_WEIGHT_SYNCS,
                            STEPS_SAMPLED_COUNTER,
                            STEPS_TRAINED_COUNTER, STEPS_TRAINED_THIS_ITER_COUNTER, TARGET_NET_UPDATE_TIMER,
                            WORKER_UPDATE_TIMER, MetricsBinding, MetricsContext)
from flowrl.ops._common import check_batch, check_int, record_staleness, staleness_info
from flowrl.policy import NONFINITE_UPDATES_SKIPPED, Policy
from flowrl.metrics import Summary
from flowrl.sample_batch import AnyBatch, MultiAgentBatch, SampleBatch
from flowrl.workers import WorkerSet

__all__ = ["TrainOneStep", "train_one_step", "LearnOnBatch", "BroadcastWeights", "UpdateKL", "MultiGPUTrainOneStep",
           "ComputeGradients", "ApplyGradients", "AverageGradients", "UpdateTargetNetwork", "UpdateWorkerWeights",
           "BroadcastUpdateLearnerWeights", "RecordLearnerOutput", "UpdateTargetAndKL"]

logger = logging.getLogger(__name__)

LearnerInfo = dict[str, dict[str, Any]]


# -- shared helpers ---------------------------------------------------------------------------------

def _global_vars(metrics: MetricsContext) -> dict[str, int]:
    """What every weight update carries."""
    return {"timestep": metrics.counters[STEPS_SAMPLED_COUNTER]}


def _check_workers(workers: WorkerSet, op: str) -> WorkerSet:
    if not callable(getattr(workers, "local_worker", None)) or not callable(getattr(workers, "remote_workers", None)):
        raise TypeError(f"{op} needs a WorkerSet (local_worker() and remote_workers()), got "
                        f"{type(workers).__name__}; pass the plan's workers")
    return workers


def _resolve_policies(workers: WorkerSet, policies: Collection[str] | None, op: str, *,
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


def _record_trained(metrics: MetricsContext, batch: AnyBatch, learner_info: LearnerInfo) -> None:
    metrics.info[LEARNER_INFO] = learner_info
    metrics.counters[STEPS_TRAINED_COUNTER] += batch.count
    metrics.counters[AGENT_STEPS_TRAINED_COUNTER] += batch.agent_steps()
    metrics.counters[STEPS_TRAINED_THIS_ITER_COUNTER] += batch.count


def _mean_stats(stats: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Element-wise mean of numeric stats over a list of stats dicts; other values, and the running count of skipped
    non-finite updates: the last one."""
    out: dict[str, Any] = {}
    keys = list(dict.fromkeys(k for s in stats for k in s))
    for key in keys:
        values = [s[key] for s in stats if key in s]
        if key == NONFINITE_UPDATES_SKIPPED:
            out[key] = values[-1]
            continue
        try:
            mean = np.mean(np.asarray(values, dtype=np.float64), axis=0)
        except (TypeError, ValueError):
            out[key] = values[-1]
            continue
        out[key] = float(mean) if np.ndim(mean) == 0 else mean
    return out


def _tree_mean(trees: Sequence[Any], path: str = "grads") -> Any:
    """Leaf-by-leaf arithmetic mean of equally shaped nests of dicts, lists and tuples."""
    first = trees[0]
    if isinstance(first, Mapping):
        if any(not isinstance(t, Mapping) or t.keys() != first.keys() for t in trees):
            raise ValueError(f"AverageGradients: the gradients differ in structure at {path} (dict keys "
                             f"{sorted(first)}); average gradients of one model only")
        return {k: _tree_mean([t[k] for t in trees], f"{path}[{k!r}]") for k in first}
    if isinstance(first, (list, tuple)):
        if any(type(t) is not type(first) or len(t) != len(first) for t in trees):
            raise ValueError(f"AverageGradients: the gradients differ in structure at {path} (a "
                             f"{type(first).__name__} of {len(first)}); average gradients of one model only")
        items = [_tree_mean([t[i] for t in trees], f"{path}[{i}]") for i in range(len(first))]
        return items if isinstance(first, list) else tuple(items)
    if first is None:
        return None
    total = trees[0]
    for leaf in trees[1:]:
        total = total + leaf
    return total / len(trees)


def _check_pair(item: Any, op: object, what: str) -> tuple[Any, int]:
    if not isinstance(item, tuple) or len(item) != 2:
        raise ValueError(f"{op!r} consumes {what} 2-tuples, got {type(item).__name__}: {item!r:.80}")
    return item[0], item[1]


# -- learning on batches --------------------------------------------------------------------------

class LearnOnBatch(MetricsBinding):
    """The learn half of TrainOneStep: trains the local worker on a batch; emits ``(batch, learner_info)``.

    Use with ``.for_each()``. Only the listed trainable policies (``None``: ``policies_to_train``)
    present in the batch learn. Minibatch SGD runs iff ``num_sgd_iter > 1`` or ``sgd_minibatch_size > 0``:
    per policy and epoch the rows are permuted and cut into consecutive minibatches (the last may be
    shorter; 0 or a size >= the rows gives one), ``local_worker().learn_on_batch`` runs on each, and
    ``learner_stats`` is the element-wise mean over the final epoch's minibatches. The permutation comes
    from the policy's ``np_random`` when it has one (a seeded, checkpointed generator), else from a
    generator of this operator seeded with the worker config's ``seed``.

    Metrics: times ``learn`` (units = count); ``info["learner"]``; ``num_steps_trained``,
    ``num_agent_steps_trained`` and ``num_steps_trained_this_iter`` += the batch's steps. Profile
    (``profile_info()``): the staleness of the rows it trains on, when they carry their ``weights_version``.

    Examples:
        >>> from flowrl.testing import fake_batch, make_fake_workers
        >>> op = LearnOnBatch(make_fake_workers(0, seed=0), num_sgd_iter=2, sgd_minibatch_size=3)
        >>> op.bind(metrics := MetricsContext())
        >>> batch, info = op(fake_batch(6))
        >>> round(info["default_policy"]["learner_stats"]["loss"], 2), metrics.counters["num_steps_trained"]
        (2.5, 6)
    """

    def __init__(self, workers: WorkerSet, policies: Collection[str] | None = None, num_sgd_iter: int = 1,
                 sgd_minibatch_size: int = 0) -> None:
        name = type(self).__name__
        self.workers = _check_workers(workers, name)
        if not isinstance(num_sgd_iter, int) or num_sgd_iter < 1:
            raise ValueError(f"{name} num_sgd_iter={num_sgd_iter!r} must be an int >= 1 (epochs over each batch)")
        if not isinstance(sgd_minibatch_size, int) or sgd_minibatch_size < 0:
            raise ValueError(f"{name} sgd_minibatch_size={sgd_minibatch_size!r} must be an int >= 0 (0: the "
                             f"whole batch is one minibatch)")
        self.policies = _resolve_policies(workers, policies, name, trained=True)
        self.num_sgd_iter, self.sgd_minibatch_size = num_sgd_iter, sgd_minibatch_size
        self.minibatch_sgd = num_sgd_iter > 1 or sgd_minibatch_size > 0
        self._rng = np.random.default_rng(getattr(workers.local_worker().config, "seed", None))
        self.staleness = Summary()

    def _policy_rng(self, pid: str) -> np.random.Generator:
        rng = getattr(self.workers.local_worker().get_policy(pid), "np_random", None)
        return rng if isinstance(rng, np.random.Generator) else self._rng

    def _learn_minibatches(self, batch: AnyBatch) -> LearnerInfo:
        local = self.workers.local_worker()
        info: LearnerInfo = {}
        for pid, part in batch.as_multi_agent().policy_batches.items():
            if pid not in self.policies or part.count == 0:
                continue
            size = self.sgd_minibatch_size if 0 < self.sgd_minibatch_size < part.count else part.count
            rng = self._policy_rng(pid)
            epoch_stats: list[dict[str, Any]] = []
            for _ in range(self.num_sgd_iter):
                epoch_stats = []
                for mb in part.minibatches(size, seed=rng, shuffle=True):
                    wrapped = mb if isinstance(batch, SampleBatch) else MultiAgentBatch({pid: mb}, mb.count)
                    result = local.learn_on_batch(wrapped)
                    if pid in result:
                        epoch_stats.append(result[pid].get(LEARNER_STATS_KEY, {}))
            info[pid] = {LEARNER_STATS_KEY: _mean_stats(epoch_stats)}
        return info

    def _learn_once(self, batch: AnyBatch) -> LearnerInfo:
        local = self.workers.local_worker()
        if isinstance(batch, MultiAgentBatch) and any(p not in self.policies for p in batch.policy_batches):
            batch = MultiAgentBatch({p: b for p, b in batch.policy_batches.items() if p in self.policies},
                                    batch.count)
        elif isinstance(batch, SampleBatch) and not set(batch.as_multi_agent().policy_batches) & set(self.policies):
            return {}
        return dict(local.learn_on_batch(batch))

    def __call__(self, batch: AnyBatch) -> tuple[AnyBatch, LearnerInfo]:
        check_batch(batch, self)
        record_staleness(self.staleness, self.workers.local_worker(), batch, self.policies)
        with self.metrics.timers[LEARN_ON_BATCH_TIMER] as timer:
            info = self._learn_minibatches(batch) if self.minibatch_sgd else self._learn_once(batch)
            timer.push_units_processed(batch.count)
        _record_trained(self.metrics, batch, info)
        return batch, info

    def profile_info(self) -> dict[str, Any]:
        """What :mod:`flowrl.profiling` adds to this operator's node: the staleness of what it trained on."""
        return staleness_info(self.staleness)

    def __repr__(self) -> str:
        return "LearnOnBatch"


class BroadcastWeights(MetricsBinding):
    """The broadcast half of TrainOneStep: a pass-through stage that sends the local weights out.

    Use with ``.for_each()`` after a learn stage. With remote workers it puts the weights of
    ``policies`` (``None``: ``policies_to_train``) once and sends that reference to every remote worker
    with ``{"timestep": num_steps_sampled}``, fire and forget; the local worker always gets the global vars.

    Metrics: times ``update`` (only when there are remote workers).

    Examples:
        >>> from flowrl.testing import make_fake_workers
        >>> workers = make_fake_workers(0)
        >>> op = BroadcastWeights(workers)
        >>> op.bind(metrics := MetricsContext())
        >>> metrics.counters["num_steps_sampled"] = 300
        >>> op("any item"), workers.local_worker().global_vars
        ('any item', [{'timestep': 300}])
    """

    def __init__(self, workers: WorkerSet, policies: Collection[str] | None = None) -> None:
        self.workers = _check_workers(workers, type(self).__name__)
        self.policies = _resolve_policies(workers, policies, type(self).__name__, trained=False)

    def __call__(self, item: Any) -> Any:
        global_vars = _global_vars(self.metrics)
        if self.workers.remote_workers():
            with self.metrics.timers[WORKER_UPDATE_TIMER]:
                self.workers.send_weights(self.workers.put_weights(self.policies), global_vars=global_vars)
        else:
            self.workers.local_worker().set_global_vars(global_vars)
        return item

    def __repr__(self) -> str:
        return "BroadcastWeights"


class TrainOneStep(MetricsBinding):
    """Learns on each batch, then broadcasts the trained weights: :class:`LearnOnBatch` followed by
    :class:`BroadcastWeights` (``broadcast=False`` leaves the second one out). Emits ``(batch, learner_info)``.

    Use with ``.for_each()``. See :class:`LearnOnBatch` for the minibatch SGD rule.

    Metrics: times ``learn`` (units = count) and ``update``; ``info["learner"]``; ``num_steps_trained``,
    ``num_agent_steps_trained`` and ``num_steps_trained_this_iter`` += the batch's steps.

    Examples:
        >>> from flowrl.testing import fake_batch, make_fake_workers
        >>> op = TrainOneStep(make_fake_workers(0))
        >>> op.bind(metrics := MetricsContext())
        >>> batch, info = op(fake_batch(10))
        >>> sorted(info["default_policy"]), metrics.counters["num_steps_trained"]
        (['learner_stats', 'td_error'], 10)
    """

    def __init__(self, workers: WorkerSet, policies: Collection[str] | None = None, num_sgd_iter: int = 1,
                 sgd_minibatch_size: int = 0, *, broadcast: bool = True) -> None:
        self.learn = LearnOnBatch(workers, policies, num_sgd_iter, sgd_minibatch_size)
        self.broadcast = BroadcastWeights(workers, self.learn.policies) if broadcast else None

    def bind(self, metrics: MetricsContext) -> None:
        super().bind(metrics)
        self.learn.bind(metrics)
        if self.broadcast is not None:
            self.broadcast.bind(metrics)

    def __call__(self, batch: AnyBatch) -> tuple[AnyBatch, LearnerInfo]:
        out = self.learn(batch)
        if self.broadcast is not None:
            self.broadcast(out)
        return out

    def profile_info(self) -> dict[str, Any]:
        """The profile of its learn step (:meth:`LearnOnBatch.profile_info`)."""
        return self.learn.profile_info()

    def __repr__(self) -> str:
        return "TrainOneStep"


class UpdateKL(MetricsBinding):
    """Adapts each trained policy's KL coefficient from its sampled KL (PPO); a pass-through stage.

    Use with ``.for_each()`` right after TrainOneStep or MultiGPUTrainOneStep: it consumes their
    ``(batch, learner_info)`` and calls ``update_kl(learner_info[pid]["learner_stats"]["kl"])`` on the
    local worker's policy of each of ``policies`` (``None``: the trainable ones) present in it (an absent
    one is skipped with a warning).

    Metrics: none.

    Examples:
        >>> from flowrl.testing import make_fake_workers
        >>> workers = make_fake_workers(0)
        >>> item = ("batch", {"default_policy": {"learner_stats": {"kl": 0.02}}})
        >>> UpdateKL(workers)(item) is item, workers.local_worker().get_policy().kl_updates
        (True, [0.02])
    """

    def __init__(self, workers: WorkerSet, policies: Collection[str] | None = None) -> None:
        self.workers = _check_workers(workers, type(self).__name__)
        self.policies = None if policies is None else _resolve_policies(workers, policies, type(self).__name__,
                                                                            trained=True)

    def __call__(self, item: tuple[AnyBatch, LearnerInfo]) -> tuple[AnyBatch, LearnerInfo]:
        if not isinstance(item, tuple) or len(item) != 2 or not isinstance(item[1], Mapping):
            raise ValueError(f"{self!r} consumes the (batch, learner_info) output of TrainOneStep or "
                             f"MultiGPUTrainOneStep, got {type(item).__name__}: {item!r:.80}; put it right after one")
        local = self.workers.local_worker()
        learner_info = item[1]
        for pid in self.policies if self.policies is not None else local.policies_to_train:
            if pid not in learner_info:
                logger.warning("UpdateKL: trainable policy %r has no learner info in this step (it was not in "
                               "the batch); its KL coefficient is left as is", pid)
                continue
            stats = learner_info[pid].get(LEARNER_STATS_KEY, {})
            if "kl" not in stats:
                raise ValueError(f"UpdateKL: learner_stats of policy {pid!r} have no 'kl' (keys {sorted(stats)}); "
                                 f"its loss must report the sampled KL, or drop UpdateKL for this policy")
            local.get_policy(pid).update_kl(stats["kl"])
        return item

    def __repr__(self) -> str:
        return "UpdateKL"


# -- multi-device learner -------------------------------------------------------------------------

def train_one_step(workers: WorkerSet, config: Any, *, num_sgd_iter: int = 1, sgd_minibatch_size: int = 0,
                   shuffle_sequences: bool = True) -> TrainOneStep | MultiGPUTrainOneStep:
    """The learn-and-broadcast stage a plan's config asks for: :class:`TrainOneStep` when
    ``config.use_simple_optimizer`` (one learner device), else :class:`MultiGPUTrainOneStep` on
    ``config.num_gpus`` devices (``config.fake_gpus``: CPU stand-ins), whose minibatches are
    ``sgd_minibatch_size`` rows (0: the whole train batch, ``config.train_batch_size``).

    Examples:
        >>> from flowrl.config import TrainerConfig
        >>> from flowrl.testing import make_fake_workers
        >>> train_one_step(make_fake_workers(0), TrainerConfig(num_workers=0))
        TrainOneStep
    """
    if config.use_simple_optimizer:
        return TrainOneStep(workers, num_sgd_iter=num_sgd_iter, sgd_minibatch_size=sgd_minibatch_size)
    return MultiGPUTrainOneStep(workers, sgd_minibatch_size=sgd_minibatch_size or config.train_batch_size,
                                num_sgd_iter=num_sgd_iter, shuffle_sequences=shuffle_sequences,
                                num_gpus=config.num_gpus, fake_gpus=config.fake_gpus)


class MultiGPUTrainOneStep(MetricsBinding):
    """Loads each batch onto the learner device(s) once, then runs ``num_sgd_iter`` epochs of minibatch SGD
    split across the devices; emits ``(batch, learner_info)`` and broadcasts like TrainOneStep.

    Use with ``.for_each()``. Devices ("towers"): ``num_gpus`` CUDA devices, one CPU device when
    ``num_gpus == 0``, or ``num_gpus`` CPU towers with ``fake_gpus=True``. Each trained policy's rows
    (permuted once when ``shuffle_sequences``) are split evenly across the towers; a remainder of fewer
    than ``num_devices`` rows is dropped but counted. Each epoch visits a random permutation of the
    ``max(1, rows_per_device // (sgd_minibatch_size // num_devices))`` minibatch offsets; each step
    computes the gradients on every tower, averages them and applies them once. ``learner_stats`` is the
    mean over the final epoch's minibatches (and towers). The permutations use the policy's ``np_random``.

    One tower trains on tensors loaded once (``Policy.to_tensors`` / ``learn_on_tensors``). Several
    towers exist only as fake (CPU) ones: each step runs ``compute_gradients`` per tower slice, averages,
    and ``apply_gradients``. Several real GPUs are refused: a Policy has one model on ``config.device``.

    Metrics: times ``load`` and ``learn`` (units = count) and ``update``; ``info["learner"]``;
    ``num_steps_trained``, ``num_agent_steps_trained`` and ``num_steps_trained_this_iter``.

    Raises:
        ValueError: ``sgd_minibatch_size // num_devices < 1``, ``num_sgd_iter < 1``, ``num_gpus`` more than
            torch sees (or > 1 without ``fake_gpus``), or a trained policy that is not a torch
            :class:`~flowrl.policy.Policy` on the towers' device type.

    Examples:
        >>> from flowrl.testing import TinyPGPolicy
        >>> from flowrl.workers import RolloutConfig, WorkerSet
        >>> cfg = RolloutConfig(env="CartPole-v1", rollout_fragment_length=32, seed=0)
        >>> workers = WorkerSet(policy_class=TinyPGPolicy, config=cfg)
        >>> op = MultiGPUTrainOneStep(workers, sgd_minibatch_size=8, num_sgd_iter=2, num_gpus=2, fake_gpus=True)
        >>> op.bind(metrics := MetricsContext())
        >>> batch, info = op(workers.local_worker().sample())
        >>> sorted(info["default_policy"]["learner_stats"]), metrics.counters["num_steps_trained"]
        (['entropy', 'loss'], 32)
    """

    def __init__(self, workers: WorkerSet, *, sgd_minibatch_size: int, num_sgd_iter: int, num_gpus: float,
                 policies: Collection[str] | None = None, shuffle_sequences: bool = True, fake_gpus: bool = False,
                 broadcast: bool = True) -> None:
        name = type(self).__name__
        self.workers = _check_workers(workers, name)
        if not isinstance(num_sgd_iter, int) or num_sgd_iter < 1:
            raise ValueError(f"{name} num_sgd_iter={num_sgd_iter!r} must be an int >= 1 (epochs over each batch)")
        if isinstance(num_gpus, bool) or not isinstance(num_gpus, (int, float)) or num_gpus < 0 or \
                not float(num_gpus).is_integer():
            raise ValueError(f"{name} num_gpus={num_gpus!r} must be a whole number >= 0 (0: one CPU device)")
        whole_gpus = int(num_gpus)
        if whole_gpus > 0 and not fake_gpus:
            visible = torch.cuda.device_count()
            if num_gpus > visible:
                raise ValueError(f"{name} num_gpus={num_gpus} but torch sees {visible} CUDA device(s); lower "
                                 f"num_gpus, or set fake_gpus=True to simulate {num_gpus} towers on the CPU")
            if num_gpus > 1:
                raise ValueError(f"{name} num_gpus={num_gpus}: several real GPUs need one model replica per GPU, "
                                 f"which flowrl's Policy (one model on config.device) does not provide; use "
                                 f"num_gpus=1 or fake_gpus=True")
        self.num_devices = max(1, whole_gpus)
        self.device_type = "cuda" if whole_gpus > 0 and not fake_gpus else "cpu"
        if not isinstance(sgd_minibatch_size, int) or sgd_minibatch_size // self.num_devices < 1:
            raise ValueError(f"{name} sgd_minibatch_size={sgd_minibatch_size!r} over {self.num_devices} device(s) "
                             f"leaves < 1 row per device; use sgd_minibatch_size >= {self.num_devices}")
        self.policies = _resolve_policies(workers, policies, name, trained=True)
        local = workers.local_worker()
        self._torch_policies: dict[str, Policy] = {}
        for pid in self.policies:
            policy = local.get_policy(pid)
            if not isinstance(policy, Policy):
                raise ValueError(f"{name} trains torch policies (flowrl.policy.Policy); policy {pid!r} is a "
                                 f"{type(policy).__name__}; use TrainOneStep for other policies")
            if policy.device.type != self.device_type:
                raise ValueError(f"{name}(num_gpus={whole_gpus}, fake_gpus={fake_gpus}) loads onto "
                                 f"{self.device_type} but policy {pid!r} lives on {policy.device}; set the "
                                 f"config's device='{self.device_type}' or change num_gpus")
            self._torch_policies[pid] = policy  # the worker's own: the same objects at every call
        self.num_gpus, self.fake_gpus = whole_gpus, fake_gpus
        self.sgd_minibatch_size, self.num_sgd_iter = sgd_minibatch_size, num_sgd_iter
        self.per_device_minibatch = sgd_minibatch_size // self.num_devices
        self.shuffle_sequences = shuffle_sequences
        self.broadcast = BroadcastWeights(workers, self.policies) if broadcast else None
        self.staleness = Summary()

    def bind(self, metrics: MetricsContext) -> None:
        super().bind(metrics)
        if self.broadcast is not None:
            self.broadcast.bind(metrics)

    def _load(self, policy: Policy, part: SampleBatch) -> tuple[list[SampleBatch], dict[str, torch.Tensor] | None]:
        """Per-tower slices; with one tower, its tensors already on the device."""
        if self.shuffle_sequences:
            part = part.shuffle(policy.np_random)
        rows = part.count // self.num_devices
        towers = [part[d * rows:(d + 1) * rows] for d in range(self.num_devices)]
        return towers, (policy.to_tensors(towers[0]) if self.num_devices == 1 else None)

    def _step(self, policy: Policy, towers: list[SampleBatch], loaded: dict[str, torch.Tensor] | None,
              rows: slice) -> dict[str, Any]:
        if loaded is not None:
            stats: dict[str, Any] = policy.learn_on_tensors({k: v[rows] for k, v in loaded.items()})[LEARNER_STATS_KEY]
            return stats
        results = [policy.compute_gradients(tower[rows]) for tower in towers]
        policy.apply_gradients(_tree_mean([grads for grads, _ in results]))
        mean = _mean_stats([info[LEARNER_STATS_KEY] for _, info in results])
        if policy.num_nonfinite_updates_skipped:
            mean[NONFINITE_UPDATES_SKIPPED] = policy.num_nonfinite_updates_skipped
        return mean

    def __call__(self, batch: AnyBatch) -> tuple[AnyBatch, LearnerInfo]:
        check_batch(batch, self)
        local = self.workers.local_worker()
        record_staleness(self.staleness, local, batch, self.policies)
        parts = {pid: b for pid, b in batch.as_multi_agent().policy_batches.items() if pid in self.policies}
        loaded: dict[str, tuple[list[SampleBatch], dict[str, torch.Tensor] | None]] = {}
        with self.metrics.timers[LOAD_BATCH_TIMER] as timer:
            for pid, part in parts.items():
                if part.count < self.num_devices:
                    logger.warning("%r: policy %r has %d rows for %d devices; it does not learn this step",
                                   self, pid, part.count, self.num_devices)
                    continue
                loaded[pid] = self._load(self._torch_policies[pid], part)
            timer.push_units_processed(batch.count)
        info: LearnerInfo = {}
        with self.metrics.timers[LEARN_ON_BATCH_TIMER] as timer:
            for pid, (towers, tensors) in loaded.items():
                policy = self._torch_policies[pid]
                size = self.per_device_minibatch
                epoch_stats: list[dict[str, Any]] = []
                for _ in range(self.num_sgd_iter):
                    epoch_stats = [self._step(policy, towers, tensors, slice(i * size, (i + 1) * size))
                                   for i in policy.np_random.permutation(max(1, towers[0].count // size))]
                info[pid] = {LEARNER_STATS_KEY: _mean_stats(epoch_stats)}
            timer.push_units_processed(batch.count)
        _record_trained(self.metrics, batch, info)
        out = (batch, info)
        if self.broadcast is not None:
            self.broadcast(out)
        return out

    def profile_info(self) -> dict[str, Any]:
        """What :mod:`flowrl.profiling` adds to this operator's node: the staleness of what it trained on."""
        return staleness_info(self.staleness)

    def __repr__(self) -> str:
        return f"MultiGPUTrainOneStep({self.num_devices} {'fake ' if self.fake_gpus else ''}{self.device_type})"


# -- gradients ------------------------------------------------------------------------------------

class ComputeGradients(MetricsBinding):
    """Computes gradients on the local worker; consumes batches, emits ``(grads, count)``.

    Use with ``.for_each()``, then ``.batch(k).for_each(AverageGradients())`` or ``ApplyGradients``.

    Metrics: times ``compute_grads`` (units = count); ``info["learner"]`` = the per-policy info.

    Examples:
        >>> from flowrl.testing import fake_batch, make_fake_workers
        >>> op = ComputeGradients(make_fake_workers(0))
        >>> op.bind(MetricsContext())
        >>> grads, count = op(fake_batch(4))
        >>> [g.tolist() for g in grads["default_policy"]], count
        ([[1.5, 1.5], [4.0, 4.0, 4.0]], 4)
    """

    def __init__(self, workers: WorkerSet) -> None:
        self.workers = _check_workers(workers, type(self).__name__)

    def __call__(self, batch: AnyBatch) -> tuple[Any, int]:
        check_batch(batch, self)
        with self.metrics.timers[COMPUTE_GRADS_TIMER] as timer:
            grads, info = self.workers.local_worker().compute_gradients(batch)
            timer.push_units_processed(batch.count)
        self.metrics.info[LEARNER_INFO] = info
        return grads, batch.count

    def __repr__(self) -> str:
        return "ComputeGradients"


class ApplyGradients(MetricsBinding):
    """Applies ``(grads, count)`` on the local worker and sends it the new weights; emits ``None``.

    Use with ``.for_each()`` after ComputeGradients, AverageGradients or AsyncGradients. With
    ``update_all=True`` the weights of ``policies`` (``None``: ``policies_to_train``) are put once and
    sent to every remote worker; with ``update_all=False`` only to the actor that produced the gradients
    (``metrics.current_actor``, as after AsyncGradients). The local worker gets the global vars.

    Metrics: ``num_steps_trained`` and ``num_steps_trained_this_iter`` += count; times ``apply_grad``
    (units = count) and ``update``.

    Examples:
        >>> from flowrl.testing import fake_batch, make_fake_workers
        >>> workers = make_fake_workers(0)
        >>> it = iter_list([fake_batch(4)]).for_each(ComputeGradients(workers)).for_each(ApplyGradients(workers))
        >>> it.take(1), it.metrics.counters["num_steps_trained"], workers.local_worker().versions
        ([None], 4, {'default_policy': 1})
    """

    def __init__(self, workers: WorkerSet, policies: Collection[str] | None = None, update_all: bool = True) -> None:
        self.workers = _check_workers(workers, type(self).__name__)
        self.policies = _resolve_policies(workers, policies, type(self).__name__, trained=False)
        self.update_all = update_all

    def __call__(self, item: tuple[Any, int]) -> None:
        grads, count = _check_pair(item, self, "(grads, count)")
        if not isinstance(count, (int, np.integer)):
            raise ValueError(f"{self!r} consumes (grads, count) with an int count, got count={count!r}")
        actor = self.metrics.current_actor
        if not self.update_all and actor is None:
            raise ValueError(f"{self!r} with update_all=False sends weights to the actor that produced the "
                             f"gradients, but metrics.current_actor is None; put it after AsyncGradients or "
                             f"use update_all=True")
        self.metrics.counters[STEPS_TRAINED_COUNTER] += int(count)
        self.metrics.counters[STEPS_TRAINED_THIS_ITER_COUNTER] += int(count)
        global_vars = _global_vars(self.metrics)
        local = self.workers.local_worker()
        recipients = self.workers.remote_workers() if self.update_all else [actor]
        with self.metrics.timers[APPLY_GRADS_TIMER] as timer:
            local.apply_gradients(grads)
            if not recipients:  # otherwise send_weights sets the local global vars
                local.set_global_vars(global_vars)
            timer.push_units_processed(int(count))
        if recipients:
            with self.metrics.timers[WORKER_UPDATE_TIMER]:
                self.workers.send_weights(self.workers.put_weights(self.policies), to=recipients,
                                          global_vars=global_vars)

    def __repr__(self) -> str:
        return "ApplyGradients" if self.update_all else "ApplyGradients(update_all=False)"


class AverageGradients:
    """Averages a list of ``(grads, count)``: emits ``(element-wise mean of the grads, sum of the counts)``.

    Use with ``.for_each()`` after ``.batch(k)``. Nested dicts, lists and tuples of numpy arrays or
    tensors are averaged leaf by leaf over the list's actual length (a final partial batch included).
    This is a true mean: upstream RLlib summed, so port its learning rates times k.

    Metrics: none.

    Examples:
        >>> import numpy as np
        >>> grads, count = AverageGradients()([({"p": [np.ones(2)]}, 10), ({"p": [np.zeros(2)]}, 20)])
        >>> grads["p"][0].tolist(), count
        ([0.5, 0.5], 30)
    """

    def __call__(self, items: Sequence[tuple[Any, int]]) -> tuple[Any, int]:
        if not isinstance(items, list) or not items:
            raise ValueError(f"{self!r} consumes a non-empty list of (grads, count), got {items!r:.80}; put it "
                             f"after .batch(k)")
        pairs = [_check_pair(item, self, "lists of (grads, count)") for item in items]
        return _tree_mean([grads for grads, _ in pairs]), sum(int(count) for _, count in pairs)

    def __repr__(self) -> str:
        return "AverageGradients"


# -- target networks ------------------------------------------------------------------------------

class UpdateTargetNetwork(MetricsBinding):
    """Updates the target networks every ``target_update_freq`` steps; a pass-through stage.

    Use with ``.for_each()`` after a train stage. It fires iff ``metric >= last_target_update_ts +
    target_update_freq`` (always when ``target_update_freq <= 0``), where the metric is
    ``num_steps_sampled`` or, with ``by_steps_trained``, ``num_steps_trained``. Firing calls
    ``update_target()`` on each listed trainable policy (``None``: ``policies_to_train``). With a
    ``learner_thread`` (Ape-X), the copy holds its ``weights_lock``, so it never reads a network the thread is
    halfway through updating.

    Metrics: times ``target_net_update``; ``num_target_updates += 1``; ``last_target_update_ts = metric``
    (shared by all UpdateTargetNetwork stages of one dataflow).

    Examples:
        >>> from flowrl.testing import make_fake_workers
        >>> workers = make_fake_workers(0)
        >>> op = UpdateTargetNetwork(workers, target_update_freq=100)
        >>> op.bind(metrics := MetricsContext())
        >>> metrics.counters["num_steps_sampled"] = 100
        >>> op("item"), workers.local_worker().get_policy().target_updates
        ('item', 1)
    """

    def __init__(self, workers: WorkerSet, target_update_freq: int, by_steps_trained: bool = False,
                 policies: Collection[str] | None = None, learner_thread: Any = None) -> None:
        name = type(self).__name__
        self.workers = _check_workers(workers, name)
        self.lock = contextlib.nullcontext() if learner_thread is None else \
            _check_learner_thread(learner_thread, name).weights_lock
        if isinstance(target_update_freq, bool) or not isinstance(target_update_freq, (int, float)):
            raise ValueError(f"{name} target_update_freq={target_update_freq!r} must be a number of steps "
                             f"(<= 0: update on every call)")
        self.target_update_freq = target_update_freq
        self.metric = STEPS_TRAINED_COUNTER if by_steps_trained else STEPS_SAMPLED_COUNTER
        self.policies = _resolve_policies(workers, policies, name, trained=True)

    def __call__(self, item: Any) -> Any:
        counters = self.metrics.counters
        metric = counters[self.metric]
        if self.target_update_freq <= 0 or metric >= counters[LAST_TARGET_UPDATE_TS] + self.target_update_freq:
            with self.metrics.timers[TARGET_NET_UPDATE_TIMER], self.lock:
                local = self.workers.local_worker()
                for pid in self.policies:
                    local.get_policy(pid).update_target()
            counters[NUM_TARGET_UPDATES] += 1
            counters[LAST_TARGET_UPDATE_TS] = metric
        return item

    def __repr__(self) -> str:
        return f"UpdateTargetNetwork({self.target_update_freq})"


# -- weight sync with a learner thread ------------------------------------------------------------

def _check_learner_thread(learner_thread: Any, op: str) -> Any:
    lock = getattr(learner_thread, "weights_lock", None)
    if not hasattr(learner_thread, "weights_updated") or not hasattr(lock, "__enter__"):
        raise TypeError(f"{op} needs a learner thread with a bool weights_updated and a threading.Lock "
                        f"weights_lock (flowrl.ops.concurrency.LearnerThread), got {type(learner_thread).__name__}")
    return learner_thread


def _check_actor_item(item: Any, op: object) -> tuple[Any, AnyBatch]:
    if not isinstance(item, tuple) or len(item) != 2:
        raise ValueError(f"{op!r} consumes (actor, batch) pairs, got {type(item).__name__}: {item!r:.80}; put it "
                         f"after .zip_with_source_actor() of an async rollout stream")
    return item[0], check_batch(item[1], op)


class UpdateWorkerWeights(MetricsBinding):
    """Sends each worker fresh weights once it has delivered ``max_weight_sync_delay`` steps (Ape-X);
    a pass-through stage over ``(actor, batch)``.

    Use with ``.for_each()`` after ``.zip_with_source_actor()``. When an actor's steps since its last
    sync reach ``max_weight_sync_delay``, the cached weights reference is refreshed (one put, read under
    ``learner_thread.weights_lock``) if there is none yet or ``learner_thread.weights_updated`` (which is
    then cleared), and sent to that actor only with the global vars.

    Metrics: ``num_weight_syncs += 1`` per sync.

    Examples:
        >>> import threading, types
        >>> from flowrl.testing import fake_batch, make_fake_workers
        >>> learner = types.SimpleNamespace(weights_updated=False, weights_lock=threading.Lock())
        >>> workers = make_fake_workers(1)
        >>> op = UpdateWorkerWeights(learner, workers, max_weight_sync_delay=100)
        >>> op.bind(metrics := MetricsContext())
        >>> actor = workers.remote_workers()[0]
        >>> [op((actor, fake_batch(60))) and metrics.counters["num_weight_syncs"] for _ in range(4)]
        [0, 1, 1, 2]
        >>> workers.stop()
    """

    def __init__(self, learner_thread: Any, workers: WorkerSet, max_weight_sync_delay: int) -> None:
        name = type(self).__name__
        self.learner_thread = _check_learner_thread(learner_thread, name)
        self.workers = _check_workers(workers, name)
        check_int(f"{name} max_weight_sync_delay", max_weight_sync_delay, 1,
                  "steps a worker delivers between weight syncs")
        self.max_weight_sync_delay = max_weight_sync_delay
        self.steps_since_update: dict[Any, int] = {}
        self.weights_ref: Any = None

    def __call__(self, item: tuple[Any, AnyBatch]) -> tuple[Any, AnyBatch]:
        actor, batch = _check_actor_item(item, self)
        steps = self.steps_since_update.get(actor, 0) + batch.count
        if steps < self.max_weight_sync_delay:
            self.steps_since_update[actor] = steps
            return item
        if self.weights_ref is None or self.learner_thread.weights_updated:
            with self.learner_thread.weights_lock:
                self.learner_thread.weights_updated = False
                self.weights_ref = self.workers.put_weights()
        self.workers.send_weights(self.weights_ref, to=[actor], global_vars=_global_vars(self.metrics))
        self.steps_since_update[actor] = 0
        self.metrics.counters[NUM_WEIGHT_SYNCS] += 1
        return item

    def __repr__(self) -> str:
        return f"UpdateWorkerWeights({self.max_weight_sync_delay})"


class BroadcastUpdateLearnerWeights(MetricsBinding):
    """Keeps every fragment's worker on the learner's current weights (IMPALA/APPO); consumes
    ``(actor, batch)`` per fragment and emits the batch.

    Use with ``.for_each()`` after ``.zip_with_source_actor()``, before concatenation. Every
    ``broadcast_interval`` fragments, if ``learner_thread.weights_updated``, the flag is cleared and the
    local weights are put once more (read under ``weights_lock``). Each fragment's actor is sent the
    cached reference with the global vars unless it already holds that exact reference. With tree
    aggregation the items are ``(aggregator, train_batch)`` (after
    :class:`~flowrl.ops.aggregation.CountFreshSteps`) and the aggregator, whose ``set_weights(weights,
    global_vars)`` caches them for its workers, is the recipient; ``broadcast_interval`` then counts train
    batches.

    Metrics: ``num_weight_broadcasts += 1`` per refresh.

    Examples:
        >>> import threading, types
        >>> from flowrl.testing import fake_batch, make_fake_workers
        >>> learner = types.SimpleNamespace(weights_updated=True, weights_lock=threading.Lock())
        >>> workers = make_fake_workers(1)
        >>> op = BroadcastUpdateLearnerWeights(learner, workers, broadcast_interval=1)
        >>> op.bind(metrics := MetricsContext())
        >>> op((workers.remote_workers()[0], fake_batch(5))).count, metrics.counters["num_weight_broadcasts"]
        (5, 1)
        >>> workers.stop()
    """

    def __init__(self, learner_thread: Any, workers: WorkerSet, broadcast_interval: int) -> None:
        name = type(self).__name__
        self.learner_thread = _check_learner_thread(learner_thread, name)
        self.workers = _check_workers(workers, name)
        check_int(f"{name} broadcast_interval", broadcast_interval, 1, "fragments between weight refreshes")
        self.broadcast_interval = broadcast_interval
        self.calls_since_broadcast = 0
        self.weights_ref: Any = None
        self.held: dict[Any, Any] = {}  # actor -> the weights reference it was sent last

    def _put(self) -> None:
        with self.learner_thread.weights_lock:
            self.weights_ref = self.workers.put_weights()

    def __call__(self, item: tuple[Any, AnyBatch]) -> AnyBatch:
        actor, batch = _check_actor_item(item, self)
        self.calls_since_broadcast += 1
        if self.calls_since_broadcast >= self.broadcast_interval and self.learner_thread.weights_updated:
            with self.learner_thread.weights_lock:
                self.learner_thread.weights_updated = False
                self.weights_ref = self.workers.put_weights()
            self.calls_since_broadcast = 0
            self.metrics.counters[NUM_WEIGHT_BROADCASTS] += 1
        elif self.weights_ref is None:
            self._put()
        global_vars = _global_vars(self.metrics)
        if self.held.get(actor) is not self.weights_ref:
            self.workers.send_weights(self.weights_ref, to=[actor], global_vars=global_vars)
            self.held[actor] = self.weights_ref
        else:
            self.workers.local_worker().set_global_vars(global_vars)
        return batch

    def __repr__(self) -> str:
        return f"BroadcastUpdateLearnerWeights({self.broadcast_interval})"


class RecordLearnerOutput(MetricsBinding):
    """Counts what a learner thread trained: consumes its out-queue items ``(env_steps, agent_steps,
    learner_info)`` and emits ``learner_info`` (IMPALA/APPO, after ``Dequeue(learner.outqueue)``).

    Use with ``.for_each()``. The trained counters come only from here, never from what was enqueued.

    Metrics: ``num_steps_trained`` and ``num_steps_trained_this_iter += env_steps``,
    ``num_agent_steps_trained += agent_steps``, ``num_learner_updates += 1``, ``info["learner"]``.

    Examples:
        >>> op = RecordLearnerOutput()
        >>> op.bind(metrics := MetricsContext())
        >>> op((50, 100, {"default_policy": {}})), metrics.counters["num_learner_updates"]
        ({'default_policy': {}}, 1)
    """

    def __call__(self, item: tuple[int, int, LearnerInfo]) -> LearnerInfo:
        if not isinstance(item, tuple) or len(item) != 3:
            raise ValueError(f"{self!r} consumes a learner thread's (env_steps, agent_steps, learner_info) "
                             f"out-queue items, got {type(item).__name__}: {item!r:.80}; put it right after "
                             f"Dequeue(learner.outqueue)")
        env_steps, agent_steps, info = item
        counters = self.metrics.counters
        counters[STEPS_TRAINED_COUNTER] += env_steps
        counters[STEPS_TRAINED_THIS_ITER_COUNTER] += env_steps
        counters[AGENT_STEPS_TRAINED_COUNTER] += agent_steps
        counters[NUM_LEARNER_UPDATES] += 1
        self.metrics.info[LEARNER_INFO] = info
        return info

    def __repr__(self) -> str:
        return "RecordLearnerOutput"


class UpdateTargetAndKL(MetricsBinding):
    """Refreshes the target networks, and adapts the KL coefficients, every ``target_update_period`` learner
    updates (APPO); consumes and emits a learner thread's ``learner_info`` (after ``RecordLearnerOutput``).

    Use as a config's ``after_train_step`` factory, ``UpdateTargetAndKL(workers, config)``, or with
    ``.for_each()``. ``config`` provides ``target_update_period`` (learner updates; APPO:
    ``num_sgd_iter x minibatch_buffer_size``) and ``use_kl_loss``. It fires iff ``num_learner_updates >=
    last_target_update_ts + target_update_period``: ``update_target()`` on each trainable policy and, with
    ``use_kl_loss``, :class:`UpdateKL` on the info. Sampled env steps play no part.

    Metrics: times ``target_net_update``; ``num_target_updates += 1``; ``last_target_update_ts =
    num_learner_updates``.

    Examples:
        >>> import types
        >>> from flowrl.testing import make_fake_workers
        >>> workers = make_fake_workers(0)
        >>> op = UpdateTargetAndKL(workers, types.SimpleNamespace(target_update_period=2, use_kl_loss=True))
        >>> op.bind(metrics := MetricsContext())
        >>> info = {"default_policy": {"learner_stats": {"kl": 0.03}}}
        >>> for _ in range(4):
        ...     metrics.counters["num_learner_updates"] += 1
        ...     _ = op(info)
        >>> policy = workers.local_worker().get_policy()
        >>> policy.target_updates, policy.kl_updates, metrics.counters["num_target_updates"]
        (2, [0.03, 0.03], 2)
    """

    def __init__(self, workers: WorkerSet, config: Any) -> None:
        name = type(self).__name__
        self.workers = _check_workers(workers, name)
        period: Any = getattr(config, "target_update_period", None)
        use_kl: Any = getattr(config, "use_kl_loss", None)
        if not isinstance(use_kl, bool):
            raise TypeError(f"{name} needs a config with target_update_period and a bool use_kl_loss (APPOConfig), "
                            f"got {type(config).__name__}")
        check_int(f"{name} target_update_period", period, 1, "learner updates between target refreshes")
        self.period: int = period
        self.update_kl = UpdateKL(workers) if use_kl else None

    def __call__(self, learner_info: LearnerInfo) -> LearnerInfo:
        if not isinstance(learner_info, Mapping):
            raise ValueError(f"{self!r} consumes learner_info dicts (RecordLearnerOutput's output), got "
                             f"{type(learner_info).__name__}: {learner_info!r:.80}")
        counters = self.metrics.counters
        updates = counters[NUM_LEARNER_UPDATES]
        if updates < counters[LAST_TARGET_UPDATE_TS] + self.period:
            return learner_info
        local = self.workers.local_worker()
        with self.metrics.timers[TARGET_NET_UPDATE_TIMER]:
            for pid in local.policies_to_train:
                local.get_policy(pid).update_target()
        counters[NUM_TARGET_UPDATES] += 1
        counters[LAST_TARGET_UPDATE_TS] = updates
        if self.update_kl is not None:
            self.update_kl((None, learner_info))  # type: ignore[arg-type]  # UpdateKL reads only the learner info
        return learner_info

    def __repr__(self) -> str:
        return f"UpdateTargetAndKL({self.period})"
