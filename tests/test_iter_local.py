"""Iterator algebra on local streams: exact orders and properties."""

from __future__ import annotations

import logging
import pickle
import threading
import time
from typing import Any, Iterator

import pytest
from hypothesis import given, settings
from ray import cloudpickle
from hypothesis import strategies as st

from flowrl.iter import LocalIterator, RetryLater, get_metrics
from flowrl.iter.stages import NOT_READY
from flowrl.metrics import MetricsBinding, MetricsContext
from flowrl.testing import iter_list


def alternating_poll(values: list[int]) -> LocalIterator[int]:
    """A from_poll source that answers None before every value."""
    answers = iter([x for v in values for x in (None, v)])

    def poll() -> int | None:
        return next(answers)  # StopIteration ends the stream

    return LocalIterator.from_poll(poll)


def running_sum(it: LocalIterator[int]) -> LocalIterator[int]:
    def add(x: int) -> int:
        get_metrics().counters["sum"] += x
        return get_metrics().counters["sum"]

    return it.for_each(add)


# -- not-ready never escapes (item 13) -----------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: alternating_poll([1, 2, 3]),
    lambda: iter_list([None, 1, None, 2, 3, None]).none_as_not_ready(),
])
def test_not_ready_never_reaches_top_level_consumers(make: Any, capsys: pytest.CaptureFixture[str]) -> None:
    expected = [1, 2, 3]
    it = make()
    assert [next(it), next(it), next(it)] == expected
    with pytest.raises(StopIteration):
        next(it)
    assert make().take(10) == expected
    assert list(make()) == expected
    make().show()
    assert capsys.readouterr().out.split() == ["1", "2", "3"]


def test_bare_duplicate_child_never_yields_the_signal() -> None:
    a, b = iter_list([1, 2]).duplicate(2)
    assert next(a) == 1  # the first pull feeds both queues
    assert next(b) == 1
    assert next(b) == 2
    assert a.take(5) == [2]
    assert b.take(5) == []


def test_nested_non_blocking_union_lets_the_outer_union_serve_others() -> None:
    gate = threading.Event()

    def poll_gated() -> int | None:
        if not gate.is_set():
            return None
        raise StopIteration

    inner = LocalIterator.from_poll(poll_gated).union(LocalIterator.from_poll(poll_gated))
    outer = inner.union(iter_list([1, 2, 3]))
    assert outer.take(3) == [1, 2, 3]  # the inner union had nothing ready all along
    gate.set()
    assert outer.take(3) == []


# -- RetryLater and _on_fetch_start (items 8–9) ----------------------------------------------------

class RetryOnce:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, x: int) -> int:
        self.calls.append(x)
        if self.calls.count(x) == 1:
            raise RetryLater
        return 10 * x


def test_retry_later_redelivers_the_same_item_exactly_once_in_order() -> None:
    fn = RetryOnce()
    assert iter_list([1, 2, 3]).for_each(fn).take(5) == [10, 20, 30]
    assert fn.calls == [1, 1, 2, 2, 3, 3]


def test_retry_later_inside_an_async_union_lets_the_other_branch_progress() -> None:
    fn = RetryOnce()
    out = iter_list([1, 2, 3]).for_each(fn).union(iter_list(["a", "b", "c", "d", "e", "f"])).take(9)
    assert [x for x in out if isinstance(x, int)] == [10, 20, 30]
    assert sorted(x for x in out if isinstance(x, str)) == list("abcdef")
    first_ten = out.index(10)
    assert out[:first_ten] and all(isinstance(x, str) for x in out[:first_ten])


class FetchCounter:
    def __init__(self) -> None:
        self.fetches = 0
        self.calls = 0

    def _on_fetch_start(self) -> None:
        get_metrics()  # the context is active during the hook
        self.fetches += 1

    def __call__(self, x: int) -> int:
        self.calls += 1
        if self.calls % 2 == 1:
            raise RetryLater
        return x


def test_on_fetch_start_runs_once_per_real_upstream_item() -> None:
    op = FetchCounter()
    assert alternating_poll([1, 2, 3]).for_each(op).take(5) == [1, 2, 3]
    assert op.fetches == 3 + 1  # one per item, plus the fetch that found the end
    assert op.calls == 6


# -- union (items 11–12) --------------------------------------------------------------------------

def test_weighted_union_exact_interleaving() -> None:
    ones, twos, threes = iter_list([1] * 3), iter_list([2] * 3), iter_list([3] * 3)
    out = ones.union(twos, threes, round_robin_weights=[3, 1, 2]).take(20)
    assert out == [1, 1, 1, 2, 3, 3, 2, 3, 2]


