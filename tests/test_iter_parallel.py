"""ParallelIterator over shard actors: gathers, shards, re-initialisation."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import Any, Iterator

import numpy as np
import pytest
import ray
from hypothesis import given, settings
from hypothesis import strategies as st
from ray import cloudpickle

from flowrl.iter import (LocalIterator, ParallelIterator, ParallelIteratorWorker, from_actors, from_items,
                         from_iterators, from_range, get_shard_worker)
from flowrl.iter.shards import from_wire, to_wire
from flowrl.sample_batch import MultiAgentBatch, SampleBatch

# The semantics of gathers, shards and repartitions hold under either executor, so the shards this module starts
# itself run locally (seconds instead of a process each); the `pool` below and the tests marked `on_ray` keep Ray.
pytestmark = pytest.mark.usefixtures("local_executor")


@ray.remote(num_cpus=0, max_restarts=0)
class CountingShard(ParallelIteratorWorker):
    """Streams ``items`` (forever when None) from a generator, counting what it produced."""

    def __init__(self, items: list[Any] | None = None, delay: float = 0.0) -> None:
        self.produced = 0

        def generate() -> Iterator[Any]:
            for x in (items if items is not None else iter(int, 1)):
                time.sleep(delay)
                self.produced += 1
                yield x

        super().__init__(generate)

    def get_produced(self) -> int:
        return self.produced


@ray.remote(num_cpus=0, max_restarts=0)
class ProgrammableShard(ParallelIteratorWorker):
    """A re-iterable shard whose items are set between gathers (reused across Hypothesis examples)."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.produced = 0
        super().__init__(lambda: self)

    def __iter__(self) -> Iterator[Any]:
        for x in self.items:
            self.produced += 1
            yield x

    def set_items(self, items: list[Any]) -> None:
        self.items, self.produced = items, 0

    def get_produced(self) -> int:
        return self.produced

    def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def pool() -> list[Any]:
    actors = [ProgrammableShard.remote() for _ in range(4)]  # type: ignore[attr-defined]
    ray.get([a.pid.remote() for a in actors])
    return actors


def programmed(pool: list[Any], shards: list[list[Any]]) -> ParallelIterator[Any]:
    ray.get([a.set_items.remote(xs) for a, xs in zip(pool, shards)])
    return from_actors(pool[:len(shards)])


def produced(actors: list[Any]) -> list[int]:
    return ray.get([a.get_produced.remote() for a in actors])


# -- constructors and names (item 1) ---------------------------------------------------------------

def test_from_items_deals_round_robin_and_from_range_gives_blocks_with_the_remainder_last() -> None:
    items = from_items([10, 11, 12, 13, 14], num_shards=2)
    assert [s.take(10) for s in items.shards()] == [[10, 12, 14], [11, 13]]
    assert [s.take(10) for s in from_range(10, num_shards=3).shards()] == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    assert repr(items) == "ParallelIterator[from_items[int, 5, shards=2]]"
    assert repr(from_range(10, 3, repeat=True)) == "ParallelIterator[from_range[10, shards=3, repeat=True]]"
    assert repr(from_iterators([[1], [2]])) == "ParallelIterator[from_iterators[shards=2]]"
    assert repr(from_iterators([[1]], name="mine")) == "ParallelIterator[mine]"
    assert repr(from_items([], num_shards=1)) == "ParallelIterator[from_items[None, 0, shards=1]]"


