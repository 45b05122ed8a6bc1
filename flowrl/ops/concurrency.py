"""Concurrency operators: sub-flows side by side in one driver thread, and queues to learner threads.

``Concurrently`` interleaves sub-flows (a union: see ``LocalIterator.union``). ``Enqueue`` and ``Dequeue`` connect
a dataflow to a ``queue.Queue`` without ever blocking it. The learner threads (``LearnerThread``,
``MultiGPULearnerThread``, ``ApexLearnerThread``) train on what arrives in their in-queue and report on
their out-queue, so sampling and learning overlap; they and ``MinibatchBuffer`` live in
:mod:`flowrl.ops.learner` and are importable from here too.

Examples:
    >>> import queue
    >>> q = queue.Queue(maxsize=1)
    >>> store = iter_list([1, 2, 3]).for_each(Enqueue(q))
    >>> Concurrently([store, Dequeue(q)], mode="async", output_indexes=[1]).take(3)
    [1, 2, 3]
"""

from __future__ import annotations

import numbers
import queue
from typing import Any, Callable, Literal, Sequence, TypeVar

from flowrl.iter import LocalIterator, RetryLater
from flowrl.iter.pullers import union_quotas
from flowrl.metrics import MetricsBinding
from flowrl.ops.learner import ApexLearnerThread, LearnerThread, MinibatchBuffer, MultiGPULearnerThread

__all__ = ["Concurrently", "Enqueue", "Dequeue", "MinibatchBuffer", "LearnerThread", "MultiGPULearnerThread",
           "ApexLearnerThread"]

T = TypeVar("T")

_MODES = ("round_robin", "async")
_PUT_TIMEOUT_S = 0.001  # Enqueue's longest wait on a full queue before it asks to be retried
_GET_TIMEOUT_S = 0.001  # Dequeue's longest wait on an empty queue before it reports "nothing yet"


# ---------------------------------------------------------------------------------------------
# Concurrently