@pytest.mark.parametrize("deterministic", [True, False])
def test_union_of_ready_lists_alternates(deterministic: bool) -> None:
    out = iter_list([1, 2, 3]).union(iter_list([4, 5, 6]), deterministic=deterministic).take(6)
    assert out == [1, 4, 2, 5, 3, 6]


def test_star_weight_drains_what_is_ready_within_one_turn() -> None:
    def poll_bursts() -> Iterator[int | None]:
        yield from range(100, 250)  # 150 ready items: two turns of at most 100
        yield None
        yield from range(250, 253)

    burst = poll_bursts()
    star = LocalIterator.from_poll(lambda: next(burst))
    out = iter_list(["a1", "a2", "a3"]).union(iter_list(["b1", "b2", "b3"]), star,
                                             round_robin_weights=[1, 1, "*"]).take(1000)
    assert out[:102] == ["a1", "b1", *range(100, 200)]
    assert out[102:154] == ["a2", "b2", *range(200, 250)]
    assert out[154:156] == ["a3", "b3"]
    assert sorted(x for x in out if isinstance(x, int)) == list(range(100, 253))


def test_fractional_weight_gives_its_mean_pulls_per_round() -> None:
    out = iter_list(["x"] * 4000).union(iter_list(["y"] * 4000), round_robin_weights=[1, 0.25]).take(2500)
    ratio = out.count("y") / out.count("x")
    assert 0.2 < ratio < 0.3


@pytest.mark.parametrize("weights", [[1], [1, 2, 3], [0, 1], [-1, 1], [1, float("nan")], [1, "+"],
                                     [1, True], "**", [float("inf"), 1], 3, {1, 2}])
def test_invalid_round_robin_weights_raise(weights: Any) -> None:
    with pytest.raises(ValueError, match="round_robin_weights"):
        iter_list([1]).union(iter_list([2]), round_robin_weights=weights)


def test_pulling_a_union_input_directly_is_an_error() -> None:
    a = iter_list([1, 2])
    u = a.union(iter_list([3]))
    with pytest.raises(RuntimeError, match="consumes it"):
        next(a)
    assert u.take(3) == [1, 3, 2]


def test_union_argument_errors() -> None:
    a = iter_list([1])
    with pytest.raises(ValueError, match="at least one"):
        a.union()
    with pytest.raises(TypeError, match="LocalIterator"):
        a.union([2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="same iterator"):
        a.union(a)


def test_async_union_never_lets_a_slow_source_delay_a_fast_one() -> None:
    def paced(tag: str, period: float, n: int) -> LocalIterator[str]:
        state = {"next_at": time.monotonic() + period, "left": n}

        def poll() -> str | None:
            if state["left"] == 0:
                raise StopIteration
            if time.monotonic() < state["next_at"]:
                return None
            state["next_at"] += period
            state["left"] -= 1
            return tag

        return LocalIterator.from_poll(poll)

    out = paced("fast", 0.05, 10).union(paced("slow", 0.3, 10)).take(20)
    assert out[:5] == ["fast"] * 5
    assert out[-3:] == ["slow"] * 3


def test_idle_union_backs_off_instead_of_spinning(caplog: pytest.LogCaptureFixture) -> None:
    polls = {"n": 0}

    def never() -> None:
        polls["n"] += 1
        return None

    it = LocalIterator.from_poll(never).union(LocalIterator.from_poll(never))
    it.stall_warning_s = 0.3
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(next(it, None)), daemon=True)
    with caplog.at_level(logging.WARNING, logger="flowrl.iter"):
        start = time.process_time()
        thread.start()
        thread.join(timeout=0.8)
        cpu = time.process_time() - start
    assert thread.is_alive() and not result
    assert polls["n"] < 2 * 0.8 / 0.001  # at least 1 ms between rounds: bounded, not a spin
    assert cpu < 0.4
    assert sum("produced no item" in r.getMessage() for r in caplog.records) == 1


# -- duplicate (item 14) ---------------------------------------------------------------------------

class QueueProbe:
    """Records, at each call, the largest queue of the duplicate state it inspects."""

    def __init__(self) -> None:
        self.max_queue = 0
        self.state: Any = None

    def __call__(self, x: Any) -> Any:
        if self.state is not None:
            self.max_queue = max(self.max_queue, *(len(q) for q in self.state.queues))
        return x


