"""Reporting operators: when a plan reports, and what the report holds.

:func:`StandardMetricsReporting` ends every plan. It keeps pulling the train op until a
:class:`ReportGate` opens (enough new steps **and** enough time), then :class:`CollectMetrics` turns the
workers' finished episodes and the dataflow's metrics context into one result dict.

Not to be confused with :mod:`flowrl.metrics`: that module is the core these operators read (the
:class:`~flowrl.metrics.MetricsContext` with its counters and timers, and the counter and timer names); this one
holds only the reporting operators, which decide when a plan reports and build its result dicts.

Examples:
    >>> from flowrl.testing import make_fake_workers
    >>> from flowrl.config import TrainerConfig
    >>> workers = make_fake_workers(0, rollout_fragment_length=10)
    >>> def sample(_: int) -> None:
    ...     workers.local_worker().sample()
    ...     LocalIterator.get_metrics().counters["num_steps_sampled"] += 10
    >>> train_op = iter_list(range(100)).for_each(sample)
    >>> reports = StandardMetricsReporting(train_op, workers, TrainerConfig(timesteps_per_iteration=30))
    >>> [(r["timesteps_total"], r["timesteps_this_iter"], r["episodes_this_iter"]) for r in reports.take(2)]
    [(30, 30, 3), (60, 30, 3)]
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from flowrl import executor
from flowrl.envs.base import EpisodeRecord
from flowrl.iter import LocalIterator
from flowrl.ops._common import check_batch
from flowrl.sample_batch import DEFAULT_POLICY_ID, AnyBatch
from flowrl.metrics import (AGENT_STEPS_SAMPLED_COUNTER, AGENT_STEPS_TRAINED_COUNTER, CUSTOM_METRICS,
                            LAST_REPORT_TIMESTEPS, LEARNER_INFO, LEARNER_STATS_KEY, STEPS_SAMPLED_COUNTER,
                            STEPS_TRAINED_COUNTER,
                            STEPS_TRAINED_THIS_ITER_COUNTER, MetricsBinding, MetricsContext)
from flowrl.validation import check_int, check_number


if TYPE_CHECKING:
    from flowrl.workers import WorkerSet

__all__ = ["OncePerTimestepsElapsed", "OncePerTimeInterval", "ReportGate", "CollectMetrics",
           "StandardMetricsReporting", "CountSteps", "WarnAboutBadRewardScales", "AddReplayShardStats"]

logger = logging.getLogger(__name__)

ResultDict = dict[str, Any]

# Config attributes StandardMetricsReporting reads, with TrainerConfig's defaults for
# configs that lack them (e.g. a bare RolloutConfig).
_CONFIG_DEFAULTS: dict[str, Any] = {"timesteps_per_iteration": 0, "min_iter_time_s": 0,
                                    "metrics_smoothing_episodes": 100, "collect_metrics_timeout": 180,
                                    "keep_per_episode_custom_metrics": False}


class OncePerTimestepsElapsed(MetricsBinding):
    """A predicate over any item: true once ``delay_steps`` more steps have elapsed since it last said yes.

    Use with ``.filter()``. The counter is ``num_steps_trained`` if ``by_steps_trained``, else
    ``num_steps_sampled``. It is always true when ``delay_steps <= 0``; otherwise it is true iff
    ``counter - last >= delay_steps`` and then sets ``last = counter`` (``last`` starts at 0).
    :meth:`check` answers without moving the bookmark and :meth:`commit` moves it; a counter below
    ``last`` (after a restore) first rebases ``last`` to the counter, in :meth:`check`.

    Metrics: reads ``num_steps_sampled`` (or ``num_steps_trained``).

    Examples:
        >>> once = OncePerTimestepsElapsed(100)
        >>> once.bind(metrics := MetricsContext())
        >>> metrics.counters["num_steps_sampled"] = 99
        >>> once(None)
        False
        >>> metrics.counters["num_steps_sampled"] = 100
        >>> once(None), once(None)
        (True, False)
    """

    def __init__(self, delay_steps: int, by_steps_trained: bool = False) -> None:
        check_number("OncePerTimestepsElapsed delay_steps", delay_steps, meaning="steps between reports; <= 0: every "
                     "item")
        self.delay_steps, self.by_steps_trained = delay_steps, by_steps_trained
        self.last = 0

    def __repr__(self) -> str:
        return f"OncePerTimestepsElapsed({self.delay_steps}{', by_steps_trained' if self.by_steps_trained else ''})"

    def _counter(self) -> int:
        return self.metrics.counters[STEPS_TRAINED_COUNTER if self.by_steps_trained else STEPS_SAMPLED_COUNTER]

    def check(self) -> bool:
        """Whether enough steps have elapsed; moves no bookmark (except the rebase after a restore)."""
        if self.delay_steps <= 0:
            return True
        counter = self._counter()
        if counter < self.last:
            self.last = counter
        return counter - self.last >= self.delay_steps

    def commit(self) -> None:
        """Moves the bookmark to the current counter."""
        if self.delay_steps > 0:
            self.last = self._counter()

    def __call__(self, item: Any) -> bool:
        if self.check():
            self.commit()
            return True
        return False


class OncePerTimeInterval:
    """A predicate over any item: true once ``delay_s`` seconds have passed on ``clock`` since it last said yes.

    Use with ``.filter()``. It is always true when ``delay_s`` is ``None`` or ``<= 0``, and its first call
    is true; otherwise it is true iff ``now - last >= delay_s`` and then sets ``last = now``.
    :meth:`check` answers without moving the bookmark and :meth:`commit` moves it.

    Metrics: none.

    Examples:
        >>> now = [0.0]
        >>> once = OncePerTimeInterval(2.5, clock=lambda: now[0])
        >>> once(None), once(None)
        (True, False)
        >>> now[0] = 2.5
        >>> once(None)
        True
    """

    def __init__(self, delay_s: float | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        check_number("OncePerTimeInterval delay_s", delay_s, none_ok=True, meaning="seconds between reports; None or "
                     "<= 0: every item")
        if not callable(clock):
            raise ValueError(f"OncePerTimeInterval clock={clock!r} must be a zero-argument callable returning seconds")
        self.delay_s, self.clock = delay_s, clock
        self.last: float | None = None

    def __repr__(self) -> str:
        return f"OncePerTimeInterval({self.delay_s})"

    def _gated(self) -> bool:
        return self.delay_s is not None and self.delay_s > 0

    def check(self) -> bool:
        """Whether ``delay_s`` has passed since the bookmark (always on the first call); moves nothing."""
        if not self._gated() or self.last is None:
            return True
        assert self.delay_s is not None  # _gated()
        return self.clock() - self.last >= self.delay_s

    def commit(self) -> None:
        """Moves the bookmark to now."""
        if self._gated():
            self.last = self.clock()

    def __call__(self, item: Any) -> bool:
        if self.check():
            self.commit()
            return True
        return False


class ReportGate(MetricsBinding):
    """A predicate over any item: true when ``delay_steps`` more steps **and** ``delay_s`` seconds have passed.

    Use with ``.filter()`` (as :func:`StandardMetricsReporting` does). It checks one
    :class:`OncePerTimestepsElapsed` and one :class:`OncePerTimeInterval` without side effects, and only
    when both hold commits both bookmarks. If either fails neither moves (apart from the step bookmark's
    rebase after a restore), so steps that elapsed while the time window was still open count towards
    the next report: chaining the two filters would instead demand another ``delay_steps`` on top.

    Metrics: reads ``num_steps_sampled`` (or ``num_steps_trained``).

    Examples:
        >>> now = [0.0]
        >>> gate = ReportGate(100, 5.0, clock=lambda: now[0])
        >>> gate.bind(metrics := MetricsContext())
        >>> metrics.counters["num_steps_sampled"] = 100
        >>> gate(None)  # 100 steps, and the first time check passes
        True
        >>> metrics.counters["num_steps_sampled"] = 200; now[0] = 1.0
        >>> gate(None)  # the steps are there, the time is not: nothing is committed
        False
        >>> now[0] = 5.0
        >>> gate(None)  # no further steps needed
        True
    """

    def __init__(self, delay_steps: int, delay_s: float | None, by_steps_trained: bool = False, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.steps = OncePerTimestepsElapsed(delay_steps, by_steps_trained)
        self.time = OncePerTimeInterval(delay_s, clock=clock)

    def bind(self, metrics: MetricsContext) -> None:
        super().bind(metrics)
        self.steps.bind(metrics)

    def __repr__(self) -> str:
        by = ", by_steps_trained" if self.steps.by_steps_trained else ""
        return f"ReportGate({self.steps.delay_steps} steps, {self.time.delay_s} s{by})"

    def __call__(self, item: Any) -> bool:
        steps_ok = self.steps.check()
        time_ok = self.time.check()
        if steps_ok and time_ok:
            self.steps.commit()
            self.time.commit()
            return True
        return False


def _stats(values: Sequence[float]) -> tuple[float, float, float]:
    """(min, max, mean) of ``values``, which must not be empty."""
    array = np.asarray(values, dtype=np.float64)
    return float(array.min()), float(array.max()), float(array.mean())


def _episode_data(ep: EpisodeRecord) -> dict[str, Any]:
    """What the smoothing window keeps of one episode, as plain data (a checkpoint holds the window)."""
    return {"episode_return": float(ep.episode_return), "episode_length": int(ep.episode_length),
            "policy_returns": {str(pid): float(ret) for pid, ret in ep.policy_returns.items()},
            "custom_metrics": dict(ep.custom_metrics)}


class CollectMetrics(MetricsBinding):
    """Ignores its input; emits one result dict of episode statistics and the dataflow's metrics.

    Use with ``.for_each()`` (after a :class:`ReportGate` filter). On each call it:

    1. requests ``get_metrics()`` from the local worker and from every remote worker that has no
       request outstanding, and waits up to ``timeout_seconds`` for the remote answers; requests that
       have not returned are carried over to the next call, never re-requested;
    2. counts the episodes of **all** workers into ``episodes_this_iter``;
    3. appends the new episodes of ``selected_workers`` (default: all remote workers) and of the local
       worker to the smoothing window, which keeps the last ``min_history`` finished episodes (across
       reports), and computes the episode statistics over that window: a true moving window, so a long
       report does not make them lag the policy, and a report with few episodes still averages
       ``min_history`` of them. ``min_history=0`` keeps no window: the statistics cover this call's
       episodes only. The window lives in the metrics context (``metrics.episode_window``), so a
       checkpoint holds it and a plan rebuilt after a worker failure goes on with it;
    4. merges the metrics context: ``info["custom_metrics"]`` is popped into ``custom_metrics``,
       ``info`` is a copy of the context's info plus every counter, and each timer ``k`` gives
       ``timers[k + "_time_ms"]`` and, when it has units, ``timers[k + "_throughput"]``;
    5. resets ``num_steps_trained_this_iter`` to 0.

    The result holds ``episode_reward_{max,min,mean}`` and ``episode_len_mean`` over the window (absent
    until the first episode has finished, never ``nan``), ``episodes_this_iter`` (every episode finished
    since the previous result, from all workers), ``policy_reward_{min,max,mean}`` (per policy, over the
    window), ``custom_metrics`` (each user metric's ``_min``/``_max``/``_mean`` over the window's finite
    values, absent when there are none), ``hist_stats`` (``episode_reward`` and ``episode_lengths``: the
    window's returns and lengths, oldest first), ``timesteps_total`` (``num_steps_trained`` if
    ``by_steps_trained``, else ``num_steps_sampled``), ``timesteps_this_iter`` (its increase since the
    previous result, at least 0), ``agent_timesteps_total``, the four step counters, ``info``, ``timers``
    and ``num_healthy_workers``.

    Metrics: reads every counter, timer and info entry; keeps the window in ``episode_window``; pops
    ``info["custom_metrics"]``; resets ``num_steps_trained_this_iter``.

    Args:
        workers: the plan's WorkerSet.
        min_history: the smoothing window, in episodes (config.metrics_smoothing_episodes); >= 0.
        timeout_seconds: how long one call waits for the remote workers' answers; >= 0.
        keep_per_episode_custom_metrics: also keep each custom metric's raw values over the window.
        selected_workers: remote workers whose episodes enter the statistics (the local worker's always
            do); ``None`` for all. It never narrows ``episodes_this_iter``.
        by_steps_trained: ``timesteps_total`` counts trained instead of sampled steps.

    Raises:
        ValueError: ``min_history`` or ``timeout_seconds`` invalid.

    Examples:
        >>> from flowrl.testing import make_fake_workers
        >>> workers = make_fake_workers(0)
        >>> op = CollectMetrics(workers, min_history=3)
        >>> op.bind(metrics := MetricsContext())
        >>> "episode_reward_mean" in op(None)  # no episode has finished yet
        False
        >>> _ = workers.local_worker().sample(), workers.local_worker().sample()
        >>> metrics.counters["num_steps_sampled"] = 200
        >>> result = op(None)
        >>> result["episodes_this_iter"], result["episode_reward_mean"], result["info"]["num_steps_sampled"]
        (2, 1.0, 200)
        >>> _ = [workers.local_worker().sample() for _ in range(2)]
        >>> result = op(None)
        >>> result["episodes_this_iter"], len(result["hist_stats"]["episode_reward"])  # the last 3 of 4
        (2, 3)
    """

    def __init__(self, workers: WorkerSet, min_history: int = 100, timeout_seconds: float = 180,
                 keep_per_episode_custom_metrics: bool = False, selected_workers: Sequence[Any] | None = None,
                 by_steps_trained: bool = False) -> None:
        check_int("CollectMetrics min_history", min_history, 0,
                  "episodes in the smoothing window; config.metrics_smoothing_episodes")
        check_number("CollectMetrics timeout_seconds", timeout_seconds, ge=0, meaning="config.collect_metrics_timeout")
        self.workers, self.min_history, self.timeout_seconds = workers, min_history, timeout_seconds
        self.keep_per_episode_custom_metrics = keep_per_episode_custom_metrics
        self.selected_workers = None if selected_workers is None else list(selected_workers)
        self.by_steps_trained = by_steps_trained
        self._pending: dict[Any, Any] = {}  # outstanding get_metrics ref -> its remote worker

    def __repr__(self) -> str:
        return "CollectMetrics"

    def _collect(self) -> tuple[list[EpisodeRecord], int]:
        """(episodes for the statistics, number of episodes from all workers) of this call."""
        remote = list(self.workers.remote_workers())
        live = set(remote)
        self._pending = {ref: w for ref, w in self._pending.items() if w in live}  # drop removed workers
        asked = set(self._pending.values())
        for worker in remote:
            if worker not in asked:
                self._pending[worker.get_metrics.remote()] = worker
        local_episodes = list(self.workers.local_worker().get_metrics())
        ready: list[Any] = []
        if self._pending:
            refs = list(self._pending)
            ready, not_ready = executor.wait(refs, num_returns=len(refs), timeout=self.timeout_seconds)
            if not_ready:
                logger.warning("CollectMetrics: %d of %d remote workers did not report episodes within %s s; "
                               "their requests carry over to the next report", len(not_ready), len(refs),
                               self.timeout_seconds)
        answered = [self._pending.pop(ref) for ref in ready]
        selected = live if self.selected_workers is None else set(self.selected_workers)
        for_stats, total = list(local_episodes), len(local_episodes)
        fetched = executor.get(ready) if ready else []  # (no Ray call without remote workers: Ray may not be running)
        for worker, episodes in zip(answered, fetched):  # a failed worker's error surfaces here
            total += len(episodes)
            if worker in selected:
                for_stats.extend(episodes)
        return for_stats, total

    def _window(self, new: list[EpisodeRecord]) -> list[dict[str, Any]]:
        """The last ``min_history`` episodes, the new ones included (all new ones when ``min_history`` is 0)."""
        added = [_episode_data(ep) for ep in new]
        if self.min_history == 0:
            return added
        window = (self.metrics.episode_window + added)[-self.min_history:]
        self.metrics.episode_window = window
        return window

    def _custom_metrics(self, episodes: list[dict[str, Any]]) -> dict[str, Any]:
        values: defaultdict[str, list[float]] = defaultdict(list)
        for ep in episodes:
            for key, value in ep["custom_metrics"].items():
                values[key].append(value)
        out: dict[str, Any] = {}
        for key, vals in values.items():
            finite = [float(v) for v in vals if not np.any(np.isnan(v))]
            if finite:  # a metric with no finite value yet is left out rather than reported as nan
                out[f"{key}_min"], out[f"{key}_max"], out[f"{key}_mean"] = _stats(finite)
            if self.keep_per_episode_custom_metrics:
                out[key] = list(vals)
        return out

    def __call__(self, item: Any) -> ResultDict:
        new, episodes_this_iter = self._collect()
        window = self._window(new)
        rewards = [float(ep["episode_return"]) for ep in window]
        lengths = [int(ep["episode_length"]) for ep in window]
        per_policy: defaultdict[str, list[float]] = defaultdict(list)
        for ep in window:
            for pid, ret in ep["policy_returns"].items():
                per_policy[pid].append(float(ret))
        policy_stats = {pid: _stats(rets) for pid, rets in per_policy.items()}
        episode_stats: ResultDict = {}
        if window:  # before the first finished episode there is nothing to report (and no nan)
            reward_min, reward_max, reward_mean = _stats(rewards)
            episode_stats = {"episode_reward_max": reward_max, "episode_reward_min": reward_min,
                             "episode_reward_mean": reward_mean, "episode_len_mean": _stats(lengths)[2]}

        metrics = self.metrics
        custom_metrics = self._custom_metrics(window)
        custom_metrics.update(metrics.info.pop(CUSTOM_METRICS, None) or {})
        # the bookmark is a counter, so it survives a checkpoint restore and a plan rebuild
        timesteps_total = metrics.counters[STEPS_TRAINED_COUNTER if self.by_steps_trained else STEPS_SAMPLED_COUNTER]
        timesteps_this_iter = max(0, timesteps_total - metrics.counters[LAST_REPORT_TIMESTEPS])
        metrics.counters[LAST_REPORT_TIMESTEPS] = timesteps_total
        counters = dict(metrics.counters)
        info = {**metrics.info, **counters}
        timers: dict[str, float] = {}
        for key, timer in metrics.timers.items():
            timers[f"{key}_time_ms"] = round(1000 * timer.mean, 3)
            if timer.has_units_processed():
                timers[f"{key}_throughput"] = round(timer.mean_throughput, 3)
        result: ResultDict = {
            **episode_stats,
            "episodes_this_iter": episodes_this_iter,
            "policy_reward_min": {pid: s[0] for pid, s in policy_stats.items()},
            "policy_reward_max": {pid: s[1] for pid, s in policy_stats.items()},
            "policy_reward_mean": {pid: s[2] for pid, s in policy_stats.items()},
            "custom_metrics": custom_metrics,
            "hist_stats": {"episode_reward": rewards, "episode_lengths": lengths},
            "timesteps_total": timesteps_total,
            "timesteps_this_iter": timesteps_this_iter,
            "agent_timesteps_total": metrics.counters[AGENT_STEPS_SAMPLED_COUNTER],
            STEPS_SAMPLED_COUNTER: metrics.counters[STEPS_SAMPLED_COUNTER],
            STEPS_TRAINED_COUNTER: metrics.counters[STEPS_TRAINED_COUNTER],
            AGENT_STEPS_SAMPLED_COUNTER: metrics.counters[AGENT_STEPS_SAMPLED_COUNTER],
            AGENT_STEPS_TRAINED_COUNTER: metrics.counters[AGENT_STEPS_TRAINED_COUNTER],
            "info": info,
            "timers": timers,
            "num_healthy_workers": len(self.workers.remote_workers()),
        }
        metrics.counters[STEPS_TRAINED_THIS_ITER_COUNTER] = 0
        return result


def StandardMetricsReporting(train_op: LocalIterator[Any], workers: WorkerSet, config: object,
                             selected_workers: Sequence[Any] | None = None, by_steps_trained: bool = False, *,
                             clock: Callable[[], float] = time.monotonic) -> LocalIterator[ResultDict]:
    """The end of a plan: pulls ``train_op`` until a :class:`ReportGate` opens, then emits a result dict.

    Returns ``train_op.filter(ReportGate(config.timesteps_per_iteration, config.min_iter_time_s,
    by_steps_trained, clock=clock)).for_each(CollectMetrics(workers, config.metrics_smoothing_episodes,
    config.collect_metrics_timeout, config.keep_per_episode_custom_metrics, selected_workers,
    by_steps_trained))``. ``train_op``'s values are ignored: one result spans as many dataflow steps as
    the gate needs. ``config`` is a config object, or a mapping with those names as keys (an RLlib 1.x dict
    config, such as Ray's own execution tests pass); a setting it lacks gets its default (0, 0, 100, 180, False).

    Metrics: as :class:`ReportGate` and :class:`CollectMetrics`.

    Examples:
        >>> from flowrl.testing import make_fake_workers
        >>> from flowrl.config import TrainerConfig
        >>> now = [0.0]
        >>> def tick(x: int) -> int:
        ...     now[0] += 1.0  # each train step takes one (fake) second
        ...     return x
        >>> reports = StandardMetricsReporting(iter_list(range(10)).for_each(tick), make_fake_workers(0),
        ...                                    TrainerConfig(min_iter_time_s=3), clock=lambda: now[0])
        >>> reports
        LocalIterator[iter_list.for_each().filter(ReportGate(0 steps, 3 s)).for_each(CollectMetrics)]
        >>> [(next(reports), now[0])[1] for _ in range(3)]  # the fake time of each report
        [1.0, 4.0, 7.0]
    """
    def setting(name: str) -> Any:
        if isinstance(config, Mapping):  # read as attributes, its keys would be missed, and the defaults silently used
            return config.get(name, _CONFIG_DEFAULTS[name])
        return getattr(config, name, _CONFIG_DEFAULTS[name])

    gate = ReportGate(setting("timesteps_per_iteration"), setting("min_iter_time_s"), by_steps_trained, clock=clock)
    collect = CollectMetrics(workers, setting("metrics_smoothing_episodes"), setting("collect_metrics_timeout"),
                             setting("keep_per_episode_custom_metrics"), selected_workers, by_steps_trained)
    return train_op.filter(gate).for_each(collect)


class CountSteps(MetricsBinding):
    """Adds each batch's steps to one named counter and passes the batch on (e.g. the per-policy
    ``agent_steps_trained_PPO`` / ``agent_steps_trained_DQN`` of the two-policy plan in
    :mod:`flowrl.algorithms.multiagent`).

    Use with ``.for_each()``. Metrics: ``counters[counter] += batch.agent_steps()`` (or ``count`` with
    ``by="env_steps"``).

    Examples:
        >>> from flowrl.testing import fake_batch
        >>> op = CountSteps("agent_steps_trained_PPO")
        >>> op.bind(metrics := MetricsContext())
        >>> op(fake_batch(3)).count, metrics.counters["agent_steps_trained_PPO"]
        (3, 3)
    """

    def __init__(self, counter: str, by: str = "agent_steps") -> None:
        if not isinstance(counter, str) or not counter:
            raise ValueError(f"CountSteps counter={counter!r} must be a counter name, e.g. a constant from "
                             f"flowrl.metrics")
        if by not in ("agent_steps", "env_steps"):
            raise ValueError(f"CountSteps by={by!r}; use 'agent_steps' or 'env_steps'")
        self.counter, self.by = counter, by

    def __call__(self, batch: AnyBatch) -> AnyBatch:
        check_batch(batch, self)
        self.metrics.counters[self.counter] += batch.agent_steps() if self.by == "agent_steps" else batch.count
        return batch

    def __repr__(self) -> str:
        return f"CountSteps({self.counter})"


class WarnAboutBadRewardScales:
    """Consumes result dicts and passes them on; logs a warning when rewards look badly scaled for PPO.

    Use with ``.for_each()`` after ``StandardMetricsReporting``. It warns (RLlib's check) when
    ``|episode_reward_mean| / vf_clip_param`` exceeds 200, so value clipping would stall value learning,
    and when the scaled value loss of a policy with a shared trunk exceeds 100. Results with more than one
    policy in ``policy_reward_mean`` (multi-agent) are not checked.

    Args:
        config: a PPO-style config with ``vf_clip_param``, ``vf_loss_coeff`` and ``model.vf_share_layers``.

    Metrics: none.

    Examples:
        >>> from flowrl.algorithms.ppo import PPOConfig
        >>> check = WarnAboutBadRewardScales(PPOConfig(vf_clip_param=0.5))
        >>> result = {"episode_reward_mean": 500.0, "policy_reward_mean": {"default_policy": 500.0}}
        >>> check(result) is result  # warns
        True
    """

    def __init__(self, config: Any) -> None:
        missing = [f for f in ("vf_clip_param", "vf_loss_coeff", "model") if not hasattr(config, f)]
        if missing:
            raise ValueError(f"WarnAboutBadRewardScales needs a PPO-style config; {type(config).__name__} lacks "
                             f"{missing}")
        self.config = config

    def __call__(self, result: dict[str, Any]) -> dict[str, Any]:
        if len(result.get("policy_reward_mean") or {}) > 1:  # multi-agent: one reward scale per policy
            return result
        stats = result.get("info", {}).get(LEARNER_INFO, {}).get(DEFAULT_POLICY_ID, {}).get(LEARNER_STATS_KEY, {})
        scaled_vf_loss = self.config.vf_loss_coeff * float(stats.get("vf_loss", 0.0))
        if self.config.model.vf_share_layers and scaled_vf_loss > 100:
            logger.warning("The value loss (%.1f, scaled by vf_loss_coeff) dwarfs the policy loss (%.3g) in a shared "
                           "trunk, which can stop the policy from learning; lower vf_loss_coeff or set "
                           "ModelConfig(vf_share_layers=False)", scaled_vf_loss, stats.get("policy_loss", math.nan))
        reward = float(result.get("episode_reward_mean", math.nan))
        if math.isfinite(reward) and abs(reward) / self.config.vf_clip_param > 200:
            logger.warning("The mean episode return (%.1f) is over 200x vf_clip_param=%s, so value clipping slows "
                           "value learning; raise vf_clip_param or scale the rewards down", reward,
                           self.config.vf_clip_param)
        return result

    def __repr__(self) -> str:
        return "WarnAboutBadRewardScales"


class AddReplayShardStats:
    """Consumes result dicts and emits them with ``info[key]`` = a replay shard's ``stats()`` (Ape-X reports
    shard 0's).

    Use with ``.for_each()`` after ``StandardMetricsReporting``. Each report waits at most ``timeout_s`` for
    the shard's answer; on timeout it reports the previous answer (``{}`` before the first) and collects the
    same request at the next report rather than sending another, so at most one is in flight. The stats are
    plain data (counts, sizes, ``max_priority``), so a checkpoint can hold them.

    Metrics: none (the result dict only).

    Args:
        shard: a replay shard actor (:class:`~flowrl.replay_buffers.ReplayShard`).
        key: the ``info`` key (``"replay_shard_0"``).
        timeout_s: the longest one report waits for the shard, > 0.

    Examples:
        >>> from flowrl.replay_buffers import make_replay_shards
        >>> [shard] = make_replay_shards(1, learning_starts=0, capacity=10)
        >>> op = AddReplayShardStats(shard, timeout_s=60)  # (a new actor answers once it has started)
        >>> result = op({"info": {}})
        >>> result["info"]["replay_shard_0"]["num_added"], result["info"]["replay_shard_0"]["capacity"]
        (0, 10)
        >>> executor.kill(shard)
    """

    def __init__(self, shard: Any, key: str = "replay_shard_0", timeout_s: float = 1.0) -> None:
        if not callable(getattr(getattr(shard, "stats", None), "remote", None)):
            raise TypeError(f"AddReplayShardStats needs a replay shard actor (stats.remote()), got "
                            f"{type(shard).__name__}; pass one of the plan's replay shards")
        check_number("AddReplayShardStats timeout_s", timeout_s, gt=0, meaning="seconds to wait for a shard's stats")
        self.shard, self.key, self.timeout_s = shard, key, timeout_s
        self.stats: dict[str, Any] = {}
        self._pending: Any = None  # the stats request in flight, if any

    def __call__(self, result: ResultDict) -> ResultDict:
        if self._pending is None:
            self._pending = self.shard.stats.remote()
        try:
            self.stats = executor.get(self._pending, timeout=self.timeout_s)
            self._pending = None
        except executor.GetTimeoutError:
            pass  # keep the previous answer; this request is collected at the next report
        result.setdefault("info", {})[self.key] = copy.deepcopy(self.stats)
        return result

    def __repr__(self) -> str:
        return f"AddReplayShardStats({self.key})"
