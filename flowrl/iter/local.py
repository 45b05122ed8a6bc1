"""Lazy iterators over Ray actors: the dataflow core of flowrl.

A :class:`LocalIterator` is a lazy, single-consumer stream in one process; a :class:`ParallelIterator`
describes a sharded stream whose recorded transforms run inside the shard actors, and becomes local
through a gather. Internally every stage answers ``pull(block)`` with an item, ``_NOT_READY`` or
``_END``; the not-ready signal never leaves this module.

Examples:
    >>> it = from_range(4, num_shards=2)
    >>> it
    ParallelIterator[from_range[4, shards=2]]
    >>> it.gather_sync().take(4)
    [0, 2, 1, 3]
    >>> it.filter(lambda x: x < 3).gather_sync().take(4)
    [0, 2, 1]
    >>> iter_list([1, 2, 3]).union(iter_list([4, 5, 6])).take(6)
    [1, 4, 2, 5, 3, 6]
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import itertools
import logging
import math
import pickle
import random
import time
import uuid
import weakref
from collections import deque
from typing import Any, Callable, Generic, Iterable, Iterator, Sequence, TypeVar

from flowrl import runtime
from flowrl.metrics import MetricsContext, Timer

import ray  # noqa: E402,I001  (flowrl.runtime sets Ray's loopback variable before this import)
from ray import cloudpickle

__all__ = [
    "LocalIterator", "ParallelIterator", "ParallelIteratorWorker", "RetryLater", "ShardTimeoutError",
    "from_items", "from_range", "from_iterators", "from_actors", "get_metrics", "get_shard_worker",
    "MetricsContext", "Timer",
]

T = TypeVar("T")
U = TypeVar("U")
logger = logging.getLogger(__name__)


class _Signal:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self) -> str:  # never crosses a process boundary; refuse loudly if it tries
        raise TypeError(f"{self._name} is private to flowrl.iter and cannot be pickled")


class _ShardStatus:
    """An explicit end-of-stream or superseded answer from a shard (it crosses the wire by reference)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> str:
        return self.name  # unpickles to the module's singleton

    def __repr__(self) -> str:
        return self.name


SHARD_END = _ShardStatus("SHARD_END")
SHARD_SUPERSEDED = _ShardStatus("SHARD_SUPERSEDED")

_NOT_READY = _Signal("_NOT_READY")
_END = _Signal("_END")
_UNSET: Any = object()


def _no_wire() -> bool:
    return False


_BYTES_LIKE = (bytes, bytearray, memoryview)


def _to_wire(item: Any) -> Any:
    """An item as a shard answers it: ``bytes`` (one plain pickle) if its type offers ``__flowrl_wire__()`` and
    that says yes, and for every bytes-like item (which Ray would hand over as plain ``bytes``: a ``bytearray``
    item would arrive as ``bytes``), so that a ``bytes`` answer is always an encoded item; anything else as it
    is, for Ray's serialiser (zero-copy numpy, ObjectRefs with their ownership, registered serialisers). Ray
    passes ``bytes`` through without its own envelope: for a 50-row fragment that saves ~70 us of CPU per answer,
    both ends together (Ray 2.60, 2 cores). ``__flowrl_wire__`` must say yes only for an instance that plain
    pickle writes wholly in-band and that unpickles in any process with flowrl (``SampleBatch``: a small batch
    of flowrl's own class)."""
    if isinstance(item, _BYTES_LIKE) or getattr(item, "__flowrl_wire__", _no_wire)():
        return pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
    return item


def _from_wire(answer: Any) -> Any:
    """The item that :func:`_to_wire` sent."""
    return pickle.loads(answer) if type(answer) is bytes else answer


class RetryLater(Exception):
    """Raised by a ``for_each``/``combine`` function: "not now; call me again later with this item"."""


# Scoped access for plain user callables; set only for the duration of one core call.
_CURRENT_METRICS: contextvars.ContextVar[MetricsContext | None] = contextvars.ContextVar(
    "flowrl_metrics", default=None)
_CURRENT_SHARD_WORKER: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "flowrl_shard_worker", default=None)


def get_metrics() -> MetricsContext:
    """The metrics context of the dataflow whose core is calling the current user function.

    Raises:
        ValueError: when called outside a ``for_each``/``filter``/``combine`` function or hook.
    """
    ctx = _CURRENT_METRICS.get()
    if ctx is None:
        raise ValueError("Cannot access context outside an iterator.")
    return ctx


def get_shard_worker() -> Any:
    """The actor object hosting the shard whose transforms are running (``None`` elsewhere)."""
    return _CURRENT_SHARD_WORKER.get()


def _call(ctx: MetricsContext, fn: Callable[..., Any], *args: Any) -> Any:
    token = _CURRENT_METRICS.set(ctx)
    try:
        return fn(*args)
    finally:
        _CURRENT_METRICS.reset(token)


class _Backoff:
    """Sleeps 1 ms, doubling to at most 10 ms; reset after progress."""

    def __init__(self) -> None:
        self.delay = 0.001

    def wait(self) -> None:
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, 0.01)


def _check_fn(fn: Any, method: str) -> None:
    if isinstance(fn, type) and any("__call__" in vars(k) for k in fn.__mro__[:-1]):
        raise TypeError(f"{method}() got the class {fn.__name__}; pass an instance: "
                        f"{fn.__name__}(...), not {fn.__name__}")
    if not callable(fn):
        raise TypeError(f"{method}() needs a callable, got {fn!r} of type {type(fn).__name__}")


def _class_dicts(fn: Any) -> set[str]:
    return {name for k in type(fn).__mro__[:-1] for name in vars(k)}


def _label(fn: Any) -> str:
    plain = isinstance(fn, type) or inspect.isroutine(fn) or "__repr__" not in _class_dicts(fn)
    return "" if plain else repr(fn)


def _check_concurrency(max_concurrency: int) -> None:
    if not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise ValueError(f"max_concurrency={max_concurrency!r} must be an int >= 1 "
                         f"(1 runs the function in this process; k > 1 runs k Ray tasks at once)")


def _check_gather_args(num_async: int, batch_ms: float, timeout_s: float | None = None) -> None:
    if not isinstance(num_async, int) or num_async < 1:
        raise ValueError(f"num_async={num_async!r} must be an int >= 1 (requests in flight per shard)")
    if not isinstance(batch_ms, (int, float)) or batch_ms < 0:
        raise ValueError(f"batch_ms={batch_ms!r} must be >= 0 (0: one item per request)")
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or
                                  not 0 < timeout_s < math.inf):
        raise ValueError(f"timeout_s={timeout_s!r} must be a finite number of seconds > 0, or None to wait forever")


class ShardTimeoutError(TimeoutError):
    """A gather built with ``timeout_s`` waited that long for a shard that delivered nothing.

    Attributes:
        actor: the shard's actor handle (a remote rollout worker, for ``ParallelRollouts``).
        shard_index: its position among the gather's shards.
        timeout_s: the gather's ``timeout_s``.
    """

    def __init__(self, message: str, *, actor: Any, shard_index: int, timeout_s: float) -> None:
        super().__init__(message)
        self.actor, self.shard_index, self.timeout_s = actor, shard_index, timeout_s


# ---------------------------------------------------------------------------------------------
# Built stages: objects with pull(block) -> item | _NOT_READY | _END.

class _Puller:
    def pull(self, block: bool) -> Any:
        raise NotImplementedError


class _IterSource(_Puller):
    def __init__(self, source: Any, ctx: MetricsContext) -> None:
        self.ctx, self.it = ctx, iter(source() if callable(source) else source)

    def pull(self, block: bool) -> Any:
        for item in self.it:
            self.ctx.current_actor = None
            return item
        return _END


