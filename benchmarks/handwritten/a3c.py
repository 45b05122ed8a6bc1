"""Hand-written A3C on Ray actors: the reference for flowrl's A3C plan in the lines-of-code benchmark.

The same algorithm and numerics as ``flowrl.algorithms.a3c.plan`` over the same
``WorkerSet``, ``ActorCriticPolicy`` and ``A3CConfig``, written without flowrl's iterators, operators or
trainer. Every remote worker samples a fragment and computes the loss gradients on it, one request in flight
per worker. A ``ray.wait`` loop takes each gradient as it arrives, sends that worker its next request at once,
applies the gradient in the driver and sends the new weights (one ``ray.put``) to that worker alone; as in
the plan, the new weights reach the worker after its next request, so each gradient is at most one update of
its own worker stale.

Run: ``train(WorkerSet(policy_class=ActorCriticPolicy, config=config), config)`` yields one result dict per
report (every ``min_iter_time_s``, 5 s by default).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from typing import Any, Iterator

from benchmarks.handwritten import EpisodeStats, ReportSchedule, make_result
from flowrl.algorithms.a3c import A3CConfig
from flowrl.metrics import (APPLY_GRADS_TIMER, GRAD_WAIT_TIMER, LEARNER_INFO, STEPS_SAMPLED_COUNTER,
                            STEPS_TRAINED_COUNTER, STEPS_TRAINED_THIS_ITER_COUNTER, WORKER_UPDATE_TIMER, Timer)
from flowrl.workers import RolloutWorker, WorkerSet

import ray  # noqa: E402,I001  (after flowrl, which keeps Ray on loopback)


def train(workers: WorkerSet, config: A3CConfig) -> Iterator[dict[str, Any]]:
    """A3C over the remote ``workers`` (at least one); yields a result dict whenever ``timesteps_per_iteration``
    and ``min_iter_time_s`` allow.

    Raises:
        ValueError: the worker set has no remote workers.
    """
    local, remote = workers.local_worker(), workers.remote_workers()
    if not remote:
        raise ValueError("A3C computes gradients on remote workers; build the WorkerSet with num_workers >= 1")
    to_train = list(local.policies_to_train)
    counters: Counter[str] = Counter()
    info: dict[str, Any] = {}
    timers: defaultdict[str, Timer] = defaultdict(Timer)
    episodes = EpisodeStats(workers, config)
    schedule = ReportSchedule(config.timesteps_per_iteration, config.min_iter_time_s)

    def sample_and_compute_gradients(worker: RolloutWorker) -> tuple[tuple[Any, Any], int]:
        batch = worker.sample()
        return worker.compute_gradients(batch), batch.count

    weights = ray.put(local.get_weights())
    for w in remote:  # every worker starts from the learner's weights
        w.set_weights.remote(weights)
    in_flight = {w.apply.remote(sample_and_compute_gradients): w for w in remote}
    while True:
        wait_start = time.perf_counter()
        [ready], _ = ray.wait(list(in_flight), num_returns=1)
        worker = in_flight.pop(ready)
        (grads, learner_info), count = ray.get(ready)
        in_flight[worker.apply.remote(sample_and_compute_gradients)] = worker  # before the new weights
        timers[GRAD_WAIT_TIMER].push(time.perf_counter() - wait_start)
        info[LEARNER_INFO] = learner_info
        counters[STEPS_SAMPLED_COUNTER] += count
        counters[STEPS_TRAINED_COUNTER] += count
        counters[STEPS_TRAINED_THIS_ITER_COUNTER] += count
        global_vars = {"timestep": counters[STEPS_SAMPLED_COUNTER]}
        with timers[APPLY_GRADS_TIMER] as timer:
            local.apply_gradients(grads)
            timer.push_units_processed(count)
        with timers[WORKER_UPDATE_TIMER]:
            worker.set_weights.remote(ray.put(local.get_weights(to_train)), global_vars)
        local.set_global_vars(global_vars)
        if schedule.due(counters[STEPS_SAMPLED_COUNTER]):
            yield make_result(counters, info, timers, episodes.collect(), workers)
