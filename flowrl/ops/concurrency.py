"""Concurrency operators: sub-flows side by side in one driver thread, and queues to learner threads.

``Concurrently`` interleaves sub-flows (a union: see ``LocalIterator.union``). ``Enqueue`` and ``Dequeue`` connect
a dataflow to a ``queue.Queue`` without ever blocking it. The learner threads (``LearnerThread``,
``MultiGPULearnerThread``, ``ApexLearnerThread``) train on what arrives in their in-queue and report on
their out-queue, so sampling and learning overlap.

Examples:
    >>> import queue
    >>> q = queue.Queue(maxsize=1)
    >>> store = iter_list([1, 2, 3]).for_each(Enqueue(q))
    >>> Concurrently([store, Dequeue(q)], mode="async", output_indexes=[1]).take(3)
    [1, 2, 3]
"""

from __future__ import annotations

import copy
import logging
import math
import numbers
import queue
import threading
from collections import deque
from typing import Any, Callable, Generic, Literal, Mapping, Protocol, Sequence, TypeVar

import numpy as np

from flowrl.iter import LocalIterator, RetryLater
from flowrl.iter.pullers import union_quotas
from flowrl.metrics import (LEARNER_DEQUEUE_TIMER, LEARNER_GRAD_TIMER, LEARNER_INFO, LEARNER_LOAD_TIMER,
                            LEARNER_LOAD_WAIT_TIMER, LEARNER_OVERALL_TIMER, LEARNER_QUEUE_INFO, LEARNER_STATS_KEY,
                            TIMING_BREAKDOWN_INFO, MetricsBinding, Timer)
from flowrl.ops._common import check_batch, check_int, record_staleness, staleness_info
from flowrl.metrics import Summary
from flowrl.sample_batch import BATCH_INDEXES, TD_ERROR, AnyBatch

__all__ = ["Concurrently", "Enqueue", "Dequeue", "MinibatchBuffer", "LearnerThread", "MultiGPULearnerThread",
           "ApexLearnerThread"]

T = TypeVar("T")
logger = logging.getLogger(__name__)

_MODES = ("round_robin", "async")
_PUT_TIMEOUT_S = 0.001  # Enqueue's longest wait on a full queue before it asks to be retried
_GET_TIMEOUT_S = 0.001  # Dequeue's longest wait on an empty queue before it reports "nothing yet"
_POLL_S = 0.05  # multi-GPU threads re-check stop() and their loaders' health at least this often


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
        flowrl.iter.RetryLater
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


# ---------------------------------------------------------------------------------------------
# Learner threads

class MinibatchBuffer(Generic[T]):
    """A ring of ``size`` slots over ``inqueue``; each item is returned ``num_passes`` times.

    ``get()`` returns ``(item, released)``. An empty slot blocks on ``inqueue.get(timeout=timeout)``
    (``queue.Empty`` propagates); a loaded item starts with the current initial TTL, which then ramps up
    by one per load from ``init_num_passes`` to ``num_passes``. ``released`` is true on an item's last use.

    Examples:
        >>> import queue
        >>> q = queue.Queue()
        >>> for x in "abc":
        ...     q.put(x)
        >>> buf = MinibatchBuffer(q, size=1, timeout=0.01, num_passes=2)
        >>> [buf.get() for _ in range(5)]
        [('a', True), ('b', False), ('b', True), ('c', False), ('c', True)]
    """

    def __init__(self, inqueue: queue.Queue[T], size: int, timeout: float | None, num_passes: int,
                 init_num_passes: int = 1) -> None:
        check_int("MinibatchBuffer size", size, 1)
        check_int("MinibatchBuffer num_passes", num_passes, 1)
        check_int("MinibatchBuffer init_num_passes", init_num_passes, 1)
        if init_num_passes > num_passes:
            raise ValueError(f"MinibatchBuffer init_num_passes={init_num_passes} exceeds num_passes={num_passes}; "
                             f"the ramp-up goes from init_num_passes up to num_passes")
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout >= 0):
            raise ValueError(f"MinibatchBuffer timeout={timeout!r} must be None (wait forever) or seconds >= 0")
        self.inqueue, self.size, self.timeout = inqueue, size, timeout
        self.max_ttl, self.cur_max_ttl = num_passes, init_num_passes
        self.buffers: list[Any] = [None] * size
        self.ttl = [0] * size
        self.idx = 0

    def get(self) -> tuple[T, bool]:
        if self.ttl[self.idx] <= 0:
            self.buffers[self.idx] = self.inqueue.get(timeout=self.timeout)
            self.ttl[self.idx] = self.cur_max_ttl
            if self.cur_max_ttl < self.max_ttl:
                self.cur_max_ttl += 1
        item: T = self.buffers[self.idx]
        self.ttl[self.idx] -= 1
        released = self.ttl[self.idx] <= 0
        if released:
            self.buffers[self.idx] = None
        self.idx = (self.idx + 1) % self.size
        return item, released


