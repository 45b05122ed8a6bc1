"""Evolution operators: perturbation evaluations as a source, collected into one update's worth, and the
update itself, with no learner, no gradient through a network and no sample batch on the wire.

``ParallelEvaluations`` is a source (every worker evaluates one round of antithetic pairs per item, in
lockstep: all with the weights of the last broadcast); ``CollectEvaluations`` is ``ConcatBatches``' counterpart
and ``ApplyEvolutionUpdate`` is ``TrainOneStep``'s: it turns the returns into a step on ``theta`` with an
algorithm's estimator and broadcasts the new weights. ``centered_ranks`` is ES's fitness shaping.

Examples:
    >>> centered_ranks(np.array([[10.0, -3.0], [0.5, 7.0]])).tolist()
    [[0.5, -0.5], [-0.16666666666666669, 0.16666666666666663]]
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from flowrl.evolution import Evaluations, EvolutionPolicy, NoiseTable
from flowrl.iter import LocalIterator, from_actors
from flowrl.metrics import (LEARN_ON_BATCH_TIMER, LEARNER_INFO, LEARNER_STATS_KEY, NUM_WEIGHT_BROADCASTS,
                            SAMPLE_TIMER, STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER, STEPS_TRAINED_THIS_ITER_COUNTER,
                            AGENT_STEPS_SAMPLED_COUNTER, MetricsBinding)
from flowrl.ops._common import check_int
from flowrl.sample_batch import DEFAULT_POLICY_ID
from flowrl.workers import WorkerSet

__all__ = ["ParallelEvaluations", "CollectEvaluations", "ApplyEvolutionUpdate", "centered_ranks", "Estimator"]

#: ``estimator(evaluations, noise, theta) -> (gradient to descend, stats)``: an algorithm's update rule
Estimator = Callable[[Evaluations, NoiseTable, np.ndarray], "tuple[np.ndarray, dict[str, float]]"]


def centered_ranks(x: np.ndarray) -> np.ndarray:
    """The ranks of ``x``'s entries (over all of them) scaled to ``[-0.5, 0.5]``, in ``x``'s shape: ES's fitness
    shaping, which makes an update blind to the scale of the returns and to outliers. Ties get distinct ranks."""
    flat = np.asarray(x, np.float64).ravel()
    if flat.size < 2:
        return np.zeros_like(np.asarray(x, np.float64))
    ranks = np.empty(flat.size, np.float64)
    ranks[flat.argsort(kind="stable")] = np.arange(flat.size)
    return (ranks / (flat.size - 1) - 0.5).reshape(np.shape(x))


class _UseNoise:
    """``worker.set_noise(noise)`` on each worker (the table crosses Ray as an object-store reference)."""

    def __init__(self, noise: NoiseTable) -> None:
        self.noise = noise

    def __call__(self, worker: Any) -> None:
        worker.set_noise(self.noise)


class _ReportEvaluated(MetricsBinding):
    """Counts each round's env steps into ``num_steps_sampled`` (and the agent-step counter)."""

    def __call__(self, evaluations: Evaluations) -> Evaluations:
        if not isinstance(evaluations, Evaluations):
            raise TypeError(f"{self!r} got {type(evaluations).__name__}; the workers must be PerturbationWorkers "
                            f"(an algorithm built on flowrl.evolution), whose items are Evaluations")
        self.metrics.counters[STEPS_SAMPLED_COUNTER] += evaluations.num_steps
        self.metrics.counters[AGENT_STEPS_SAMPLED_COUNTER] += evaluations.num_steps
        return evaluations

    def __repr__(self) -> str:
        return "ReportEvaluated"


def ParallelEvaluations(workers: WorkerSet, noise: NoiseTable) -> LocalIterator[Evaluations]:
    """The evaluation source: one :class:`~flowrl.evolution.Evaluations` per round, in which every remote
    :class:`~flowrl.evolution.PerturbationWorker` evaluates ``pairs_per_worker`` antithetic pairs (concatenated in
    worker order); with no remote workers the local worker evaluates them in the driver.

    Hands ``noise`` to every worker now (one object-store copy they all read) and broadcasts the local weights,
    so every round perturbs the weights of the last broadcast. The driver waits at most
    ``workers.config.sample_timeout_s`` for each worker's round.

    Metrics: ``num_steps_sampled`` (and ``num_agent_steps_sampled``) += each round's env steps.

    Raises:
        ValueError: a table smaller than the policy's parameters (from each worker's ``set_noise``).

    Examples:
        >>> from dataclasses import dataclass
        >>> from flowrl.evolution import EvolutionConfig, EvolutionPolicy, PerturbationWorker
        >>> @dataclass(frozen=True, kw_only=True)
        ... class TwoPairs(EvolutionConfig):
        ...     pairs_per_iteration = 2
        >>> workers = WorkerSet(policy_class=EvolutionPolicy, worker_class=PerturbationWorker,
        ...                     config=TwoPairs(num_workers=0, noise_size=10_000, seed=0))
        >>> noise = NoiseTable(10_000, seed=0)
        >>> still = lambda evaluations, noise, theta: (np.zeros_like(theta), {})  # an estimator that stays put
        >>> it = (ParallelEvaluations(workers, noise).combine(CollectEvaluations(min_episodes=4))
        ...       .for_each(ApplyEvolutionUpdate(workers, noise, still, name="still")))
        >>> it
        LocalIterator[ParallelEvaluations.combine(CollectEvaluations(4 episodes, 1 steps)).for_each(ApplyEvolutionUpdate(still))]
        >>> stats = next(it)["default_policy"]["learner_stats"]
        >>> stats["num_pairs"], stats["update_ratio"], it.metrics.counters["num_steps_sampled"] > 0
        (2.0, 0.0, True)
    """
    workers.foreach_worker(_UseNoise(noise))
    workers.sync_weights()
    remote = workers.remote_workers()
    source: LocalIterator[Evaluations]
    if remote:
        source = (from_actors(remote).batch_across_shards(timeout_s=workers.config.sample_timeout_s)
                  .for_each(Evaluations.concat))
    else:
        local = workers.local_worker()

        def evaluate_locally() -> Any:
            while True:
                yield local.evaluate()  # type: ignore[attr-defined]  # a PerturbationWorker

        source = LocalIterator.from_iterable(evaluate_locally, name="local_worker.evaluate")
    return source.for_each(_ReportEvaluated()).named("ParallelEvaluations")


