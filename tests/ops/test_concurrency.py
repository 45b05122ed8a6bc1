"""flowrl.ops.concurrency against fakes."""

from __future__ import annotations

import itertools
import math
import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Literal

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from flowrl.iter import LocalIterator, RetryLater
from flowrl.metrics import (LEARNER_DEQUEUE_TIMER, LEARNER_GRAD_TIMER, LEARNER_INFO, LEARNER_LOAD_TIMER,
                            LEARNER_LOAD_WAIT_TIMER, LEARNER_OVERALL_TIMER, LEARNER_QUEUE_INFO, LEARNER_STATS_KEY,
                            TIMING_BREAKDOWN_INFO, MetricsBinding)
from flowrl.ops.concurrency import (ApexLearnerThread, Concurrently, Dequeue, Enqueue, LearnerThread, MinibatchBuffer,
                                    MultiGPULearnerThread)
from flowrl.sample_batch import BATCH_INDEXES, DEFAULT_POLICY_ID, TD_ERROR, MultiAgentBatch
from flowrl.testing import FakeConfig, FakeWorker, fake_batch, iter_list

Mode = Literal["round_robin", "async"]
WAIT_S = 10  # generous upper bound for waiting on a learner thread's event; never slept


class CountSeen(MetricsBinding):
    """Counts each item into the shared metrics context: an observable side effect of a sub-flow."""

    def __call__(self, item: Any) -> Any:
        self.metrics.counters["seen"] += 1
        return item


class ScriptedLearner:
    """A local worker whose ``learn_on_batch`` records, optionally probes the learner or raises."""

    def __init__(self, fail_on_call: int | None = None, stats_td_error: bool = False) -> None:
        self.calls: list[int] = []
        self.lock_held: list[bool] = []
        self.learner: Any = None
        self.fail_on_call, self.stats_td_error = fail_on_call, stats_td_error

    def learn_on_batch(self, batch: Any) -> dict[str, Any]:
        self.calls.append(batch.count)
        if self.learner is not None:
            self.lock_held.append(self.learner.weights_lock.locked())
        if self.fail_on_call == len(self.calls):
            raise ValueError("learner exploded")
        out: dict[str, Any] = {}
        for pid, b in batch.as_multi_agent().policy_batches.items():
            stats: dict[str, Any] = {"n": len(self.calls)}
            if self.stats_td_error:
                stats[TD_ERROR] = np.full(b.count, 0.5)
            out[pid] = {LEARNER_STATS_KEY: stats}
        return out


@pytest.fixture
def start() -> Iterator[Callable[[Any], Any]]:
    """Starts learner threads; at teardown stops them and checks that they (and any loaders) ended."""
    started: list[Any] = []

    def _start(thread: Any) -> Any:
        started.append(thread)
        thread.start()
        return thread

    yield _start
    for thread in started:
        thread.stop()
    for thread in started:
        for t in [thread, *getattr(thread, "loader_threads", [])]:
            t.join(timeout=WAIT_S)
            assert not t.is_alive(), f"{t.name} did not stop"


def poll_source(items: list[Any], p_not_ready: float = 0.5, rng: random.Random | None = None,
                done: list[bool] | None = None) -> LocalIterator[Any]:
    """A from_poll source over ``items`` that is not ready with probability ``p_not_ready`` per poll."""
    rng = rng or random.Random(0)
    it = iter(items)

    def poll() -> Any:
        if rng.random() < p_not_ready:
            return None
        for x in it:
            return x
        if done is not None:
            done[0] = True
        raise StopIteration

    return LocalIterator.from_poll(poll)


# ---------------------------------------------------------------------------------------------
# Concurrently (item 42)

def _ops() -> list[LocalIterator[int]]:
    return [iter_list([1, 2, 3]), iter_list([4, 5, 6])]