def _check_seconds(what: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{what}={value!r} must be a number of seconds > 0")


class _LearnsOnBatch(Protocol):
    def learn_on_batch(self, batch: AnyBatch) -> Mapping[str, Any]: ...


class _SizeWindow:
    """The last ``n`` in-queue sizes, summarised as ``size_count/mean/std/quantiles``."""

    def __init__(self, n: int = 50) -> None:
        self.values: deque[int] = deque(maxlen=n)

    def push(self, value: int) -> None:
        self.values.append(value)

    def stats(self) -> dict[str, Any]:
        values = np.asarray(list(self.values), dtype=np.float64)  # list(deque) is one atomic C call
        if values.size == 0:
            return {"size_count": 0, "size_mean": 0.0, "size_std": 0.0, "size_quantiles": []}
        return {"size_count": int(values.size), "size_mean": float(values.mean()), "size_std": float(values.std()),
                "size_quantiles": np.percentile(values, [0, 10, 50, 90, 100]).tolist()}


class _Stop:
    def __repr__(self) -> str:
        return "_STOP"


_STOP: Any = _Stop()  # put on a learner's in-queue by stop() to wake it; private to this module


class _LearnerBase(threading.Thread):
    """What every learner thread shares: queues, the weights flag and lock, error capture, stop, stats."""

    def __init__(self, local_worker: _LearnsOnBatch, learner_queue_size: int, name: str) -> None:
        super().__init__(name=name, daemon=True)
        check_int(f"{type(self).__name__} learner_queue_size", learner_queue_size, 1)
        self.local_worker = local_worker
        self.inqueue: queue.Queue[Any] = queue.Queue(maxsize=learner_queue_size)
        self.outqueue: queue.Queue[Any] = queue.Queue()
        # the worker's own lock where it has one (RolloutWorker.learn_lock), so its get_state in the driver
        # (a checkpoint) waits for the step in progress instead of reading a half-updated network
        lock = getattr(local_worker, "learn_lock", None)
        self.weights_lock: threading.Lock | threading.RLock = lock if lock is not None else threading.Lock()
        self.weights_updated = False
        self.learner_info: dict[str, Any] = {}
        self.num_steps = 0
        self.error: BaseException | None = None
        self.queue_timer, self.grad_timer = Timer(), Timer()
        self.learner_queue_size = _SizeWindow(50)
        self.staleness = Summary()  # of the rows it trains on, when they carry their weights_version
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                self.step()
        except Exception as e:  # stored; Dequeue(check=self.is_alive) re-raises it as the cause
            self.error = e
            logger.error("%s died; Dequeue(check=<it>.is_alive) will raise RuntimeError from this error",
                         self.name, exc_info=e)

    def step(self) -> None:
        """One unit of work (subclasses); returns without output when nothing arrived in time."""
        raise NotImplementedError

    def stop(self) -> None:
        """Asks the thread to end after its current step; ``join()`` waits for that."""
        self._stop_event.set()
        try:
            self.inqueue.put_nowait(_STOP)  # wakes a thread waiting on an empty in-queue
        except queue.Full:
            pass  # a full in-queue means the thread is not waiting on it

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop_event.is_set()

    @property
    def timers(self) -> dict[str, Timer]:
        """The thread's timers by their standard key (``learner_dequeue``, ``learner_grad``, ...)."""
        return {LEARNER_DEQUEUE_TIMER: self.queue_timer, LEARNER_GRAD_TIMER: self.grad_timer}

    def add_learner_metrics(self, result: dict[str, Any]) -> dict[str, Any]:
        """Adds ``learner_queue``, ``learner`` and ``timing_breakdown`` to ``result["info"]``; returns it.

        Use with ``.for_each()`` after the report.
        """
        info = result.setdefault("info", {})
        info[LEARNER_QUEUE_INFO] = self.learner_queue_size.stats()
        info[LEARNER_INFO] = copy.deepcopy(self.learner_info)
        info[TIMING_BREAKDOWN_INFO] = {f"{key}_time_ms": round(1000 * timer.mean, 3)
                                       for key, timer in self.timers.items()}
        return result

    def profile_info(self) -> dict[str, Any]:
        """What :mod:`flowrl.profiling` adds to the thread's node: the staleness of what it trained on, and the
        learn steps taken."""
        return {"learn_steps": self.num_steps, **staleness_info(self.staleness)}

    def _learn(self, batch: AnyBatch) -> dict[str, Any]:
        """``learn_on_batch`` under the grad timer and the weights lock; sets ``weights_updated``. Records the
        batch's staleness first (this thread is the only one that changes the learner's weights)."""
        record_staleness(self.staleness, self.local_worker, batch)
        with self.grad_timer, self.weights_lock:
            info = dict(self.local_worker.learn_on_batch(batch))
            self.weights_updated = True
        self.grad_timer.push_units_processed(batch.count)
        self.num_steps += 1
        return info


class LearnerThread(_LearnerBase):
    """The IMPALA/APPO learner: trains on the batches put in ``inqueue``, reports on ``outqueue``.

    A daemon thread. Each step takes a batch through a :class:`MinibatchBuffer` (size
    ``minibatch_buffer_size``, every batch used ``num_sgd_iter`` times), runs
    ``local_worker.learn_on_batch`` under ``weights_lock``, sets ``weights_updated`` and puts
    ``(env_steps, agent_steps, learner_info)`` on ``outqueue``. A wait longer than
    ``learner_queue_timeout`` on an empty in-queue just starts another wait. Any error is stored in
    ``error`` and ends the thread, so ``is_alive()`` turns false.

    Use ``Enqueue(learner.inqueue)`` and ``Dequeue(learner.outqueue, check=learner.is_alive)``; call
    ``start()`` once and ``stop()`` at shutdown. Metrics: ``add_learner_metrics(result)``. Profile:
    ``profile_info()`` (learn steps; staleness of stamped rows), as every learner thread.

    Examples:
        >>> from flowrl.testing import FakeConfig, FakeWorker, fake_batch
        >>> learner = LearnerThread(FakeWorker(config=FakeConfig()))
        >>> learner.start()
        >>> learner.inqueue.put(fake_batch(4))
        >>> env_steps, agent_steps, info = learner.outqueue.get(timeout=10)
        >>> env_steps, agent_steps, sorted(info["default_policy"]["learner_stats"])
        (4, 4, ['kl', 'loss'])
        >>> learner.stop(); learner.join(timeout=10); learner.is_alive()
        False
    """

    def __init__(self, local_worker: _LearnsOnBatch, minibatch_buffer_size: int = 1, num_sgd_iter: int = 1,
                 learner_queue_size: int = 16, learner_queue_timeout: float = 300) -> None:
        super().__init__(local_worker, learner_queue_size, "flowrl-learner")
        check_int("LearnerThread minibatch_buffer_size", minibatch_buffer_size, 1)
        check_int("LearnerThread num_sgd_iter", num_sgd_iter, 1)
        _check_seconds("LearnerThread learner_queue_timeout", learner_queue_timeout)
        self.minibatch_buffer: MinibatchBuffer[Any] = MinibatchBuffer(
            self.inqueue, size=minibatch_buffer_size, timeout=learner_queue_timeout, num_passes=num_sgd_iter,
            init_num_passes=num_sgd_iter)

    def step(self) -> None:
        with self.queue_timer:
            try:
                item, _ = self.minibatch_buffer.get()
            except queue.Empty:
                return
        if item is _STOP:
            return
        batch = check_batch(item, self)
        info = self._learn(batch)
        self.learner_info = info
        self.outqueue.put((batch.count, batch.agent_steps(), info))
        self.learner_queue_size.push(self.inqueue.qsize())


def _devices(num_gpus: float) -> list[str]:
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, (int, float)) or not 0 <= num_gpus < math.inf:
        raise ValueError(f"MultiGPULearnerThread num_gpus={num_gpus!r} must be a number >= 0 (0: the towers "
                         f"live on the CPU)")
    if num_gpus == 0:
        return ["cpu"]
    import torch  # only when GPUs are asked for: the CPU path stays torch-free

    wanted, seen = math.ceil(num_gpus), torch.cuda.device_count()
    if wanted > seen:
        raise ValueError(f"MultiGPULearnerThread num_gpus={num_gpus} but torch sees {seen} CUDA device(s); "
                         f"lower num_gpus (0 runs the towers on the CPU)")
    return [f"cuda:{i}" for i in range(wanted)]