class CollectEvaluations(MetricsBinding):
    """Consumes :class:`~flowrl.evolution.Evaluations`; emits one (concatenated) once at least ``min_episodes``
    perturbed episodes and ``min_steps`` env steps are held. Use with ``.combine()``.

    Metrics: times ``sample`` from the fetch of the first held input to the emission (units = env steps).

    Examples:
        >>> round_ = Evaluations(np.arange(2), np.zeros((2, 2)), np.ones((2, 2), np.int64), 30, 0)
        >>> [e.count for e in iter_list([round_] * 5).combine(CollectEvaluations(min_episodes=6, min_steps=40))]
        [4, 4]
    """

    def __init__(self, min_episodes: int, min_steps: int = 1) -> None:
        check_int("CollectEvaluations min_episodes", min_episodes, 1, "perturbed episodes per update")
        check_int("CollectEvaluations min_steps", min_steps, 1, "env steps per update")
        self.min_episodes, self.min_steps = min_episodes, min_steps
        self.buffer: list[Evaluations] = []
        self._fetch_start: float | None = None

    def _on_fetch_start(self) -> None:
        if not self.buffer:
            self._fetch_start = time.perf_counter()

    def __call__(self, evaluations: Evaluations) -> list[Evaluations]:
        self.buffer.append(evaluations)
        if sum(e.num_episodes for e in self.buffer) < self.min_episodes or \
                sum(e.num_steps for e in self.buffer) < self.min_steps:
            return []
        out, self.buffer = Evaluations.concat(self.buffer), []
        if self._fetch_start is not None:
            timer = self.metrics.timers[SAMPLE_TIMER]
            timer.push(time.perf_counter() - self._fetch_start)
            timer.push_units_processed(out.num_steps)
        self._fetch_start = None
        return [out]

    def __repr__(self) -> str:
        return f"CollectEvaluations({self.min_episodes} episodes, {self.min_steps} steps)"


class ApplyEvolutionUpdate(MetricsBinding):
    """Consumes collected :class:`~flowrl.evolution.Evaluations`; takes one step of the local policy's optimizer
    down ``estimator(evaluations, noise, theta)``, broadcasts the new weights (with the merged observation filter)
    and emits the learner info.

    Metrics: times ``learn`` (units = pairs); ``info["learner"]``; ``num_steps_trained`` and
    ``num_steps_trained_this_iter`` += the evaluations' env steps; ``num_weight_broadcasts`` += 1.
    """

    def __init__(self, workers: WorkerSet, noise: NoiseTable, estimator: Estimator, name: str = "") -> None:
        self.workers, self.noise, self.estimator = workers, noise, estimator
        self.name = name or getattr(estimator, "__name__", type(estimator).__name__)
        self.updates = 0

    def __call__(self, evaluations: Evaluations) -> dict[str, Any]:
        policy = self.workers.local_worker().get_policy()
        if not isinstance(policy, EvolutionPolicy):
            raise TypeError(f"{self!r} updates an EvolutionPolicy, got {type(policy).__name__}")
        timer = self.metrics.timers[LEARN_ON_BATCH_TIMER]
        with timer:
            theta = policy.flat_weights()
            gradient, stats = self.estimator(evaluations, self.noise, theta)
            policy.apply_flat_gradient(gradient)
            new_theta = policy.flat_weights()
        timer.push_units_processed(evaluations.count)
        self.workers.sync_weights()
        self.updates += 1
        step = float(np.linalg.norm(new_theta - theta))
        stats = {**stats, "update_ratio": step / max(float(np.linalg.norm(theta)), 1e-12), "theta_norm":
                 float(np.linalg.norm(new_theta)), "num_pairs": float(evaluations.count),
                 "perturbed_return_mean": float(evaluations.returns.mean()),
                 "perturbed_return_max": float(evaluations.returns.max())}
        info = {DEFAULT_POLICY_ID: {LEARNER_STATS_KEY: stats}}
        counters = self.metrics.counters
        counters[STEPS_TRAINED_COUNTER] += evaluations.num_steps
        counters[STEPS_TRAINED_THIS_ITER_COUNTER] += evaluations.num_steps
        counters[NUM_WEIGHT_BROADCASTS] += 1
        self.metrics.info[LEARNER_INFO] = info
        return info

    def profile_info(self) -> dict[str, Any]:
        return {"updates": self.updates}

    def __repr__(self) -> str:
        return f"ApplyEvolutionUpdate({self.name})"