def test_duplicate_children_see_the_whole_stream_and_queues_stay_bounded() -> None:
    a, b = iter_list(range(5)).duplicate(2)
    probe_a, probe_b = QueueProbe(), QueueProbe()
    probe_a.state = probe_b.state = a._source.args[0]  # type: ignore[attr-defined]  # the shared state
    batched = a.batch(2).for_each(probe_a)
    plain = b.for_each(probe_b)
    out = batched.union(plain).take(20)
    assert [x for x in out if isinstance(x, list)] == [[0, 1], [2, 3], [4]]
    assert [x for x in out if isinstance(x, int)] == [0, 1, 2, 3, 4]
    assert max(probe_a.max_queue, probe_b.max_queue) == 1  # never more than one item queued


def test_duplicate_child_ahead_reports_not_ready_without_pulling() -> None:
    pulled: list[int] = []
    a, b = iter_list(range(3)).for_each(lambda x: pulled.append(x) or x).duplicate(2)
    assert next(a) == 0 and pulled == [0]
    chain = a._chain
    assert chain is not None
    assert chain.pull(False) is NOT_READY and pulled == [0]  # a is ahead: b still holds item 0
    state = chain.state  # type: ignore[attr-defined]
    assert [len(q) for q in state.queues] == [0, 1]
    assert next(b) == 0
    assert max(len(q) for q in state.queues) <= 1


@pytest.mark.parametrize("n", [0, 1, -2])
def test_duplicate_needs_two_children(n: int) -> None:
    with pytest.raises(ValueError, match="duplicate"):
        iter_list([1]).duplicate(n)


def test_transform_on_a_duplicate_lineage_is_rejected() -> None:
    a, b = iter_list([1, 2]).duplicate(2)
    with pytest.raises(ValueError, match="duplicate"):
        a.for_each(str).transform(lambda xs: xs)
    with pytest.raises(ValueError, match="duplicate"):
        a.union(b).transform(lambda xs: xs)


def test_transform_blocks_on_not_ready_and_its_function_sees_real_items_only() -> None:
    seen: list[Any] = []

    def record(xs: Any) -> Iterator[int]:
        for x in xs:
            seen.append(x)
            yield x * 2

    assert alternating_poll([1, 2, 3]).transform(record).take(5) == [2, 4, 6]
    assert seen == [1, 2, 3]


# -- metrics (items 15–18) ------------------------------------------------------------------------

def test_independent_chains_have_independent_metrics() -> None:
    assert running_sum(iter_list([1, 2, 3, 4])).take(4) == [1, 3, 6, 10]
    assert running_sum(iter_list([1, 2, 3, 4])).take(4) == [1, 3, 6, 10]


def test_union_shares_one_context_across_branches() -> None:
    a, b = running_sum(iter_list([1, 2, 3])), running_sum(iter_list([10, 20, 30]))
    u = a.union(b, deterministic=True)
    assert u.take(6) == [1, 11, 13, 33, 36, 66]
    assert u.metrics is a.metrics is b.metrics
    assert u.metrics.counters["sum"] == 66


def test_nested_three_way_union_shares_one_context() -> None:
    branches = [running_sum(iter_list([1, 1])), running_sum(iter_list([10, 10])), running_sum(iter_list([100, 100]))]
    inner = branches[1].union(branches[2], deterministic=True)
    u = branches[0].union(inner, deterministic=True)
    assert u.take(6) == [1, 11, 12, 112, 122, 222]  # outer turns alternate; inner alternates its two
    assert len({id(u.metrics), *(id(b.metrics) for b in branches), id(inner.metrics)}) == 1


def test_union_merges_existing_counters_and_info_into_the_survivor() -> None:
    a, b = iter_list([1]), iter_list([2])
    a.metrics.counters["n"] = 1
    b.metrics.counters["n"] = 2
    a.metrics.info["k"] = "a"
    b.metrics.info.update(k="b", only_b=True)
    u = a.union(b)
    assert u.metrics.counters["n"] == 3
    assert u.metrics.info == {"k": "a", "only_b": True}


def test_get_metrics_only_inside_core_calls() -> None:
    with pytest.raises(ValueError, match="outside an iterator"):
        get_metrics()
    it = iter_list([1, 2]).for_each(lambda x: get_metrics())
    with pytest.raises(ValueError, match="outside an iterator"):
        LocalIterator.get_metrics()
    assert it.take(2) == [it.metrics, it.metrics]
    with pytest.raises(ValueError, match="outside an iterator"):
        get_metrics()


class Bound(MetricsBinding):
    def __call__(self, x: int) -> int:
        self.metrics.counters["bound"] += x
        return x


