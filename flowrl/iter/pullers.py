"""The built stages of a :class:`~flowrl.iter.LocalIterator`: one :class:`~flowrl.iter.stages.Puller` per
operator, which the iterator chains when it is first pulled.

Each stage answers ``pull(block)`` with an item, ``NOT_READY`` or ``END`` (:mod:`flowrl.iter.stages`) and calls
user functions through :func:`~flowrl.iter.stages.call_with_metrics`, so that they may read the dataflow's
metrics. The sources of a stream are here too (an iterable, a poll function), and the fan-out and fan-in stages:
the children of ``duplicate()`` and the turn-taking of ``union()``. Gathers, the sources that read shard
actors, are in :mod:`flowrl.iter.parallel`.

Examples:
    >>> from flowrl.metrics import MetricsContext
    >>> ctx = MetricsContext()
    >>> chain = Batch(Filter(IterSource([1, 2, 3, 4, 5], ctx), lambda x: x % 2, ctx), 2)
    >>> [chain.pull(True) for _ in range(3)]
    [[1, 3], [5], END]
    >>> union_quotas(2, False, [3, "*"])
    [(True, 3), (False, '*')]
"""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Sequence

from flowrl import executor
from flowrl.iter.stages import END, NOT_READY, Backoff, Puller, RetryLater, call_with_metrics
from flowrl.metrics import MetricsContext

__all__ = ["IterSource", "PollSource", "ForEach", "ConcurrentForEach", "Filter", "Batch", "Flatten", "Shuffle",
           "Transform", "NoneAsNotReady", "ZipWithSourceActor", "union_quotas", "LocalUnion", "DuplicateState",
           "DuplicateChild"]

_UNSET: Any = object()


class IterSource(Puller):
    """``LocalIterator.from_iterable``: the items of an iterable (or of what a zero-argument callable returns)."""

    def __init__(self, source: Any, ctx: MetricsContext) -> None:
        self.ctx, self.it = ctx, iter(source() if callable(source) else source)

    def pull(self, block: bool) -> Any:
        for item in self.it:
            self.ctx.current_actor = None
            return item
        return END


class PollSource(Puller):
    """``LocalIterator.from_poll``: ``poll_fn()`` gives an item, ``None`` (not ready) or raises StopIteration."""

    def __init__(self, poll_fn: Callable[[], Any], ctx: MetricsContext) -> None:
        self.poll_fn, self.ctx = poll_fn, ctx

    def pull(self, block: bool) -> Any:
        try:
            item = call_with_metrics(self.ctx, self.poll_fn)
        except StopIteration:
            return END
        if item is None:
            return NOT_READY
        self.ctx.current_actor = None
        return item


class ForEach(Puller):
    """``for_each(fn)``: ``fn(item)``; a :class:`RetryLater` keeps the item to offer it again."""

    def __init__(self, up: Puller, fn: Callable[[Any], Any], ctx: MetricsContext) -> None:
        self.up, self.fn, self.ctx, self.pending, self.pending_actor = up, fn, ctx, _UNSET, None
        hook = getattr(fn, "_on_fetch_start", None)
        self.on_fetch_start = hook if callable(hook) else None
        self.fetch_started = False

    def pull(self, block: bool) -> Any:
        if self.pending is _UNSET:
            if self.on_fetch_start is not None and not self.fetch_started:
                call_with_metrics(self.ctx, self.on_fetch_start)
                self.fetch_started = True
            item = self.up.pull(block)
            if item is NOT_READY or item is END:
                return item
            self.pending, self.fetch_started, self.pending_actor = item, False, self.ctx.current_actor
        else:  # a retried item: other branches may have moved current_actor since it was fetched
            self.ctx.current_actor = self.pending_actor
        try:
            out = call_with_metrics(self.ctx, self.fn, self.pending)
        except RetryLater:
            return NOT_READY
        self.pending = _UNSET
        return out


class ConcurrentForEach(Puller):
    """``for_each(fn, max_concurrency=k)``: fn runs as Ray tasks, k in flight, completion order."""

    def __init__(self, up: Puller, fn: Callable[[Any], Any], k: int, resources: dict[str, Any]) -> None:
        self.up, self.k, self.ended = up, k, False
        self.remote_fn = executor.remote_function(fn, **resources)
        self.inflight: list[Any] = []
        self.done: deque[Any] = deque()

    def pull(self, block: bool) -> Any:
        while True:
            if self.done:
                return self.done.popleft()
            if not self.ended and len(self.inflight) < self.k:
                item = self.up.pull(block if not self.inflight else False)
                if item is END:
                    self.ended = True
                elif item is not NOT_READY:
                    self.inflight.append(self.remote_fn.remote(item))
                    continue
                elif not self.inflight:
                    return NOT_READY
            if not self.inflight:
                return END
            ready, self.inflight = executor.wait(self.inflight, num_returns=1, timeout=None if block else 0)
            if not ready:
                return NOT_READY
            self.done.extend(executor.get(ready))


class Filter(Puller):
    """``filter(fn)``: the items for which ``fn(item)`` is truthy."""

    def __init__(self, up: Puller, fn: Callable[[Any], Any], ctx: MetricsContext) -> None:
        self.up, self.fn, self.ctx = up, fn, ctx

    def pull(self, block: bool) -> Any:
        while True:
            item = self.up.pull(block)
            if item is NOT_READY or item is END or call_with_metrics(self.ctx, self.fn, item):
                return item