class _Tag:
    """``item -> (index, item)``: marks which op an item came from."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __call__(self, item: Any) -> tuple[int, Any]:
        return self.index, item

    def __repr__(self) -> str:
        return f"Tag({self.index})"


class _SelectOutputs:
    """``(index, item) -> [item]`` for an output op, ``[]`` otherwise (the item is dropped here)."""

    def __init__(self, output_indexes: frozenset[int]) -> None:
        self.output_indexes = output_indexes

    def __call__(self, tagged: tuple[int, Any]) -> list[Any]:
        index, item = tagged
        return [item] if index in self.output_indexes else []

    def __repr__(self) -> str:
        return f"SelectOutputs({sorted(self.output_indexes)})"


def _check_output_indexes(output_indexes: Sequence[int] | None, num_ops: int) -> frozenset[int] | None:
    if output_indexes is None:
        return None
    fix = f"pass a non-empty list of op indices in [0, {num_ops}), or omit it to output every op"
    if isinstance(output_indexes, (str, bytes)) or not isinstance(output_indexes, Sequence) or not output_indexes:
        raise ValueError(f"Concurrently output_indexes={output_indexes!r} is not a non-empty list; {fix}")
    for i in output_indexes:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= i < num_ops:
            raise ValueError(f"Concurrently output_indexes entry {i!r} is not the index of one of the {num_ops} "
                             f"ops; {fix}")
    return frozenset(int(i) for i in output_indexes)


def Concurrently(ops: Sequence[LocalIterator[Any]], *, mode: Literal["round_robin", "async"] = "round_robin",
                 output_indexes: Sequence[int] | None = None,
                 round_robin_weights: Sequence[float | str] | None = None) -> LocalIterator[Any]:
    """Runs several sub-flows in one thread: a union of ``ops`` that emits the items of the output ops.

    ``"round_robin"`` fixes the ratio of pulls between the ops: one each per turn, or ``w`` for a numeric
    weight (a fraction is a probability of one more) and up to 100 ready items for ``"*"``.
    ``"async"`` runs each op as fast as it can: an op with nothing ready never holds up the others.
    Ops not listed in ``output_indexes`` are still pulled, so their side effects (storing, training,
    enqueuing) happen; their items are dropped inside the dataflow. All ops end up sharing one metrics
    context. Every check runs here, at construction, and a failed call leaves the ops
    untouched.

    Metrics: none of its own (merges the ops' contexts).

    Args:
        ops: two or more LocalIterators, each consumed by this union only.
        mode: ``"round_robin"`` or ``"async"``.
        output_indexes: the ops whose items are emitted (default: all).
        round_robin_weights: per-op pulls per turn, a positive number or ``"*"`` (not all ``"*"``);
            ``"round_robin"`` mode only.

    Returns:
        A LocalIterator over the output ops' items.

    Raises:
        ValueError: fewer than 2 ops, an unknown mode, weights in async mode, all-``"*"``, wrong-length or
            invalid weights, an empty, non-integer or out-of-range output index, or one op passed twice.
        TypeError: an op that is not a LocalIterator, or a LocalIterator in place of the list of ops.

    Examples:
        >>> stored = []
        >>> store_op = iter_list([1, 2, 3]).for_each(stored.append)
        >>> it = Concurrently([store_op, iter_list([4, 5, 6])], output_indexes=[1])
        >>> it.take(3), stored
        ([4, 5, 6], [1, 2, 3])
        >>> Concurrently([iter_list([1]), iter_list([2])], mode="async")
        LocalIterator[Concurrently(async)[LocalIterator[iter_list], LocalIterator[iter_list]]]
        >>> Concurrently([iter_list([1] * 3), iter_list([2] * 3)], round_robin_weights=[2, 1]).take(6)
        [1, 1, 2, 1, 2, 2]
    """
    if isinstance(ops, LocalIterator):  # list() would consume the stream itself
        raise TypeError(f"Concurrently got the single iterator {ops!r}; pass a list of sub-flows: "
                        f"Concurrently([op_a, op_b], ...)")
    ops = list(ops)
    if len(ops) < 2:
        raise ValueError(f"Concurrently needs at least 2 ops, got {len(ops)}; a single sub-flow needs no "
                         f"Concurrently: use the iterator itself")
    for i, op in enumerate(ops):
        if not isinstance(op, LocalIterator):
            raise TypeError(f"Concurrently ops[{i}] is a {type(op).__name__}, not a LocalIterator; gather a "
                            f"ParallelIterator first (.gather_async() or .gather_sync())")
    if len({id(op) for op in ops}) < len(ops):
        raise ValueError("Concurrently got the same iterator twice; use it.duplicate(n) to feed one stream to "
                         "several sub-flows")
    if mode not in _MODES:
        raise ValueError(f"Concurrently mode={mode!r} is unknown; use 'round_robin' (a fixed ratio of pulls) "
                         f"or 'async' (each op as fast as it can)")
    if round_robin_weights is not None:
        if mode == "async":
            raise ValueError(f"Concurrently round_robin_weights={round_robin_weights!r} given with mode='async'; "
                             f"weights fix a ratio of pulls, so use mode='round_robin' or drop the weights")
        if isinstance(round_robin_weights, (str, bytes)) or not isinstance(round_robin_weights, Sequence):
            raise ValueError(f"Concurrently round_robin_weights={round_robin_weights!r} must be a list with one "
                             f"entry per op ({len(ops)})")
        union_quotas(len(ops), True, round_robin_weights)  # the core's checks: length and entries
        if all(w == "*" for w in round_robin_weights):
            raise ValueError(f"Concurrently round_robin_weights={list(round_robin_weights)!r} are all '*'; give "
                             f"at least one op a numeric weight (pulls per turn) to set the pace")
    outputs = _check_output_indexes(output_indexes, len(ops))

    label: list[str] = [mode]
    if round_robin_weights is not None:
        label.append(f"round_robin_weights={list(round_robin_weights)!r}")
    if outputs is not None:
        label.append(f"output_indexes={sorted(outputs)}")
    name = f"Concurrently({', '.join(label)})[{', '.join(repr(op) for op in ops)}]"

    deterministic = mode == "round_robin"
    if outputs is None:
        merged = ops[0].union(*ops[1:], deterministic=deterministic, round_robin_weights=round_robin_weights)
    else:
        tagged = [op.for_each(_Tag(i)) for i, op in enumerate(ops)]
        merged = (tagged[0].union(*tagged[1:], deterministic=deterministic, round_robin_weights=round_robin_weights)
                  .combine(_SelectOutputs(outputs)))
    return merged.named(name, inputs=ops, mode=mode, round_robin_weights=round_robin_weights,
                        output_indexes=None if outputs is None else sorted(outputs))


# ---------------------------------------------------------------------------------------------
# Queues

def _check_queue(q: object, who: str) -> None:
    if not isinstance(q, queue.Queue):
        raise ValueError(f"{who} needs a queue.Queue, got {type(q).__name__}: {q!r:.80}; pass e.g. "
                         f"learner.inqueue, or queue.Queue(maxsize=n) for a bounded hand-off")


class Enqueue(MetricsBinding):
    """Consumes any item except ``None``; puts it on ``output_queue`` and emits it unchanged.

    The put waits at most ~1 ms. On a full queue it raises :class:`~flowrl.iter.RetryLater`, so the core
    retries the same item on a later pull (no loss, no duplication, order kept) and pulls nothing new
    meanwhile, while a surrounding union serves its other branches.

    Use with ``.for_each()``. Metrics: none.

    Examples:
        >>> import queue
        >>> q = queue.Queue(maxsize=2)
        >>> iter_list([1, 2]).for_each(Enqueue(q)).take(2), q.qsize()
        ([1, 2], 2)
        >>> Enqueue(q)(3)
        Traceback (most recent call last):
        ...
        flowrl.iter.stages.RetryLater
    """

    def __init__(self, output_queue: queue.Queue[Any]) -> None:
        _check_queue(output_queue, "Enqueue")
        self.queue = output_queue

    def __call__(self, item: T) -> T:
        if item is None:
            raise ValueError(f"{self!r} got None; None means 'nothing yet' to the Dequeue reading this queue, so "
                             f"filter None items out before Enqueue")
        try:
            self.queue.put(item, timeout=_PUT_TIMEOUT_S)
        except queue.Full:
            raise RetryLater from None
        return item

    def __repr__(self) -> str:
        return f"Enqueue(maxsize={self.queue.maxsize})"


def Dequeue(input_queue: queue.Queue[T], check: Callable[[], object] = lambda: True) -> LocalIterator[T]:
    """A source of the items of ``input_queue``; "nothing yet" while it is empty, never blocking.

    Before **every** poll it evaluates ``check()``. If that is false it raises ``RuntimeError``; when
    ``check`` is a learner thread's ``is_alive`` and the thread died of an exception (``thread.error``),
    that exception is chained as the cause. Each poll waits at most ~1 ms on the queue. The stream does
    not end on its own; ``check()`` may raise ``StopIteration`` to end it.

    Use as a sub-flow of :func:`Concurrently`. Metrics: none; ``current_actor`` is ``None``.

    Args:
        input_queue: the queue to read, e.g. ``learner.outqueue``; producers must not put ``None``.
        check: a zero-argument callable, e.g. ``learner.is_alive``.

    Raises:
        ValueError: ``input_queue`` is not a ``queue.Queue`` (at construction), or it yields ``None``.
        RuntimeError: ``check()`` returned a false value.

    Examples:
        >>> import queue
        >>> q = queue.Queue()
        >>> for x in (1, 2):
        ...     q.put(x)
        >>> Dequeue(q).take(2)
        [1, 2]
        >>> Concurrently([Dequeue(q), iter_list([3, 4])], mode="async").take(2)  # q is empty: no wait
        [3, 4]
        >>> Dequeue(q, check=lambda: False).take(1)
        Traceback (most recent call last):
        ...
        RuntimeError: Dequeue check() returned False: ...
    """
    _check_queue(input_queue, "Dequeue")
    if not callable(check):
        raise TypeError(f"Dequeue check={check!r} must be a zero-argument callable, e.g. learner.is_alive")

    def poll() -> T | None:
        if not check():
            error = getattr(getattr(check, "__self__", None), "error", None)
            cause = error if isinstance(error, BaseException) else None
            why = ("its producer died of the exception above" if cause is not None
                   else "its producer is gone, so nothing more will arrive")
            raise RuntimeError(f"Dequeue check() returned False: {check!r} says {why}; fix the producer "
                               f"(e.g. the learner thread's error) and rebuild the plan") from cause
        try:
            item = input_queue.get(timeout=_GET_TIMEOUT_S)
        except queue.Empty:
            return None
        if item is None:
            raise ValueError("Dequeue got None from its queue; None means 'nothing yet' to a poll source, so "
                             "producers must not put None")
        return item

    # named as a source that records its queue and producer, so plan inspection can link it to its Enqueue
    return LocalIterator.from_poll(poll).named("Dequeue", inputs=(), queue=input_queue,
                                               producer=getattr(check, "__self__", None))
