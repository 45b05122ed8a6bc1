"""One training step in the driver: learn on a batch on one device or several, then broadcast the weights.

:class:`TrainOneStep` keeps the paper's meaning, learn then broadcast, and is built from :class:`LearnOnBatch`
and :class:`BroadcastWeights`, each usable alone; :class:`MultiGPUTrainOneStep` loads each batch onto the
learner device(s) once and runs its minibatch SGD there; :func:`train_one_step` picks one of the two from a
config. :class:`UpdateKL` adapts PPO's KL coefficients from the step's output. :mod:`flowrl.ops.train`
re-exports all of them.

Examples:
    >>> from flowrl.testing import fake_batch, make_fake_workers
    >>> workers = make_fake_workers(0)
    >>> it = iter_list([fake_batch(4)]).for_each(TrainOneStep(workers)).for_each(UpdateKL(workers))
    >>> [info["default_policy"]["learner_stats"]["loss"] for _, info in it]
    [1.5]
    >>> len(workers.local_worker().get_policy().kl_updates)
    1
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence

import numpy as np
import torch

from flowrl.callbacks import add_learner_stats, before_learning
from flowrl.metrics import (AGENT_STEPS_TRAINED_COUNTER, LEARN_ON_BATCH_TIMER, LEARNER_INFO, LEARNER_STATS_KEY,
                            LOAD_BATCH_TIMER, STEPS_TRAINED_COUNTER, STEPS_TRAINED_THIS_ITER_COUNTER,
                            WORKER_UPDATE_TIMER, MetricsBinding, MetricsContext)
from flowrl.ops._common import (LearnerInfo, check_batch, check_workers, record_staleness, resolve_policies,
                                staleness_info, tree_mean, weight_update_vars)
from flowrl.policy import NONFINITE_UPDATES_SKIPPED, Policy, flush_denormals
from flowrl.metrics import Summary
from flowrl.sample_batch import AnyBatch, MultiAgentBatch, SampleBatch
from flowrl.sequences import batch_sequence_lengths, shuffled_sequence_minibatches
from flowrl.validation import check_int, check_number
from flowrl.workers import WorkerSet

__all__ = ["TrainOneStep", "train_one_step", "LearnOnBatch", "BroadcastWeights", "UpdateKL", "MultiGPUTrainOneStep"]

logger = logging.getLogger(__name__)


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



# -- learning on batches --------------------------------------------------------------------------

def _minibatches(policy: Any, part: SampleBatch, size: int, rng: np.random.Generator) -> Iterator[SampleBatch]:
    """``part``'s rows permuted and cut into minibatches of ``size`` rows; for a recurrent policy whole sequences
    (:mod:`flowrl.sequences`, at most ``model.max_seq_len`` steps) are permuted, and each minibatch takes whole
    sequences until it holds at least ``size`` rows."""
    if not getattr(policy, "is_recurrent", False):
        yield from part.minibatches(size, seed=rng, shuffle=True)
        return
    lens = batch_sequence_lengths(part, policy.config.model.max_seq_len)
    for rows, _ in shuffled_sequence_minibatches(lens, size, rng):
        yield part.rows(rows)


def minibatch_sgd(worker: Any, batch: AnyBatch, policies: Collection[str], *, num_sgd_iter: int,
                  sgd_minibatch_size: int, rng_for: Callable[[str], np.random.Generator]) -> LearnerInfo:
    """``worker.learn_on_batch`` on minibatches of ``batch``: per listed policy present in it and per epoch
    (``num_sgd_iter``), its rows permuted by ``rng_for(policy_id)`` and cut into minibatches of
    ``sgd_minibatch_size`` rows (0 or a size >= the rows: one). Returns each policy's learner stats, the
    element-wise mean over the final epoch's minibatches.

    A worker with a learner group gets the same minibatches, drawn here from the same generator in the same order
    (``SampleBatch.shuffle``'s permutation), as row indices, and its group learns on all of them in one call
    (:meth:`~flowrl.workers.RolloutWorker.learn_minibatches`)."""
    grouped = getattr(worker, "learner_group", None) is not None
    info: LearnerInfo = {}
    for pid, part in batch.as_multi_agent().policy_batches.items():
        if pid not in policies or part.count == 0:
            continue
        size = sgd_minibatch_size if 0 < sgd_minibatch_size < part.count else part.count
        rng = rng_for(pid)
        if grouped:
            orders = [rng.permutation(part.count) for _ in range(num_sgd_iter)]
            epochs = [[order[start:start + size] for start in range(0, part.count, size)] for order in orders]
            single = part if isinstance(batch, SampleBatch) else MultiAgentBatch({pid: part}, part.count)
            info.update(worker.learn_minibatches(single, [pid], epochs))
            continue
        epoch_stats: list[dict[str, Any]] = []
        for _ in range(num_sgd_iter):
            epoch_stats = []
            for mb in _minibatches(worker.get_policy(pid), part, size, rng):
                wrapped = mb if isinstance(batch, SampleBatch) else MultiAgentBatch({pid: mb}, mb.count)
                result = worker.learn_on_batch(wrapped)
                if pid in result:
                    epoch_stats.append(result[pid].get(LEARNER_STATS_KEY, {}))
        info[pid] = {LEARNER_STATS_KEY: _mean_stats(epoch_stats)}
    return info


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
        self.workers = check_workers(workers, name)
        check_int(f"{name} num_sgd_iter", num_sgd_iter, 1, "epochs over each batch")
        check_int(f"{name} sgd_minibatch_size", sgd_minibatch_size, 0, "0: the whole batch is one minibatch")
        self.policies = resolve_policies(workers, policies, name, trained=True)
        self.num_sgd_iter, self.sgd_minibatch_size = num_sgd_iter, sgd_minibatch_size
        self.minibatch_sgd = num_sgd_iter > 1 or sgd_minibatch_size > 0
        self._rng = np.random.default_rng(getattr(workers.local_worker().config, "seed", None))
        self.staleness = Summary()

    def _policy_rng(self, pid: str) -> np.random.Generator:
        rng = getattr(self.workers.local_worker().get_policy(pid), "np_random", None)
        return rng if isinstance(rng, np.random.Generator) else self._rng

    def _learn_minibatches(self, batch: AnyBatch) -> LearnerInfo:
        return minibatch_sgd(self.workers.local_worker(), batch, self.policies, num_sgd_iter=self.num_sgd_iter,
                             sgd_minibatch_size=self.sgd_minibatch_size, rng_for=self._policy_rng)

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
        self.workers = check_workers(workers, type(self).__name__)
        self.policies = resolve_policies(workers, policies, type(self).__name__, trained=False)

    def __call__(self, item: Any) -> Any:
        global_vars = weight_update_vars(self.metrics)
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
        self.workers = check_workers(workers, type(self).__name__)
        self.policies = None if policies is None else resolve_policies(workers, policies, type(self).__name__,
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
        self.workers = check_workers(workers, name)
        check_int(f"{name} num_sgd_iter", num_sgd_iter, 1, "epochs over each batch")
        check_number(f"{name} num_gpus", num_gpus, ge=0, lt=math.inf, meaning="0: one CPU device")
        if not float(num_gpus).is_integer():
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
        self.policies = resolve_policies(workers, policies, name, trained=True)
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
        with flush_denormals(getattr(self.workers.local_worker().config, "flush_denormal", False)):
            return self._step_flushed(policy, towers, loaded, rows)

    def _step_flushed(self, policy: Policy, towers: list[SampleBatch], loaded: dict[str, torch.Tensor] | None,
                      rows: slice) -> dict[str, Any]:
        if loaded is not None:
            stats: dict[str, Any] = policy.learn_on_tensors({k: v[rows] for k, v in loaded.items()})[LEARNER_STATS_KEY]
            return stats
        results = [policy.compute_gradients(tower[rows]) for tower in towers]
        policy.apply_gradients(tree_mean([grads for grads, _ in results]))
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
            hooks = getattr(local, "callbacks", None)  # a worker built without them (a test's stand-in) has none
            for pid, (towers, tensors) in loaded.items():
                policy = self._torch_policies[pid]
                added = {} if hooks is None else before_learning(hooks, policy, parts[pid])
                size = self.per_device_minibatch
                epoch_stats: list[dict[str, Any]] = []
                for _ in range(self.num_sgd_iter):
                    epoch_stats = [self._step(policy, towers, tensors, slice(i * size, (i + 1) * size))
                                   for i in policy.np_random.permutation(max(1, towers[0].count // size))]
                info[pid] = add_learner_stats({LEARNER_STATS_KEY: _mean_stats(epoch_stats)}, added)
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
