"""Hand-written Ape-X on Ray actors: the reference for flowrl's Ape-X plan in the lines-of-code benchmark.

The same algorithm and numerics as ``flowrl.algorithms.apex.plan`` over the same
``WorkerSet``, ``ApexPolicy``, ``ApexConfig``, per-worker epsilons and ``ReplayShard`` actors, written without
flowrl's iterators, operators or trainer. One driver loop takes turns at three jobs:

1. store: each worker keeps two sample requests in flight; a fragment goes to a random shard with fewer
   than two unacknowledged adds (waiting for one when all are busy), and a worker gets the learner's latest
   weights (one ``ray.put`` per learner change) once it has delivered ``max_weight_sync_delay`` steps;
2. replay: each shard keeps four replay requests in flight; replayed batches go to the learner thread's
   bounded queue (kept back while it is full);
3. update: the learner's output sends new priorities to the shard that replayed the batch, is counted, and
   updates the target network every ``target_network_update_freq`` trained steps; a report may follow.

Without ``training_intensity`` each turn takes at most one ready item per job and never blocks; with it,
each turn blocks for one fragment and ``training_intensity / native_ratio`` replays (in expectation), as
the plan's round robin does.

Run: ``train(WorkerSet(policy_class=ApexPolicy, config=config), config)`` yields one result dict per report.
"""

from __future__ import annotations

import math
import queue
import random
import threading
import time
from collections import Counter, defaultdict, deque
from typing import Any, Iterator

from benchmarks.handwritten import EpisodeStats, ReportSchedule, make_result
from flowrl.algorithms.apex import ApexConfig, make_replay_shards, set_worker_epsilons
from flowrl.metrics import (AGENT_STEPS_SAMPLED_COUNTER, AGENT_STEPS_TRAINED_COUNTER, LAST_TARGET_UPDATE_TS,
                            LEARNER_GRAD_TIMER, LEARNER_INFO, LEARNER_STATS_KEY, NUM_LEARNER_UPDATES,
                            NUM_TARGET_UPDATES, NUM_WEIGHT_SYNCS, STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER,
                            STEPS_TRAINED_THIS_ITER_COUNTER, TARGET_NET_UPDATE_TIMER, TIMING_BREAKDOWN_INFO, Timer)
from flowrl.sample_batch import BATCH_INDEXES, TD_ERROR, AnyBatch
from flowrl.workers import RolloutWorker, WorkerSet

import ray  # noqa: E402,I001  (after flowrl, which keeps Ray on loopback)


class LearnerThread(threading.Thread):
    """Learns on the ``(replay_shard, batch)`` items of ``inqueue``; puts ``(replay_shard, {pid: (batch_indexes,
    td_error)}, env_steps, agent_steps)`` on ``outqueue``. An error is kept in ``error`` and ends the thread."""

    def __init__(self, local_worker: RolloutWorker, queue_size: int) -> None:
        super().__init__(name="handwritten-apex-learner", daemon=True)
        self.local_worker = local_worker
        self.inqueue: queue.Queue[tuple[Any, AnyBatch]] = queue.Queue(maxsize=queue_size)
        self.outqueue: queue.Queue[tuple[Any, dict[str, Any], int, int]] = queue.Queue()
        self.weights_lock = threading.Lock()
        self.weights_updated = False
        self.learner_info: dict[str, Any] = {}
        self.grad_timer = Timer()
        self.error: Exception | None = None
        self.stopped = False

    def run(self) -> None:
        try:
            while not self.stopped:
                try:
                    shard, batch = self.inqueue.get(timeout=0.1)
                except queue.Empty:
                    continue
                with self.grad_timer, self.weights_lock:
                    info = self.local_worker.learn_on_batch(batch)
                    self.weights_updated = True
                self.grad_timer.push_units_processed(batch.count)
                parts = batch.as_multi_agent().policy_batches
                priorities = {pid: (parts[pid][BATCH_INDEXES], i.get(TD_ERROR, i[LEARNER_STATS_KEY].get(TD_ERROR)))
                              for pid, i in info.items()}
                self.learner_info = {pid: {k: v for k, v in i.items() if k != TD_ERROR} for pid, i in info.items()}
                self.outqueue.put((shard, priorities, batch.count, batch.agent_steps()))
        except Exception as error:
            self.error = error


def reap(refs: list[Any]) -> list[Any]:
    """The calls of ``refs`` still running; raises the error of a finished one that failed."""
    if not refs:
        return refs
    done, running = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
    ray.get(done)
    return running