class _PollSource(_Puller):
    def __init__(self, poll_fn: Callable[[], Any], ctx: MetricsContext) -> None:
        self.poll_fn, self.ctx = poll_fn, ctx

    def pull(self, block: bool) -> Any:
        try:
            item = _call(self.ctx, self.poll_fn)
        except StopIteration:
            return _END
        if item is None:
            return _NOT_READY
        self.ctx.current_actor = None
        return item


class _ForEach(_Puller):
    def __init__(self, up: _Puller, fn: Callable[[Any], Any], ctx: MetricsContext) -> None:
        self.up, self.fn, self.ctx, self.pending, self.pending_actor = up, fn, ctx, _UNSET, None
        hook = getattr(fn, "_on_fetch_start", None)
        self.on_fetch_start = hook if callable(hook) else None
        self.fetch_started = False

    def pull(self, block: bool) -> Any:
        if self.pending is _UNSET:
            if self.on_fetch_start is not None and not self.fetch_started:
                _call(self.ctx, self.on_fetch_start)
                self.fetch_started = True
            item = self.up.pull(block)
            if item is _NOT_READY or item is _END:
                return item
            self.pending, self.fetch_started, self.pending_actor = item, False, self.ctx.current_actor
        else:  # a retried item: other branches may have moved current_actor since it was fetched
            self.ctx.current_actor = self.pending_actor
        try:
            out = _call(self.ctx, self.fn, self.pending)
        except RetryLater:
            return _NOT_READY
        self.pending = _UNSET
        return out


class _ConcurrentForEach(_Puller):
    """``for_each(fn, max_concurrency=k)``: fn runs as Ray tasks, k in flight, completion order."""

    def __init__(self, up: _Puller, fn: Callable[[Any], Any], k: int, resources: dict[str, Any]) -> None:
        self.up, self.k, self.ended = up, k, False
        self.remote_fn = ray.remote(fn).options(**resources) if resources else ray.remote(fn)
        self.inflight: list[Any] = []
        self.done: deque[Any] = deque()

    def pull(self, block: bool) -> Any:
        while True:
            if self.done:
                return self.done.popleft()
            if not self.ended and len(self.inflight) < self.k:
                item = self.up.pull(block if not self.inflight else False)
                if item is _END:
                    self.ended = True
                elif item is not _NOT_READY:
                    self.inflight.append(self.remote_fn.remote(item))
                    continue
                elif not self.inflight:
                    return _NOT_READY
            if not self.inflight:
                return _END
            ready, self.inflight = ray.wait(self.inflight, num_returns=1, timeout=None if block else 0)
            if not ready:
                return _NOT_READY
            self.done.extend(ray.get(ready))


class _Filter(_Puller):
    def __init__(self, up: _Puller, fn: Callable[[Any], Any], ctx: MetricsContext) -> None:
        self.up, self.fn, self.ctx = up, fn, ctx

    def pull(self, block: bool) -> Any:
        while True:
            item = self.up.pull(block)
            if item is _NOT_READY or item is _END or _call(self.ctx, self.fn, item):
                return item


class _Batch(_Puller):
    def __init__(self, up: _Puller, n: int) -> None:
        self.up, self.n = up, n
        self.buf: list[Any] = []

    def pull(self, block: bool) -> Any:
        while len(self.buf) < self.n:
            item = self.up.pull(block)
            if item is _NOT_READY:
                return item
            if item is _END:
                if not self.buf:
                    return _END
                break
            self.buf.append(item)
        out, self.buf = self.buf, []
        return out


class _Flatten(_Puller):
    def __init__(self, up: _Puller) -> None:
        self.up = up
        self.pending: Iterator[Any] = iter(())

    def pull(self, block: bool) -> Any:
        while True:
            for element in self.pending:
                return element
            item = self.up.pull(block)
            if item is _NOT_READY or item is _END:
                return item
            self.pending = iter(item)


class _Shuffle(_Puller):
    def __init__(self, up: _Puller, size: int, seed: int | None) -> None:
        self.up, self.size, self.rng, self.ended = up, size, random.Random(seed), False
        self.buf: list[Any] = []

    def pull(self, block: bool) -> Any:
        while not self.ended:
            item = self.up.pull(block)
            if item is _NOT_READY:
                return item
            if item is _END:
                self.ended = True
                self.rng.shuffle(self.buf)
            elif len(self.buf) < self.size:
                self.buf.append(item)
            else:
                i = self.rng.randrange(self.size)
                out, self.buf[i] = self.buf[i], item
                return out
        return self.buf.pop() if self.buf else _END


class _Transform(_Puller):
    def __init__(self, up: _Puller, fn: Callable[[Iterable[Any]], Iterable[Any]],
                 ctx: MetricsContext) -> None:
        self.ctx = ctx
        self.out = iter(_call(ctx, fn, _blocking_items(up)))

    def pull(self, block: bool) -> Any:
        return _call(self.ctx, next, self.out, _END)


def _blocking_items(up: _Puller) -> Iterator[Any]:
    """The real items of ``up``, waiting with backoff whenever it reports not-ready."""
    backoff = _Backoff()
    while (item := up.pull(True)) is not _END:
        if item is _NOT_READY:
            backoff.wait()
        else:
            backoff = _Backoff()
            yield item


class _NoneAsNotReady(_Puller):
    def __init__(self, up: _Puller) -> None:
        self.up = up

    def pull(self, block: bool) -> Any:
        item = self.up.pull(block)
        return _NOT_READY if item is None else item


class _ZipWithSourceActor(_Puller):
    def __init__(self, up: _Puller, ctx: MetricsContext) -> None:
        self.up, self.ctx = up, ctx

    def pull(self, block: bool) -> Any:
        item = self.up.pull(block)
        if item is _NOT_READY or item is _END:
            return item
        if self.ctx.current_actor is None:
            raise ValueError("Could not identify source actor of item")
        return self.ctx.current_actor, item


class _Stage:
    """A recorded stage: its name suffix and how to build it around an upstream puller."""

    def __init__(self, suffix: str, build: Callable[[_Puller, MetricsContext], _Puller],
                 fn: Any = None) -> None:
        self.suffix, self.build, self.fn = suffix, build, fn


class _Origin:
    """Where a LocalIterator's stream starts, recorded at plan-build time for :mod:`flowrl.plan_graph`.

    ``kind`` is ``"source"``, ``"gather"`` (``inputs``: the ParallelIterator), ``"union"``, ``"duplicate"``
    (``inputs``: the duplicated iterator) or ``"named"``; ``attrs`` hold the arguments that shape the flow.
    """

    def __init__(self, kind: str, label: str, inputs: tuple[Any, ...] = (), **attrs: Any) -> None:
        self.kind, self.label, self.inputs, self.attrs = kind, label, inputs, attrs


# ---------------------------------------------------------------------------------------------
# The shared metrics cell: iterators of one lineage share a cell; union re-points cells at one flow.

class _Flow:
    def __init__(self) -> None:
        self.metrics = MetricsContext()
        self.callbacks: list[Callable[[], Any]] = []
        self.cells: list[_Cell] = []
        self.profiler: Any = None  # flowrl.profiling: when set, it wraps each stage as the chain is built

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "callbacks": [], "profiler": None}  # both stay in their process


class _Cell:
    def __init__(self) -> None:
        self.flow = _Flow()
        self.flow.cells.append(self)


def _merge(cells: Sequence[_Cell]) -> None:
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


# ---------------------------------------------------------------------------------------------

