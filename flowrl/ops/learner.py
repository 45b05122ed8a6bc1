"""Learner threads: train on what arrives in an in-queue and report on an out-queue, so sampling and learning
overlap (IMPALA, APPO, Ape-X).

:class:`LearnerThread` (one device), :class:`MultiGPULearnerThread` (loader threads fill tower stacks) and
:class:`ApexLearnerThread` (reports new priorities per replay shard) share one base: queues, the weights flag
and lock, error capture, stop and stats. :class:`MinibatchBuffer` replays each in-queue item a few times.
A plan feeds a thread with ``Enqueue(learner.inqueue)`` and reads it with ``Dequeue(learner.outqueue,
check=learner.is_alive)`` (:mod:`flowrl.ops.concurrency`, which re-exports these classes).

Examples:
    >>> from flowrl.testing import FakeConfig, FakeWorker
    >>> learner = LearnerThread(FakeWorker(config=FakeConfig()), learner_queue_size=4)  # not started yet
    >>> learner.inqueue.maxsize, learner.is_alive(), learner.add_learner_metrics({})["info"]["learner_queue"]
    (4, False, {'size_count': 0, 'size_mean': 0.0, 'size_std': 0.0, 'size_quantiles': []})
"""

from __future__ import annotations

import copy
import logging
import math
import queue
import sys
import threading
from collections import deque
from typing import Any, Callable, Generic, Mapping, Protocol, Sequence, TypeVar

import numpy as np

from flowrl import decisions, executor
from flowrl.metrics import (LEARNER_DEQUEUE_TIMER, LEARNER_GRAD_TIMER, LEARNER_INFO, LEARNER_LOAD_TIMER,
                            LEARNER_LOAD_WAIT_TIMER, LEARNER_OVERALL_TIMER, LEARNER_QUEUE_INFO, LEARNER_STATS_KEY,
                            TIMING_BREAKDOWN_INFO, Timer)
from flowrl.ops._common import check_batch, record_staleness, staleness_info
from flowrl.metrics import Summary
from flowrl.sample_batch import BATCH_INDEXES, TD_ERROR, AnyBatch
from flowrl.validation import check_int, check_number

__all__ = ["MinibatchBuffer", "LearnerThread", "MultiGPULearnerThread", "ApexLearnerThread"]

T = TypeVar("T")
logger = logging.getLogger(__name__)

_POLL_S = 0.05  # multi-GPU threads re-check stop() and their loaders' health at least this often


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
        check_number("MinibatchBuffer timeout", timeout, ge=0, none_ok=True, meaning="seconds; None: wait forever")
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


class _SteppedQueue(queue.Queue[Any]):
    """The in-queue of a learner under the local executor: every put runs the learner's steps that can run now,
    in the putting thread (the driver), instead of waking a learner thread."""

    def __init__(self, learner: _LearnerBase, maxsize: int) -> None:
        super().__init__(maxsize)
        self.learner = learner

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        self.learner.run_ready_steps()


class _ObservedLock:
    """A learner's ``weights_lock`` under a decision log: each time the driver takes it (to read the weights,
    or update a target network) is a decision that records, or replays, how far the learner had trained."""

    def __init__(self, lock: threading.Lock | threading.RLock, log: decisions.Recorder | decisions.Replayer) -> None:
        self.lock, self.log = lock, log

    def __enter__(self) -> None:
        site = sys._getframe(1).f_code.co_qualname
        if isinstance(self.log, decisions.Replayer):
            self.log.decide("lock", site, lambda: None)  # the learner advanced first: it takes the lock itself
            self.lock.acquire()
        else:
            self.lock.acquire()
            self.log.decide("lock", site, lambda: None)  # while held: the learner cannot step on

    def __exit__(self, *exc: object) -> None:
        self.lock.release()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self.lock.acquire(blocking, timeout)

    def release(self) -> None:
        self.lock.release()