@pytest.mark.parametrize("kwargs, match", [
    (dict(mode="parallel"), "mode='parallel' is unknown"),
    (dict(mode="async", round_robin_weights=[1, 1]), "given with mode='async'"),
    (dict(round_robin_weights=["*", "*"]), "all '\\*'"),
    (dict(round_robin_weights=[1]), "one entry per input"),
    (dict(round_robin_weights=[1, 2, 3]), "one entry per input"),
    (dict(round_robin_weights=3), "must be a list"),
    (dict(round_robin_weights="*1"), "must be a list"),
    (dict(round_robin_weights=[1, 0]), "entry 0 is invalid"),
    (dict(round_robin_weights=[1, -2.5]), "entry -2.5 is invalid"),
    (dict(round_robin_weights=[1, float("nan")]), "entry nan is invalid"),
    (dict(round_robin_weights=[1, float("inf")]), "entry inf is invalid"),
    (dict(round_robin_weights=[1, "x"]), "entry 'x' is invalid"),
    (dict(round_robin_weights=[1, True]), "entry True is invalid"),
    (dict(output_indexes=[]), "not a non-empty list"),
    (dict(output_indexes=1), "not a non-empty list"),
    (dict(output_indexes=[2]), "entry 2 is not the index"),
    (dict(output_indexes=[-1]), "entry -1 is not the index"),
    (dict(output_indexes=[0.0]), "entry 0.0 is not the index"),
    (dict(output_indexes=["1"]), "entry '1' is not the index"),
    (dict(output_indexes=[True]), "entry True is not the index"),
])
def test_concurrently_rejects_bad_arguments_at_construction(kwargs: dict[str, Any], match: str) -> None:
    ops = _ops()
    with pytest.raises(ValueError, match=match):
        Concurrently(ops, **kwargs)
    # a failed construction leaves the ops untouched: they still work in a valid Concurrently
    assert Concurrently(ops).take(6) == [1, 4, 2, 5, 3, 6]


def test_concurrently_rejects_too_few_ops_foreign_ops_and_repeats() -> None:
    with pytest.raises(ValueError, match="at least 2 ops, got 1"):
        Concurrently([iter_list([1])])
    with pytest.raises(ValueError, match="at least 2 ops, got 0"):
        Concurrently([])
    with pytest.raises(TypeError, match=r"ops\[1\] is a list, not a LocalIterator"):
        Concurrently([iter_list([1]), [2]])  # type: ignore[list-item]
    it = iter_list([1])
    with pytest.raises(ValueError, match="same iterator twice; use it.duplicate"):
        Concurrently([it, it])
    with pytest.raises(TypeError, match="pass a list of sub-flows"):
        Concurrently(it)  # type: ignore[arg-type]
    assert it.take(1) == [1]  # and it was not consumed


@pytest.mark.parametrize("mode", ["round_robin", "async"])
def test_concurrently_alternates_in_both_modes(mode: Mode) -> None:
    assert list(Concurrently(_ops(), mode=mode)) == [1, 4, 2, 5, 3, 6]
    assert list(Concurrently(_ops(), mode=mode, output_indexes=[0, 1])) == [1, 4, 2, 5, 3, 6]


@pytest.mark.parametrize("mode", ["round_robin", "async"])
def test_output_indexes_filter_but_non_output_ops_still_run(mode: Mode) -> None:
    side_effect = iter_list([1, 2, 3]).for_each(CountSeen())
    it = Concurrently([side_effect, iter_list([4, 5, 6])], mode=mode, output_indexes=[1])
    assert list(it) == [4, 5, 6]
    assert it.metrics.counters["seen"] == 3
    only_first = Concurrently(_ops(), mode=mode, output_indexes=[0])
    assert list(only_first) == [1, 2, 3]


def test_round_robin_weights_give_the_exact_interleaving() -> None:
    def ops() -> list[LocalIterator[int]]:
        return [iter_list([1] * 3), iter_list([2] * 3), iter_list([3] * 3)]

    assert list(Concurrently(ops(), round_robin_weights=[3, 1, 2])) == [1, 1, 1, 2, 3, 3, 2, 3, 2]
    assert list(Concurrently(ops(), round_robin_weights=[3, 1, 2], output_indexes=[0, 2])) == [1, 1, 1, 3, 3, 3]


def test_fractional_weight_gives_that_many_pulls_on_average() -> None:
    it = Concurrently([iter_list([0] * 5000), iter_list([1] * 5000)], round_robin_weights=[1, 0.25])
    share = sum(it.take(2000)) / 2000  # expected 0.25 / 1.25 = 0.2
    assert 0.17 < share < 0.23


def test_concurrently_shares_one_metrics_context_and_has_a_readable_repr() -> None:
    a, b = iter_list([1]), iter_list([2]).for_each(CountSeen())
    a.metrics.counters["before"] = 5
    it = Concurrently([a, b], mode="async", output_indexes=[0])
    assert a.metrics is b.metrics is it.metrics
    assert it.metrics.counters["before"] == 5
    assert repr(it) == ("LocalIterator[Concurrently(async, output_indexes=[0])[LocalIterator[iter_list], "
                        "LocalIterator[iter_list.for_each()]]]")
    weighted = Concurrently(_ops(), round_robin_weights=[1, "*"])
    assert repr(weighted) == ("LocalIterator[Concurrently(round_robin, round_robin_weights=[1, '*'])"
                              "[LocalIterator[iter_list], LocalIterator[iter_list]]]")