class LocalIterator(Generic[T]):
    """A lazy, single-consumer stream in one process.

    Operators return new iterators that share this one's source factory and metrics context.
    Nothing runs until the first pull; iteration yields real items only.

    Examples:
        >>> it = iter_list([1, 2, 3, 4]).for_each(lambda x: x * 10).filter(lambda x: x > 10)
        >>> it
        LocalIterator[iter_list.for_each().filter()]
        >>> list(it.batch(2))
        [[20, 30], [40]]
    """

    stall_warning_s: float = 60.0

    def __init__(self, source: Callable[[MetricsContext], _Puller], name: str, *, cell: _Cell | None = None,
                 stages: tuple[_Stage, ...] = (), has_duplicate: bool = False, origin: _Origin | None = None) -> None:
        self._source, self._name, self._stages = source, name, stages
        self._origin = origin if origin is not None else _Origin("source", name)
        self._cell = cell if cell is not None else _Cell()
        self._has_duplicate = has_duplicate
        self._chain: _Puller | None = None
        self._consumed_by: LocalIterator[Any] | None = None

    # -- sources --------------------------------------------------------------------------------
    @staticmethod
    def from_iterable(source: Iterable[T] | Callable[[], Iterable[T]], name: str | None = None) -> LocalIterator[T]:
        """A blocking source over an iterable, or a zero-argument callable returning one."""
        return LocalIterator(functools.partial(_IterSource, source), name or "from_iterable")

    @staticmethod
    def from_poll(poll_fn: Callable[[], T | None], name: str | None = None) -> LocalIterator[T]:
        """A non-blocking source: ``poll_fn()`` returns an item, ``None`` (not ready), or raises StopIteration.

        Examples:
            >>> items = iter([None, 1, None, 2])
            >>> LocalIterator.from_poll(lambda: next(items)).take(5)
            [1, 2]
        """
        return LocalIterator(functools.partial(_PollSource, poll_fn), name or "from_poll")

    get_metrics = staticmethod(get_metrics)

    # -- building and consumption -----------------------------------------------------------------
    def _derive(self, stage: _Stage) -> LocalIterator[Any]:
        return LocalIterator(self._source, self._name + stage.suffix, cell=self._cell,
                             stages=self._stages + (stage,), has_duplicate=self._has_duplicate, origin=self._origin)

    def _build(self) -> _Puller:
        flow = self._cell.flow
        wrap = flow.profiler.wrap if flow.profiler is not None else lambda record, puller: puller
        puller: _Puller = wrap(self._origin, self._source(flow.metrics))
        for stage in self._stages:
            if callable(getattr(stage.fn, "bind", None)):
                stage.fn.bind(flow.metrics)
            puller = wrap(stage, stage.build(puller, flow.metrics))
        return puller

    def _pull(self, block: bool) -> Any:
        if self._chain is None:
            if self._consumed_by is not None:
                raise RuntimeError(f"{self!r} is an input of {self._consumed_by!r}, which consumes it; "
                                   f"pull the union, or duplicate() the stream to read it twice")
            self._chain = self._build()
        return self._chain.pull(block)

    def __iter__(self) -> LocalIterator[T]:
        return self

    def __next__(self) -> T:
        backoff, since, warned = _Backoff(), time.monotonic(), False
        while True:
            item = self._pull(True)
            if item is _END:
                raise StopIteration
            if item is not _NOT_READY:
                return item  # type: ignore[no-any-return]  # a real item of the stream
            if not warned and time.monotonic() - since > self.stall_warning_s:
                logger.warning("%r has produced no item for %.1f s; is a source stalled, or a "
                               "duplicate() child consumed without its siblings?", self, self.stall_warning_s)
                warned = True
            backoff.wait()

    def take(self, n: int) -> list[T]:
        """Pulls up to ``n`` items from this iterator (advancing it)."""
        return list(itertools.islice(self, n))

    def show(self, n: int = 20) -> None:
        """Prints up to ``n`` items, one per line."""
        for item in itertools.islice(self, n):
            print(item)

    @property
    def metrics(self) -> MetricsContext:
        """The dataflow's shared metrics context."""
        return self._cell.flow.metrics

    def named(self, name: str, *, inputs: Sequence[LocalIterator[Any]] | None = None,
              **attrs: Any) -> LocalIterator[T]:
        """The same stream (same stages, same metrics) under a new name: for sources built by
        composition, e.g. ``ParallelRollouts(bulk_sync)``.

        :meth:`describe` shows it as one node over its own stages, or over ``inputs`` when given (the
        sub-flows of a combinator such as ``Concurrently``; ``()`` makes it a source); ``attrs`` are
        recorded on that node for plan inspection.

        Examples:
            >>> iter_list([1, 2]).for_each(lambda x: x).named("Two")
            LocalIterator[Two]
        """
        origin = _Origin("named", name, (self,) if inputs is None else tuple(inputs), **attrs)
        return LocalIterator(functools.partial(_build_of, self), name, cell=self._cell,
                             has_duplicate=self._has_duplicate, origin=origin)

    def on_close(self, fn: Callable[[], Any]) -> LocalIterator[T]:
        """Registers a zero-argument callback run by :meth:`close` (newest first); returns ``self``."""
        if not callable(fn):
            raise TypeError(f"on_close() needs a zero-argument callable, got {fn!r}")
        self._cell.flow.callbacks.append(fn)
        return self

    def close(self) -> None:
        """Runs every registered close callback once, newest first; re-raises the first error."""
        callbacks, self._cell.flow.callbacks = self._cell.flow.callbacks, []
        error: BaseException | None = None
        for fn in reversed(callbacks):
            try:
                fn()
            except Exception as e:  # run them all, then report the first failure
                error = error or e
        if error is not None:
            raise error

    def __getstate__(self) -> dict[str, Any]:
        if self._chain is not None:
            raise TypeError(f"{self!r} has already been pulled and holds live state; pickle it before "
                            f"the first pull, or pickle the ParallelIterator it gathers")
        return self.__dict__

    def __repr__(self) -> str:
        return f"LocalIterator[{self._name}]"

    # -- inspection (flowrl.plan_graph; it imports this module, hence the local imports) ---------
    def describe(self) -> str:
        """The plan's operator graph as a text tree (:func:`flowrl.plan_graph.to_text`): the output on top,
        each stage's upstream below it; a union's inputs (``[i]``), a composite's internals and the producers
        of a queue (``<~``) indented. A stream read by several consumers (a ``duplicate()`` parent) is shown
        once, tagged ``@k``, and referred to by that tag afterwards.

        Examples:
            >>> a, b = iter_list([1, 2]).duplicate(2)
            >>> print(a.for_each(abs).union(b, deterministic=True).describe())
            LocalUnion(round_robin)
              [0] for_each()
                  duplicate[0]
                  iter_list @1
              [1] duplicate[1]
                  iter_list @1 (shown above)
        """
        from flowrl import plan_graph
        return plan_graph.to_text(plan_graph.build(self))

    def validate(self) -> None:
        """Checks the plan before launch; raises ``ValueError`` listing every problem with its fix.

        See :func:`flowrl.plan_graph.problems` for what it checks.

        Examples:
            >>> a, b = iter_list([1, 2]).duplicate(2)
            >>> a.for_each(abs).validate()
            Traceback (most recent call last):
            ...
            ValueError: the plan has 1 problem:
            - duplicate[1] of iter_list is never consumed by the plan: ...
        """
        from flowrl import plan_graph
        found = plan_graph.problems(plan_graph.build(self), self.metrics)
        if found:
            raise ValueError(f"the plan has {len(found)} problem{'s' if len(found) > 1 else ''}:\n- "
                             + "\n- ".join(found))

    def profile(self) -> str:
        """The per-operator profile as a table lined up with :meth:`describe`: items in and out, seconds in each
        operator and waiting for its upstream, share of wall time, and queue depths, requests in flight and
        staleness where known (:func:`flowrl.profiling.table`). Turn profiling on before the first pull with
        :func:`flowrl.profiling.enable` (``TrainerConfig(profile=True)`` does it for a trainer's plan).

        Examples:
            >>> from flowrl import profiling
            >>> it = profiling.enable(iter_list([1, 2, 3]).for_each(abs))
            >>> it.take(3)
            [1, 2, 3]
            >>> print(it.profile())  # doctest: +ELLIPSIS
            profile: ... s of wall time since the first pull (cumulative)
            | operator | in | out | in op s | waiting s | wall % |
            |:...|
            | for_each() | 3 | 3 | ... |
            | iter_list | - | 3 | ... |
            | (outside the stages) | | | ... |
            (outside the stages: wall time when no operator of the plan ran, ...
        """
        from flowrl import profiling
        return profiling.table(self)

    # -- transforms ----------------------------------------------------------------------------
    def for_each(self, fn: Callable[[T], U], max_concurrency: int = 1,
                 resources: dict[str, Any] | None = None) -> LocalIterator[U]:
        """Maps ``fn`` over items; ``fn`` may raise :class:`RetryLater` to be called again later.

        Examples:
            >>> calls = []
            >>> def once_later(x):
            ...     calls.append(x)
            ...     if calls.count(x) == 1:
            ...         raise RetryLater
            ...     return 10 * x
            >>> iter_list([1, 2, 3]).for_each(once_later).take(3), calls
            ([10, 20, 30], [1, 1, 2, 2, 3, 3])
        """
        _check_fn(fn, "for_each")
        _check_concurrency(max_concurrency)
        if max_concurrency == 1:
            return self._derive(_Stage(f".for_each({_label(fn)})", lambda up, ctx: _ForEach(up, fn, ctx), fn))
        res = dict(resources or {})
        return self._derive(_Stage(f".for_each({_label(fn)})",
                                   lambda up, ctx: _ConcurrentForEach(up, fn, max_concurrency, res)))

    def filter(self, fn: Callable[[T], Any]) -> LocalIterator[T]:
        """Keeps items for which ``fn(item)`` is truthy."""
        _check_fn(fn, "filter")
        return self._derive(_Stage(f".filter({_label(fn)})", lambda up, ctx: _Filter(up, fn, ctx), fn))

    def batch(self, n: int) -> LocalIterator[list[T]]:
        """Lists of ``n`` items; the final partial list is emitted at the end."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"batch(n={n!r}) needs an int n >= 1")
        return self._derive(_Stage(f".batch({n})", lambda up, ctx: _Batch(up, n)))

    def flatten(self) -> LocalIterator[Any]:
        """Yields the elements of each iterable item."""
        return self._derive(_Stage(".flatten()", lambda up, ctx: _Flatten(up)))

    def combine(self, fn: Callable[[T], Iterable[U]]) -> LocalIterator[U]:
        """Flat-map: ``fn`` returns a list of 0..k outputs per input.

        Examples:
            >>> iter_list([1, 2, 3]).combine(lambda x: [x] * (x - 1)).take(5)
            [2, 3, 3]
        """
        _check_fn(fn, "combine")
        return self._derive(_Stage(f".combine({_label(fn)})",
                                   lambda up, ctx: _Flatten(_ForEach(up, fn, ctx)), fn))

    def transform(self, fn: Callable[[Iterable[T]], Iterable[U]]) -> LocalIterator[U]:
        """Applies ``fn(Iterable[T]) -> Iterable[U]`` once; its input blocks until items are ready.

        Examples:
            >>> iter_list([1, 2, 3]).transform(lambda xs: (x + 1 for x in xs)).take(3)
            [2, 3, 4]
        """
        _check_fn(fn, "transform")
        if self._has_duplicate:
            raise ValueError(f"transform() on {self!r}: its lineage contains a duplicate() child, and a "
                             f"blocking transform would deadlock against its siblings; use for_each/combine")
        return self._derive(_Stage(f".transform({_label(fn)})", lambda up, ctx: _Transform(up, fn, ctx), fn))

    def shuffle(self, shuffle_buffer_size: int, seed: int | None = None) -> LocalIterator[T]:
        """Buffered shuffle with ``random.Random(seed)``; a buffer of 1 is the identity."""
        if not isinstance(shuffle_buffer_size, int) or shuffle_buffer_size < 1:
            raise ValueError(f"shuffle_buffer_size={shuffle_buffer_size!r} must be an int >= 1")
        return self._derive(_Stage(f".shuffle(shuffle_buffer_size={shuffle_buffer_size}, seed={seed})",
                                   lambda up, ctx: _Shuffle(up, shuffle_buffer_size, seed)))

    def none_as_not_ready(self) -> LocalIterator[T]:
        """A ``None`` item is consumed and reported as "nothing yet"; other items pass."""
        return self._derive(_Stage(".none_as_not_ready()", lambda up, ctx: _NoneAsNotReady(up)))

    def zip_with_source_actor(self) -> LocalIterator[tuple[Any, T]]:
        """Maps each item to ``(current_actor, item)``."""
        return self._derive(_Stage(".zip_with_source_actor()", lambda up, ctx: _ZipWithSourceActor(up, ctx)))

    # -- fan-out and fan-in ----------------------------------------------------------------------
    def duplicate(self, n: int) -> list[LocalIterator[T]]:
        """``n`` children over one stream; a child ahead of its siblings waits (queues hold <= 1 item).

        Examples:
            >>> a, b = iter_list([1, 2, 3]).duplicate(2)
            >>> a.union(b, deterministic=True).take(6)
            [1, 1, 2, 2, 3, 3]
        """
        if not isinstance(n, int) or n < 2:
            raise ValueError(f"duplicate(n={n!r}) needs n >= 2; use the iterator itself for one consumer")
        state = _DuplicateState(self, n)
        return [LocalIterator(functools.partial(_DuplicateChild, state, i), f"{self._name}.duplicate[{i}]",
                              cell=self._cell, has_duplicate=True,
                              origin=_Origin("duplicate", f"duplicate[{i}]", (self,), index=i, n=n))
                for i in range(n)]

    def union(self, *others: LocalIterator[T], deterministic: bool = False,
              round_robin_weights: Sequence[float | str] | None = None) -> LocalIterator[T]:
        """Interleaves this and ``others``, merging their metrics contexts.

        Examples:
            >>> ones, twos, threes = iter_list([1] * 3), iter_list([2] * 3), iter_list([3] * 3)
            >>> ones.union(twos, threes, round_robin_weights=[3, 1, 2]).take(9)
            [1, 1, 1, 2, 3, 3, 2, 3, 2]
        """
        inputs = [self, *others]
        if not others:
            raise ValueError("union() needs at least one other iterator")
        for it in others:
            if not isinstance(it, LocalIterator):
                raise TypeError(f"LocalIterator.union() got {type(it).__name__}; every input must be a "
                                f"LocalIterator (gather a ParallelIterator first, or use ParallelIterator.union)")
        if len({id(it) for it in inputs}) < len(inputs):
            raise ValueError("union() got the same iterator twice; use duplicate() to consume one stream twice")
        quotas = _union_quotas(len(inputs), deterministic, round_robin_weights)
        _merge([it._cell for it in inputs])
        name = "LocalUnion[" + ", ".join(repr(it) for it in inputs) + "]"
        mode = "round_robin" if deterministic or round_robin_weights is not None else "async"
        origin = _Origin("union", "LocalUnion", tuple(inputs), mode=mode, round_robin_weights=round_robin_weights)
        union: LocalIterator[T] = LocalIterator(lambda ctx: _Union([it._build() for it in inputs], quotas), name,
                                                cell=self._cell, has_duplicate=any(it._has_duplicate for it in inputs),
                                                origin=origin)
        for it in inputs:
            it._consumed_by = union
        return union


def _union_quotas(n: int, deterministic: bool,
                  weights: Sequence[float | str] | None) -> list[tuple[bool, float | str]]:
    """(blocking pull?, weight) per input: weight 1 unweighted, a number, or "*"."""
    if weights is None:
        return [(deterministic, 1)] * n
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence) or len(weights) != n:
        raise ValueError(f"round_robin_weights={weights!r} must have one entry per input ({n})")
    for w in weights:
        ok = w == "*" or (isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w > 0)
        if not ok:
            raise ValueError(f"round_robin_weights entry {w!r} is invalid; use a positive finite number "
                             f"(pulls per turn) or '*' (drain whatever is ready)")
    return [(w != "*", w) for w in weights]


class _Union(_Puller):
    def __init__(self, inputs: list[_Puller], quotas: list[tuple[bool, float | str]]) -> None:
        self.active = [(up, blocking, w) for up, (blocking, w) in zip(inputs, quotas)]
        self.rng = random.Random(0)
        self.idx, self.left, self.idle_turns, self.emitted = 0, -1, 0, False

    def _quota(self, w: float | str) -> int:
        if w == "*":
            return 100
        assert isinstance(w, (int, float))
        whole = math.floor(w)
        return whole + (1 if self.rng.random() < w - whole else 0)

    def _end_turn(self) -> None:
        self.idle_turns = 0 if self.emitted else self.idle_turns + 1
        self.idx, self.left, self.emitted = self.idx + 1, -1, False

    def pull(self, block: bool) -> Any:
        while self.active:
            if self.idx >= len(self.active):
                self.idx = 0
            up, blocking, w = self.active[self.idx]
            if self.left < 0:
                self.left = self._quota(w)
            if self.left == 0:
                self._end_turn()
            else:
                item = up.pull(blocking)
                if item is _END:
                    del self.active[self.idx]
                    self.left, self.emitted = -1, False
                elif item is _NOT_READY:
                    self._end_turn()
                    if not block:
                        return _NOT_READY
                else:
                    self.left -= 1
                    self.emitted = True
                    if self.left == 0:
                        self._end_turn()
                    return item
            if self.active and self.idle_turns >= len(self.active):
                self.idle_turns = 0
                return _NOT_READY
        return _END


def _build_of(it: LocalIterator[Any], ctx: MetricsContext) -> _Puller:
    """The source of a named iterator: the built chain of the iterator it renames."""
    return it._build()


class _DuplicateState:
    def __init__(self, parent: LocalIterator[Any], n: int) -> None:
        self.parent = parent
        self.queues: list[deque[tuple[Any, Any]]] = [deque() for _ in range(n)]
        self.chain: _Puller | None = None
        self.ended = False


class _DuplicateChild(_Puller):
    def __init__(self, state: _DuplicateState, i: int, ctx: MetricsContext) -> None:
        self.state, self.queue, self.ctx = state, state.queues[i], ctx

    def pull(self, block: bool) -> Any:
        state = self.state
        if not self.queue:
            if any(state.queues):
                return _NOT_READY  # ahead of a sibling: never grow its queue
            if state.ended:
                return _END
            if state.chain is None:
                state.chain = state.parent._build()
            item = state.chain.pull(block)
            if item is _NOT_READY:
                return item
            if item is _END:
                state.ended = True
                return item
            for q in state.queues:
                q.append((item, self.ctx.current_actor))
        item, self.ctx.current_actor = self.queue.popleft()
        return item


# ---------------------------------------------------------------------------------------------
# Shards: the worker protocol and the actor the constructors create.

_Transforms = tuple[tuple[str, tuple[Any, ...]], ...]


class ParallelIteratorWorker:
    """Mixin that makes an actor class a shard source.

    Args:
        item_source: an iterable, or a zero-argument callable returning one (called once, on the
            first initialisation). Lists and ranges restart at every initialisation; generators continue.
        repeat: cycle the source forever (it must be re-iterable).

    Answers are the item (or a list of items) itself, or an explicit status value, ``SHARD_END`` or
    ``SHARD_SUPERSEDED``; end of stream never crosses the wire as an exception. (Not ``("ok", item)``
    tuples: a tuple costs ~10% of a Ray call on a 2-core machine,
    so the common answer is the bare item.) Items that offer it travel as one plain pickle
    (:func:`_to_wire`); the gathers decode them.
    """

    def __init__(self, item_source: Any, repeat: bool = False) -> None:
        self._par_source, self._par_repeat = item_source, repeat
        self._par_items: Any = _UNSET
        self._par_it: LocalIterator[Any] | None = None
        self._par_gen: Any = None
        self._par_slices: tuple[int, list[deque[Any]]] | None = None
        self._par_pos = 0

    def _par_items_now(self) -> Iterable[Any]:
        if self._par_items is _UNSET:
            src = self._par_source
            items = src() if callable(src) else src
            if self._par_repeat:
                if iter(items) is items:
                    raise ValueError("repeat=True needs a re-iterable source (a list, a range, or a callable "
                                     "returning one), not a bare iterator that cannot restart")
                items = itertools.chain.from_iterable(itertools.repeat(items))
            self._par_items = items
        return self._par_items  # type: ignore[no-any-return]  # an iterable, set above

    def par_iter_init(self, transforms: _Transforms, generation: Any) -> None:
        """Builds the shard's local chain over its items with ``transforms``; serves ``generation``."""
        it: LocalIterator[Any] = LocalIterator.from_iterable(self._par_items_now(), name="shard")
        for method, args in transforms:
            it = getattr(it, method)(*args)
        self._par_it, self._par_gen, self._par_slices, self._par_pos = it, generation, None, 0

    def _par_next(self) -> Any:
        assert self._par_it is not None  # par_iter_init ran: generations matched
        token = _CURRENT_SHARD_WORKER.set(self)
        try:
            return next(self._par_it, _END)
        finally:
            _CURRENT_SHARD_WORKER.reset(token)

    def _par_collect(self, next_item: Callable[[], Any], batch_ms: float) -> Any:
        deadline = time.monotonic() + batch_ms / 1000
        items: list[Any] = []
        while not items or time.monotonic() < deadline:
            item = next_item()
            if item is _END:
                return items if items else SHARD_END
            items.append(_to_wire(item))
        return items

    def par_iter_next(self, generation: Any = None) -> Any:
        """The next item, or the explicit ``SHARD_END`` / ``SHARD_SUPERSEDED`` status value.

        Without ``generation`` it serves the current chain: the core's one-item fast path, whose
        requests carry no argument (each argument costs a measurable share of a Ray call), and which
        detects concurrent gathers on the driver instead.
        """
        if generation is not None and generation != self._par_gen:
            return SHARD_SUPERSEDED
        item = self._par_next()
        return SHARD_END if item is _END else _to_wire(item)

    def par_iter_next_batch(self, generation: Any, batch_ms: float) -> Any:
        """A list of items collected for up to ``batch_ms`` (one if 0), or a status value."""
        if generation != self._par_gen:
            return SHARD_SUPERSEDED
        if batch_ms <= 0:
            item = self._par_next()
            return SHARD_END if item is _END else [_to_wire(item)]
        return self._par_collect(self._par_next, batch_ms)

    def par_iter_slice_batch(self, generation: Any, step: int, start: int, batch_ms: float) -> Any:
        """Like :meth:`par_iter_next_batch` over the items at positions ``start (mod step)``."""
        if generation != self._par_gen:
            return SHARD_SUPERSEDED
        if self._par_slices is None or self._par_slices[0] != step:
            self._par_slices = (step, [deque() for _ in range(step)])
        buffers = self._par_slices[1]

        def next_slice_item() -> Any:
            while not buffers[start]:  # deal the next items by stream position
                item = self._par_next()
                if item is _END:
                    return _END
                buffers[self._par_pos % step].append(item)
                self._par_pos += 1
            return buffers[start].popleft()

        return self._par_collect(next_slice_item, batch_ms)


