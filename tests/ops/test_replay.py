"""Replay operators against local buffers, replay shards and small fake shards."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Iterator

import numpy as np
import pytest
import ray

from flowrl.iter import LocalIterator, ParallelIteratorWorker, RetryLater
from flowrl.metrics import STEPS_SAMPLED_COUNTER, MetricsContext
from flowrl.ops.replay import MixInReplay, Replay, StoreToReplayBuffer, UpdatePriorities, WaitUntilTimestepsElapsed
from flowrl.replay_buffers import LocalReplayBuffer, make_replay_shards
from flowrl.sample_batch import BATCH_INDEXES, DEFAULT_POLICY_ID, OBS, MultiAgentBatch, SampleBatch
from flowrl.testing import fake_batch, iter_list

DP = DEFAULT_POLICY_ID


# -- fakes ------------------------------------------------------------------------------------------

@ray.remote(num_cpus=0)
class FakeReplayShard:
    """Records each ``add_batch`` (by the batch's first obs) and how many were in progress at once.

    An async actor, so every submitted call enters at once: ``inflight`` is the number of calls that
    arrived and have not finished. ``gated`` calls wait for :meth:`release`; ``delay_s`` simulates work.
    (An async actor may start calls out of order, so tests wait with ``StoreToReplayBuffer.flush()``.)
    """

    def __init__(self, delay_s: float = 0.0, gated: bool = False) -> None:
        self.delay_s, self.gated = delay_s, gated
        self.inflight = self.max_inflight = 0
        self.received: list[int] = []
        self._gate: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._gate is None:
            self._gate = asyncio.Event()
            if not self.gated:
                self._gate.set()
        return self._gate

    async def add_batch(self, batch: SampleBatch) -> None:
        gate = self._event()
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        await gate.wait()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)  # simulated work
        self.received.append(int(batch[OBS][0]))
        self.inflight -= 1

    async def release(self) -> None:
        self._event().set()

    async def report(self) -> dict[str, Any]:
        return {"received": list(self.received), "max_inflight": self.max_inflight}


class _CountingShard(ParallelIteratorWorker):
    """A replay shard that never has data: its stream is ``None`` forever; counts the requests."""

    def __init__(self) -> None:
        super().__init__(lambda: itertools.repeat(None))
        self.requests = 0

    def par_iter_next(self, generation: Any = None) -> Any:
        self.requests += 1
        return super().par_iter_next(generation)

    def num_requests(self) -> int:
        return self.requests


CountingShard = ray.remote(num_cpus=0)(_CountingShard)


class RecordingBuffer:
    """Records what ``update_priorities`` receives."""

    def __init__(self, replay_sequence_length: int = 1) -> None:
        self.replay_sequence_length = replay_sequence_length
        self.calls: list[dict[str, tuple[np.ndarray, np.ndarray]]] = []

    def update_priorities(self, prio_dict: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        self.calls.append(prio_dict)


class ReplaySource:
    """One replay store, local or sharded: makes the store and replay ops and waits for stores to land."""

    def __init__(self, kind: str, num_actors: int = 1, **buffer_kwargs: Any) -> None:
        self.kind = kind
        self.buffer: LocalReplayBuffer | None = None
        self.actors: list[Any] = []
        if kind == "local":
            self.buffer = LocalReplayBuffer(**buffer_kwargs)
        else:
            self.actors = make_replay_shards(num_actors, **buffer_kwargs)

    def sources(self) -> dict[str, Any]:
        return {"local_buffer": self.buffer} if self.kind == "local" else {"actors": self.actors}

    def store_op(self) -> StoreToReplayBuffer:
        return StoreToReplayBuffer(**self.sources())

    def replay_op(self) -> LocalIterator[Any]:
        return Replay(**self.sources())

    def settle(self) -> None:
        """Every add_batch submitted so far has run (an actor runs one caller's calls in order)."""
        ray.get([a.ping.remote() for a in self.actors])

    def direct_replay(self) -> Any:
        if self.buffer is not None:
            return self.buffer.replay()
        return ray.get(self.actors[0].replay.remote())

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor)


@pytest.fixture(params=["local", "actors"])
def replay_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_source() -> Iterator[Any]:
    made: list[ReplaySource] = []

    def make(kind: str, **kwargs: Any) -> ReplaySource:
        made.append(ReplaySource(kind, **kwargs))
        return made[-1]

    yield make
    for source in made:
        source.close()


def batches(count: int, n: int, offset: int = 0) -> list[SampleBatch]:
    """``n`` batches of ``count`` rows; batch ``i`` starts its obs at ``count * (i + offset)``."""
    return [fake_batch(count, start=count * (i + offset)) for i in range(n)]


def is_store(item: Any) -> bool:
    """Store items are the fake SampleBatches; replays come back as MultiAgentBatches."""
    return isinstance(item, SampleBatch)


# -- construction (§6.40) ---------------------------------------------------------------------------

@pytest.mark.parametrize("op", [StoreToReplayBuffer, Replay])
def test_exactly_one_source_is_required(op: Any) -> None:
    buf = LocalReplayBuffer(learning_starts=0)
    with pytest.raises(ValueError, match="both"):
        op(local_buffer=buf, actors=["actor"])
    with pytest.raises(ValueError, match="neither"):
        op()
    with pytest.raises(ValueError, match=r"actors=\[\]"):
        op(actors=[])
    with pytest.raises(ValueError, match="has no"):
        op(local_buffer=object())


def test_an_empty_buffer_whose_len_is_zero_is_accepted() -> None:
    class EmptyBuffer:
        def __len__(self) -> int:
            return 0

        def add_batch(self, batch: Any) -> None:
            self.added = batch

        def replay(self) -> None:
            return None

    for buf in (LocalReplayBuffer(learning_starts=0), EmptyBuffer()):
        assert len(buf) == 0 and not buf  # falsy: a truthiness test would reject it
        StoreToReplayBuffer(local_buffer=buf)
        Replay(local_buffer=buf)


def test_bad_arguments_and_items_raise_value_error() -> None:
    buf = LocalReplayBuffer(learning_starts=0)
    with pytest.raises(ValueError, match="max_outstanding_adds"):
        StoreToReplayBuffer(local_buffer=buf, max_outstanding_adds=0)
    with pytest.raises(ValueError, match="num_async"):
        Replay(local_buffer=buf, num_async=0)
    with pytest.raises(ValueError, match="SampleBatch or MultiAgentBatch"):
        StoreToReplayBuffer(local_buffer=buf)({"obs": [1]})
    assert repr(StoreToReplayBuffer(local_buffer=buf)) == "StoreToReplayBuffer(local)"


# -- StoreToReplayBuffer with actors: bounded outstanding adds (§6.40) -----------------------------

def test_store_retries_later_when_every_actor_is_at_its_limit() -> None:
    actors = [FakeReplayShard.remote(gated=True) for _ in range(2)]
    try:
        op = StoreToReplayBuffer(actors=actors, max_outstanding_adds=2)
        items = batches(1, 5)
        for b in items[:4]:
            assert op(b) is b
        assert op.num_outstanding() == [2, 2]
        with pytest.raises(RetryLater):
            op(items[4])
        assert op.num_outstanding() == [2, 2]  # nothing was submitted
        ray.get(actors[0].release.remote())
        it = iter_list([items[4]]).for_each(op)  # the core retries the same batch until an add is reaped
        assert next(it) is items[4]
        ray.get(actors[1].release.remote())
        op.flush()
        assert op.num_outstanding() == [0, 0]
        done = ray.get([a.report.remote() for a in actors])
        assert len(done[0]["received"]) == 3 and 4 in done[0]["received"]  # it went to the free actor
        assert sorted(done[0]["received"] + done[1]["received"]) == [0, 1, 2, 3, 4]
    finally:
        for actor in actors:
            ray.kill(actor)


def test_slow_actors_never_exceed_max_outstanding_adds_and_lose_nothing() -> None:
    actors = [FakeReplayShard.remote(delay_s=0.01) for _ in range(2)]
    try:
        op = StoreToReplayBuffer(actors=actors, max_outstanding_adds=2)
        items = batches(1, 30)
        out = list(iter_list(items).for_each(op))
        assert out == items  # every batch once, in order
        assert all(n <= 2 for n in op.num_outstanding())
        op.flush()
        done = ray.get([a.report.remote() for a in actors])
        received = done[0]["received"] + done[1]["received"]
        assert sorted(received) == list(range(30))  # none lost, none stored twice
        assert max(d["max_inflight"] for d in done) == 2  # the bound was reached and held
    finally:
        for actor in actors:
            ray.kill(actor)


def test_store_surfaces_a_failed_add() -> None:
    actors = make_replay_shards(1, learning_starts=0, capacity=100, replay_mode="lockstep")
    try:
        op = StoreToReplayBuffer(actors=actors, max_outstanding_adds=1)
        # policies that cannot be aligned by env step: the actor's add_batch raises
        bad = MultiAgentBatch({"a": fake_batch(2), "b": fake_batch(3)}, 3)
        op(bad)
        it = iter_list([fake_batch(1)]).for_each(op)
        with pytest.raises(ray.exceptions.RayTaskError, match="lockstep"):
            next(it)
        flushed = StoreToReplayBuffer(actors=actors)
        flushed(bad)
        with pytest.raises(ray.exceptions.RayTaskError, match="lockstep"):
            flushed.flush()
    finally:
        ray.kill(actors[0])


# -- Replay (§6.13, §6.39) ----------------------------------------------------------------------------

def test_replay_is_not_ready_until_learning_starts(replay_kind: str, make_source: Any) -> None:
    source = make_source(replay_kind, learning_starts=200, capacity=1000, replay_batch_size=100)
    store = source.store_op()
    first, second = batches(100, 2)
    store(first)
    source.settle()
    assert source.direct_replay() is None
    # the replay branch has nothing: a blocking union serves the other input instead of waiting
    assert source.replay_op().union(iter_list(["a", "b", "c"]), deterministic=True).take(3) == ["a", "b", "c"]
    store(second)
    source.settle()
    assert source.direct_replay().count == 100
    replay = source.replay_op()
    if replay_kind == "local":
        assert [b.count for b in replay.take(2)] == [100, 100]
        assert replay.metrics.current_actor is None
    else:
        actor, batch = next(replay.zip_with_source_actor())
        assert actor == source.actors[0] and batch.count == 100


def test_local_replay_never_yields_the_not_ready_signal() -> None:
    buf = LocalReplayBuffer(learning_starts=3, capacity=100, replay_batch_size=2, seed=0)
    fills = iter([fake_batch(1), fake_batch(1), fake_batch(1)])

    def poll_store() -> SampleBatch | None:
        batch = next(fills, None)
        if batch is not None:
            buf.add_batch(batch)
        return None  # this source itself never has an item

    it = LocalIterator.from_poll(poll_store).union(Replay(local_buffer=buf))
    out = it.take(3)
    assert [type(b) for b in out] == [MultiAgentBatch] * 3 and all(b.count == 2 for b in out)


class ScriptedBuffer:
    """``replay()`` answers from a script (``None``: no data yet), then ends the stream."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)

    def replay(self) -> Any:
        if not self.script:
            raise StopIteration
        return self.script.pop(0)


def test_local_replay_hides_not_ready_from_next_take_list_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    a, b = fake_batch(1), fake_batch(1, start=1)
    script = [None, a, None, None, b]
    it = Replay(local_buffer=ScriptedBuffer(script))
    assert next(it) is a and next(it) is b
    assert Replay(local_buffer=ScriptedBuffer(script)).take(5) == [a, b]
    assert list(Replay(local_buffer=ScriptedBuffer(script))) == [a, b]
    Replay(local_buffer=ScriptedBuffer(script)).show()
    assert capsys.readouterr().out == f"{a!r}\n{b!r}\n"


def test_actor_replay_reports_not_ready_without_busy_looping() -> None:
    shard = CountingShard.remote()
    try:
        replay = Replay(actors=[shard], num_async=4)
        assert replay.union(iter_list(list(range(5))), deterministic=True).take(5) == [0, 1, 2, 3, 4]
        # each replay turn consumes one "no data yet" answer and resubmits once: at most
        # 4 initial requests plus one per turn (6 turns), not a loop of re-pulls within a turn
        assert ray.get(shard.num_requests.remote()) <= 4 + 6
    finally:
        ray.kill(shard)


# -- DQN-shaped round robin (§6.39, §6.47) ---------------------------------------------------------

def test_round_robin_keeps_storing_until_learning_starts(replay_kind: str, make_source: Any) -> None:
    source = make_source(replay_kind, learning_starts=200, capacity=1000, replay_batch_size=10,
                         prioritized_replay_alpha=0.0)
    stored = batches(50, 8)
    store_op = iter_list(stored).for_each(source.store_op())
    out = store_op.union(source.replay_op(), deterministic=True, round_robin_weights=[1, 2]).take(16)
    stores = [item for item in out if is_store(item)]
    assert stores == stored  # all stores, in order: the replay branch never blocked them
    first_replay = next(i for i, item in enumerate(out) if not is_store(item))
    assert first_replay >= 4  # no replay before 4 x 50 = learning_starts steps were stored
    assert all(item.count == 10 for item in out if not is_store(item))
    if replay_kind == "local":  # exact turns: S S S S, then R R S four times
        assert [is_store(x) for x in out] == [True] * 4 + [False, False, True] * 4


@pytest.mark.parametrize("k", [3, 2.5])
def test_round_robin_replay_to_store_ratio_converges_to_k(k: float) -> None:
    buf = LocalReplayBuffer(learning_starts=0, capacity=1000, replay_batch_size=2, prioritized_replay_alpha=0.0,
                            seed=0)
    endless = LocalIterator.from_iterable(lambda: (fake_batch(2, start=i) for i in itertools.count()))
    store_op = endless.for_each(StoreToReplayBuffer(local_buffer=buf))
    out = store_op.union(Replay(local_buffer=buf), deterministic=True, round_robin_weights=[1, k]).take(2000)
    num_stores = sum(is_store(x) for x in out)
    ratio = (len(out) - num_stores) / num_stores
    assert ratio == pytest.approx(k, rel=0.06)
    if k == 3:
        assert [is_store(x) for x in out[:8]] == [True, False, False, False] * 2


# -- UpdatePriorities ----------------------------------------------------------------------------------

def test_update_priorities_sends_indexes_and_td_errors_per_policy() -> None:
    buf = RecordingBuffer()
    batch = MultiAgentBatch({"a": fake_batch(3, **{BATCH_INDEXES: [4, 5, 6]}),
                             "b": fake_batch(2, **{BATCH_INDEXES: [0, 1]})}, 3)
    info = {"a": {"td_error": np.array([1.0, 2.0, 3.0])},
            "b": {"learner_stats": {"td_error": [0.5, -0.5]}}}
    item = (batch, info)
    assert UpdatePriorities(buf)(item) is item
    [call] = buf.calls
    assert sorted(call) == ["a", "b"]
    np.testing.assert_array_equal(call["a"][0], [4, 5, 6])
    np.testing.assert_array_equal(call["a"][1], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(call["b"][0], [0, 1])
    np.testing.assert_array_equal(call["b"][1], [0.5, -0.5])


def test_update_priorities_takes_every_t_th_index_for_sequences() -> None:
    buf = RecordingBuffer(replay_sequence_length=3)
    batch = fake_batch(6, **{BATCH_INDEXES: [7, 7, 7, 2, 2, 2]})
    UpdatePriorities(buf)((batch, {DP: {"td_error": [0.1, 0.2]}}))
    np.testing.assert_array_equal(buf.calls[0][DP][0], [7, 2])


def test_update_priorities_rejects_what_it_cannot_match() -> None:
    op = UpdatePriorities(RecordingBuffer())
    batch = fake_batch(3, **{BATCH_INDEXES: [0, 1, 2]})
    with pytest.raises(ValueError, match="learner_info"):
        op(batch)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="td_error"):
        op((batch, {DP: {"learner_stats": {}}}))
    with pytest.raises(ValueError, match="TD errors"):
        op((batch, {DP: {"td_error": [1.0, 2.0]}}))
    with pytest.raises(ValueError, match="batch holds only"):
        op((batch, {"other": {"td_error": [1.0, 2.0, 3.0]}}))
    with pytest.raises(ValueError, match="batch_indexes"):
        op((fake_batch(3), {DP: {"td_error": [1.0, 2.0, 3.0]}}))
    with pytest.raises(ValueError, match="update_priorities"):
        UpdatePriorities(object())


def test_update_priorities_reach_a_prioritized_buffer() -> None:
    buf = LocalReplayBuffer(learning_starts=0, capacity=100, replay_batch_size=4, seed=0)
    buf.add_batch(fake_batch(8))
    replayed = buf.replay()
    assert replayed is not None
    UpdatePriorities(buf)((replayed, {DP: {"td_error": np.full(4, 9.0)}}))
    assert buf.replay_buffers[DP].max_priority == pytest.approx(9.0)


# -- MixInReplay (§6.41) --------------------------------------------------------------------------------

def test_mix_in_replay_proportion_zero_and_two() -> None:
    assert len(MixInReplay(0, 0)(fake_batch(2))) == 1
    op = MixInReplay(num_slots=4, replay_proportion=0, seed=0)
    b = fake_batch(2)
    assert op(b) == [b] and op(b)[0] is b
    assert len(op.buffer) == 0  # never replayed, so never stored (copies of image batches add up to gigabytes)
    op = MixInReplay(num_slots=4, replay_proportion=2, seed=0)
    for i in range(20):
        out = op(fake_batch(2, start=10 * i))
        assert len(out) == 3
        assert all(int(r[OBS][0]) % 10 == 0 and int(r[OBS][0]) <= 10 * i for r in out[1:])  # stored batches only


def test_mix_in_replay_half_gives_one_or_two_with_mean_one_and_a_half() -> None:
    op = MixInReplay(num_slots=8, replay_proportion=0.5, seed=1)
    lengths = [len(op(fake_batch(1, start=i))) for i in range(2000)]
    assert set(lengths) == {1, 2}
    assert np.mean(lengths) == pytest.approx(1.5, abs=0.05)


def test_mix_in_replay_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="num_slots=0"):
        MixInReplay(0, 0.5)
    with pytest.raises(ValueError, match="replay_proportion"):
        MixInReplay(4, -0.1)


def test_mix_in_replay_stored_data_survives_in_place_changes_downstream() -> None:
    op = MixInReplay(num_slots=1, replay_proportion=1, seed=0)
    first = fake_batch(3)
    out = op(first)
    assert out[0] is first and out[1] == first and out[1] is not first  # a replay is a copy
    first[OBS] *= 0  # like StandardizeFields on the emitted input...
    out[1][OBS] += 100  # ...and on the emitted replay
    assert op.buffer.replay()[OBS].tolist() == [0.0, 1.0, 2.0]
    assert op(fake_batch(3, start=50))[1][OBS].tolist() == [50.0, 51.0, 52.0]  # one slot: the newest


def test_mix_in_replay_in_a_combine() -> None:
    it = iter_list(batches(2, 5)).combine(MixInReplay(num_slots=2, replay_proportion=1, seed=0))
    out = it.take(10)
    assert len(out) == 10 and [int(b[OBS][0]) for b in out[::2]] == [0, 2, 4, 6, 8]


# -- WaitUntilTimestepsElapsed ----------------------------------------------------------------------

def test_wait_until_timesteps_elapsed_passes_once_past_the_target() -> None:
    def count(batch: SampleBatch) -> SampleBatch:
        LocalIterator.get_metrics().counters[STEPS_SAMPLED_COUNTER] += batch.count
        return batch

    it = iter_list(batches(10, 5)).for_each(count).filter(WaitUntilTimestepsElapsed(30))
    assert [int(b[OBS][0]) for b in it] == [30, 40]  # counters 40 and 50 are > 30; 30 is not
    wait = WaitUntilTimestepsElapsed(5)
    wait.bind(metrics := MetricsContext())
    metrics.counters[STEPS_SAMPLED_COUNTER] = 5
    assert wait(None) is False