class _LearnerBase(threading.Thread):
    """What every learner thread shares: queues, the weights flag and lock, error capture, stop, stats.

    Made under the local executor (:mod:`flowrl.executor`), a learner is *scheduled*: ``start()`` starts no
    thread, and each put on its in-queue runs, in the putting thread, every step that can run without waiting
    (:meth:`run_ready_steps`), so a run's learning interleaves with the driver in one fixed order. An error in
    a step is kept in ``error`` and ends the learner, as in a thread.
    """

    def __init__(self, local_worker: _LearnsOnBatch, learner_queue_size: int, name: str) -> None:
        super().__init__(name=name, daemon=True)
        check_int(f"{type(self).__name__} learner_queue_size", learner_queue_size, 1)
        self.local_worker = local_worker
        # under a decision log (flowrl.decisions), what the driver sees of this learner is recorded or replayed;
        # replaying, the learner is scheduled and trains only as far as the log says before each decision
        self._log = decisions.active()
        replayed = isinstance(self._log, decisions.Replayer)
        self.scheduled = executor.current() == "local" or replayed
        self._scheduled_started = False
        self.inqueue: queue.Queue[Any]
        self.outqueue: queue.Queue[Any]
        if self._log is not None:
            self.inqueue = decisions.ObservedQueue(learner_queue_size, f"{name} in-queue", driver_op="put")
            self.outqueue = decisions.ObservedQueue(0, f"{name} out-queue", driver_op="get")
        else:
            self.inqueue = (_SteppedQueue(self, learner_queue_size) if self.scheduled else
                            queue.Queue(maxsize=learner_queue_size))
            self.outqueue = queue.Queue()
        # the worker's own lock where it has one (RolloutWorker.learn_lock), so its get_state in the driver
        # (a checkpoint) waits for the step in progress instead of reading a half-updated network
        lock = getattr(local_worker, "learn_lock", None)
        self._lock: threading.Lock | threading.RLock = lock if lock is not None else threading.Lock()
        self.weights_lock: Any = self._lock if self._log is None else _ObservedLock(self._lock, self._log)
        if self._log is not None and lock is not None:
            local_worker.learn_lock = self.weights_lock  # type: ignore[attr-defined]  # the driver's takes observed too
        self._weights_updated = False
        self._version = 0  # odd while a step publishes its update: the driver reads flag and steps consistently
        self.learner_info: dict[str, Any] = {}
        self.num_steps = 0
        decisions.register_learner(self)
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

    def _next_ready_step(self) -> Callable[[], None] | None:
        """The step that can run now without waiting (a scheduled learner), or ``None``."""
        return self.step if self.inqueue.qsize() else None

    @property
    def weights_updated(self) -> bool:
        """Whether a learn step changed the weights since the driver last cleared the flag (a decision of the
        run under a log: :mod:`flowrl.decisions`)."""
        log = self._log
        if log is None:
            return self._weights_updated
        site = sys._getframe(1).f_code.co_qualname
        if isinstance(log, decisions.Replayer):
            flag, progress = log.next_entry("flag", site)
            log.advance(progress)
            if bool(flag) != self._weights_updated:
                raise decisions.ReplayDivergence(f"replay of {log.path} diverged at report {log.report}, decision "
                                                 f"#{log.position}: {site} read weights_updated={bool(flag)} in the "
                                                 f"recorded run, {self._weights_updated} now")
            return bool(flag)
        while True:  # the flag and the step count of one moment, never half a step's update
            version = self._version
            flag, steps = self._weights_updated, self.num_steps
            if version % 2 == 0 and version == self._version:
                break
        progress = [steps if learner is self else learner.num_steps for learner in log.learners]
        log.write("flag", site, int(flag), progress)
        return flag

    @weights_updated.setter
    def weights_updated(self, value: bool) -> None:
        self._weights_updated = value

    def advance_to(self, num_steps: int) -> None:
        """A replayed learner's turn: learn steps until ``num_steps`` are done (what the log recorded).

        Raises:
            ReplayDivergence: the steps it needs cannot run (nothing to train on): the run diverged.
        """
        while self.num_steps < num_steps:
            step = self._next_ready_step()
            if step is None:
                log = self._log
                raise decisions.ReplayDivergence(
                    f"replay of {getattr(log, 'path', '?')} diverged at report {getattr(log, 'report', '?')}: the "
                    f"log has {self.name} at {num_steps} learn steps, but it has nothing to train on after "
                    f"{self.num_steps}")
            step()

    def run_ready_steps(self) -> None:
        """A scheduled learner's turn: runs the steps that can run now, until none can (or one fails: its error
        is kept in ``error``, as a thread keeps it). Does nothing before ``start()``, after ``stop()``, or
        for a learner that runs as a thread."""
        if not (self.scheduled and self._scheduled_started) or self.stopped or self.error is not None:
            return
        if isinstance(self._log, decisions.Replayer):
            return  # a replayed learner trains only as far as the log says, at each decision
        try:
            while (step := self._next_ready_step()) is not None:
                step()
        except Exception as e:  # kept; Dequeue(check=self.is_alive) raises from it
            self.error = e

    def start(self) -> None:
        """Starts the thread (a scheduled learner: lets puts run its steps)."""
        if self.scheduled:
            self._scheduled_started = True
            self.run_ready_steps()
        else:
            super().start()

    def is_alive(self) -> bool:
        if self.scheduled:
            return self._scheduled_started and not self.stopped and self.error is None
        return super().is_alive()

    def join(self, timeout: float | None = None) -> None:
        if not self.scheduled:
            super().join(timeout)

    def stop(self) -> None:
        """Asks the thread to end after its current step; ``join()`` waits for that."""
        self._stop_event.set()
        if self.scheduled:
            return
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
        with self.grad_timer, self._lock:
            info = dict(self.local_worker.learn_on_batch(batch))
            self._version += 1  # the flag and the step count change together (see weights_updated)
            self._weights_updated = True
            self.num_steps += 1
            self._version += 1
        self.grad_timer.push_units_processed(batch.count)
        return info