class _ShardActor(ParallelIteratorWorker):
    def ping(self) -> str:
        return "ok"


_RemoteShard = ray.remote(_ShardActor)


def _new_generation() -> str:
    return uuid.uuid4().hex


def _make_shards(sources: Sequence[Any], repeat: bool, actor_options: dict[str, Any] | None) -> list[Any]:
    runtime.ensure_initialized()
    options = runtime.actor_options(**{"num_cpus": 0, **(actor_options or {})})
    return [_RemoteShard.options(**options).remote(src, repeat) for src in sources]


# ---------------------------------------------------------------------------------------------
# Gathers.

class _ActorSet:
    def __init__(self, actors: list[Any], transforms: _Transforms = ()) -> None:
        self.actors, self.transforms = actors, transforms

    def with_transform(self, method: str, *args: Any) -> _ActorSet:
        return _ActorSet(self.actors, self.transforms + ((method, args),))


# The gather that last initialised each shard actor (by actor id), so that an older gather in this
# process learns it was superseded before it sends another argument-free request.
_ACTIVE_GATHERS: weakref.WeakValueDictionary[str, _GatherSource] = weakref.WeakValueDictionary()


class _GatherSource(_Puller):
    def __init__(self, pi: ParallelIterator[Any], timeout_s: float | None = None) -> None:
        self.name, self.pairs = repr(pi), pi._pairs()
        self.generation: str | None = None
        self.superseded = False
        self.timeout_s = timeout_s

    def _timed_out(self, actor: Any) -> ShardTimeoutError:
        index = next(i for i, (a, _) in enumerate(self.pairs) if a == actor)
        return ShardTimeoutError(f"{self.name}: shard {index} delivered nothing for {self.timeout_s:g} s "
                                 f"(timeout_s={self.timeout_s:g})", actor=actor, shard_index=index,
                                 timeout_s=float(self.timeout_s or 0))

    def _init(self) -> None:
        self.generation = _new_generation()
        ray.get([actor.par_iter_init.remote(transforms, self.generation) for actor, transforms in self.pairs])
        for actor, _ in self.pairs:
            key = actor._actor_id.hex()
            previous = _ACTIVE_GATHERS.get(key)
            if previous is not None and previous is not self:
                previous.superseded = True
            _ACTIVE_GATHERS[key] = self

    def _check(self, status: Any = None) -> None:
        if self.superseded or status is SHARD_SUPERSEDED:
            raise RuntimeError(f"{self.name}: shard re-initialised by another gather; only one gather may "
                               f"be active per shard (derive one gather and duplicate() it to consume twice)")


