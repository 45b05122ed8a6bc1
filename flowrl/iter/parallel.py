"""The parallel iterator: a description of a sharded stream whose transforms run inside the shard actors, its
constructors, and the gathers that turn it into a local iterator.

A :class:`ParallelIterator` holds sets of shard actors (:mod:`flowrl.iter.shards`) and the transforms recorded for
each set; nothing runs until a gather initialises the shards. The gathers are the sources of a
:class:`~flowrl.iter.LocalIterator`: ``batch_across_shards`` / ``gather_sync`` (lock-step rounds, one request per
live shard), ``gather_async`` (completion order, at most ``num_async`` requests in flight per shard) and
``get_shard`` (one shard, in order). With ``timeout_s`` a gather raises :class:`ShardTimeoutError` for a shard that
delivers nothing for that long. Only one gather may be active per shard: initialising it again supersedes the
older gather, which then fails at its next request.

Examples:
    >>> pi = from_range(6, num_shards=3)
    >>> pi.num_shards(), pi.get_shard(2).take(5)
    (3, [4, 5])
    >>> pi.batch_across_shards().take(1)
    [[0, 2, 4]]
"""

from __future__ import annotations

import functools
import math
import time
import weakref
from collections import Counter, deque
from typing import Any, Callable, Generic, Iterable, Iterator, Sequence, TypeVar

from flowrl.iter.local import LocalIterator
from flowrl.iter.pullers import Flatten
from flowrl.iter.shards import (SHARD_END, SHARD_SUPERSEDED, ShardStatus, Transforms, from_wire, make_shards,
                                new_generation)
from flowrl.iter.stages import END, NOT_READY, Origin, Puller, check_concurrency, check_fn, label_of
from flowrl.metrics import MetricsContext
from flowrl.validation import check_int, check_number

from flowrl import executor
from ray import cloudpickle  # noqa: I001  (the flowrl package imports flowrl.runtime first, which sets Ray's loopback variable)

__all__ = ["ParallelIterator", "ShardTimeoutError", "AsyncSource", "from_items", "from_range", "from_iterators",
           "from_actors"]

T = TypeVar("T")
U = TypeVar("U")


def _check_gather_args(num_async: int, batch_ms: float, timeout_s: float | None = None) -> None:
    check_int("num_async", num_async, 1, "requests in flight per shard")
    check_number("batch_ms", batch_ms, ge=0, meaning="0: one item per request")
    check_number("timeout_s", timeout_s, gt=0, lt=math.inf, none_ok=True, meaning="seconds; None waits forever")


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
# Gathers.

class _ActorSet:
    def __init__(self, actors: list[Any], transforms: Transforms = ()) -> None:
        self.actors, self.transforms = actors, transforms

    def with_transform(self, method: str, *args: Any) -> _ActorSet:
        return _ActorSet(self.actors, self.transforms + ((method, args),))


# The gather that last initialised each shard actor (by actor id), so that an older gather in this
# process learns it was superseded before it sends another argument-free request.
_ACTIVE_GATHERS: weakref.WeakValueDictionary[str, _GatherSource] = weakref.WeakValueDictionary()


class _GatherSource(Puller):
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
        self.generation = new_generation()
        executor.get([actor.par_iter_init.remote(transforms, self.generation) for actor, transforms in self.pairs])
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
            ready, _ = executor.wait(self.round, num_returns=len(self.round), timeout=timeout)
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
                    return END
                self.round = [a.par_iter_next.remote() for a in self.active]
                if self.timeout_s is not None:
                    self.round_deadline = time.monotonic() + self.timeout_s
            if not self._wait_round(block):
                return NOT_READY
            results, self.round = [from_wire(r) for r in executor.get(self.round)], None
            items = [r for r in results if not isinstance(r, ShardStatus)]
            self.active = [a for a, r in zip(self.active, results) if not isinstance(r, ShardStatus)]
            if items:
                self.ctx.current_actor = None
                return items