def test_reprs_name_the_pipeline(pool: list[Any]) -> None:
    pi = from_items([1, 2, 3, 4], num_shards=2)
    assert repr(pi.for_each(lambda x: x)) == "ParallelIterator[from_items[int, 4, shards=2].for_each()]"
    assert repr(pi.for_each(lambda x: x).gather_async()) == (
        "LocalIterator[ParallelIterator[from_items[int, 4, shards=2].for_each()].gather_async()]")
    assert repr(pi.batch(2).flatten().local_shuffle(3, seed=1).gather_sync()) == (
        "LocalIterator[ParallelIterator[from_items[int, 4, shards=2].batch(2).flatten()"
        ".local_shuffle(shuffle_buffer_size=3, seed=1)].gather_sync()]")
    assert repr(pi.batch_across_shards()) == "LocalIterator[ParallelIterator[from_items[int, 4, shards=2]].batch_across_shards()]"
    assert repr(pi.get_shard(1)) == "LocalIterator[ParallelIterator[from_items[int, 4, shards=2]].shard[1]]"
    assert repr(pi.select_shards([1])) == "ParallelIterator[from_items[int, 4, shards=2].select_shards([1])]"
    other = from_actors(pool[:1])
    assert repr(pi.union(other)) == ("ParallelIterator[ParallelUnion[ParallelIterator[from_items[int, 4, shards=2]], "
                                     "ParallelIterator[from_actors[shards=1]]]]")
    parts = from_range(4).repartition(2)
    assert repr(parts) == "ParallelIterator[from_range[4, shards=2].repartition[num_partitions=2]]"
    # gathered, so its shard actors exist before the handles go: dropping an actor Ray has not yet registered
    # cancels it and Ray prints "Failed to register actor ... SchedulingCancelled" to the test output
    assert sorted(parts.gather_sync().take(4)) == [0, 1, 2, 3]