class _BarrierSource(_GatherSource):
    """batch_across_shards: one request per live shard per round, lists in shard order, no prefetch."""

    def __init__(self, pi: ParallelIterator[Any], ctx: MetricsContext, timeout_s: float | None = None) -> None:
        super().__init__(pi, timeout_s)
        self.ctx = ctx
        self.round: list[Any] | None = None
        self.round_deadline = math.inf
        self.active = [a for a, _ in self.pairs]

    def _wait_round(self, block: bool) -> bool:
        """Whether every request of the round is done; raises when ``timeout_s`` passed with one still out."""
        assert self.round is not None
        if block and self.timeout_s is None:
            return True  # the caller's ray.get waits
        while True:
            timeout = max(0.0, self.round_deadline - time.monotonic()) if block else 0
            ready, _ = ray.wait(self.round, num_returns=len(self.round), timeout=timeout)
            if len(ready) == len(self.round):
                return True
            if time.monotonic() >= self.round_deadline:
                done = set(ready)
                raise self._timed_out(next(a for a, ref in zip(self.active, self.round) if ref not in done))
            if not block:
                return False

    def pull(self, block: bool) -> Any:
        if self.generation is None:
            self._init()
        while True:
            if self.round is None:
                self._check()
                if not self.active:
                    return _END
                self.round = [a.par_iter_next.remote() for a in self.active]
                if self.timeout_s is not None:
                    self.round_deadline = time.monotonic() + self.timeout_s
            if not self._wait_round(block):
                return _NOT_READY
            results, self.round = [_from_wire(r) for r in ray.get(self.round)], None
            items = [r for r in results if not isinstance(r, _ShardStatus)]
            self.active = [a for a, r in zip(self.active, results) if not isinstance(r, _ShardStatus)]
            if items:
                self.ctx.current_actor = None
                return items