class _LoaderThread(threading.Thread):
    """Moves batches from the learner's in-queue into idle tower stacks, then marks them ready."""

    def __init__(self, learner: MultiGPULearnerThread, index: int, share_stats: bool) -> None:
        super().__init__(name=f"{learner.name}-loader-{index}", daemon=True)
        self.learner = learner
        self.error: BaseException | None = None
        self.queue_timer = learner.queue_timer if share_stats else Timer()
        self.load_timer = learner.load_timer if share_stats else Timer()

    def run(self) -> None:
        try:
            while not self.learner.stopped:
                self.step()
        except Exception as e:  # stored; the learner raises from it on its next step
            self.error = e
            logger.error("%s died; %s will raise on its next step", self.name, self.learner.name, exc_info=e)

    def step(self) -> None:
        s = self.learner
        with self.queue_timer:
            try:
                item = s.inqueue.get(timeout=s.wait_s)
            except queue.Empty:
                return
        batch = check_batch(item, s)
        while True:
            try:
                index = s.idle_tower_stacks.get(timeout=s.wait_s)
                break
            except queue.Empty:
                if s.stopped:
                    return
        with self.load_timer:
            s.tower_stacks[index] = batch  # the towers on s.devices train on this stack's batch
        s.ready_tower_stacks.put(index)