def test_apex_shaped_star_branch_drains_what_is_ready_without_blocking() -> None:  # item 48
    q: queue.Queue[Any] = queue.Queue()
    for i in range(150):
        q.put(("d", i))
    store = iter_list([("s", i) for i in range(1000)])
    replay = iter_list([("r", i) for i in range(1000)])
    it = Concurrently([store, replay, Dequeue(q)], round_robin_weights=[1, 2, "*"])

    def group(i: int) -> list[tuple[str, int]]:
        return [("s", i), ("r", 2 * i), ("r", 2 * i + 1)]

    got = it.take(3 + 100 + 3 + 50 + 30)
    assert got == (group(0) + [("d", i) for i in range(100)] + group(1) + [("d", i) for i in range(100, 150)]
                   + [x for g in range(2, 12) for x in group(g)])
    for i in range(150, 155):  # new arrivals come out at the "*" branch's next turn
        q.put(("d", i))
    assert it.take(8) == [("d", i) for i in range(150, 155)] + group(12)


# ---------------------------------------------------------------------------------------------
# Enqueue and Dequeue (items 13, 43)

@pytest.mark.parametrize("bad", [[], queue.SimpleQueue(), None, "queue"])
def test_enqueue_and_dequeue_reject_anything_but_a_queue(bad: Any) -> None:
    with pytest.raises(ValueError, match="Enqueue needs a queue.Queue"):
        Enqueue(bad)
    with pytest.raises(ValueError, match="Dequeue needs a queue.Queue"):
        Dequeue(bad)


def test_enqueue_on_a_full_queue_asks_for_a_retry_within_a_few_ms() -> None:
    q: queue.Queue[Any] = queue.Queue(maxsize=1)
    op = Enqueue(q)
    assert op("a") == "a"
    t0 = time.monotonic()
    with pytest.raises(RetryLater):
        op("b")
    assert time.monotonic() - t0 < 5  # bounded: a blocking put would never return (wide margin for load)
    assert list(q.queue) == ["a"]
    with pytest.raises(ValueError, match="got None"):
        Enqueue(queue.Queue())(None)
    assert repr(op) == "Enqueue(maxsize=1)"


def test_enqueue_retries_the_same_item_and_pulls_nothing_new_meanwhile() -> None:
    maxsize, n = 2, 30
    q: queue.Queue[Any] = queue.Queue(maxsize=maxsize)
    pulled: list[int] = []
    drained: list[int] = []
    attempts: list[int] = []

    def source() -> Iterator[int]:
        for i in range(n):
            pulled.append(i)
            yield i

    enqueue = Enqueue(q)

    def counting_enqueue(x: int) -> int:
        attempts.append(x)
        return enqueue(x)

    polls = itertools.count()

    def slow_consumer() -> int | None:  # takes one item every third poll
        assert len(pulled) - len(drained) <= maxsize + 1  # queue + the one item being retried
        if next(polls) % 3 or q.empty():
            return None
        drained.append(q.get_nowait())
        return drained[-1]

    store = LocalIterator.from_iterable(source).for_each(counting_enqueue)
    it = Concurrently([store, LocalIterator.from_poll(slow_consumer)], mode="async", output_indexes=[1])
    assert it.take(n) == list(range(n))  # no loss, no duplication, order kept
    assert len(attempts) > n  # the full queue made Enqueue retry ...
    assert [k for k, _ in itertools.groupby(attempts)] == list(range(n))  # ... always the same item


def test_dequeue_reports_not_ready_when_empty_so_other_ops_proceed() -> None:
    q: queue.Queue[Any] = queue.Queue()
    it = Concurrently([Dequeue(q), iter_list([1, 2, 3])], mode="async")
    assert it.take(3) == [1, 2, 3]
    q.put("late")
    assert it.take(1) == ["late"]
    assert repr(Dequeue(q)) == "LocalIterator[Dequeue]"


def test_dequeue_never_yields_the_not_ready_signal_to_a_top_level_consumer(
        capsys: pytest.CaptureFixture[str]) -> None:  # item 13
    q: queue.Queue[Any] = queue.Queue()
    calls = itertools.count(1)

    def check() -> bool:  # every other poll finds an item; the stream ends after the 21st
        n = next(calls)
        if n > 20:
            raise StopIteration
        if n % 2 == 0:
            q.put(n)
        return True

    it = Dequeue(q, check=check)
    assert next(it) == 2
    assert it.take(2) == [4, 6]
    assert list(itertools.islice(it, 2)) == [8, 10]
    it.show(2)
    assert capsys.readouterr().out.split() == ["12", "14"]
    assert list(it) == [16, 18, 20]