class LearnerThread(_LearnerBase):
    """The IMPALA/APPO learner: trains on the batches put in ``inqueue``, reports on ``outqueue``.

    A daemon thread. It takes batches through a :class:`MinibatchBuffer` (size ``minibatch_buffer_size``, every
    batch used ``num_sgd_iter`` times); given ``minibatches``, a function that cuts a batch into the batches to
    learn on one after another (IMPALA's cuts whole trajectory pieces), each use of a batch is cut by it. Each
    step runs ``local_worker.learn_on_batch`` on one batch (or one cut of it) under ``weights_lock``, sets
    ``weights_updated`` and puts ``(env_steps, agent_steps, learner_info)`` of the rows it learned on on
    ``outqueue``. A wait longer than ``learner_queue_timeout`` on an empty in-queue just starts another wait. Any
    error is stored in ``error`` and ends the thread, so ``is_alive()`` turns false.

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
                 learner_queue_size: int = 16, learner_queue_timeout: float = 300,
                 minibatches: Callable[[AnyBatch], Sequence[AnyBatch]] | None = None) -> None:
        super().__init__(local_worker, learner_queue_size, "flowrl-learner")
        if minibatches is not None and not callable(minibatches):
            raise TypeError(f"LearnerThread minibatches={minibatches!r} must be a function batch -> batches, or None")
        self.minibatches = minibatches
        self._cut: deque[AnyBatch] = deque()  # the rest of the batch being learned on, cut by ``minibatches``
        check_int("LearnerThread minibatch_buffer_size", minibatch_buffer_size, 1)
        check_int("LearnerThread num_sgd_iter", num_sgd_iter, 1)
        check_number("LearnerThread learner_queue_timeout", learner_queue_timeout, gt=0, meaning="seconds")
        self.minibatch_buffer: MinibatchBuffer[Any] = MinibatchBuffer(
            self.inqueue, size=minibatch_buffer_size, timeout=learner_queue_timeout, num_passes=num_sgd_iter,
            init_num_passes=num_sgd_iter)

    def _next_ready_step(self) -> Callable[[], None] | None:
        buffer = self.minibatch_buffer
        return self.step if self._cut or buffer.ttl[buffer.idx] > 0 or self.inqueue.qsize() else None

    def step(self) -> None:
        if not self._cut:
            with self.queue_timer:
                try:
                    item, _ = self.minibatch_buffer.get()
                except queue.Empty:
                    return
            if item is _STOP:
                return
            whole = check_batch(item, self)
            parts = list(self.minibatches(whole)) if self.minibatches is not None else [whole]
            if not parts:
                raise ValueError(f"{self.name}: minibatches cut a batch of {whole.count} rows into no batches; it "
                                 f"must return at least one")
            self._cut.extend(parts)
        batch = self._cut.popleft()
        info = self._learn(batch)
        self.learner_info = info
        self.outqueue.put((batch.count, batch.agent_steps(), info))
        self.learner_queue_size.push(self.inqueue.qsize())


def _devices(num_gpus: float) -> list[str]:
    check_number("MultiGPULearnerThread num_gpus", num_gpus, ge=0, lt=math.inf, meaning="0: the towers live on the CPU")
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
        check_number("MultiGPULearnerThread learner_queue_timeout", learner_queue_timeout, gt=0, meaning="seconds")
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
        """Starts the loader threads, then the learner (a scheduled learner: the loaders become its steps)."""
        if not self.scheduled:
            for loader in self.loader_threads:
                loader.start()
        super().start()

    def stop(self) -> None:
        self._stop_event.set()  # every wait here is at most wait_s long, so no wake-up is needed

    def _next_ready_step(self) -> Callable[[], None] | None:
        if self.inqueue.qsize() and self.idle_tower_stacks.qsize():
            return self.loader_threads[0].step
        buffer = self.ready_tower_stacks_buffer
        return self.step if buffer.ttl[buffer.idx] > 0 or self.ready_tower_stacks.qsize() else None

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
    """The Ape-X learner: trains on ``(replay_shard, batch)`` items and reports new priorities.

    A daemon thread. Per step it learns on the batch under ``weights_lock``, sets ``weights_updated``,
    extracts per-policy ``td_error`` (from the info, or its ``learner_stats``) and ``batch_indexes``, and
    puts ``(replay_shard, {pid: (batch_indexes, td_error)}, env_steps, agent_steps)`` on ``outqueue``.
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
                raise ValueError(f"{self.name} in-queue items are (replay_shard, batch) pairs, got "
                                 f"{type(item).__name__}; feed it with "
                                 f".zip_with_source_actor().for_each(Enqueue(learner.inqueue))")
            replay_shard, batch = item[0], check_batch(item[1], self)
            info = self._learn(batch)
            self.learner_info = {pid: {k: v for k, v in policy_info.items() if k != TD_ERROR}
                                 for pid, policy_info in info.items()}
            self.outqueue.put((replay_shard, _priorities(batch, info), batch.count, batch.agent_steps()))
            self.learner_queue_size.push(self.inqueue.qsize())
        self.overall_timer.push_units_processed(batch.count)
