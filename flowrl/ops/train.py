"""Train operators: learn on batches, apply and average gradients, broadcast weights, update targets.

This is the family's module: every train operator imports from here. It holds the gradient operators and
:class:`UpdateTargetNetwork`; one training step in the driver (:class:`TrainOneStep`, :class:`LearnOnBatch`,
:class:`BroadcastWeights`, :class:`MultiGPUTrainOneStep`, :func:`train_one_step`, :class:`UpdateKL`) lives in
:mod:`flowrl.ops.train_step`, and the operators for plans with a learner thread in :mod:`flowrl.ops.learner_sync`.

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
from typing import Any, Collection, Sequence

import numpy as np

from flowrl.metrics import (APPLY_GRADS_TIMER, COMPUTE_GRADS_TIMER, LAST_TARGET_UPDATE_TS, LEARNER_INFO,
                            NUM_TARGET_UPDATES, STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER,
                            STEPS_TRAINED_THIS_ITER_COUNTER, TARGET_NET_UPDATE_TIMER, WORKER_UPDATE_TIMER,
                            MetricsBinding)
from flowrl.metrics import MetricsContext  # noqa: F401  (the examples use it)
from flowrl.ops._common import (check_batch, check_learner_thread, check_workers, resolve_policies, tree_mean,
                                weight_update_vars)
from flowrl.ops.learner_sync import (BroadcastUpdateLearnerWeights, RecordLearnerOutput, UpdateTargetAndKL,
                                     UpdateWorkerWeights)
from flowrl.ops.train_step import (BroadcastWeights, LearnOnBatch, MultiGPUTrainOneStep, TrainOneStep, UpdateKL,
                                   train_one_step)
from flowrl.sample_batch import AnyBatch
from flowrl.validation import check_number
from flowrl.workers import WorkerSet

__all__ = ["TrainOneStep", "train_one_step", "LearnOnBatch", "BroadcastWeights", "UpdateKL", "MultiGPUTrainOneStep",
           "ComputeGradients", "ApplyGradients", "AverageGradients", "UpdateTargetNetwork", "UpdateWorkerWeights",
           "BroadcastUpdateLearnerWeights", "RecordLearnerOutput", "UpdateTargetAndKL"]


def _check_pair(item: Any, op: object, what: str) -> tuple[Any, int]:
    if not isinstance(item, tuple) or len(item) != 2:
        raise ValueError(f"{op!r} consumes {what} 2-tuples, got {type(item).__name__}: {item!r:.80}")
    return item[0], item[1]


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
        self.workers = check_workers(workers, type(self).__name__)

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
        self.workers = check_workers(workers, type(self).__name__)
        self.policies = resolve_policies(workers, policies, type(self).__name__, trained=False)
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
        global_vars = weight_update_vars(self.metrics)
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
        return tree_mean([grads for grads, _ in pairs]), sum(int(count) for _, count in pairs)

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
        self.workers = check_workers(workers, name)
        self.lock = contextlib.nullcontext() if learner_thread is None else \
            check_learner_thread(learner_thread, name).weights_lock
        check_number(f"{name} target_update_freq", target_update_freq, meaning="steps; <= 0: update on every call")
        self.target_update_freq = target_update_freq
        self.metric = STEPS_TRAINED_COUNTER if by_steps_trained else STEPS_SAMPLED_COUNTER
        self.policies = resolve_policies(workers, policies, name, trained=True)

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