def test_dequeue_nested_in_a_nested_concurrently_lets_the_outer_serve_others() -> None:  # item 13
    q1: queue.Queue[Any] = queue.Queue()
    q2: queue.Queue[Any] = queue.Queue()
    inner = Concurrently([Dequeue(q1), Dequeue(q2)], mode="async")
    outer = Concurrently([inner, iter_list([1, 2, 3, 4])], mode="async")
    assert outer.take(3) == [1, 2, 3]
    q2.put("x")
    assert outer.take(2) == ["x", 4]


def test_dequeue_checks_before_every_poll_even_with_items_waiting() -> None:
    q: queue.Queue[Any] = queue.Queue()
    for i in range(5):
        q.put(i)
    checks: list[bool] = []
    alive = [True]

    def check() -> bool:
        checks.append(alive[0])
        return alive[0]

    it = Dequeue(q, check=check)
    assert it.take(3) == [0, 1, 2]
    assert len(checks) == 3
    alive[0] = False
    with pytest.raises(RuntimeError, match="Dequeue check\\(\\) returned False") as info:
        next(it)
    assert info.value.__cause__ is None
    assert q.qsize() == 2  # nothing was taken once check() said no


def test_dequeue_rejects_a_none_item() -> None:
    q: queue.Queue[Any] = queue.Queue()
    q.put(None)
    with pytest.raises(ValueError, match="producers must not put None"):
        Dequeue(q).take(1)


# ---------------------------------------------------------------------------------------------
# Stateful: Concurrently over random branch speeds, with Enqueue/Dequeue (STYLE §12)

class _Label:
    def __init__(self, branch: int, emitted: list[Any]) -> None:
        self.branch, self.emitted = branch, emitted

    def __call__(self, payload: Any) -> tuple[int, Any]:
        self.emitted.append(payload)  # the branch ran, whether or not it is an output
        return self.branch, payload


weights = st.one_of(st.integers(1, 3), st.sampled_from([0.5, 1.5, 2.25]), st.just("*"))


class ConcurrentlyMachine(RuleBasedStateMachine):
    """Branches that are ready or not at random; the output loses, duplicates and reorders nothing."""

    @initialize(data=st.data())
    def build(self, data: st.DataObject) -> None:
        rng = random.Random(data.draw(st.integers(0, 2 ** 16), label="seed"))
        speed = st.sampled_from([0.0, 0.3, 0.6])
        sources: list[LocalIterator[Any]] = []
        self.expected: list[list[int]] = []
        for _ in range(data.draw(st.integers(1, 3), label="poll branches")):
            items = list(range(data.draw(st.integers(0, 8))))
            sources.append(poll_source(items, data.draw(speed), rng))
            self.expected.append(items)
        self.queue: queue.Queue[Any] | None = None
        if data.draw(st.booleans(), label="with queue"):
            q: queue.Queue[Any] = queue.Queue(maxsize=data.draw(st.integers(1, 3), label="maxsize"))
            self.queue = q
            items = list(range(100, 100 + data.draw(st.integers(0, 8))))
            done = [False]

            def check() -> bool:  # ends the Dequeue once every item went through the queue
                if done[0] and q.empty():
                    raise StopIteration
                return True

            sources.append(poll_source(items, data.draw(speed), rng, done).for_each(Enqueue(q)))
            sources.append(Dequeue(q, check=check))
            self.expected += [items, items]
        n = len(sources)
        if n < 2:  # Concurrently needs two ops
            sources.append(iter_list([]))
            self.expected.append([])
            n += 1
        self.emitted: list[list[Any]] = [[] for _ in range(n)]
        ops = [src.for_each(_Label(b, self.emitted[b])) for b, src in enumerate(sources)]
        mode: Mode = data.draw(st.sampled_from(["round_robin", "async"]), label="mode")
        rr_weights = None
        if mode == "round_robin":
            rr_weights = data.draw(st.none() | st.lists(weights, min_size=n, max_size=n).filter(
                lambda ws: not all(w == "*" for w in ws)), label="weights")
        out_idx = data.draw(st.none() | st.lists(st.integers(0, n - 1), min_size=1, unique=True), label="outputs")
        self.outputs = set(range(n)) if out_idx is None else set(out_idx)
        self.it = Concurrently(ops, mode=mode, output_indexes=out_idx, round_robin_weights=rr_weights)
        self.out: list[tuple[int, Any]] = []
        self.ended = False

    @precondition(lambda self: not self.ended)
    @rule(k=st.integers(1, 6))
    def pull(self, k: int) -> None:
        got = self.it.take(k)
        self.out.extend(got)
        self.ended = len(got) < k

    @precondition(lambda self: self.ended)
    @rule()
    def pull_after_end(self) -> None:
        assert self.it.take(1) == []

    @invariant()
    def only_outputs_each_in_order_at_most_once(self) -> None:
        if not hasattr(self, "it"):
            return
        for b, items in enumerate(self.expected):
            seen = [p for branch, p in self.out if branch == b]
            assert seen == (items[:len(seen)] if b in self.outputs else [])
            assert self.emitted[b] == items[:len(self.emitted[b])]
        if self.queue is not None:
            assert self.queue.qsize() <= self.queue.maxsize

    def teardown(self) -> None:
        if not hasattr(self, "it"):
            return
        if not self.ended:
            self.out.extend(self.it)
        for b, items in enumerate(self.expected):  # every branch ran to its end, outputs or not
            assert self.emitted[b] == items
        assert Counter(self.out) == Counter((b, p) for b in self.outputs for p in self.expected[b])


ConcurrentlyMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=8, deadline=None,
                                                 suppress_health_check=[HealthCheck.too_slow])
TestConcurrentlyStateful = ConcurrentlyMachine.TestCase


# ---------------------------------------------------------------------------------------------
# MinibatchBuffer (item 50)

def _filled(items: list[Any]) -> queue.Queue[Any]:
    q: queue.Queue[Any] = queue.Queue()
    for x in items:
        q.put(x)
    return q


def test_minibatch_buffer_returns_each_item_num_passes_times() -> None:
    buf = MinibatchBuffer(_filled(["a", "b"]), size=1, timeout=0.01, num_passes=3, init_num_passes=3)
    assert [buf.get() for _ in range(6)] == [("a", False), ("a", False), ("a", True),
                                             ("b", False), ("b", False), ("b", True)]


def test_minibatch_buffer_ramps_up_from_init_num_passes() -> None:
    buf = MinibatchBuffer(_filled(list("abcd")), size=1, timeout=0.01, num_passes=3, init_num_passes=1)
    got = [buf.get() for _ in range(1 + 2 + 3 + 3)]
    assert [x for x, _ in got] == list("abbcccddd")
    assert [r for _, r in got] == [True, False, True, False, False, True, False, False, True]


def test_minibatch_buffer_is_a_ring_and_empty_propagates() -> None:
    buf = MinibatchBuffer(_filled(list("abc")), size=2, timeout=0.01, num_passes=2, init_num_passes=2)
    assert [buf.get() for _ in range(5)] == [("a", False), ("b", False), ("a", True), ("b", True), ("c", False)]
    with pytest.raises(queue.Empty):  # slot 1 is empty and so is the queue ...
        buf.get()
    buf.inqueue.put("d")  # ... and the failed get did not move the ring
    assert [buf.get() for _ in range(3)] == [("d", False), ("c", True), ("d", True)]


def test_the_learner_threads_live_in_ops_learner_and_import_from_concurrency_too() -> None:
    from flowrl.ops import concurrency, learner

    for name in learner.__all__:
        assert getattr(concurrency, name) is getattr(learner, name) and name in concurrency.__all__
        assert getattr(learner, name).__module__ == "flowrl.ops.learner"


@pytest.mark.parametrize("kwargs", [dict(size=0), dict(num_passes=0), dict(init_num_passes=4),
                                    dict(init_num_passes=0), dict(timeout=-1)])
