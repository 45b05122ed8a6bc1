"""The shared metrics context of a dataflow, its timers, and the standard key names.

Every dataflow owns exactly one :class:`MetricsContext`; the iterator a plan returns carries it as
``it.metrics``. flowrl's operators receive it through ``bind(metrics)`` (see
:class:`MetricsBinding`); counter and timer names are the constants below.

Not to be confused with :mod:`flowrl.ops.metrics`: this module is the core that records (the context, its
counters and timers, the key names); :mod:`flowrl.ops.metrics` holds the reporting operators
(``StandardMetricsReporting``, ``CollectMetrics``, ``ReportGate``) that read this context and turn it into a
plan's result dicts.

Examples:
    >>> ctx = MetricsContext()
    >>> ctx.counters[STEPS_SAMPLED_COUNTER] += 200
    >>> with ctx.timers[SAMPLE_TIMER] as t:
    ...     t.push_units_processed(200)
    >>> state = ctx.save()
    >>> state["counters"]
    {'num_steps_sampled': 200}
    >>> other = MetricsContext()
    >>> other.restore(state)
    >>> other.counters[STEPS_SAMPLED_COUNTER], len(other.timers)
    (200, 0)
"""

from __future__ import annotations

import copy
import math
import time
from collections import Counter, defaultdict, deque
from typing import TYPE_CHECKING, Any, Iterable

from flowrl.validation import check_int

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "MetricsContext", "Timer", "MetricsBinding", "Summary",
    "STEPS_SAMPLED_COUNTER", "AGENT_STEPS_SAMPLED_COUNTER", "STEPS_TRAINED_COUNTER",
    "AGENT_STEPS_TRAINED_COUNTER", "STEPS_TRAINED_THIS_ITER_COUNTER", "LAST_TARGET_UPDATE_TS", "LAST_REPORT_TIMESTEPS",
    "NUM_TARGET_UPDATES", "NUM_WEIGHT_BROADCASTS", "NUM_WEIGHT_SYNCS", "NUM_LEARNER_UPDATES",
    "NUM_REPLAY_SHARDS_RECREATED",
    "PPO_AGENT_STEPS_TRAINED_COUNTER", "DQN_AGENT_STEPS_TRAINED_COUNTER",
    "SAMPLE_TIMER", "WORKER_UPDATE_TIMER", "GRAD_WAIT_TIMER", "APPLY_GRADS_TIMER",
    "LEARN_ON_BATCH_TIMER", "LOAD_BATCH_TIMER", "COMPUTE_GRADS_TIMER", "TARGET_NET_UPDATE_TIMER",
    "LEARNER_DEQUEUE_TIMER", "LEARNER_GRAD_TIMER", "LEARNER_OVERALL_TIMER", "LEARNER_LOAD_TIMER",
    "LEARNER_LOAD_WAIT_TIMER",
    "LEARNER_INFO", "LEARNER_STATS_KEY", "CUSTOM_METRICS", "LEARNER_QUEUE_INFO", "TIMING_BREAKDOWN_INFO",
]

# Counters. Operators import these; nobody spells a key as a free string.
STEPS_SAMPLED_COUNTER = "num_steps_sampled"
AGENT_STEPS_SAMPLED_COUNTER = "num_agent_steps_sampled"
STEPS_TRAINED_COUNTER = "num_steps_trained"
AGENT_STEPS_TRAINED_COUNTER = "num_agent_steps_trained"
STEPS_TRAINED_THIS_ITER_COUNTER = "num_steps_trained_this_iter"
LAST_TARGET_UPDATE_TS = "last_target_update_ts"
LAST_REPORT_TIMESTEPS = "last_report_timesteps"  # timesteps_total at the previous result (CollectMetrics)
NUM_TARGET_UPDATES = "num_target_updates"
NUM_WEIGHT_BROADCASTS = "num_weight_broadcasts"
NUM_WEIGHT_SYNCS = "num_weight_syncs"
NUM_LEARNER_UPDATES = "num_learner_updates"
NUM_REPLAY_SHARDS_RECREATED = "num_replay_shards_recreated"  # dead trainer-owned replay shards replaced (Trainer)
PPO_AGENT_STEPS_TRAINED_COUNTER = "agent_steps_trained_PPO"
DQN_AGENT_STEPS_TRAINED_COUNTER = "agent_steps_trained_DQN"