class _AsyncSource(_GatherSource):
    """gather_async / get_shard: <= num_async requests per shard, resubmitted before yielding."""

    def __init__(self, pi: ParallelIterator[Any], ctx: MetricsContext, num_async: int, batch_ms: float,
                 in_order: bool = False, timeout_s: float | None = None) -> None:
        super().__init__(pi, timeout_s)
        self.ctx, self.num_async, self.batch_ms, self.in_order = ctx, num_async, batch_ms, in_order
        self.refs: dict[Any, Any] = {}  # outstanding ref -> actor, in submission order
        self.submitted: dict[Any, float] = {}  # outstanding ref -> when it was submitted (with timeout_s only)
        self.done: deque[tuple[Any, Any]] = deque()  # (actor, result) completed, not yet processed
        self.items: deque[tuple[Any, Any]] = deque()
        self.direct_waits = 0  # blocking waits since the last probe for every finished request

    def _submit(self, actor: Any) -> None:
        self._check()
        if self.batch_ms > 0:
            ref = actor.par_iter_next_batch.remote(self.generation, self.batch_ms)
        else:  # one item per request, no arguments: the cheapest Ray call there is
            ref = actor.par_iter_next.remote()
        self.refs[ref] = actor
        if self.timeout_s is not None:
            self.submitted[ref] = time.monotonic()

    def _check_late(self, refs: list[Any], ready: list[Any]) -> None:
        """Raises :class:`ShardTimeoutError` for the oldest request not in ``ready`` once ``timeout_s`` passed
        since its submission (a request may wait behind its shard's earlier ones: ``refs`` is oldest first)."""
        assert self.timeout_s is not None
        now = time.monotonic()
        if now < self.submitted[refs[0]] + self.timeout_s:
            return  # not even the oldest request is late
        done = set(ready)
        late = next((ref for ref in refs if ref not in done), None)
        if late is not None and now >= self.submitted[late] + self.timeout_s:
            raise self._timed_out(self.refs[late])

    def _wait(self, block: bool) -> bool:
        refs = list(self.refs)
        if self.in_order:  # one shard, FIFO: only the head may complete next
            refs = refs[:1]
        while True:
            # a blocking wait ends by the oldest request's deadline (it returns nothing then, and the check raises)
            timeout = None if self.timeout_s is None else \
                max(0.0, self.submitted[refs[0]] + self.timeout_s - time.monotonic())
            if block and 0 < self.direct_waits < len(refs):
                # starved: the next completion (~4 us once one is done; a probe that times out costs ~80 us on
                # Ray 2.60); a probe every len(refs) waits takes every finished request, so none is passed over
                ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
                self.direct_waits += 1
            else:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                self.direct_waits = 0
                if self.timeout_s is not None:
                    self._check_late(refs, ready)
                if not ready:
                    if not block:
                        return False
                    ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
                    self.direct_waits = 1
            if ready:
                break
            self._check_late(refs, ready)  # (only with timeout_s: the blocking wait ran out)
        for ref, result in zip(ready, ray.get(ready)):
            self.done.append((self.refs.pop(ref), result))
            self.submitted.pop(ref, None)
        return True

    def pull(self, block: bool) -> Any:
        if self.generation is None:
            self._init()
            for actor, _ in self.pairs:
                for _ in range(self.num_async):
                    self._submit(actor)
        while not self.items:
            if not self.done:
                if not self.refs:
                    return _END
                if not self._wait(block):
                    return _NOT_READY
            actor, result = self.done.popleft()
            self._check(result)
            if result is not SHARD_END:
                self._submit(actor)
                if self.batch_ms > 0:
                    self.items.extend((_from_wire(item), actor) for item in result)
                else:
                    self.items.append((_from_wire(result), actor))
        item, self.ctx.current_actor = self.items.popleft()
        return item