def test_minibatch_buffer_validates(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = dict(size=1, timeout=1.0, num_passes=3, init_num_passes=1)
    with pytest.raises(ValueError, match="MinibatchBuffer"):
        MinibatchBuffer(queue.Queue(), **{**args, **kwargs})


# ---------------------------------------------------------------------------------------------
# LearnerThread

def test_learner_outputs_steps_and_learner_info(start: Callable[[Any], Any]) -> None:
    fake = ScriptedLearner()
    learner = start(LearnerThread(fake))
    fake.learner = learner
    learner.inqueue.put(fake_batch(5))
    env_steps, agent_steps, info = learner.outqueue.get(timeout=WAIT_S)
    assert (env_steps, agent_steps) == (5, 5)
    assert info == {DEFAULT_POLICY_ID: {LEARNER_STATS_KEY: {"n": 1}}}
    learner.inqueue.put(MultiAgentBatch({"a": fake_batch(3), "b": fake_batch(2)}, env_steps=3))
    env_steps, agent_steps, info = learner.outqueue.get(timeout=WAIT_S)
    assert (env_steps, agent_steps, sorted(info)) == (3, 5, ["a", "b"])
    assert learner.weights_updated and learner.num_steps == 2
    assert fake.lock_held == [True, True]  # learn_on_batch ran under weights_lock
    assert learner.learner_info is info


def test_learner_uses_each_batch_num_sgd_iter_times(start: Callable[[Any], Any]) -> None:
    learner = start(LearnerThread(FakeWorker(config=FakeConfig()), num_sgd_iter=3))
    learner.inqueue.put(fake_batch(2))
    learner.inqueue.put(fake_batch(3))
    assert [learner.outqueue.get(timeout=WAIT_S)[0] for _ in range(6)] == [2, 2, 2, 3, 3, 3]


def test_learner_cuts_each_use_of_a_batch_with_minibatches_and_learns_on_each_cut(
        start: Callable[[Any], Any]) -> None:
    calls: list[int] = []

    def halves(batch: Any) -> list[Any]:
        calls.append(batch.count)
        return [batch[:2], batch[2:]]

    worker = FakeWorker(config=FakeConfig())
    learner = start(LearnerThread(worker, num_sgd_iter=2, minibatches=halves))
    learner.inqueue.put(fake_batch(5))
    learner.inqueue.put(fake_batch(4, start=5))
    outs = [learner.outqueue.get(timeout=WAIT_S)[0] for _ in range(8)]
    assert outs == [2, 3, 2, 3, 2, 2, 2, 2]  # each of the 2 passes over a batch cut anew; every row learned twice
    assert calls == [5, 5, 4, 4] and worker.learn_calls == outs and learner.num_steps == 8


def test_learner_dies_of_minibatches_that_return_no_batch(start: Callable[[Any], Any]) -> None:
    learner = start(LearnerThread(FakeWorker(config=FakeConfig()), minibatches=lambda batch: []))
    learner.inqueue.put(fake_batch(3))
    learner.join(timeout=WAIT_S)
    assert isinstance(learner.error, ValueError) and "cut a batch of 3 rows into no batches" in str(learner.error)
    with pytest.raises(TypeError, match="minibatches=3 must be a function batch -> batches"):
        LearnerThread(FakeWorker(config=FakeConfig()), minibatches=3)  # type: ignore[arg-type]


def test_impala_shaped_flow_keeps_the_slow_learner_inqueue_bounded(start: Callable[[Any], Any]) -> None:
    maxsize, n = 2, 15
    worker = FakeWorker(config=FakeConfig(learn_delay_s=0.02))
    learner = start(LearnerThread(worker, learner_queue_size=maxsize))
    sizes: list[int] = []
    pulled: list[int] = []

    def batches() -> Iterator[Any]:
        for i in range(n):
            # in the queue, in the learner, and this one: never more, since a full queue stops the pulls
            assert i - len(worker.learn_calls) <= maxsize + 1
            pulled.append(i)
            yield fake_batch(10, start=i)

    def record(out: Any) -> Any:
        sizes.append(learner.inqueue.qsize())
        return out

    enqueue_op = LocalIterator.from_iterable(batches).for_each(Enqueue(learner.inqueue))
    dequeue_op = Dequeue(learner.outqueue, check=learner.is_alive).for_each(record)
    outs = Concurrently([enqueue_op, dequeue_op], mode="async", output_indexes=[1]).take(n)
    assert [o[:2] for o in outs] == [(10, 10)] * n
    assert all(o[2][DEFAULT_POLICY_ID][LEARNER_STATS_KEY] for o in outs)
    assert max(sizes) <= maxsize
    assert max(learner.learner_queue_size.values) == maxsize  # the queue did fill: backpressure was real
    assert worker.learn_calls == [10] * n


def test_learner_error_ends_the_thread_and_dequeue_raises_with_it(start: Callable[[Any], Any]) -> None:
    learner = start(LearnerThread(ScriptedLearner(fail_on_call=2)))
    dequeue = Dequeue(learner.outqueue, check=learner.is_alive)
    learner.inqueue.put(fake_batch(1))
    learner.inqueue.put(fake_batch(1))
    learner.join(timeout=WAIT_S)
    assert not learner.is_alive()
    assert isinstance(learner.error, ValueError) and str(learner.error) == "learner exploded"
    with pytest.raises(RuntimeError, match="returned False") as info:
        dequeue.take(2)  # the first step's output is waiting, but check() comes first
    assert info.value.__cause__ is learner.error


def test_learner_dies_of_a_non_batch_item(start: Callable[[Any], Any]) -> None:
    learner = start(LearnerThread(FakeWorker(config=FakeConfig())))
    learner.inqueue.put("not a batch")
    learner.join(timeout=WAIT_S)
    assert isinstance(learner.error, ValueError) and "consumes SampleBatch or MultiAgentBatch" in str(learner.error)


def test_learner_never_dies_of_a_queue_timeout(start: Callable[[Any], Any]) -> None:
    learner = start(LearnerThread(FakeWorker(config=FakeConfig()), learner_queue_timeout=0.001))
    learner.join(timeout=0.05)  # ~50 empty waits
    assert learner.is_alive() and learner.error is None
    learner.inqueue.put(fake_batch(2))
    assert learner.outqueue.get(timeout=WAIT_S)[0] == 2


def test_stop_ends_an_idle_learner_promptly() -> None:
    learner = LearnerThread(FakeWorker(config=FakeConfig()))  # waits up to 300 s on an empty queue
    learner.start()
    t0 = time.monotonic()
    learner.stop()
    learner.join(timeout=WAIT_S)
    assert not learner.is_alive() and learner.stopped and learner.error is None
    assert time.monotonic() - t0 < 10  # not the 300 s queue timeout (wide margin for load)


def test_add_learner_metrics(start: Callable[[Any], Any]) -> None:
    learner = start(LearnerThread(FakeWorker(config=FakeConfig())))
    for i in range(2):
        learner.inqueue.put(fake_batch(3))
        learner.outqueue.get(timeout=WAIT_S)
    result = learner.add_learner_metrics({"info": {"num_steps_trained": 6}})
    info = result["info"]
    assert info["num_steps_trained"] == 6
    assert info[LEARNER_QUEUE_INFO]["size_count"] == 2
    assert set(info[LEARNER_QUEUE_INFO]) == {"size_count", "size_mean", "size_std", "size_quantiles"}
    assert info[LEARNER_INFO] is not learner.learner_info  # a copy, safe from the thread's next step
    assert info[LEARNER_INFO][DEFAULT_POLICY_ID][LEARNER_STATS_KEY] == {"loss": 1.0, "kl": 0.01}
    assert set(info[TIMING_BREAKDOWN_INFO]) == {f"{LEARNER_DEQUEUE_TIMER}_time_ms", f"{LEARNER_GRAD_TIMER}_time_ms"}
    assert learner.add_learner_metrics({})["info"][LEARNER_QUEUE_INFO]["size_count"] == 2


@pytest.mark.parametrize("kwargs, match", [
    (dict(learner_queue_size=0), "learner_queue_size=0"),
    (dict(minibatch_buffer_size=0), "minibatch_buffer_size=0"),
    (dict(num_sgd_iter=0), "num_sgd_iter=0"),
    (dict(learner_queue_timeout=0), "learner_queue_timeout=0"),
])
def test_learner_validates(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LearnerThread(FakeWorker(config=FakeConfig()), **kwargs)


# ---------------------------------------------------------------------------------------------
# MultiGPULearnerThread (CPU towers)

def test_multi_gpu_learner_trains_every_stack_num_sgd_iter_times(start: Callable[[Any], Any]) -> None:
    fake = ScriptedLearner()
    learner = start(MultiGPULearnerThread(fake, num_gpus=0, train_batch_size=5, num_multi_gpu_tower_stacks=2,
                                          num_sgd_iter=2, num_data_load_threads=2))
    fake.learner = learner
    assert learner.devices == ["cpu"]
    for count in range(1, 7):  # an even number: the ring of 2 stacks waits for a pair to finish its passes
        learner.inqueue.put(fake_batch(count))
    outs = [learner.outqueue.get(timeout=WAIT_S) for _ in range(12)]
    assert Counter(o[0] for o in outs) == {c: 2 for c in range(1, 7)}
    assert all(o[0] == o[1] and DEFAULT_POLICY_ID in o[2] for o in outs)
    assert all(fake.lock_held) and learner.weights_updated
    assert learner.idle_tower_stacks.qsize() == 2  # every released stack went back to idle
    timing = learner.add_learner_metrics({})["info"][TIMING_BREAKDOWN_INFO]
    assert {f"{LEARNER_LOAD_TIMER}_time_ms", f"{LEARNER_LOAD_WAIT_TIMER}_time_ms"} <= set(timing)


def test_multi_gpu_dead_loader_makes_the_learner_raise(start: Callable[[Any], Any]) -> None:
    learner = start(MultiGPULearnerThread(FakeWorker(config=FakeConfig()), num_gpus=0, train_batch_size=5,
                                          num_data_load_threads=1))
    learner.inqueue.put("not a batch")
    learner.join(timeout=WAIT_S)
    assert not learner.is_alive()
    loader = learner.loader_threads[0]
    assert not loader.is_alive() and isinstance(loader.error, ValueError)
    assert isinstance(learner.error, RuntimeError) and learner.error.__cause__ is loader.error
    with pytest.raises(RuntimeError, match="returned False") as info:
        Dequeue(learner.outqueue, check=learner.is_alive).take(1)
    assert info.value.__cause__ is learner.error


@pytest.mark.parametrize("num_gpus, match", [
    (-1, r"num_gpus=-1 must be a number in \[0, inf\) \(0: the towers live on the CPU\)"),
    ("1", r"num_gpus='1' must be a number in \[0, inf\)"), (math.inf, r"num_gpus=inf must be a number"),
    (10 ** 6, "but torch sees")])
def test_multi_gpu_learner_validates_devices(num_gpus: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MultiGPULearnerThread(FakeWorker(config=FakeConfig()), num_gpus=num_gpus, train_batch_size=5)


# ---------------------------------------------------------------------------------------------
# ApexLearnerThread

def test_apex_learner_reports_priorities_per_replay_shard(start: Callable[[Any], Any]) -> None:
    worker = FakeWorker(config=FakeConfig())
    learner = start(ApexLearnerThread(worker, learner_queue_size=4))
    assert learner.inqueue.maxsize == 4
    learner.inqueue.put(("shard-1", fake_batch(3, start=5, **{BATCH_INDEXES: [7, 8, 9]})))
    actor, prios, env_steps, agent_steps = learner.outqueue.get(timeout=WAIT_S)
    assert (actor, env_steps, agent_steps) == ("shard-1", 3, 3)
    indexes, td_error = prios[DEFAULT_POLICY_ID]
    assert indexes.tolist() == [7, 8, 9] and td_error.tolist() == [5.0, 6.0, 7.0]
    assert learner.weights_updated and worker.versions[DEFAULT_POLICY_ID] == 1
    assert TD_ERROR not in learner.learner_info[DEFAULT_POLICY_ID]
    assert set(learner.learner_info[DEFAULT_POLICY_ID][LEARNER_STATS_KEY]) == {"loss", "kl"}
    assert set(learner.timers) == {LEARNER_DEQUEUE_TIMER, LEARNER_GRAD_TIMER, LEARNER_OVERALL_TIMER}
    assert learner.timers[LEARNER_OVERALL_TIMER].mean_units_processed == 3


def test_apex_learner_takes_td_error_from_learner_stats_per_policy(start: Callable[[Any], Any]) -> None:
    fake = ScriptedLearner(stats_td_error=True)
    learner = start(ApexLearnerThread(fake))
    fake.learner = learner
    a_cols: dict[str, Any] = {BATCH_INDEXES: [0, 1]}
    b_cols: dict[str, Any] = {BATCH_INDEXES: [4]}
    batch = MultiAgentBatch({"a": fake_batch(2, **a_cols), "b": fake_batch(1, **b_cols)}, env_steps=2)
    learner.inqueue.put(("shard-0", batch))
    _, prios, env_steps, agent_steps = learner.outqueue.get(timeout=WAIT_S)
    assert (env_steps, agent_steps) == (2, 3)
    assert {pid: (i.tolist(), td.tolist()) for pid, (i, td) in prios.items()} == {
        "a": ([0, 1], [0.5, 0.5]), "b": ([4], [0.5])}
    assert fake.lock_held == [True]


def test_apex_learner_dies_of_a_malformed_item(start: Callable[[Any], Any]) -> None:
    learner = start(ApexLearnerThread(FakeWorker(config=FakeConfig())))
    learner.inqueue.put(fake_batch(2))  # not a (replay_shard, batch) pair
    learner.join(timeout=WAIT_S)
    assert isinstance(learner.error, ValueError) and "(replay_shard, batch) pairs" in str(learner.error)
    with pytest.raises(RuntimeError) as info:
        Dequeue(learner.outqueue, check=learner.is_alive).take(1)
    assert info.value.__cause__ is learner.error


def test_learner_threads_are_daemons_with_bounded_inqueues() -> None:
    worker = FakeWorker(config=FakeConfig())
    for learner in (LearnerThread(worker, learner_queue_size=3),
                    MultiGPULearnerThread(worker, 0, 10, learner_queue_size=3),
                    ApexLearnerThread(worker, learner_queue_size=3)):
        assert learner.daemon and learner.inqueue.maxsize == 3 and learner.outqueue.maxsize == 0
        assert isinstance(learner.weights_lock, type(threading.Lock())) and learner.weights_updated is False