# Timers.
SAMPLE_TIMER = "sample"
WORKER_UPDATE_TIMER = "update"
GRAD_WAIT_TIMER = "grad_wait"
APPLY_GRADS_TIMER = "apply_grad"
LEARN_ON_BATCH_TIMER = "learn"
LOAD_BATCH_TIMER = "load"
COMPUTE_GRADS_TIMER = "compute_grads"
TARGET_NET_UPDATE_TIMER = "target_net_update"
# Learner-thread timers (flowrl.ops.concurrency): Ape-X exposes the first three as plan timers;
# every learner thread reports them as ``<key>_time_ms`` under ``info["timing_breakdown"]``.
LEARNER_DEQUEUE_TIMER = "learner_dequeue"
LEARNER_GRAD_TIMER = "learner_grad"
LEARNER_OVERALL_TIMER = "learner_overall"
LEARNER_LOAD_TIMER = "learner_load"
LEARNER_LOAD_WAIT_TIMER = "learner_load_wait"

# Info keys.
LEARNER_INFO = "learner"
LEARNER_STATS_KEY = "learner_stats"
CUSTOM_METRICS = "custom_metrics"
LEARNER_QUEUE_INFO = "learner_queue"  # learner in-queue size statistics (add_learner_metrics)
TIMING_BREAKDOWN_INFO = "timing_breakdown"  # learner-thread timers in ms (add_learner_metrics)


class Timer:
    """Wall-time statistics over a window of the last ``window_size`` measurements.

    Use as a context manager (monotonic clock) or feed it with :meth:`push`.

    Examples:
        >>> t = Timer()
        >>> t.push(0.5); t.push_units_processed(100)
        >>> t.push(1.5); t.push_units_processed(300)
        >>> t.mean, t.mean_units_processed, t.mean_throughput
        (1.0, 200.0, 200.0)
    """

    def __init__(self, window_size: int = 10) -> None:
        check_int("Timer window_size", window_size, 1, "the last this many pushes are averaged")
        self._seconds: deque[float] = deque(maxlen=window_size)
        self._units: deque[float] = deque(maxlen=window_size)
        self._start: float | None = None

    def __enter__(self) -> Timer:
        if self._start is not None:
            raise RuntimeError("Timer is already entered; a timer cannot time two overlapping spans")
        self._start = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._start is not None  # internal invariant: set by __enter__
        self.push(time.monotonic() - self._start)
        self._start = None

    def push(self, seconds: float) -> None:
        """Records one duration in seconds."""
        self._seconds.append(seconds)

    def push_units_processed(self, n: float) -> None:
        """Records how many units (e.g. env steps) the last span processed."""
        self._units.append(n)

    def has_units_processed(self) -> bool:
        return len(self._units) > 0

    @property
    def mean(self) -> float:
        return sum(self._seconds) / len(self._seconds) if self._seconds else 0.0

    @property
    def mean_units_processed(self) -> float:
        return sum(self._units) / len(self._units) if self._units else 0.0

    @property
    def mean_throughput(self) -> float:
        seconds = sum(self._seconds)
        return sum(self._units) / seconds if seconds > 0 else 0.0

    def __repr__(self) -> str:
        return f"Timer(mean={self.mean:.4g}s, n={len(self._seconds)})"