class Batch(Puller):
    """``batch(n)``: lists of ``n`` items, the last one shorter."""

    def __init__(self, up: Puller, n: int) -> None:
        self.up, self.n = up, n
        self.buf: list[Any] = []

    def pull(self, block: bool) -> Any:
        while len(self.buf) < self.n:
            item = self.up.pull(block)
            if item is NOT_READY:
                return item
            if item is END:
                if not self.buf:
                    return END
                break
            self.buf.append(item)
        out, self.buf = self.buf, []
        return out


class Flatten(Puller):
    """``flatten()`` (and ``combine``): the elements of each iterable item."""

    def __init__(self, up: Puller) -> None:
        self.up = up
        self.pending: Iterator[Any] = iter(())

    def pull(self, block: bool) -> Any:
        while True:
            for element in self.pending:
                return element
            item = self.up.pull(block)
            if item is NOT_READY or item is END:
                return item
            self.pending = iter(item)


class Shuffle(Puller):
    """``shuffle(size, seed)``: a buffered shuffle with ``random.Random(seed)``."""

    def __init__(self, up: Puller, size: int, seed: int | None) -> None:
        self.up, self.size, self.rng, self.ended = up, size, random.Random(seed), False
        self.buf: list[Any] = []

    def pull(self, block: bool) -> Any:
        while not self.ended:
            item = self.up.pull(block)
            if item is NOT_READY:
                return item
            if item is END:
                self.ended = True
                self.rng.shuffle(self.buf)
            elif len(self.buf) < self.size:
                self.buf.append(item)
            else:
                i = self.rng.randrange(self.size)
                out, self.buf[i] = self.buf[i], item
                return out
        return self.buf.pop() if self.buf else END


class Transform(Puller):
    """``transform(fn)``: the items of ``fn(the upstream's items)``, its input blocking until ready."""

    def __init__(self, up: Puller, fn: Callable[[Iterable[Any]], Iterable[Any]],
                 ctx: MetricsContext) -> None:
        self.ctx = ctx
        self.out = iter(call_with_metrics(ctx, fn, _blocking_items(up)))

    def pull(self, block: bool) -> Any:
        return call_with_metrics(self.ctx, next, self.out, END)


def _blocking_items(up: Puller) -> Iterator[Any]:
    """The real items of ``up``, waiting with backoff whenever it reports not-ready."""
    backoff = Backoff()
    while (item := up.pull(True)) is not END:
        if item is NOT_READY:
            backoff.wait()
        else:
            backoff = Backoff()
            yield item


class NoneAsNotReady(Puller):
    """``none_as_not_ready()``: a ``None`` item is answered as :data:`NOT_READY`."""

    def __init__(self, up: Puller) -> None:
        self.up = up

    def pull(self, block: bool) -> Any:
        item = self.up.pull(block)
        return NOT_READY if item is None else item


class ZipWithSourceActor(Puller):
    """``zip_with_source_actor()``: ``(the actor that produced the item, item)``."""

    def __init__(self, up: Puller, ctx: MetricsContext) -> None:
        self.up, self.ctx = up, ctx

    def pull(self, block: bool) -> Any:
        item = self.up.pull(block)
        if item is NOT_READY or item is END:
            return item
        if self.ctx.current_actor is None:
            raise ValueError("Could not identify source actor of item")
        return self.ctx.current_actor, item



def union_quotas(n: int, deterministic: bool,
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


class LocalUnion(Puller):
    """``LocalIterator.union``: turns over the inputs, each for its quota of items per turn."""

    def __init__(self, inputs: list[Puller], quotas: list[tuple[bool, float | str]]) -> None:
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
                if item is END:
                    del self.active[self.idx]
                    self.left, self.emitted = -1, False
                elif item is NOT_READY:
                    self._end_turn()
                    if not block:
                        return NOT_READY
                else:
                    self.left -= 1
                    self.emitted = True
                    if self.left == 0:
                        self._end_turn()
                    return item
            if self.active and self.idle_turns >= len(self.active):
                self.idle_turns = 0
                return NOT_READY
        return END


class DuplicateState:
    """What the children of one ``duplicate()`` share: the parent's chain and one queue per child."""

    def __init__(self, build_parent: Callable[[], Puller], n: int) -> None:
        self.build_parent = build_parent
        self.queues: list[deque[tuple[Any, Any]]] = [deque() for _ in range(n)]
        self.chain: Puller | None = None
        self.ended = False


class DuplicateChild(Puller):
    """One ``duplicate()`` child: the parent's items in order, never more than one ahead of a sibling."""

    def __init__(self, state: DuplicateState, i: int, ctx: MetricsContext) -> None:
        self.state, self.queue, self.ctx = state, state.queues[i], ctx

    def pull(self, block: bool) -> Any:
        state = self.state
        if not self.queue:
            if any(state.queues):
                return NOT_READY  # ahead of a sibling: never grow its queue
            if state.ended:
                return END
            if state.chain is None:
                state.chain = state.build_parent()
            item = state.chain.pull(block)
            if item is NOT_READY:
                return item
            if item is END:
                state.ended = True
                return item
            for q in state.queues:
                q.append((item, self.ctx.current_actor))
        item, self.ctx.current_actor = self.queue.popleft()
        return item