class AsyncSource(_GatherSource):
    """gather_async / get_shard: <= num_async requests per shard, resubmitted before yielding.

    :mod:`flowrl.iter.profiling` samples :meth:`in_flight` against ``num_async``."""

    def __init__(self, pi: ParallelIterator[Any], ctx: MetricsContext, num_async: int, batch_ms: float,
                 in_order: bool = False, timeout_s: float | None = None) -> None:
        super().__init__(pi, timeout_s)
        self.ctx, self.num_async, self.batch_ms, self.in_order = ctx, num_async, batch_ms, in_order
        self.refs: dict[Any, Any] = {}  # outstanding ref -> actor, in submission order
        self.submitted: dict[Any, float] = {}  # outstanding ref -> when it was submitted (with timeout_s only)
        self.done: deque[tuple[Any, Any]] = deque()  # (actor, result) completed, not yet processed
        self.items: deque[tuple[Any, Any]] = deque()
        self.direct_waits = 0  # blocking waits since the last probe for every finished request

    def in_flight(self) -> list[float]:
        """Requests submitted to each shard and not yet collected, in shard order."""
        counts = Counter(self.refs.values())  # outstanding ref -> its actor
        return [counts[actor] for actor, _ in self.pairs]

    def _submit(self, actor: Any) -> None:
        self._check()
        if self.batch_ms > 0:  # (a local actor answers one item: a batch by time would make the run depend on it)
            ref = actor.par_iter_next_batch.remote(self.generation, 0 if executor.is_local(actor) else self.batch_ms)
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
                ready, _ = executor.wait(refs, num_returns=1, timeout=timeout)
                self.direct_waits += 1
            else:
                ready, _ = executor.wait(refs, num_returns=len(refs), timeout=0)
                self.direct_waits = 0
                if self.timeout_s is not None:
                    self._check_late(refs, ready)
                if not ready:
                    if not block:
                        return False
                    ready, _ = executor.wait(refs, num_returns=1, timeout=timeout)
                    self.direct_waits = 1
            if ready:
                break
            self._check_late(refs, ready)  # (only with timeout_s: the blocking wait ran out)
        for ref, result in zip(ready, executor.get(ready)):
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
                    return END
                if not self._wait(block):
                    return NOT_READY
            actor, result = self.done.popleft()
            self._check(result)
            if result is not SHARD_END:
                self._submit(actor)
                if self.batch_ms > 0:
                    self.items.extend((from_wire(item), actor) for item in result)
                else:
                    self.items.append((from_wire(result), actor))
        item, self.ctx.current_actor = self.items.popleft()
        return item