def _sliced_stream(actors: list[Any], generation: str, step: int, start: int,
                   batch_ms: float) -> Iterator[Any]:
    """A repartition partition: positions ``start (mod step)`` of every source shard, as they arrive."""
    refs = {a.par_iter_slice_batch.remote(generation, step, start, batch_ms): a for a in actors}
    while refs:
        ready, _ = ray.wait(list(refs), num_returns=1)
        actor = refs.pop(ready[0])
        result = ray.get(ready[0])
        if result is SHARD_SUPERSEDED:
            raise RuntimeError("repartition source shard re-initialised by another gather")
        if result is not SHARD_END:
            refs[actor.par_iter_slice_batch.remote(generation, step, start, batch_ms)] = actor
            yield from map(_from_wire, result)


class ParallelIterator(Generic[T]):
    """A description of a sharded stream; transforms are recorded and run inside the shards.

    Not iterable: gather it (``gather_sync``, ``gather_async``, ``batch_across_shards``,
    ``get_shard``) to get a :class:`LocalIterator`.

    Examples:
        >>> pi = from_items([1, 2, 3, 4], num_shards=2).for_each(lambda x: x * 10)
        >>> pi
        ParallelIterator[from_items[int, 4, shards=2].for_each()]
        >>> sorted(pi.gather_async().take(4))
        [10, 20, 30, 40]
        >>> pi.batch_across_shards().take(2)
        [[10, 20], [30, 40]]
    """

    def __init__(self, actor_sets: list[_ActorSet], name: str, parents: tuple[Any, ...] = ()) -> None:
        self._actor_sets, self._name, self._parents = actor_sets, name, parents

    def __repr__(self) -> str:
        return f"ParallelIterator[{self._name}]"

    def __iter__(self) -> Iterator[T]:
        raise TypeError("ParallelIterator is not iterable; call .gather_sync() or .gather_async()")

    def _pairs(self) -> list[tuple[Any, _Transforms]]:
        return [(a, s.transforms) for s in self._actor_sets for a in s.actors]

    def _with(self, suffix: str, method: str, *args: Any) -> ParallelIterator[Any]:
        return ParallelIterator([s.with_transform(method, *args) for s in self._actor_sets],
                                self._name + suffix, self._parents)

    def _with_fn(self, method: str, fn: Any, *extra: Any) -> ParallelIterator[Any]:
        _check_fn(fn, method)
        try:
            cloudpickle.dumps(fn)  # type: ignore[no-untyped-call]  # ray.cloudpickle is untyped
        except Exception as e:
            raise TypeError(f"{method}({_label(fn) or getattr(fn, '__name__', fn)!r}) on {self!r}: the "
                            f"function cannot be pickled to run in the shard actors ({e}); move what it "
                            f"captures (locks, open files, actors' internals) into the function") from e
        return self._with(f".{method}({_label(fn)})", method, fn, *extra)

    def num_shards(self) -> int:
        """The number of shard actors over all actor sets."""
        return sum(len(s.actors) for s in self._actor_sets)

    # -- recorded transforms (run in the shards) -------------------------------------------------
    def for_each(self, fn: Callable[[T], U], max_concurrency: int = 1,
                 resources: dict[str, Any] | None = None) -> ParallelIterator[U]:
        """Per-shard map, run inside each shard actor."""
        _check_concurrency(max_concurrency)
        return self._with_fn("for_each", fn, max_concurrency, resources)

    def filter(self, fn: Callable[[T], Any]) -> ParallelIterator[T]:
        """Per-shard filter, run inside each shard actor."""
        return self._with_fn("filter", fn)

    def combine(self, fn: Callable[[T], Iterable[U]]) -> ParallelIterator[U]:
        """Per-shard flat-map, run inside each shard actor."""
        return self._with_fn("combine", fn)

    def transform(self, fn: Callable[[Iterable[T]], Iterable[U]]) -> ParallelIterator[U]:
        """Per-shard ``fn(Iterable) -> Iterable``, called once per initialisation in each shard."""
        return self._with_fn("transform", fn)

    def batch(self, n: int) -> ParallelIterator[list[T]]:
        """Per-shard lists of ``n`` items."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"batch(n={n!r}) needs an int n >= 1")
        return self._with(f".batch({n})", "batch", n)

    def flatten(self) -> ParallelIterator[Any]:
        """Per-shard un-nesting of iterable items."""
        return self._with(".flatten()", "flatten")

    def local_shuffle(self, shuffle_buffer_size: int, seed: int | None = None) -> ParallelIterator[T]:
        """Per-shard buffered shuffle; shard membership never changes."""
        if not isinstance(shuffle_buffer_size, int) or shuffle_buffer_size < 1:
            raise ValueError(f"shuffle_buffer_size={shuffle_buffer_size!r} must be an int >= 1")
        return self._with(f".local_shuffle(shuffle_buffer_size={shuffle_buffer_size}, seed={seed})",
                          "shuffle", shuffle_buffer_size, seed)

    # -- structure -----------------------------------------------------------------------------
    def union(self, other: ParallelIterator[T]) -> ParallelIterator[T]:
        """Concatenates the actor sets; each side keeps its own transforms."""
        if not isinstance(other, ParallelIterator):
            raise TypeError(f"ParallelIterator.union() got {type(other).__name__}; pass a ParallelIterator "
                            f"(for LocalIterators use LocalIterator.union)")
        return ParallelIterator(self._actor_sets + other._actor_sets, f"ParallelUnion[{self!r}, {other!r}]",
                                self._parents + other._parents)

    def select_shards(self, shards_to_keep: Sequence[int]) -> ParallelIterator[T]:
        """The listed shards of a single actor set, with the same transforms."""
        keep = list(shards_to_keep)
        if len(self._actor_sets) != 1:
            raise ValueError(f"select_shards() on {self!r}: it spans {len(self._actor_sets)} actor sets "
                             f"after a union; select shards before the union")
        actors = self._actor_sets[0].actors
        if not keep or len(set(keep)) != len(keep) or not all(isinstance(i, int) and 0 <= i < len(actors)
                                                               for i in keep):
            raise ValueError(f"select_shards({keep!r}) needs distinct shard indices in [0, {len(actors)})")
        chosen = _ActorSet([actors[i] for i in keep], self._actor_sets[0].transforms)
        return ParallelIterator([chosen], f"{self._name}.select_shards({keep})", self._parents)

    def repartition(self, num_partitions: int, batch_ms: float = 0) -> ParallelIterator[T]:
        """Eager: new shard ``i`` holds the items at positions ``i (mod num_partitions)`` of every source shard.

        Examples:
            >>> sorted(from_range(8, 2).repartition(3).get_shard(0).take(10))
            [0, 3, 4, 7]
        """
        if not isinstance(num_partitions, int) or num_partitions < 1:
            raise ValueError(f"repartition(num_partitions={num_partitions!r}) needs an int >= 1")
        _check_gather_args(1, batch_ms)
        pairs = self._pairs()
        generation = _new_generation()
        ray.get([actor.par_iter_init.remote(transforms, generation) for actor, transforms in pairs])
        sources = [a for a, _ in pairs]
        parts = _make_shards([functools.partial(_sliced_stream, sources, generation, num_partitions, i, batch_ms)
                              for i in range(num_partitions)], False, None)
        return ParallelIterator([_ActorSet(parts)], f"{self._name}.repartition[num_partitions={num_partitions}]",
                                self._parents + (self,))

    # -- gathers -------------------------------------------------------------------------------
    def batch_across_shards(self, *, timeout_s: float | None = None) -> LocalIterator[list[T]]:
        """Lock-step rounds: one item from every live shard per pull, in shard order (a barrier).

        With ``timeout_s``, a round that is not complete ``timeout_s`` seconds after its requests were sent
        raises :class:`ShardTimeoutError` naming the first shard still out (``None``: wait forever)."""
        _check_gather_args(1, 0, timeout_s)
        return LocalIterator(functools.partial(_BarrierSource, self, timeout_s=timeout_s),
                             f"{self!r}.batch_across_shards()",
                             origin=_Origin("gather", "batch_across_shards", (self,)))

    def gather_sync(self) -> LocalIterator[T]:
        """``batch_across_shards().flatten()``: round after round, in shard order."""
        return LocalIterator(lambda ctx: _Flatten(_BarrierSource(self, ctx)), f"{self!r}.gather_sync()",
                             origin=_Origin("gather", "gather_sync", (self,)))

    def gather_async(self, batch_ms: float = 0, num_async: int = 1, *,
                     timeout_s: float | None = None) -> LocalIterator[T]:
        """Completion-order gather with at most ``num_async`` requests in flight per shard.

        With ``timeout_s``, a request still unanswered ``timeout_s`` seconds after it was sent raises
        :class:`ShardTimeoutError` naming its shard (``None``: wait forever). The clock starts at submission, so
        a request also waits out the ones sent to its shard before it: at most ``num_async`` of them.

        Examples:
            >>> import time
            >>> def stalls():
            ...     yield 1
            ...     time.sleep(5)  # longer than the timeout
            ...     yield 2
            >>> it = from_iterators([stalls]).gather_async(timeout_s=0.5)
            >>> next(it)
            1
            >>> next(it)
            Traceback (most recent call last):
            ...
            flowrl.iter.ShardTimeoutError: ParallelIterator[...]: shard 0 delivered nothing for 0.5 s (timeout_s=0.5)
        """
        _check_gather_args(num_async, batch_ms, timeout_s)
        return LocalIterator(lambda ctx: _AsyncSource(self, ctx, num_async, batch_ms, timeout_s=timeout_s),
                             f"{self!r}.gather_async()",
                             origin=_Origin("gather", "gather_async", (self,), num_async=num_async, batch_ms=batch_ms))

    def get_shard(self, shard_index: int, batch_ms: float = 0, num_async: int = 1) -> LocalIterator[T]:
        """A LocalIterator over one shard, in that shard's order."""
        _check_gather_args(num_async, batch_ms)
        pairs = self._pairs()
        if not isinstance(shard_index, int) or not 0 <= shard_index < len(pairs):
            raise ValueError(f"get_shard({shard_index!r}): {self!r} has shards 0..{len(pairs) - 1}")
        actor, transforms = pairs[shard_index]
        shard: ParallelIterator[T] = ParallelIterator([_ActorSet([actor], transforms)], self._name, self._parents)
        return LocalIterator(lambda ctx: _AsyncSource(shard, ctx, num_async, batch_ms, in_order=True),
                             f"{self!r}.shard[{shard_index}]",
                             origin=_Origin("gather", f"shard[{shard_index}]", (shard,), num_async=num_async,
                                            batch_ms=batch_ms))

    def shards(self) -> list[LocalIterator[T]]:
        """``[get_shard(i) for i in range(num_shards())]``."""
        return [self.get_shard(i) for i in range(self.num_shards())]

    def take(self, n: int) -> list[T]:
        """Up to ``n`` items through a fresh ``gather_sync()`` (re-initialises the shards)."""
        return self.gather_sync().take(n)

    def show(self, n: int = 20) -> None:
        """Prints up to ``n`` items through a fresh ``gather_sync()``."""
        self.gather_sync().show(n)


