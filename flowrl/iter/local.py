"""The local iterator: a lazy, single-consumer stream in one process, and how it fans out and in.

A :class:`LocalIterator` records its source and stages (:mod:`flowrl.iter.stages`) and builds them into a chain
of pullers (:mod:`flowrl.iter.pullers`) on its first pull. Its operators (``for_each``, ``filter``, ``batch``,
``combine``, ``transform``, ...) return new iterators over the same source and metrics context;
``duplicate(n)`` gives ``n`` children over one stream and ``union(...)`` interleaves streams, merging their
metrics contexts. Iteration yields real items only: the not-ready and end signals stay inside.

:func:`origin_of`, :func:`stages_of`, :func:`flow_of` and :func:`was_pulled` give the plan graph and the profiler
what an iterator recorded, without reaching into its attributes.

Examples:
    >>> it = LocalIterator.from_iterable([1, 2, 3, 4], name="four").for_each(lambda x: x * 10)
    >>> it
    LocalIterator[four.for_each()]
    >>> origin_of(it).label, [stage.suffix for stage in stages_of(it)], was_pulled(it)
    ('four', ['.for_each()'], False)
    >>> it.take(2), was_pulled(it)
    ([10, 20], True)
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from typing import Any, Callable, Generic, Iterable, Sequence, TypeVar

from flowrl.iter.pullers import (Batch, ConcurrentForEach, DuplicateChild, DuplicateState, Filter, Flatten, ForEach,
                                 IterSource, LocalUnion, NoneAsNotReady, PollSource, Shuffle, Transform,
                                 ZipWithSourceActor, union_quotas)
from flowrl.iter.stages import (END, NOT_READY, Backoff, Cell, Flow, Origin, Puller, RetryLater, Stage,
                                check_concurrency, check_fn, get_metrics, label_of, merge_cells)
from flowrl.metrics import MetricsContext
from flowrl.validation import check_int

__all__ = ["LocalIterator", "origin_of", "stages_of", "flow_of", "was_pulled"]

T = TypeVar("T")
U = TypeVar("U")
logger = logging.getLogger(__name__)


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

    def __init__(self, source: Callable[[MetricsContext], Puller], name: str, *, cell: Cell | None = None,
                 stages: tuple[Stage, ...] = (), has_duplicate: bool = False, origin: Origin | None = None) -> None:
        self._source, self._name, self._stages = source, name, stages
        self._origin = origin if origin is not None else Origin("source", name)
        self._cell = cell if cell is not None else Cell()
        self._has_duplicate = has_duplicate
        self._chain: Puller | None = None
        self._consumed_by: LocalIterator[Any] | None = None

    # -- sources --------------------------------------------------------------------------------
    @staticmethod
    def from_iterable(source: Iterable[T] | Callable[[], Iterable[T]], name: str | None = None) -> LocalIterator[T]:
        """A blocking source over an iterable, or a zero-argument callable returning one."""
        return LocalIterator(functools.partial(IterSource, source), name or "from_iterable")

    @staticmethod
    def from_poll(poll_fn: Callable[[], T | None], name: str | None = None) -> LocalIterator[T]:
        """A non-blocking source: ``poll_fn()`` returns an item, ``None`` (not ready), or raises StopIteration.

        Examples:
            >>> items = iter([None, 1, None, 2])
            >>> LocalIterator.from_poll(lambda: next(items)).take(5)
            [1, 2]
        """
        return LocalIterator(functools.partial(PollSource, poll_fn), name or "from_poll")

    get_metrics = staticmethod(get_metrics)

    # -- building and consumption -----------------------------------------------------------------
    def _derive(self, stage: Stage) -> LocalIterator[Any]:
        return LocalIterator(self._source, self._name + stage.suffix, cell=self._cell,
                             stages=self._stages + (stage,), has_duplicate=self._has_duplicate, origin=self._origin)

    def _build(self) -> Puller:
        flow = self._cell.flow
        wrap = flow.profiler.wrap if flow.profiler is not None else lambda record, puller: puller
        puller: Puller = wrap(self._origin, self._source(flow.metrics))
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
        profiler = self._cell.flow.profiler
        if profiler is None:
            return self._next(Backoff.wait)
        with profiler.pulling():
            return self._next(profiler.timed_wait)

    def _next(self, wait: Callable[[Backoff], None]) -> T:
        backoff, since, warned = Backoff(), time.monotonic(), False
        while True:
            item = self._pull(True)
            if item is END:
                raise StopIteration
            if item is not NOT_READY:
                return item  # type: ignore[no-any-return]  # a real item of the stream
            if not warned and time.monotonic() - since > self.stall_warning_s:
                logger.warning("%r has produced no item for %.1f s; is a source stalled, or a "
                               "duplicate() child consumed without its siblings?", self, self.stall_warning_s)
                warned = True
            wait(backoff)

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
        origin = Origin("named", name, (self,) if inputs is None else tuple(inputs), **attrs)
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

    # -- inspection (flowrl.iter.plan_graph and .profiling import this module, hence the local imports) ---
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
        from flowrl.iter import plan_graph
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
        from flowrl.iter import plan_graph
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
            named: ...
            | operator | in | out | in op s | waiting s | wall % |
            |:...|
            | for_each() | 3 | 3 | ... |
            | iter_list | - | 3 | ... |
            | (backoff: nothing ready) | | | ... |
            | (between pulls) | | | ... |
            | (unaccounted) | | | ... |
            (backoff: ...
        """
        from flowrl.iter import profiling
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
        check_fn(fn, "for_each")
        check_concurrency(max_concurrency)
        if max_concurrency == 1:
            return self._derive(Stage(f".for_each({label_of(fn)})", lambda up, ctx: ForEach(up, fn, ctx), fn))
        res = dict(resources or {})
        return self._derive(Stage(f".for_each({label_of(fn)})",
                                   lambda up, ctx: ConcurrentForEach(up, fn, max_concurrency, res)))

    def filter(self, fn: Callable[[T], Any]) -> LocalIterator[T]:
        """Keeps items for which ``fn(item)`` is truthy."""
        check_fn(fn, "filter")
        return self._derive(Stage(f".filter({label_of(fn)})", lambda up, ctx: Filter(up, fn, ctx), fn))

    def batch(self, n: int) -> LocalIterator[list[T]]:
        """Lists of ``n`` items; the final partial list is emitted at the end."""
        check_int("batch() n", n, 1, "items per list")
        return self._derive(Stage(f".batch({n})", lambda up, ctx: Batch(up, n)))

    def flatten(self) -> LocalIterator[Any]:
        """Yields the elements of each iterable item."""
        return self._derive(Stage(".flatten()", lambda up, ctx: Flatten(up)))

    def combine(self, fn: Callable[[T], Iterable[U]]) -> LocalIterator[U]:
        """Flat-map: ``fn`` returns a list of 0..k outputs per input.

        Examples:
            >>> iter_list([1, 2, 3]).combine(lambda x: [x] * (x - 1)).take(5)
            [2, 3, 3]
        """
        check_fn(fn, "combine")
        return self._derive(Stage(f".combine({label_of(fn)})",
                                   lambda up, ctx: Flatten(ForEach(up, fn, ctx)), fn))

    def transform(self, fn: Callable[[Iterable[T]], Iterable[U]]) -> LocalIterator[U]:
        """Applies ``fn(Iterable[T]) -> Iterable[U]`` once; its input blocks until items are ready.

        Examples:
            >>> iter_list([1, 2, 3]).transform(lambda xs: (x + 1 for x in xs)).take(3)
            [2, 3, 4]
        """
        check_fn(fn, "transform")
        if self._has_duplicate:
            raise ValueError(f"transform() on {self!r}: its lineage contains a duplicate() child, and a "
                             f"blocking transform would deadlock against its siblings; use for_each/combine")
        return self._derive(Stage(f".transform({label_of(fn)})", lambda up, ctx: Transform(up, fn, ctx), fn))

    def shuffle(self, shuffle_buffer_size: int, seed: int | None = None) -> LocalIterator[T]:
        """Buffered shuffle with ``random.Random(seed)``; a buffer of 1 is the identity."""
        check_int("shuffle_buffer_size", shuffle_buffer_size, 1, "items held to shuffle among")
        return self._derive(Stage(f".shuffle(shuffle_buffer_size={shuffle_buffer_size}, seed={seed})",
                                   lambda up, ctx: Shuffle(up, shuffle_buffer_size, seed)))

    def none_as_not_ready(self) -> LocalIterator[T]:
        """A ``None`` item is consumed and reported as "nothing yet"; other items pass."""
        return self._derive(Stage(".none_as_not_ready()", lambda up, ctx: NoneAsNotReady(up)))

    def zip_with_source_actor(self) -> LocalIterator[tuple[Any, T]]:
        """Maps each item to ``(current_actor, item)``."""
        return self._derive(Stage(".zip_with_source_actor()", lambda up, ctx: ZipWithSourceActor(up, ctx)))

    # -- fan-out and fan-in ----------------------------------------------------------------------
    def duplicate(self, n: int) -> list[LocalIterator[T]]:
        """``n`` children over one stream; a child ahead of its siblings waits (queues hold <= 1 item).

        Examples:
            >>> a, b = iter_list([1, 2, 3]).duplicate(2)
            >>> a.union(b, deterministic=True).take(6)
            [1, 1, 2, 2, 3, 3]
        """
        check_int("duplicate() n", n, 2, "children; use the iterator itself for one consumer")
        state = DuplicateState(self._build, n)
        return [LocalIterator(functools.partial(DuplicateChild, state, i), f"{self._name}.duplicate[{i}]",
                              cell=self._cell, has_duplicate=True,
                              origin=Origin("duplicate", f"duplicate[{i}]", (self,), index=i, n=n))
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
        quotas = union_quotas(len(inputs), deterministic, round_robin_weights)
        merge_cells([it._cell for it in inputs])
        name = "LocalUnion[" + ", ".join(repr(it) for it in inputs) + "]"
        mode = "round_robin" if deterministic or round_robin_weights is not None else "async"
        origin = Origin("union", "LocalUnion", tuple(inputs), mode=mode, round_robin_weights=round_robin_weights)
        union: LocalIterator[T] = LocalIterator(lambda ctx: LocalUnion([it._build() for it in inputs], quotas),
                                                name, cell=self._cell, origin=origin,
                                                has_duplicate=any(it._has_duplicate for it in inputs))
        for it in inputs:
            it._consumed_by = union
        return union



def _build_of(it: LocalIterator[Any], ctx: MetricsContext) -> Puller:
    """The source of a named iterator: the built chain of the iterator it renames."""
    return it._build()


def origin_of(it: LocalIterator[Any]) -> Origin:
    """Where ``it``'s stream starts, as recorded when it was built (:mod:`flowrl.iter.plan_graph` reads it)."""
    return it._origin


def stages_of(it: LocalIterator[Any]) -> tuple[Stage, ...]:
    """The stages ``it`` applies after its origin, upstream first."""
    return it._stages


def flow_of(it: LocalIterator[Any]) -> Flow:
    """What ``it`` shares with the other iterators of its dataflow: metrics, close callbacks, the profiler."""
    return it._cell.flow


def was_pulled(it: LocalIterator[Any]) -> bool:
    """Whether ``it`` has built its chain (on its first pull); a profiler set afterwards would not see it."""
    return it._chain is not None