class MultiGPULearnerThread(_LearnerBase):
    """The multi-device IMPALA/APPO learner: loader threads fill tower stacks, the learner trains on them.

    ``num_data_load_threads`` loader threads move batches from ``inqueue`` into idle tower stacks (one of
    ``num_multi_gpu_tower_stacks`` slots serving every device in ``devices``; with ``num_gpus=0`` the one
    device is the CPU). The learner takes ready stacks through a :class:`MinibatchBuffer` of size
    ``num_multi_gpu_tower_stacks`` (every stack used ``num_sgd_iter`` times), runs
    ``local_worker.learn_on_batch`` on the stack's batch under ``weights_lock``, returns a released stack
    to idle, and puts ``(env_steps, agent_steps, learner_info)`` on ``outqueue``, as
    :class:`LearnerThread` does. A dead loader makes the learner raise (``error`` set, ``is_alive()``
    false). No wait is fatal; the threads re-check ``stop()`` and the loaders at least every 50 ms.

    Use like :class:`LearnerThread`. Metrics: ``add_learner_metrics(result)``, plus the load timers.

    Examples:
        >>> from flowrl.testing import FakeConfig, FakeWorker, fake_batch
        >>> learner = MultiGPULearnerThread(FakeWorker(config=FakeConfig()), num_gpus=0, train_batch_size=4,
        ...                                 num_data_load_threads=1)
        >>> learner.devices
        ['cpu']
        >>> learner.start()
        >>> learner.inqueue.put(fake_batch(4))
        >>> learner.outqueue.get(timeout=10)[:2]
        (4, 4)
        >>> learner.stop(); learner.join(timeout=10); learner.is_alive()
        False
    """

    def __init__(self, local_worker: _LearnsOnBatch, num_gpus: float, train_batch_size: int,
                 num_multi_gpu_tower_stacks: int = 1, num_sgd_iter: int = 1, learner_queue_size: int = 16,
                 learner_queue_timeout: float = 300, num_data_load_threads: int = 16) -> None:
        super().__init__(local_worker, learner_queue_size, "flowrl-multi-gpu-learner")
        self.devices = _devices(num_gpus)
        check_int("MultiGPULearnerThread train_batch_size", train_batch_size, 1)
        check_int("MultiGPULearnerThread num_multi_gpu_tower_stacks", num_multi_gpu_tower_stacks, 1)
        check_int("MultiGPULearnerThread num_sgd_iter", num_sgd_iter, 1)
        check_int("MultiGPULearnerThread num_data_load_threads", num_data_load_threads, 1)
        _check_seconds("MultiGPULearnerThread learner_queue_timeout", learner_queue_timeout)
        self.train_batch_size = train_batch_size
        self.wait_s = min(float(learner_queue_timeout), _POLL_S)
        self.tower_stacks: list[AnyBatch | None] = [None] * num_multi_gpu_tower_stacks
        self.idle_tower_stacks: queue.Queue[int] = queue.Queue()
        self.ready_tower_stacks: queue.Queue[int] = queue.Queue()
        for index in range(num_multi_gpu_tower_stacks):
            self.idle_tower_stacks.put(index)
        self.ready_tower_stacks_buffer: MinibatchBuffer[int] = MinibatchBuffer(
            self.ready_tower_stacks, size=num_multi_gpu_tower_stacks, timeout=self.wait_s, num_passes=num_sgd_iter,
            init_num_passes=num_sgd_iter)
        self.load_timer, self.load_wait_timer = Timer(), Timer()
        self.loader_threads = [_LoaderThread(self, i, share_stats=i == 0) for i in range(num_data_load_threads)]

    def start(self) -> None:
        """Starts the loader threads, then the learner."""
        for loader in self.loader_threads:
            loader.start()
        super().start()

    def stop(self) -> None:
        self._stop_event.set()  # every wait here is at most wait_s long, so no wake-up is needed

    @property
    def timers(self) -> dict[str, Timer]:
        return {**super().timers, LEARNER_LOAD_TIMER: self.load_timer, LEARNER_LOAD_WAIT_TIMER: self.load_wait_timer}

    def step(self) -> None:
        for loader in self.loader_threads:
            if loader.ident is not None and not loader.is_alive() and not self.stopped:
                raise RuntimeError(f"{loader.name} died, so {self.name} gets no more data; see the chained "
                                   f"loader error") from loader.error
        with self.load_wait_timer:
            try:
                index, released = self.ready_tower_stacks_buffer.get()
            except queue.Empty:
                return
        batch = self.tower_stacks[index]
        assert batch is not None  # internal invariant: a ready stack holds a batch until it is released
        info = self._learn(batch)
        self.learner_info = info
        if released:
            self.tower_stacks[index] = None
            self.idle_tower_stacks.put(index)
        self.outqueue.put((batch.count, batch.agent_steps(), info))
        self.learner_queue_size.push(self.inqueue.qsize())