def _sliced_stream(actors: list[Any], generation: str, step: int, start: int,
                   batch_ms: float) -> Iterator[Any]:
    """A repartition partition: positions ``start (mod step)`` of every source shard, as they arrive."""
    if any(executor.is_local(a) for a in actors):
        batch_ms = 0  # one item per answer: a batch collected by time would make a local run depend on the clock
    refs = {a.par_iter_slice_batch.remote(generation, step, start, batch_ms): a for a in actors}
    while refs:
        ready, _ = executor.wait(list(refs), num_returns=1)
        actor = refs.pop(ready[0])
        result = executor.get(ready[0])
        if result is SHARD_SUPERSEDED:
            raise RuntimeError("repartition source shard re-initialised by another gather")
        if result is not SHARD_END:
            refs[actor.par_iter_slice_batch.remote(generation, step, start, batch_ms)] = actor
            yield from map(from_wire, result)


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

    def _pairs(self) -> list[tuple[Any, Transforms]]:
        return [(a, s.transforms) for s in self._actor_sets for a in s.actors]

    def _with(self, suffix: str, method: str, *args: Any) -> ParallelIterator[Any]:
        return ParallelIterator([s.with_transform(method, *args) for s in self._actor_sets],
                                self._name + suffix, self._parents)

    def _with_fn(self, method: str, fn: Any, *extra: Any) -> ParallelIterator[Any]:
        check_fn(fn, method)
        try:
            cloudpickle.dumps(fn)  # type: ignore[no-untyped-call]  # ray.cloudpickle is untyped
        except Exception as e:
            raise TypeError(f"{method}({label_of(fn) or getattr(fn, '__name__', fn)!r}) on {self!r}: the "
                            f"function cannot be pickled to run in the shard actors ({e}); move what it "
                            f"captures (locks, open files, actors' internals) into the function") from e
        return self._with(f".{method}({label_of(fn)})", method, fn, *extra)

    def num_shards(self) -> int:
        """The number of shard actors over all actor sets."""
        return sum(len(s.actors) for s in self._actor_sets)

    # -- recorded transforms (run in the shards) -------------------------------------------------
    def for_each(self, fn: Callable[[T], U], max_concurrency: int = 1,
                 resources: dict[str, Any] | None = None) -> ParallelIterator[U]:
        """Per-shard map, run inside each shard actor."""
        check_concurrency(max_concurrency)
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
        check_int("batch() n", n, 1, "items per list")
        return self._with(f".batch({n})", "batch", n)

    def flatten(self) -> ParallelIterator[Any]:
        """Per-shard un-nesting of iterable items."""
        return self._with(".flatten()", "flatten")

    def local_shuffle(self, shuffle_buffer_size: int, seed: int | None = None) -> ParallelIterator[T]:
        """Per-shard buffered shuffle; shard membership never changes."""
        check_int("shuffle_buffer_size", shuffle_buffer_size, 1, "items held to shuffle among")
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
        check_int("repartition() num_partitions", num_partitions, 1, "new shards")
        _check_gather_args(1, batch_ms)
        pairs = self._pairs()
        generation = new_generation()
        executor.get([actor.par_iter_init.remote(transforms, generation) for actor, transforms in pairs])
        sources = [a for a, _ in pairs]
        parts = make_shards([functools.partial(_sliced_stream, sources, generation, num_partitions, i, batch_ms)
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
                             origin=Origin("gather", "batch_across_shards", (self,)))

    def gather_sync(self) -> LocalIterator[T]:
        """``batch_across_shards().flatten()``: round after round, in shard order."""
        return LocalIterator(lambda ctx: Flatten(_BarrierSource(self, ctx)), f"{self!r}.gather_sync()",
                             origin=Origin("gather", "gather_sync", (self,)))

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
            flowrl.iter.parallel.ShardTimeoutError: ...: shard 0 delivered nothing for 0.5 s (timeout_s=0.5)
        """
        _check_gather_args(num_async, batch_ms, timeout_s)
        return LocalIterator(lambda ctx: AsyncSource(self, ctx, num_async, batch_ms, timeout_s=timeout_s),
                             f"{self!r}.gather_async()",
                             origin=Origin("gather", "gather_async", (self,), num_async=num_async, batch_ms=batch_ms))

    def get_shard(self, shard_index: int, batch_ms: float = 0, num_async: int = 1) -> LocalIterator[T]:
        """A LocalIterator over one shard, in that shard's order."""
        _check_gather_args(num_async, batch_ms)
        pairs = self._pairs()
        check_int("get_shard() shard_index", shard_index, 0, f"{self!r} has shards 0..{len(pairs) - 1}",
                  le=len(pairs) - 1)
        actor, transforms = pairs[shard_index]
        shard: ParallelIterator[T] = ParallelIterator([_ActorSet([actor], transforms)], self._name, self._parents)
        return LocalIterator(lambda ctx: AsyncSource(shard, ctx, num_async, batch_ms, in_order=True),
                             f"{self!r}.shard[{shard_index}]",
                             origin=Origin("gather", f"shard[{shard_index}]", (shard,), num_async=num_async,
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
    return ParallelIterator([_ActorSet(make_shards(shards, repeat, actor_options))], name)


def from_range(n: int, num_shards: int = 2, repeat: bool = False, *,
               actor_options: dict[str, Any] | None = None) -> ParallelIterator[int]:
    """Contiguous blocks of ``range(n)``; the last shard also takes the remainder."""
    _check_shards(num_shards)
    check_int("from_range() n", n, 0, "the length of range(n)")
    m = n // num_shards
    shards = [range(s * m, (s + 1) * m if s < num_shards - 1 else n) for s in range(num_shards)]
    name = f"from_range[{n}, shards={num_shards}{', repeat=True' if repeat else ''}]"
    return ParallelIterator([_ActorSet(make_shards(shards, repeat, actor_options))], name)


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
    return ParallelIterator([_ActorSet(make_shards(sources, repeat, actor_options))], name)


def from_actors(actors: Sequence[Any], name: str | None = None) -> ParallelIterator[Any]:
    """Wraps existing actors that implement the shard protocol (:class:`ParallelIteratorWorker`)."""
    actors = list(actors)
    return ParallelIterator([_ActorSet(actors)], name or f"from_actors[shards={len(actors)}]")


def _check_shards(num_shards: int) -> None:
    check_int("num_shards", num_shards, 1, "shard actors")