def train(workers: WorkerSet, config: ApexConfig) -> Iterator[dict[str, Any]]:
    """Ape-X over ``workers`` with its own replay shards and learner thread, both stopped when the generator is
    closed; yields a result dict whenever ``timesteps_per_iteration`` and ``min_iter_time_s`` allow."""
    local, remote = workers.local_worker(), workers.remote_workers()
    to_train = list(local.policies_to_train)
    shards = make_replay_shards(config)
    learner = LearnerThread(local, config.learner_queue_size)
    set_worker_epsilons(workers, config)
    counters: Counter[str] = Counter()
    info: dict[str, Any] = {}
    timers: defaultdict[str, Timer] = defaultdict(Timer)
    episodes = EpisodeStats(workers, config, selected=remote[-math.ceil(len(remote) / 3):] if remote else None)
    schedule = ReportSchedule(config.timesteps_per_iteration, config.min_iter_time_s)
    round_robin = config.training_intensity is not None
    replays_per_turn = config.round_robin_weights[1]
    hook = config.before_learn_on_batch
    adds: list[list[Any]] = [[] for _ in shards]  # unacknowledged add_batch calls per shard
    priority_updates: list[Any] = []
    backlog: deque[tuple[Any, AnyBatch]] = deque()  # replayed batches waiting for room in the learner's queue
    steps_since_sync: Counter[Any] = Counter()
    weights = ray.put(local.get_weights())
    for w in remote:  # every worker starts from the learner's weights
        w.set_weights.remote(weights)

    def store(batch: AnyBatch) -> None:
        counters[STEPS_SAMPLED_COUNTER] += batch.count
        counters[AGENT_STEPS_SAMPLED_COUNTER] += batch.agent_steps()
        while not (free := [i for i, refs in enumerate(adds) if len(refs) < 2]):
            ray.wait([ref for refs in adds for ref in refs], num_returns=1)
            adds[:] = [reap(refs) for refs in adds]
        i = random.choice(free)
        adds[i].append(shards[i].add_batch.remote(batch))

    def next_ready(requests: dict[Any, Any], method: str) -> tuple[Any, Any] | None:
        """(actor, result) of one finished request, sent again at once; ``None`` if none is done (or blocks)."""
        ready, _ = ray.wait(list(requests), num_returns=1, timeout=None if round_robin else 0)
        if not ready:
            return None
        actor = requests.pop(ready[0])
        requests[getattr(actor, method).remote()] = actor
        return actor, ray.get(ready[0])

    samples = {w.sample.remote(): w for w in remote for _ in range(2)}
    replays = {shard.replay.remote(): shard for shard in shards for _ in range(4)}
    learner.start()
    try:
        while True:
            if not learner.is_alive():
                raise RuntimeError("the Ape-X learner thread died") from learner.error
            progressed = False
            # (1) store one fragment; sync its worker's weights every max_weight_sync_delay steps
            adds[:] = [reap(refs) for refs in adds]
            if not remote:
                store(local.sample())
                progressed = True
            elif (sampled := next_ready(samples, "sample")) is not None:
                worker, batch = sampled
                store(batch)
                steps_since_sync[worker] += batch.count
                if steps_since_sync[worker] >= config.max_weight_sync_delay:
                    if learner.weights_updated:
                        with learner.weights_lock:
                            learner.weights_updated = False
                            weights = ray.put(local.get_weights())
                    global_vars = {"timestep": counters[STEPS_SAMPLED_COUNTER]}
                    worker.set_weights.remote(weights, global_vars)
                    local.set_global_vars(global_vars)
                    steps_since_sync[worker] = 0
                    counters[NUM_WEIGHT_SYNCS] += 1
                progressed = True
            # (2) replayed batches into the learner's queue: one, or training_intensity's share in round robin
            quota = int(replays_per_turn) + (random.random() < replays_per_turn % 1) if round_robin else 1
            for _ in range(quota):
                if not backlog:
                    replayed = next_ready(replays, "replay")
                    if replayed is None or replayed[1] is None:  # nothing done yet, or the shard is still filling
                        break
                    shard, batch = replayed
                    backlog.append((shard, batch if hook is None else hook(batch, workers, config)))
                if learner.inqueue.full():
                    break
                learner.inqueue.put(backlog.popleft())
                progressed = True
            # (3) the learner's output: priorities, counters, target network; a report when it is due
            priority_updates = reap(priority_updates)
            for _ in range(100 if round_robin else 1):
                try:
                    shard, priorities, env_steps, agent_steps = learner.outqueue.get_nowait()
                except queue.Empty:
                    break
                progressed = True
                if config.prioritized_replay:
                    priority_updates.append(shard.update_priorities.remote(priorities))
                counters[STEPS_TRAINED_COUNTER] += env_steps
                counters[STEPS_TRAINED_THIS_ITER_COUNTER] += env_steps
                counters[AGENT_STEPS_TRAINED_COUNTER] += agent_steps
                counters[NUM_LEARNER_UPDATES] += 1
                info[LEARNER_INFO] = learner.learner_info
                trained = counters[STEPS_TRAINED_COUNTER]
                if trained >= counters[LAST_TARGET_UPDATE_TS] + config.target_network_update_freq:
                    with timers[TARGET_NET_UPDATE_TIMER], learner.weights_lock:
                        for pid in to_train:
                            local.get_policy(pid).update_target()
                    counters[NUM_TARGET_UPDATES] += 1
                    counters[LAST_TARGET_UPDATE_TS] = trained
                if schedule.due(counters[STEPS_SAMPLED_COUNTER]):
                    result = make_result(counters, info, timers, episodes.collect(), workers)
                    result["info"][TIMING_BREAKDOWN_INFO] = {
                        f"{LEARNER_GRAD_TIMER}_time_ms": round(1000 * learner.grad_timer.mean, 3)}
                    result["info"]["replay_shard_0"] = ray.get(shards[0].stats.remote())
                    yield result
            if not progressed:
                time.sleep(0.001)
    finally:
        learner.stopped = True
        learner.join(timeout=30)
        for shard in shards:
            ray.kill(shard, no_restart=True)