@pytest.mark.parametrize("call,message", [
    (lambda: from_items([1], num_shards=0), r"num_shards=0 must be an int >= 1 \(shard actors\)"),
    (lambda: from_range(-1), r"from_range\(\) n=-1 must be an int >= 0 \(the length of range\(n\)\)"),
    (lambda: from_range(3, num_shards=True), r"num_shards=True must be an int >= 1"),
])
def test_constructor_arguments_are_checked(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


# -- gather_sync / batch_across_shards (items 2–3) ------------------------------------------------

def test_gather_sync_orders() -> None:
    assert from_range(4).gather_sync().take(10) == [0, 2, 1, 3]
    assert from_range(4).filter(lambda x: x < 3).gather_sync().take(10) == [0, 2, 1]
    assert from_iterators([[0, 1, 2], [3]]).batch_across_shards().take(10) == [[0, 3], [1], [2]]


def test_batch_across_shards_is_a_barrier_without_prefetch() -> None:
    actors = [CountingShard.remote() for _ in range(3)]  # type: ignore[attr-defined]
    lists = from_actors(actors).batch_across_shards()
    for n in range(1, 5):
        assert len(next(lists)) == 3
        assert produced(actors) == [n, n, n]
    items = from_actors(actors).gather_sync()
    for m in range(1, 8):
        next(items)
        assert produced(actors) == [4 + math.ceil(m / 3)] * 3


@settings(max_examples=25, deadline=None)
@given(shards=st.lists(st.lists(st.integers(), max_size=6), min_size=1, max_size=4))
def test_property_gather_sync_is_a_barrier(pool: list[Any], shards: list[list[int]]) -> None:
    expected, round_of = [], []
    for r in range(max(map(len, shards), default=0)):
        for xs in shards:
            if r < len(xs):
                expected.append(xs[r])
                round_of.append(r + 1)
    out = []
    for m, x in enumerate(programmed(pool, shards).gather_sync()):
        out.append(x)
        assert produced(pool[:len(shards)]) == [min(len(xs), round_of[m]) for xs in shards]
    assert out == expected


# -- gather_async (items 4–5) ----------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 3])
def test_gather_async_resubmits_before_yielding(k: int) -> None:
    actor = CountingShard.remote()  # type: ignore[attr-defined]
    it = from_actors([actor]).gather_async(num_async=k)
    assert next(it) == 0
    assert produced([actor]) == [k + 1]


@settings(max_examples=25, deadline=None)
@given(shards=st.lists(st.lists(st.integers(), max_size=8), min_size=1, max_size=4), k=st.integers(1, 3))
def test_property_gather_async_bounds_requests_and_delivers_exactly_once(
        pool: list[Any], shards: list[list[int]], k: int) -> None:
    tagged = [[(i, x) for x in xs] for i, xs in enumerate(shards)]
    actors = pool[:len(shards)]
    it = programmed(pool, tagged).gather_async(num_async=k).zip_with_source_actor()
    consumed = [0] * len(shards)
    out = []
    for actor, (i, x) in it:
        assert actor == actors[i]  # current_actor is the producer
        consumed[i] += 1
        out.append((i, x))
        for j, count in enumerate(produced(actors)):
            assert count - consumed[j] <= k  # never more than k requests outstanding per shard
    assert sorted(out) == sorted(x for xs in tagged for x in xs)


@pytest.mark.parametrize("kwargs,message", [
    ({"num_async": 0}, r"num_async=0 must be an int >= 1 \(requests in flight per shard\)"),
    ({"num_async": 1.5}, r"num_async=1.5 must be an int >= 1"),
    ({"batch_ms": -1}, r"batch_ms=-1 must be a number >= 0 \(0: one item per request\)"),
    ({"batch_ms": math.nan}, r"batch_ms=nan must be a number >= 0"),
])
def test_gather_async_arguments_are_checked(pool: list[Any], kwargs: dict[str, Any], message: str) -> None:
    # over live actors: a shard actor dropped before Ray registered it makes Ray print "Failed to register actor"
    pi = from_actors(pool[:1])
    with pytest.raises(ValueError, match=message):
        pi.gather_async(**kwargs)
    with pytest.raises(ValueError, match=message):
        pi.get_shard(0, **kwargs)


@pytest.mark.parametrize("timeout_s", [0, -1.0, math.inf, math.nan, True])
def test_gather_timeouts_are_checked(pool: list[Any], timeout_s: Any) -> None:
    pi = from_actors(pool[:1])
    message = rf"timeout_s={timeout_s!r} must be a number in \(0, inf\), or None \(seconds; None waits forever\)"
    with pytest.raises(ValueError, match=message):
        pi.gather_async(timeout_s=timeout_s)
    with pytest.raises(ValueError, match=message):
        pi.batch_across_shards(timeout_s=timeout_s)


def test_batched_async_gather_delivers_everything_and_returns_at_end_of_stream() -> None:
    assert sorted(from_range(100).gather_async(batch_ms=100, num_async=4).take(1000)) == list(range(100))
    pi = from_items([1, 2, 3], num_shards=1)
    assert pi.gather_sync().take(1) == [1]  # the shard actor is up before the clock starts
    start = time.monotonic()
    assert pi.gather_async(batch_ms=30_000).take(10) == [1, 2, 3]
    # the shard answered at end of stream, not at the 30 s deadline (a wide margin for a loaded machine)
    assert time.monotonic() - start < 15


# -- get_shard (item 6) ----------------------------------------------------------------------------

@pytest.mark.parametrize("num_async,batch_ms", [(1, 0), (3, 0), (2, 50)])
def test_get_shard_returns_the_shard_in_order(num_async: int, batch_ms: float) -> None:
    pi = from_range(20, num_shards=2)
    assert pi.get_shard(1, batch_ms=batch_ms, num_async=num_async).take(100) == list(range(10, 20))
    with pytest.raises(ValueError, match="shards 0..1"):
        pi.get_shard(2)


def test_get_shard_sets_current_actor_to_its_shard(pool: list[Any]) -> None:
    pi = programmed(pool, [[1], [2, 3]])
    assert pi.get_shard(1).zip_with_source_actor().take(5) == [(pool[1], 2), (pool[1], 3)]


# -- remote operators run in the shard (item 7) ----------------------------------------------------

def _pid(_: Any) -> int:
    return os.getpid()


@pytest.mark.parametrize("build", [
    lambda pi: pi.for_each(_pid),
    lambda pi: pi.filter(lambda x: x == os.getpid() or True).for_each(lambda x: get_shard_worker().pid()),
    lambda pi: pi.batch(2).for_each(lambda b: os.getpid()),
    lambda pi: pi.for_each(lambda x: [os.getpid()]).flatten(),
    lambda pi: pi.combine(lambda x: [os.getpid()] * 2),
    lambda pi: pi.transform(lambda xs: (os.getpid() for _ in xs)),
])
def test_remote_operators_run_inside_the_shard_actor(pool: list[Any], build: Any) -> None:
    pi = programmed(pool, [[1, 2], [3, 4]])
    pids = set(build(pi).gather_sync().take(100))
    assert pids == set(ray.get([a.pid.remote() for a in pool[:2]]))
    assert os.getpid() not in pids


# -- for_each(max_concurrency) (item 10) ------------------------------------------------------------

@ray.remote(num_cpus=0)
class Tracker:
    """An async actor, so a task can wait on the "all slots busy" event while others enter and leave."""

    def __init__(self) -> None:
        import asyncio

        self.running: dict[int, int] = {}
        self.max_total = 0
        self.violations = 0
        self.enters = 0
        self.full = asyncio.Event()  # set once 4 tasks (2 shards x max_concurrency 2) ran at the same time

    async def enter(self, shard: int) -> None:
        if self.running.get(shard, 0) >= 2:
            self.violations += 1
        self.running[shard] = self.running.get(shard, 0) + 1
        self.enters += 1
        self.max_total = max(self.max_total, sum(self.running.values()))
        if self.max_total >= 4:
            self.full.set()

    async def wait_full(self, timeout_s: float) -> None:
        import asyncio

        try:
            await asyncio.wait_for(self.full.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass  # the report then shows max_total < 4

    async def leave(self, shard: int) -> None:
        self.running[shard] -= 1

    async def report(self) -> tuple[int, int, int]:
        return self.max_total, self.violations, self.enters


@pytest.mark.on_ray
@pytest.mark.parametrize("gather", ["gather_sync", "gather_async"])
def test_for_each_max_concurrency_keeps_k_tasks_running_per_shard(pool: list[Any], gather: str) -> None:
    tracker = Tracker.remote()  # type: ignore[attr-defined]

    def work(item: tuple[int, int]) -> int:
        ray.get(tracker.enter.remote(item[0]))
        ray.get(tracker.wait_full.remote(20.0))  # the first four hold until all four run (no timing luck)
        time.sleep(0.05)  # simulated work, so later tasks overlap too
        ray.get(tracker.leave.remote(item[0]))
        return item[1]

    pi = programmed(pool, [[(0, x) for x in range(6)], [(1, x) for x in range(6, 12)]])
    out = getattr(pi.for_each(work, max_concurrency=2, resources={"num_cpus": 0}), gather)().take(100)
    assert sorted(out) == list(range(12))
    assert ray.get(tracker.report.remote()) == (4, 0, 12)
    with pytest.raises(ValueError, match="max_concurrency"):
        pi.for_each(work, max_concurrency=0)


# -- source actors, nesting, selection (items 19–22) ------------------------------------------------

def test_zip_with_source_actor(pool: list[Any]) -> None:
    with pytest.raises(ValueError, match="Could not identify source actor"):
        from_range(4).gather_sync().zip_with_source_actor().take(4)
    pi = programmed(pool, [[1, 2], [3, 4]])
    actors = [a for a, _ in pi.gather_async().zip_with_source_actor().take(10)]
    assert sorted(actors.count(a) for a in pool[:2]) == [2, 2] and len(actors) == 4


def test_a_retried_item_keeps_its_source_actor_while_other_branches_pull(pool: list[Any]) -> None:
    """RetryLater holds an item; when it is retried, current_actor must again be its producer, even
    though another union branch (here another gather) moved current_actor in between."""
    from flowrl.iter import RetryLater

    tries: dict[int, int] = {}

    def busy_once(x: int) -> int:
        tries[x] = tries.get(x, 0) + 1
        if tries[x] == 1:
            raise RetryLater
        return x

    producer = {pool[0]: "a", pool[1]: "b"}
    ray.get([pool[0].set_items.remote([1, 2, 3]), pool[1].set_items.remote([10, 20, 30])])
    store = from_actors([pool[0]]).gather_async().for_each(busy_once).zip_with_source_actor()
    other = from_actors([pool[1]]).gather_async().zip_with_source_actor()
    pairs = store.union(other).take(6)
    assert sorted((producer[a], x) for a, x in pairs) == [("a", 1), ("a", 2), ("a", 3),
                                                          ("b", 10), ("b", 20), ("b", 30)]


@ray.remote(num_cpus=0)
def consume(it: LocalIterator[Any]) -> list[Any]:
    return it.take(100)


@ray.remote(num_cpus=0)
def consume_shard_in_nested_task(pi: ParallelIterator[Any], i: int) -> list[Any]:
    return ray.get(consume.remote(pi.get_shard(i)))


@pytest.mark.on_ray
def test_iterators_are_consumed_in_remote_tasks() -> None:
    pi = from_range(6, num_shards=2).for_each(lambda x: x * 10)
    assert sorted(ray.get(consume.remote(pi.gather_async().for_each(lambda x: x + 1)))) == [1, 11, 21, 31, 41, 51]
    assert ray.get(consume_shard_in_nested_task.remote(pi, 1)) == [30, 40, 50]
    started = pi.gather_sync()
    started.take(1)
    with pytest.raises(TypeError, match="already been pulled"):
        cloudpickle.dumps(started)


def test_select_shards_children_are_disjoint(pool: list[Any]) -> None:
    pi = from_items([1, 2, 3, 4], num_shards=2)
    assert pi.select_shards([0]).gather_sync().take(10) == [1, 3]
    assert pi.select_shards([1]).gather_sync().take(10) == [2, 4]
    for bad in ([], [2], [0, 0], [-1]):
        with pytest.raises(ValueError, match="select_shards"):
            pi.select_shards(bad)
    with pytest.raises(ValueError, match="union"):
        pi.union(from_actors(pool[:1])).select_shards([0])  # live actors: none dropped unregistered


def test_repartition() -> None:
    # On Ray each repartition starts its own shard actors (~1 s each on 2 cores), so the checks share three of them.
    part = from_range(8, 2).repartition(3)
    assert part.num_shards() == 3
    membership = [sorted(s.take(100)) for s in part.shards()]
    assert membership == [[0, 3, 4, 7], [1, 5], [2, 6]]
    chained = from_range(8, 2).repartition(3).for_each(lambda x: -x)
    both = chained.union(from_range(4, 2).repartition(2))
    assert both.num_shards() == 5
    per_shard = [sorted(s.take(100)) for s in both.shards()]
    assert per_shard[:3] == [sorted(-x for x in m) for m in membership]  # the same dealing, transformed in the shards
    assert sorted(per_shard[3] + per_shard[4]) == [0, 1, 2, 3]


def test_local_shuffle_keeps_membership_and_is_seeded() -> None:
    pi = from_range(40, num_shards=2)
    assert [s.take(100) for s in pi.local_shuffle(1).shards()] == [list(range(20)), list(range(20, 40))]
    a = [s.take(100) for s in pi.local_shuffle(5, seed=7).shards()]
    assert [sorted(x) for x in a] == [list(range(20)), list(range(20, 40))] and a[0] != list(range(20))
    assert [s.take(100) for s in pi.local_shuffle(5, seed=7).shards()] == a


# -- errors at build time (item 24) ----------------------------------------------------------------

class Op:
    def __call__(self, x: Any) -> Any:
        return x


def test_parallel_iterator_misuse_is_caught_when_attached(pool: list[Any]) -> None:
    pi = from_items([1, 2])
    with pytest.raises(TypeError, match=r"call .gather_sync\(\) or .gather_async\(\)"):
        iter(pi)
    other = from_actors(pool[:1])  # live actors, so that none is dropped before Ray registered it
    with pytest.raises(TypeError, match="ParallelIterator"):
        pi.union(other.gather_sync())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="LocalIterator"):
        other.gather_sync().union(pi)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"pass an instance: Op\(...\), not Op"):
        pi.for_each(Op)
    assert pi.for_each(str).gather_sync().take(2) == ["1", "2"]
    lock = threading.Lock()
    with pytest.raises(TypeError, match="cannot be pickled"):
        pi.for_each(lambda x: lock and x)
    with pytest.raises(ValueError):
        pi.batch(0)