def test_operators_are_bound_to_their_dataflow_once() -> None:
    op = Bound()
    it = iter_list([1, 2]).for_each(op)
    it.take(2)
    assert it.metrics.counters["bound"] == 3
    with pytest.raises(ValueError, match="already bound"):
        iter_list([1]).for_each(op).take(1)


def test_binding_happens_after_the_union_merge() -> None:
    op = Bound()
    u = iter_list([1, 2]).for_each(op).union(iter_list([3]))
    u.take(3)
    assert u.metrics.counters["bound"] == 3


# -- argument errors (item 24 and §2.10) -----------------------------------------------------------

class ConcatLike:
    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, x: Any) -> list[Any]:
        return [x]

    def __repr__(self) -> str:
        return f"ConcatLike({self.n})"


@pytest.mark.parametrize("method", ["for_each", "filter", "combine", "transform"])
def test_an_operator_class_instead_of_an_instance_is_rejected_at_attach_time(method: str) -> None:
    with pytest.raises(TypeError, match=r"pass an instance: ConcatLike\(...\), not ConcatLike"):
        getattr(iter_list([1]), method)(ConcatLike)
    assert getattr(iter_list(["1"]), method)(str) is not None  # instances of str are not callable


def test_labels_and_reprs() -> None:
    it = iter_list([1]).for_each(ConcatLike(4)).combine(ConcatLike(2)).for_each(lambda x: x).batch(3)
    assert repr(it) == "LocalIterator[iter_list.for_each(ConcatLike(4)).combine(ConcatLike(2)).for_each().batch(3)]"
    a, b = iter_list([1]).duplicate(2)
    assert repr(a) == "LocalIterator[iter_list.duplicate[0]]"
    assert repr(a.union(b)) == ("LocalIterator[LocalUnion[LocalIterator[iter_list.duplicate[0]], "
                                "LocalIterator[iter_list.duplicate[1]]]]")
    assert repr(iter_list([1]).shuffle(4, seed=1).none_as_not_ready().zip_with_source_actor()) == (
        "LocalIterator[iter_list.shuffle(shuffle_buffer_size=4, seed=1).none_as_not_ready()"
        ".zip_with_source_actor()]")


