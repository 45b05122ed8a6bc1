"""Operators for plans with a learner thread (IMPALA, APPO, Ape-X): keep the workers' weights in step with the
thread's, count what the thread trained, refresh target networks by its updates.

The thread (:mod:`flowrl.ops.learner`) sets ``weights_updated`` after each step, under its ``weights_lock``;
:class:`UpdateWorkerWeights` (Ape-X) and :class:`BroadcastUpdateLearnerWeights` (IMPALA/APPO) send the new weights
out; :class:`RecordLearnerOutput` reads the thread's out-queue items; :class:`UpdateTargetAndKL` (APPO) refreshes
targets and KL coefficients every few learner updates. :mod:`flowrl.ops.train` re-exports all of them.

Examples:
    >>> it = iter_list([(4, 4, {"default_policy": {}}), (2, 2, {})]).for_each(RecordLearnerOutput())
    >>> it.take(2), it.metrics.counters["num_steps_trained"]
    ([{'default_policy': {}}, {}], 6)
"""

from __future__ import annotations

import contextlib

from typing import Any, Mapping

from flowrl.metrics import (AGENT_STEPS_TRAINED_COUNTER, LAST_TARGET_UPDATE_TS, LEARNER_INFO, NUM_LEARNER_UPDATES,
                            NUM_TARGET_UPDATES, NUM_WEIGHT_BROADCASTS, NUM_WEIGHT_SYNCS, STEPS_TRAINED_COUNTER,
                            STEPS_TRAINED_THIS_ITER_COUNTER, TARGET_NET_UPDATE_TIMER, MetricsBinding)
from flowrl.metrics import MetricsContext  # noqa: F401  (the examples use it)
from flowrl.ops._common import LearnerInfo, check_batch, check_learner_thread, check_workers, weight_update_vars
from flowrl.ops.train_step import UpdateKL
from flowrl.sample_batch import AnyBatch
from flowrl.validation import check_int
from flowrl.workers import WorkerSet

__all__ = ["UpdateWorkerWeights", "BroadcastUpdateLearnerWeights", "RecordLearnerOutput", "UpdateTargetAndKL"]


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
        self.learner_thread = check_learner_thread(learner_thread, name)
        self.workers = check_workers(workers, name)
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
        self.workers.send_weights(self.weights_ref, to=[actor], global_vars=weight_update_vars(self.metrics))
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
        self.learner_thread = check_learner_thread(learner_thread, name)
        self.workers = check_workers(workers, name)
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
        global_vars = weight_update_vars(self.metrics)
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
        self.workers = check_workers(workers, name)
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
        # under the worker's learn lock (the learner thread's weights lock): never a network halfway through a step
        with self.metrics.timers[TARGET_NET_UPDATE_TIMER], getattr(local, "learn_lock", contextlib.nullcontext()):
            for pid in local.policies_to_train:
                local.get_policy(pid).update_target()
        counters[NUM_TARGET_UPDATES] += 1
        counters[LAST_TARGET_UPDATE_TS] = updates
        if self.update_kl is not None:
            self.update_kl((None, learner_info))  # type: ignore[arg-type]  # UpdateKL reads only the learner info
        return learner_info

    def __repr__(self) -> str:
        return f"UpdateTargetAndKL({self.period})"