# -- repeat, empty sets, restarts, generations (items 25–28) ----------------------------------------

def test_repeat_cycles_and_rejects_bare_iterators() -> None:
    assert from_items([1, 2, 3, 4], repeat=True).take(8) == [1, 2, 3, 4, 1, 2, 3, 4]
    assert from_iterators([[1, 2]], repeat=True).gather_sync().take(5) == [1, 2, 1, 2, 1]
    with pytest.raises(ValueError, match="bare iterator"):
        from_iterators([iter([1, 2])], repeat=True)


def test_empty_actor_sets_and_exhausted_shards_end_cleanly(caplog: pytest.LogCaptureFixture) -> None:
    empty = from_actors([])
    assert empty.gather_sync().take(5) == []
    assert empty.gather_async(num_async=3).take(5) == []
    assert empty.batch_across_shards().take(5) == []
    with caplog.at_level(logging.DEBUG, logger="flowrl"):
        assert sorted(from_range(5, 2).gather_async(num_async=2).take(100)) == list(range(5))
        assert from_range(5, 2).gather_sync().take(100) == [0, 2, 1, 3, 4]
    assert not caplog.records


def test_regather_restarts_lists_and_continues_generators() -> None:
    listed = from_items([1, 2, 3, 4], num_shards=2)
    assert listed.take(2) == [1, 2]
    assert listed.take(2) == [1, 2]
    generated = from_iterators([lambda: iter(range(10))])
    assert generated.take(2) == [0, 1]
    assert generated.take(2) == [2, 3]