@pytest.mark.parametrize("call,message", [
    (lambda it: it.batch(0), r"batch\(\) n=0 must be an int >= 1 \(items per list\)"),
    (lambda it: it.batch(True), r"batch\(\) n=True must be an int >= 1"),  # a bool is never a count
    (lambda it: it.for_each(str, max_concurrency=0),
     r"max_concurrency=0 must be an int >= 1 \(1 runs the function in this process; k > 1 runs k Ray tasks"),
    (lambda it: it.shuffle(0), r"shuffle_buffer_size=0 must be an int >= 1 \(items held to shuffle among\)"),
    (lambda it: it.duplicate(1), r"duplicate\(\) n=1 must be an int >= 2 \(children; use the iterator itself"),
])
def test_bad_arguments_raise_value_error_naming_argument_value_and_meaning(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(iter_list([1]))


def test_zip_with_source_actor_needs_a_source_actor() -> None:
    with pytest.raises(ValueError, match="Could not identify source actor of item"):
        iter_list([1]).zip_with_source_actor().take(1)


def test_errors_in_user_functions_propagate_unchanged() -> None:
    def boom(x: int) -> int:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        iter_list([1]).for_each(boom).take(1)


def test_pickling_a_started_local_iterator_raises_but_an_unstarted_one_round_trips() -> None:
    it = iter_list([1, 2, 3]).for_each(str)
    copy = pickle.loads(cloudpickle.dumps(it))
    assert copy.take(3) == ["1", "2", "3"]
    it.take(1)
    with pytest.raises(TypeError, match="already been pulled"):
        cloudpickle.dumps(it)


def test_close_runs_callbacks_newest_first_once_and_reraises_the_first_error() -> None:
    calls: list[str] = []
    a = iter_list([1]).on_close(lambda: calls.append("a1"))
    b = iter_list([2]).on_close(lambda: calls.append("b1"))

    def fail() -> None:
        calls.append("fail")
        raise RuntimeError("first")

    u = a.union(b).on_close(fail).on_close(lambda: calls.append("last"))
    with pytest.raises(RuntimeError, match="first"):
        u.close()
    assert calls == ["last", "fail", "b1", "a1"]
    u.close()
    assert len(calls) == 4
    assert pickle.loads(cloudpickle.dumps(iter_list([1]).on_close(lambda: None)))._cell.flow.callbacks == []


# -- remaining local stages -----------------------------------------------------------------------

def test_shuffle_is_a_seeded_permutation_and_size_one_is_the_identity() -> None:
    data = list(range(50))
    assert iter_list(data).shuffle(1).take(100) == data
    a = iter_list(data).shuffle(8, seed=3).take(100)
    assert sorted(a) == data and a != data
    assert iter_list(data).shuffle(8, seed=3).take(100) == a


def test_combine_returning_nothing_consumes_inputs() -> None:
    assert iter_list(range(10)).combine(lambda x: [x] if x % 4 == 0 else []).take(5) == [0, 4, 8]


def test_concurrent_for_each_runs_ray_tasks() -> None:
    out = iter_list(range(6)).for_each(lambda x: x * 2, max_concurrency=3, resources={"num_cpus": 0}).take(10)
    assert sorted(out) == [0, 2, 4, 6, 8, 10]


# -- properties ----------------------------------------------------------------------------------

streams = st.lists(st.lists(st.integers(), max_size=12), min_size=2, max_size=4)
weight = st.one_of(st.integers(1, 4), st.floats(0.1, 3.0), st.just("*"))


@settings(max_examples=60, deadline=None)
@given(inputs=streams, data=st.data())
def test_union_emits_exactly_the_multiset_of_its_inputs(inputs: list[list[int]], data: st.DataObject) -> None:
    mode = data.draw(st.sampled_from(["deterministic", "async", "weights"]))
    tagged = [[(i, x) for x in xs] for i, xs in enumerate(inputs)]
    its = [iter_list(xs) for xs in tagged]
    weights = data.draw(st.lists(weight, min_size=len(its), max_size=len(its))) if mode == "weights" else None
    out = its[0].union(*its[1:], deterministic=mode == "deterministic", round_robin_weights=weights).take(10**6)
    assert sorted(out) == sorted(x for xs in tagged for x in xs)
    for i, xs in enumerate(tagged):  # each input's own order is kept
        assert [x for x in out if x[0] == i] == xs


def reference_round_robin_pulls(inputs: list[list[Any]], weights: list[int]) -> list[Any]:
    """The union's loop: turns over active inputs; an input is removed when a pull finds its end."""
    queues = [list(xs) for xs in inputs]
    active = list(range(len(inputs)))
    out: list[Any] = []
    pos = 0
    while active:
        pos %= len(active)
        i = active[pos]
        for _ in range(weights[i]):
            if not queues[i]:
                active.pop(pos)
                break
            out.append(queues[i].pop(0))
        else:
            pos += 1
    return out


@settings(max_examples=80, deadline=None)
@given(inputs=streams, data=st.data())
def test_integer_weights_give_the_exact_interleaving(inputs: list[list[int]], data: st.DataObject) -> None:
    weights = data.draw(st.lists(st.integers(1, 4), min_size=len(inputs), max_size=len(inputs)))
    tagged = [[(i, x) for x in xs] for i, xs in enumerate(inputs)]
    its = [iter_list(xs) for xs in tagged]
    out = its[0].union(*its[1:], round_robin_weights=weights).take(10**6)
    assert out == reference_round_robin_pulls(tagged, weights)


@settings(max_examples=60, deadline=None)
@given(xs=st.lists(st.integers(), max_size=30), n=st.integers(2, 4), batch=st.integers(1, 5))
def test_each_duplicate_child_sees_the_whole_stream_in_order(xs: list[int], n: int, batch: int) -> None:
    children = iter_list(xs).duplicate(n)
    tagged = [c.for_each(lambda x, i=i: (i, x)) for i, c in enumerate(children)]
    tagged[0] = children[0].batch(batch).flatten().for_each(lambda x: (0, x))
    out = tagged[0].union(*tagged[1:]).take(10**6)
    for i in range(n):
        assert [x for j, x in out if j == i] == xs


@settings(max_examples=60, deadline=None)
@given(xs=st.lists(st.integers(), max_size=40), n=st.integers(1, 7))
def test_batch_and_flatten_round_trip(xs: list[int], n: int) -> None:
    batches = iter_list(xs).batch(n).take(10**6)
    assert all(len(b) == n for b in batches[:-1]) and all(0 < len(b) <= n for b in batches)
    assert iter_list(xs).batch(n).flatten().take(10**6) == xs


def test_metrics_context_of_a_fresh_iterator_is_its_own() -> None:
    assert isinstance(iter_list([]).metrics, MetricsContext)
    assert iter_list([]).metrics is not iter_list([]).metrics
