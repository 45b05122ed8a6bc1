"""Meta-learning operators (MAML, RLlib Flow's showcase): workers adapt to their own task inside the dataflow,
between barrier rounds, and the driver meta-updates on what every round sampled.

``InnerAdaptation`` is a ``transform`` over barrier rounds (one batch per worker, in worker order): at the start
of a meta-iteration it gives every remote worker a new task (``SetTasks``), then for each of the first
``inner_adaptation_steps`` rounds it standardises each batch's advantages and sends each worker its own batch to
``learn_on_batch`` (fire and forget: per-caller ordering applies the step before the worker's next sample); after
the last round it emits the meta batch (all rounds, each row tagged with its task and round) and the
adaptation metrics. ``MetaUpdate`` takes ``maml_optimizer_steps`` learner steps on it, broadcasts the meta
weights, adapts the inner KL coefficients and emits one result.

Examples:
    >>> batches = [SampleBatch({REWARDS: np.array([1.0, 1.0, 2.0]), EPS_ID: np.array([4, 4, 5])})]
    >>> mean_episode_return(batches)
    2.0
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Iterator

import numpy as np

from flowrl import executor
from flowrl.metrics import (LEARNER_INFO, LEARNER_STATS_KEY, STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER,
                            STEPS_TRAINED_THIS_ITER_COUNTER, AGENT_STEPS_SAMPLED_COUNTER, MetricsBinding,
                            MetricsContext)
from flowrl.ops.metrics import CollectMetrics
from flowrl.ops.rollout import StandardizeFields
from flowrl.sample_batch import ADVANTAGES, EPS_ID, REWARDS, SampleBatch
from flowrl.workers import RolloutWorker, WorkerSet

__all__ = ["SetTasks", "InnerAdaptation", "MetaUpdate", "TASK_INDEX", "ADAPTATION_ROUND", "mean_episode_return",
           "check_task_env", "standardized_advantages"]

#: the meta batch's columns: which worker's task a row belongs to (0-based, worker order) and in which round
#: (0: before any adaptation, ``inner_adaptation_steps``: after the last) it was sampled
TASK_INDEX = "task_index"
ADAPTATION_ROUND = "adaptation_round"


def mean_episode_return(batches: Iterable[SampleBatch]) -> float:
    """The mean return of the complete episodes in ``batches`` (rows grouped by ``eps_id``); nan without rows."""
    returns: list[float] = []
    for batch in batches:
        if batch.count == 0:
            continue
        eps = np.asarray(batch[EPS_ID])
        starts = np.flatnonzero(np.concatenate([[True], eps[1:] != eps[:-1]]))
        returns += np.add.reduceat(np.asarray(batch[REWARDS], np.float64), starts).tolist()
    return float(np.mean(returns)) if returns else float("nan")


def check_task_env(workers: WorkerSet) -> None:
    """Raises ``ValueError`` (at plan build) when the driver's env has no ``sample_tasks``/``set_task``."""
    local = workers.local_worker()
    if isinstance(local, RolloutWorker):
        try:
            local.sample_tasks(1)
        except ValueError as e:
            raise ValueError(f"env {workers.config.env!r} is not a task distribution: MAML needs envs with "
                             f"sample_tasks(n) and set_task(task) (see flowrl/envs/tasks.py; flowrl/PointGoal-v0 "
                             f"is one); {e}") from None


class SetTasks:
    """Draws one task per remote worker from the driver's env (``sample_tasks``) and sets it on each worker
    (``set_task``, which restarts its envs); returns the tasks."""

    def __init__(self, workers: WorkerSet) -> None:
        self.workers = workers

    def __call__(self) -> list[Any]:
        remote = self.workers.remote_workers()
        local = self.workers.local_worker()
        tasks = local.sample_tasks(len(remote))  # type: ignore[attr-defined]  # a RolloutWorker
        executor.get([w.set_task.remote(task) for w, task in zip(remote, tasks)])
        return list(tasks)

    def __repr__(self) -> str:
        return "SetTasks"


#: standardises a batch's ``advantages`` in place (what an inner step learns from); returns the batch
standardized_advantages = StandardizeFields([ADVANTAGES])


