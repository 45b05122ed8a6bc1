"""Hand-written PPO, A3C and Ape-X: the reference side of the lines-of-code benchmark (``benchmarks/loc.py``).

The RLlib Flow paper (https://arxiv.org/abs/2011.12719) compares each execution plan with the hand-written
distributed code it replaced, written over the same workers and policies, and reports 2-9x fewer lines for
the plans. These modules are that hand-written side for flowrl: each ``train(workers, config)`` drives
the same :class:`~flowrl.workers.WorkerSet`, policies, configs, postprocessing and replay shards as the plan
in ``flowrl/algorithms/<name>.py``, directly on Ray actors (``.remote()``, ``ray.get``/``ray.wait`` loops,
``ray.put`` weight broadcasts), without ``flowrl.iter``, ``flowrl.ops`` or ``flowrl.trainer``. So the only
difference from a plan is the execution code, and each yields one result dict per iteration as a plan does.

This module holds what the three share: episode statistics, the report schedule and the result dict.
``benchmarks/loc.py`` counts it apart from the three algorithm files.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from typing import Any, Mapping, Sequence

import flowrl  # noqa: F401  (before ray: keeps a local Ray instance on loopback)
from flowrl.config import TrainerConfig
from flowrl.envs import EpisodeRecord
from flowrl.metrics import (AGENT_STEPS_SAMPLED_COUNTER, AGENT_STEPS_TRAINED_COUNTER, LAST_REPORT_TIMESTEPS,
                            STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER, STEPS_TRAINED_THIS_ITER_COUNTER, Timer)
from flowrl.workers import WorkerSet

import ray  # noqa: E402,I001


class EpisodeStats:
    """The workers' finished episodes, smoothed over the last ``config.metrics_smoothing_episodes``.

    Each :meth:`collect` asks every remote worker without a request in flight for ``get_metrics()``, waits
    up to ``config.collect_metrics_timeout`` and carries unanswered requests over to the next call. Only the
    local worker's and the ``selected`` workers' episodes (default: all) enter the statistics; all count.
    """

    def __init__(self, workers: WorkerSet, config: TrainerConfig, selected: Sequence[Any] | None = None) -> None:
        self.workers, self.timeout_s, self.selected = workers, config.collect_metrics_timeout, selected
        self.window: deque[EpisodeRecord] = deque(maxlen=config.metrics_smoothing_episodes)
        self.pending: dict[Any, Any] = {}  # get_metrics ref -> its worker

    def collect(self) -> dict[str, Any]:
        asked = set(self.pending.values())
        for worker in self.workers.remote_workers():
            if worker not in asked:
                self.pending[worker.get_metrics.remote()] = worker
        new = list(self.workers.local_worker().get_metrics())
        count = len(new)
        if self.pending:
            ready, _ = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=self.timeout_s)
            for ref in ready:
                worker, episodes = self.pending.pop(ref), ray.get(ref)
                count += len(episodes)
                if self.selected is None or worker in self.selected:
                    new += episodes
        self.window.extend(new)
        rewards = [float(ep.episode_return) for ep in self.window]
        lengths = [int(ep.episode_length) for ep in self.window]
        return {"episode_reward_mean": _mean(rewards), "episode_reward_min": min(rewards, default=math.nan),
                "episode_reward_max": max(rewards, default=math.nan), "episode_len_mean": _mean(lengths),
                "episodes_this_iter": count}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


class ReportSchedule:
    """Says when to report: once ``steps`` more steps **and** ``seconds`` more seconds have passed (the first
    time check passes at once); both bookmarks move only together."""

    def __init__(self, steps: int, seconds: float) -> None:
        self.steps, self.seconds = steps, seconds
        self.last_steps, self.last_time = 0, -math.inf

    def due(self, steps: int) -> bool:
        now = time.monotonic()
        if steps - self.last_steps < self.steps or now - self.last_time < self.seconds:
            return False
        self.last_steps, self.last_time = steps, now
        return True


def make_result(counters: Counter[str], info: Mapping[str, Any], timers: Mapping[str, Timer],
                episodes: Mapping[str, Any], workers: WorkerSet) -> dict[str, Any]:
    """One result dict with the keys a plan's report has; resets ``num_steps_trained_this_iter``."""
    total = counters[STEPS_SAMPLED_COUNTER]
    this_iter = max(0, total - counters[LAST_REPORT_TIMESTEPS])
    counters[LAST_REPORT_TIMESTEPS] = total
    result = {**episodes, "timesteps_total": total, "timesteps_this_iter": this_iter,
              "agent_timesteps_total": counters[AGENT_STEPS_SAMPLED_COUNTER],
              **{key: counters[key] for key in (STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER,
                                                AGENT_STEPS_SAMPLED_COUNTER, AGENT_STEPS_TRAINED_COUNTER)},
              "info": {**info, **counters}, "timers": {}, "num_healthy_workers": len(workers.remote_workers())}
    for key, timer in timers.items():
        result["timers"][f"{key}_time_ms"] = round(1000 * timer.mean, 3)
        if timer.has_units_processed():
            result["timers"][f"{key}_throughput"] = round(timer.mean_throughput, 3)
    counters[STEPS_TRAINED_THIS_ITER_COUNTER] = 0
    return result