def test_a_superseded_gather_raises_and_sequential_regathers_work() -> None:
    pi = from_range(10, 2)
    first = pi.gather_sync()
    assert first.take(2) == [0, 5]
    second = pi.gather_async()
    assert len(second.take(2)) == 2
    with pytest.raises(RuntimeError, match="re-initialised by another gather"):
        first.take(1)
    assert pi.gather_sync().take(4) == [0, 5, 1, 6]
    g = pi.gather_sync()
    siblings = g.for_each(str), g.for_each(repr)
    siblings[0].take(1)
    siblings[1].take(1)
    with pytest.raises(RuntimeError, match="re-initialised"):
        siblings[0].take(3)  # its buffered round is used up, and the next round is refused


@pytest.mark.on_ray
def test_errors_in_shards_propagate_as_ray_errors_with_the_original_cause() -> None:
    def fail(x: int) -> int:
        raise KeyError(f"bad {x}")

    with pytest.raises(KeyError) as info:
        from_range(2, 1).for_each(fail).gather_sync().take(1)
    assert isinstance(info.value, ray.exceptions.RayTaskError)


def test_duplicate_children_restore_the_producing_actor(pool: list[Any]) -> None:
    pi = programmed(pool, [[(0, x) for x in range(3)], [(1, x) for x in range(3)]])
    a, b = pi.gather_async(num_async=2).duplicate(2)
    out = a.zip_with_source_actor().union(b.zip_with_source_actor()).take(100)
    assert len(out) == 12
    assert all(actor == pool[shard] for actor, (shard, _) in out)