class InnerAdaptation:
    """A transform over barrier rounds (lists of one batch per remote worker, in worker order) that emits
    ``(meta batch, adaptation metrics)`` every ``inner_adaptation_steps + 1`` rounds.

    Before each meta-iteration's first round it sets new tasks (:class:`SetTasks`). Each round's batches get
    their advantages standardised; the first ``inner_adaptation_steps`` rounds go back to their workers'
    ``learn_on_batch`` (an inner step; fire and forget, checked at the end of the meta-iteration). The meta batch
    is every round's batches concatenated, with ``task_index`` and ``adaptation_round`` columns. Metrics:
    ``episode_reward_mean_adapt_<r>`` per round, ``adaptation_delta`` (the last round's minus the first's),
    ``sampling_s`` (the meta-iteration's seconds waiting at the barrier) and ``inner_adaptation_s`` (of those, the
    seconds a worker spent in its inner steps, as it reports them: ``inner_step_s``).
    """

    def __init__(self, workers: WorkerSet, inner_adaptation_steps: int) -> None:
        self.workers, self.steps = workers, inner_adaptation_steps
        self.set_tasks = SetTasks(workers)

    def __call__(self, rounds: Iterable[list[SampleBatch]]) -> Iterator[tuple[SampleBatch, dict[str, float]]]:
        remote = self.workers.remote_workers()
        source = iter(rounds)
        while True:
            self.set_tasks()
            pieces: list[SampleBatch] = []
            metrics: dict[str, float] = {}
            sampling_s = 0.0
            inner_steps: list[Any] = []
            for r in range(self.steps + 1):
                waited = time.perf_counter()
                try:
                    batches = next(source)
                except StopIteration:
                    return
                for batch in batches:
                    standardized_advantages(batch)
                sampling_s += time.perf_counter() - waited
                metrics[f"episode_reward_mean_adapt_{r}"] = mean_episode_return(batches)
                if r < self.steps:
                    inner_steps += [w.learn_on_batch.remote(b) for w, b in zip(remote, batches)]
                for task, batch in enumerate(batches):
                    batch[TASK_INDEX] = np.full(batch.count, task, np.int64)
                    batch[ADAPTATION_ROUND] = np.full(batch.count, r, np.int64)
                    pieces.append(batch)
            infos = executor.get(inner_steps)  # done by now (each came before its worker's next sample); raises errors
            inner_s = [stats.get("inner_step_s", 0.0) for info in infos for policy_info in info.values()
                       for stats in [policy_info.get(LEARNER_STATS_KEY, {})]]
            metrics["sampling_s"] = sampling_s  # waiting at the barrier: the workers' inner steps, then their samples
            metrics["inner_adaptation_s"] = float(np.mean(inner_s)) * self.steps if inner_s else 0.0
            metrics["adaptation_delta"] = (metrics[f"episode_reward_mean_adapt_{self.steps}"]
                                           - metrics["episode_reward_mean_adapt_0"])
            yield SampleBatch.concat(pieces), metrics

    def __repr__(self) -> str:
        return f"InnerAdaptation({self.steps} steps)"


class MetaUpdate(MetricsBinding):
    """Consumes ``(meta batch, adaptation metrics)``: counts the batch into ``num_steps_sampled``, runs
    ``maml_optimizer_steps`` learner steps on it in the driver, broadcasts the meta weights, adapts each trained
    policy's inner KL coefficients (``update_kl`` with the ``inner_kl_<s>`` stats, in order) and emits one result:
    :class:`~flowrl.ops.metrics.CollectMetrics` merged with the adaptation metrics and ``meta_update_s`` (the
    seconds of its learner steps).

    Metrics: ``num_steps_sampled``, ``num_steps_trained`` (+= count per meta-iteration); ``info["learner"]``.
    """

    def __init__(self, workers: WorkerSet, maml_optimizer_steps: int, collect: CollectMetrics) -> None:
        self.workers, self.steps, self.collect = workers, maml_optimizer_steps, collect

    def bind(self, metrics: MetricsContext) -> None:
        super().bind(metrics)
        self.collect.bind(metrics)

    def __call__(self, item: tuple[SampleBatch, dict[str, float]]) -> dict[str, Any]:
        batch, adaptation = item
        counters = self.metrics.counters
        counters[STEPS_SAMPLED_COUNTER] += batch.count
        counters[AGENT_STEPS_SAMPLED_COUNTER] += batch.count
        local = self.workers.local_worker()
        info: dict[str, Any] = {}
        start = time.perf_counter()
        for _ in range(self.steps):
            info = local.learn_on_batch(batch)
        meta_update_s = time.perf_counter() - start
        self.workers.sync_weights()
        for pid, policy_info in info.items():
            stats = policy_info.get(LEARNER_STATS_KEY, {})
            steps = sorted(int(k[len("inner_kl_"):]) for k in stats if k.startswith("inner_kl_"))
            kls = [stats[f"inner_kl_{s}"] for s in steps]
            if kls:
                policy: Any = local.get_policy(pid)  # a meta-learning policy: one KL per inner step
                policy.update_kl(kls)
        self.metrics.info[LEARNER_INFO] = info
        counters[STEPS_TRAINED_COUNTER] += batch.count
        counters[STEPS_TRAINED_THIS_ITER_COUNTER] += batch.count
        return {**self.collect(None), **adaptation, "meta_update_s": meta_update_s}

    def __repr__(self) -> str:
        return f"MetaUpdate({self.steps} steps)"

