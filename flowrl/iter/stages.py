"""The vocabulary of the iterator core: what every built stage answers, what an iterator records about itself,
and the metrics flow that iterators of one plan share.

A built stage is a :class:`Puller`: ``pull(block)`` answers an item, :data:`NOT_READY` ("nothing yet; ask
again") or :data:`END` (the stream is over). The two signals never leave the package's process: the local
iterator turns them into waiting and ``StopIteration``, a shard into its status values. An iterator records how
to build its chain before anything runs: where its stream starts (an :class:`Origin`) and the :class:`Stage` s
applied after it; :mod:`flowrl.iter.plan_graph` reads those records, :mod:`flowrl.iter.profiling` wraps the
stages as they are built. Iterators of one lineage share a :class:`Cell`, whose :class:`Flow` holds the metrics
context, the close callbacks and the profiler; a union merges its inputs' flows into one.

User functions see the metrics context only while the core calls them (:func:`call_with_metrics`,
:func:`get_metrics`), and raise :class:`RetryLater` to be offered the same item again.

Examples:
    >>> NOT_READY, END
    (NOT_READY, END)
    >>> ctx = MetricsContext()
    >>> call_with_metrics(ctx, lambda: get_metrics() is ctx)
    True
    >>> label_of(abs), label_of(RetryLater)
    ('', '')
"""

from __future__ import annotations

import contextvars
import inspect
import time
from typing import Any, Callable, ContextManager, Protocol, Sequence

from flowrl.metrics import MetricsContext
from flowrl.validation import check_int

__all__ = ["NOT_READY", "END", "Puller", "StageWrapper", "Stage", "Origin", "Flow", "Cell", "merge_cells",
           "RetryLater", "get_metrics", "call_with_metrics", "Backoff", "check_fn", "label_of", "check_concurrency"]


class _Signal:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self) -> str:  # never crosses a process boundary; refuse loudly if it tries
        raise TypeError(f"{self._name} is private to flowrl.iter and cannot be pickled")


#: A stage's answer "no item yet; pull again later" (a non-blocking pull, or a source that is waiting).
NOT_READY = _Signal("NOT_READY")
#: A stage's answer "the stream is over".
END = _Signal("END")


class RetryLater(Exception):
    """Raised by a ``for_each``/``combine`` function: "not now; call me again later with this item"."""


# Scoped access for plain user callables; set only for the duration of one core call.
_CURRENT_METRICS: contextvars.ContextVar[MetricsContext | None] = contextvars.ContextVar(
    "flowrl_metrics", default=None)


def get_metrics() -> MetricsContext:
    """The metrics context of the dataflow whose core is calling the current user function.

    Raises:
        ValueError: when called outside a ``for_each``/``filter``/``combine`` function or hook.
    """
    ctx = _CURRENT_METRICS.get()
    if ctx is None:
        raise ValueError("Cannot access context outside an iterator.")
    return ctx


def call_with_metrics(ctx: MetricsContext, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with ``ctx`` as what :func:`get_metrics` returns for the duration of the call."""
    token = _CURRENT_METRICS.set(ctx)
    try:
        return fn(*args)
    finally:
        _CURRENT_METRICS.reset(token)


class Backoff:
    """Sleeps 1 ms, doubling to at most 10 ms; reset after progress."""

    def __init__(self) -> None:
        self.delay = 0.001

    def wait(self) -> None:
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, 0.01)


def check_fn(fn: Any, method: str) -> None:
    """A TypeError unless ``fn`` is a callable to record as ``method``'s function (an operator class passed
    where its instance belongs is named as such)."""
    if isinstance(fn, type) and any("__call__" in vars(k) for k in fn.__mro__[:-1]):
        raise TypeError(f"{method}() got the class {fn.__name__}; pass an instance: "
                        f"{fn.__name__}(...), not {fn.__name__}")
    if not callable(fn):
        raise TypeError(f"{method}() needs a callable, got {fn!r} of type {type(fn).__name__}")


def _class_dicts(fn: Any) -> set[str]:
    return {name for k in type(fn).__mro__[:-1] for name in vars(k)}


def label_of(fn: Any) -> str:
    """How a stage's name shows ``fn``: its repr if its class defines one (an operator), else ``""``."""
    plain = isinstance(fn, type) or inspect.isroutine(fn) or "__repr__" not in _class_dicts(fn)
    return "" if plain else repr(fn)


def check_concurrency(max_concurrency: int) -> None:
    """``for_each``'s ``max_concurrency``: an int >= 1."""
    check_int("max_concurrency", max_concurrency, 1,
              "1 runs the function in this process; k > 1 runs k Ray tasks at once")


# ---------------------------------------------------------------------------------------------
# Built stages and what an iterator records to build them.

class Puller:
    """A built stage: ``pull(block)`` answers an item, :data:`NOT_READY` or :data:`END`. With ``block`` it may
    wait for its upstream; without, it answers :data:`NOT_READY` rather than wait."""

    def pull(self, block: bool) -> Any:
        raise NotImplementedError


class StageWrapper(Protocol):
    """What a :class:`Flow` may hold as its ``profiler``: called with each record (an :class:`Origin` or a
    :class:`Stage`) and its built puller as the chain is built; returns the puller to use. ``pulling()`` brackets
    each ``next()`` of an iterator of the flow, and ``timed_wait(backoff)`` sleeps a backoff inside one."""

    def wrap(self, record: object, puller: Puller) -> Puller: ...

    def pulling(self) -> ContextManager[None]: ...

    def timed_wait(self, backoff: Backoff) -> None: ...


class Stage:
    """A recorded stage: its name suffix and how to build it around an upstream puller."""

    def __init__(self, suffix: str, build: Callable[[Puller, MetricsContext], Puller],
                 fn: Any = None) -> None:
        self.suffix, self.build, self.fn = suffix, build, fn


class Origin:
    """Where a LocalIterator's stream starts, recorded at plan-build time for :mod:`flowrl.iter.plan_graph`.

    ``kind`` is ``"source"``, ``"gather"`` (``inputs``: the ParallelIterator), ``"union"``, ``"duplicate"``
    (``inputs``: the duplicated iterator) or ``"named"``; ``attrs`` hold the arguments that shape the flow.
    """

    def __init__(self, kind: str, label: str, inputs: tuple[Any, ...] = (), **attrs: Any) -> None:
        self.kind, self.label, self.inputs, self.attrs = kind, label, inputs, attrs


# ---------------------------------------------------------------------------------------------
# The shared metrics cell: iterators of one lineage share a cell; union re-points cells at one flow.

class Flow:
    """What the iterators of one dataflow share: the metrics context, the close callbacks, and the profiler
    (when set, it wraps each stage as the chain is built)."""

    def __init__(self) -> None:
        self.metrics = MetricsContext()
        self.callbacks: list[Callable[[], Any]] = []
        self.cells: list[Cell] = []
        self.profiler: StageWrapper | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "callbacks": [], "profiler": None}  # both stay in their process


class Cell:
    """An iterator lineage's pointer to its :class:`Flow` (a union re-points it at the merged flow)."""

    def __init__(self) -> None:
        self.flow = Flow()
        self.flow.cells.append(self)


def merge_cells(cells: Sequence[Cell]) -> None:
    """Points every cell at the first cell's flow, merging the others' metrics and callbacks into it."""
    survivor = cells[0].flow
    for cell in cells[1:]:
        flow = cell.flow
        if flow is survivor:
            continue
        survivor.metrics.merge_from(flow.metrics)
        survivor.callbacks.extend(flow.callbacks)
        for c in flow.cells:
            c.flow = survivor
        survivor.cells.extend(flow.cells)