def test_transform_over_a_barrier_source_sees_real_items_only() -> None:
    seen: list[Any] = []

    def pairs(xs: Any) -> Iterator[tuple[Any, Any]]:
        it = iter(xs)
        for x in it:
            seen.append(x)
            yield x, next(it, None)

    out = from_range(4).batch_across_shards().transform(pairs).take(10)
    assert out == [([0, 2], [1, 3])]
    assert seen == [[0, 2]]


# -- the wire: items that offer it cross as one plain pickle, every other item as Ray serialises it ---------------

class _TaggedBatch(SampleBatch):
    """A SampleBatch subclass: it goes through Ray's serialiser (its class may live in a script's __main__)."""


def _wire_items() -> list[Any]:
    small = SampleBatch({"obs": np.arange(12, dtype=np.float32).reshape(6, 2), "actions": np.arange(6)})
    tagged = _TaggedBatch(small)
    tagged.note = "kept"
    return [small, b"raw bytes", SampleBatch({"obs": np.zeros((20_000, 2))}), tagged,
            MultiAgentBatch({"p0": small, "p1": small[0:2]}, env_steps=6), {"a": 1}, None,
            bytearray(b"ba")]  # Ray alone would hand a bytearray item over as bytes


def test_wire_encodes_only_items_that_offer_it_and_every_bytes_item() -> None:
    small, raw, large, tagged, multi, plain, none, buf = _wire_items()
    for item in (small, raw, multi, buf, np.bytes_(b"np")):
        answer = to_wire(item)
        assert type(answer) is bytes
        decoded = from_wire(answer)
        assert type(decoded) is type(item) and decoded == item
    for item in (large, tagged, plain, none):
        assert to_wire(item) is item and from_wire(item) is item
    ref = ray.put(small)
    assert to_wire(ref) is ref  # Ray's serialiser keeps ObjectRefs' ownership: never a plain pickle