def _priorities(batch: AnyBatch, info: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{pid: (batch_indexes, td_error)}``; either is ``None`` where the batch or the info lacks it."""
    policy_batches = batch.as_multi_agent().policy_batches
    out: dict[str, tuple[Any, Any]] = {}
    for pid, policy_info in info.items():
        td_error = policy_info.get(TD_ERROR)
        if td_error is None:
            td_error = policy_info.get(LEARNER_STATS_KEY, {}).get(TD_ERROR)
        policy_batch = policy_batches.get(pid)
        out[pid] = (policy_batch.get(BATCH_INDEXES) if policy_batch is not None else None, td_error)
    return out


class ApexLearnerThread(_LearnerBase):
    """The Ape-X learner: trains on ``(replay_actor, batch)`` items and reports new priorities.

    A daemon thread. Per step it learns on the batch under ``weights_lock``, sets ``weights_updated``,
    extracts per-policy ``td_error`` (from the info, or its ``learner_stats``) and ``batch_indexes``, and
    puts ``(replay_actor, {pid: (batch_indexes, td_error)}, env_steps, agent_steps)`` on ``outqueue``.
    ``learner_info`` keeps the info without the per-row ``td_error``. Any error is stored in ``error`` and
    ends the thread.

    Use ``.zip_with_source_actor().for_each(Enqueue(learner.inqueue))`` and
    ``Dequeue(learner.outqueue, check=learner.is_alive)``. Metrics: ``timers`` (``learner_dequeue``,
    ``learner_grad``, ``learner_overall``) and ``add_learner_metrics(result)``.

    Examples:
        >>> from flowrl.testing import FakeConfig, FakeWorker, fake_batch
        >>> learner = ApexLearnerThread(FakeWorker(config=FakeConfig()))
        >>> learner.start()
        >>> learner.inqueue.put(("shard-0", fake_batch(3, batch_indexes=[7, 8, 9])))
        >>> shard, prios, env_steps, agent_steps = learner.outqueue.get(timeout=10)
        >>> shard, prios["default_policy"][0].tolist(), prios["default_policy"][1].tolist(), env_steps
        ('shard-0', [7, 8, 9], [0.0, 1.0, 2.0], 3)
        >>> learner.stop(); learner.join(timeout=10); learner.is_alive()
        False
    """

    def __init__(self, local_worker: _LearnsOnBatch, learner_queue_size: int = 16) -> None:
        super().__init__(local_worker, learner_queue_size, "flowrl-apex-learner")
        self.overall_timer = Timer()

    @property
    def timers(self) -> dict[str, Timer]:
        return {**super().timers, LEARNER_OVERALL_TIMER: self.overall_timer}

    def step(self) -> None:
        with self.overall_timer:
            with self.queue_timer:
                item = self.inqueue.get()  # stop() wakes it
            if item is _STOP:
                return
            if not (isinstance(item, tuple) and len(item) == 2):
                raise ValueError(f"{self.name} in-queue items are (replay_actor, batch) pairs, got "
                                 f"{type(item).__name__}; feed it with "
                                 f".zip_with_source_actor().for_each(Enqueue(learner.inqueue))")
            replay_actor, batch = item[0], check_batch(item[1], self)
            info = self._learn(batch)
            self.learner_info = {pid: {k: v for k, v in policy_info.items() if k != TD_ERROR}
                                 for pid, policy_info in info.items()}
            self.outqueue.put((replay_actor, _priorities(batch, info), batch.count, batch.agent_steps()))
            self.learner_queue_size.push(self.inqueue.qsize())
        self.overall_timer.push_units_processed(batch.count)