class MetricsContext:
    """Counters, timers, free-form info and the current source actor of one dataflow.

    Attributes:
        counters: ``str -> int``; reading or incrementing an absent key starts it at 0.
        timers: ``str -> Timer``; an absent key is created on first use.
        info: free-form information (``info["learner"]`` holds learner stats).
        episode_window: the finished episodes that the episode statistics are computed over, oldest first,
            each as plain data (``episode_return``, ``episode_length``, ``policy_returns``,
            ``custom_metrics``); :class:`~flowrl.ops.metrics.CollectMetrics` keeps it. It lives here, not in
            the operator, so that it is saved in checkpoints and carried over a plan rebuild with the counters.
        current_actor: the shard actor that produced the item being processed, or ``None``.
    """

    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.timers: defaultdict[str, Timer] = defaultdict(Timer)
        self.info: dict[str, Any] = {}
        self.episode_window: list[dict[str, Any]] = []
        self.current_actor: Any = None

    def save(self) -> dict[str, Any]:
        """Returns ``{"counters", "info", "episode_window", "timers": None}`` as copies (timers are not saved)."""
        return {"counters": dict(self.counters), "info": copy.deepcopy(self.info),
                "episode_window": copy.deepcopy(self.episode_window), "timers": None}

    def restore(self, state: dict[str, Any]) -> None:
        """Reloads counters, info and the episode window from :meth:`save` output (a state saved before
        checkpoints held the window restores an empty one); clears timers and the current actor."""
        for key in ("counters", "info"):
            if not isinstance(state.get(key), dict):
                raise ValueError(f"metrics state lacks a dict under {key!r}; pass MetricsContext.save() "
                                 f"output, got keys {sorted(state)}")
        window = state.get("episode_window", [])
        if not isinstance(window, list) or not all(isinstance(ep, dict) for ep in window):
            raise ValueError(f"metrics state's episode_window must be a list of episode dicts (MetricsContext.save() "
                             f"output), got {window!r:.80}")
        self.counters.clear()
        self.counters.update({str(k): int(v) for k, v in state["counters"].items()})
        self.info = copy.deepcopy(state["info"])
        self.episode_window = copy.deepcopy(window)
        self.timers.clear()
        self.current_actor = None

    def merge_from(self, other: MetricsContext) -> None:
        """Adds ``other``'s counters into this context and its info where this lacks the key."""
        self.counters.update(other.counters)
        for key, value in other.info.items():
            self.info.setdefault(key, value)

    def __repr__(self) -> str:
        return f"MetricsContext(counters={dict(self.counters)})"


class MetricsBinding:
    """Mixin for operators: ``bind(metrics)`` once; a different context afterwards is an error.

    The iterator core calls ``bind`` when it builds the operator's stage; a test may call it itself.

    Examples:
        >>> class CountItems(MetricsBinding):
        ...     def __call__(self, item: int) -> int:
        ...         self.metrics.counters["items"] += 1
        ...         return item
        >>> op, ctx = CountItems(), MetricsContext()
        >>> op.bind(ctx); op.bind(ctx)  # the same context again: nothing happens
        >>> op(7), ctx.counters["items"]
        (7, 1)
        >>> op.bind(MetricsContext())
        Traceback (most recent call last):
        ...
        ValueError: CountItems is already bound to another dataflow's metrics context; an operator instance belongs to one dataflow, so build a new CountItems(...) per plan
    """

    _bound_metrics: MetricsContext | None = None

    def bind(self, metrics: MetricsContext) -> None:
        if self._bound_metrics is None:
            self._bound_metrics = metrics
        elif self._bound_metrics is not metrics:
            name = type(self).__name__
            raise ValueError(f"{name} is already bound to another dataflow's metrics context; an operator "
                             f"instance belongs to one dataflow, so build a new {name}(...) per plan")

    @property
    def metrics(self) -> MetricsContext:
        if self._bound_metrics is None:
            raise RuntimeError(f"{type(self).__name__} is not bound to a metrics context; attach it to an "
                               f"iterator (the core binds it on the first pull) or call .bind(metrics)")
        return self._bound_metrics

    @property
    def bound_metrics(self) -> MetricsContext | None:
        """The context this operator is bound to; ``None`` before the first ``bind``."""
        return self._bound_metrics


class Summary:
    """Count, mean, min and max of observed values (one writing thread; any thread may read).

    Examples:
        >>> s = Summary()
        >>> s.add([0, 2, 4]); s.add(6)
        >>> s.to_data()
        {'count': 4, 'mean': 3.0, 'min': 0.0, 'max': 6.0}
    """

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, values: float | Iterable[float] | np.ndarray) -> None:
        """Records one value or an array of values."""
        import numpy as np  # here, so that the iterator core imports without numpy

        array = np.asarray(values, dtype=np.float64)
        if array.size:
            self.min, self.max = min(self.min, float(array.min())), max(self.max, float(array.max()))
            self.total += float(array.sum())
            self.count += int(array.size)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    def to_data(self) -> dict[str, Any]:
        """``{"count", "mean", "min", "max"}`` as plain numbers (``None`` before the first value)."""
        if not self.count:
            return {"count": 0, "mean": None, "min": None, "max": None}
        return {"count": self.count, "mean": self.mean, "min": self.min, "max": self.max}