def test_a_shard_answers_a_small_batch_as_bytes_and_a_large_one_as_itself() -> None:
    small, _, large, *_ = _wire_items()
    shard = CountingShard.remote([small, large])  # type: ignore[attr-defined]
    ray.get(shard.par_iter_init.remote((), "g"))
    first, second = ray.get(shard.par_iter_next.remote()), ray.get(shard.par_iter_next.remote())
    assert type(first) is bytes and from_wire(first) == small
    assert type(second) is SampleBatch and second == large


@pytest.mark.on_ray
@pytest.mark.parametrize("gather", ["gather_sync", "gather_async", "gather_async_k2", "gather_async_batched",
                                    "batch_across_shards", "get_shard", "repartition"])
def test_every_gather_delivers_every_kind_of_item_unchanged(gather: str) -> None:
    items = _wire_items()  # made inside the shards: Ray's arguments would turn the bytearray into bytes already
    pi = from_iterators([lambda: _wire_items()[0::2], lambda: _wire_items()[1::2]])
    it = {"gather_sync": lambda: pi.gather_sync(), "gather_async": lambda: pi.gather_async(),
          "gather_async_k2": lambda: pi.gather_async(num_async=2),
          "gather_async_batched": lambda: pi.gather_async(batch_ms=5),
          "batch_across_shards": lambda: pi.batch_across_shards().flatten(),
          "get_shard": lambda: pi.get_shard(0),
          "repartition": lambda: pi.repartition(3).gather_sync()}[gather]()
    out = it.take(100)
    expected = items[0::2] if gather == "get_shard" else items
    assert len(out) == len(expected)
    for item in expected:  # order differs between gathers; match by type and value
        matches = [x for x in out if type(x) is type(item) and x == item]
        assert matches, f"{gather} lost or changed {item!r}"
    tagged = next(x for x in out if type(x) is _TaggedBatch) if gather != "get_shard" else None
    assert tagged is None or tagged.note == "kept"