# ---------------------------------------------------------------------------------------------
# Constructors.

def from_items(items: Sequence[T], num_shards: int = 2, repeat: bool = False, *,
               actor_options: dict[str, Any] | None = None) -> ParallelIterator[T]:
    """Item ``i`` goes to shard ``i % num_shards``; shard lists keep item order."""
    _check_shards(num_shards)
    items = list(items)
    shards = [items[s::num_shards] for s in range(num_shards)]
    first = type(items[0]).__name__ if items else None
    name = f"from_items[{first}, {len(items)}, shards={num_shards}{', repeat=True' if repeat else ''}]"
    return ParallelIterator([_ActorSet(_make_shards(shards, repeat, actor_options))], name)


def from_range(n: int, num_shards: int = 2, repeat: bool = False, *,
               actor_options: dict[str, Any] | None = None) -> ParallelIterator[int]:
    """Contiguous blocks of ``range(n)``; the last shard also takes the remainder."""
    _check_shards(num_shards)
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"from_range(n={n!r}) needs an int n >= 0")
    m = n // num_shards
    shards = [range(s * m, (s + 1) * m if s < num_shards - 1 else n) for s in range(num_shards)]
    name = f"from_range[{n}, shards={num_shards}{', repeat=True' if repeat else ''}]"
    return ParallelIterator([_ActorSet(_make_shards(shards, repeat, actor_options))], name)


def from_iterators(generators: Sequence[Iterable[T] | Callable[[], Iterable[T]]], repeat: bool = False,
                   name: str | None = None, *, actor_options: dict[str, Any] | None = None) -> ParallelIterator[T]:
    """One new shard per element: an iterable, or a zero-argument callable returning one."""
    sources = list(generators)
    if repeat:
        for g in sources:
            if not callable(g) and iter(g) is g:
                raise ValueError(f"from_iterators(repeat=True) got a bare iterator {g!r}, which cannot "
                                 f"restart; pass a list, or a zero-argument callable returning an iterable")
    name = name or f"from_iterators[shards={len(sources)}{', repeat=True' if repeat else ''}]"
    return ParallelIterator([_ActorSet(_make_shards(sources, repeat, actor_options))], name)


def from_actors(actors: Sequence[Any], name: str | None = None) -> ParallelIterator[Any]:
    """Wraps existing actors that implement the shard protocol (:class:`ParallelIteratorWorker`)."""
    actors = list(actors)
    return ParallelIterator([_ActorSet(actors)], name or f"from_actors[shards={len(actors)}]")


def _check_shards(num_shards: int) -> None:
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards={num_shards!r} must be an int >= 1")
