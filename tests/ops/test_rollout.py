"""Rollout operators against fake workers."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from flowrl import executor

from flowrl.iter import ParallelIterator
from flowrl.metrics import (AGENT_STEPS_SAMPLED_COUNTER, GRAD_WAIT_TIMER, LEARNER_INFO, SAMPLE_TIMER,
                            STEPS_SAMPLED_COUNTER, MetricsContext)
from flowrl.ops.rollout import (AsyncGradients, ConcatBatches, ParallelRollouts, SelectExperiences,
                                StandardizeFields)
from flowrl.sample_batch import MultiAgentBatch
from flowrl.testing import (SAMPLE_INDEX, WEIGHTS_VERSION, WORKER_INDEX, fake_batch, iter_list,
                            make_fake_workers)
from flowrl.workers import PolicySpec, WorkerSet

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py


@pytest.fixture(scope="module")
def two_workers() -> Any:
    workers = make_fake_workers(2, rollout_fragment_length=100)
    yield workers
    workers.stop()


def records(workers: WorkerSet) -> list[dict[str, Any]]:
    return executor.get([w.get_record.remote() for w in workers.remote_workers()])  # type: ignore[no-any-return]


def test_bulk_sync_concatenates_one_fragment_from_every_worker() -> None:
    workers = make_fake_workers(2, rollout_fragment_length=100)
    try:
        it = ParallelRollouts(workers, mode="bulk_sync")
        assert repr(it) == "LocalIterator[ParallelRollouts(bulk_sync)]"
        calls_after_construction = [len(r["set_weights_calls"]) for r in records(workers)]
        batch = next(it)
        assert batch.count == 200
        assert sorted(set(batch[WORKER_INDEX].tolist())) == [1, 2]
        assert it.metrics.counters[STEPS_SAMPLED_COUNTER] == 200
        assert it.metrics.counters[AGENT_STEPS_SAMPLED_COUNTER] == 200
        next(it)
        # sync_weights ran once, at construction (the WorkerSet's own initial sync is the first call)
        assert [len(r["set_weights_calls"]) for r in records(workers)] == calls_after_construction == [2, 2]
    finally:
        workers.stop()


def test_async_items_are_single_fragments_with_their_producer_as_current_actor(two_workers: WorkerSet) -> None:
    seen: list[tuple[Any, int]] = []
    it = ParallelRollouts(two_workers, mode="async", num_async=2)
    it = it.for_each(lambda b: seen.append((it.metrics.current_actor, int(b[WORKER_INDEX][0]))) or b)
    batches = it.take(6)
    assert all(b.count == 100 for b in batches)
    actors = two_workers.remote_workers()
    assert all(actor == actors[index - 1] for actor, index in seen)
    assert it.metrics.counters[STEPS_SAMPLED_COUNTER] == 600


def test_raw_returns_the_parallel_iterator(two_workers: WorkerSet) -> None:
    raw = ParallelRollouts(two_workers, mode="raw")
    assert isinstance(raw, ParallelIterator)
    assert raw.num_shards() == 2
    assert [b.count for b in raw.gather_sync().take(2)] == [100, 100]


def test_without_remote_workers_rollouts_sample_locally_and_raw_is_refused() -> None:
    workers = make_fake_workers(0, rollout_fragment_length=10)
    for mode in ("bulk_sync", "async"):
        it = ParallelRollouts(workers, mode=mode)  # type: ignore[arg-type]
        assert [b.count for b in it.take(3)] == [10, 10, 10]
        assert it.metrics.counters[STEPS_SAMPLED_COUNTER] == 30
    with pytest.raises(ValueError, match=r"mode='raw'\) needs remote workers"):
        ParallelRollouts(workers, mode="raw")


@pytest.mark.parametrize("kwargs, message", [({"mode": "bulk"}, "mode='bulk'"),
                                             ({"mode": "async", "num_async": 0}, "num_async=0")])
def test_bad_rollout_arguments_are_named(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ParallelRollouts(make_fake_workers(0), **kwargs)


def test_async_gradients_count_steps_and_name_the_producer(two_workers: WorkerSet) -> None:
    it = AsyncGradients(two_workers)
    producers = []
    for grads, count in it.take(4):
        producers.append(it.metrics.current_actor)
        assert count == 100
        assert set(grads) == {"default_policy"} and grads["default_policy"][1].tolist() == [100.0] * 3
    assert set(producers) <= set(two_workers.remote_workers())
    assert it.metrics.counters[STEPS_SAMPLED_COUNTER] == 400
    assert "default_policy" in it.metrics.info[LEARNER_INFO]
    assert len(it.metrics.timers[GRAD_WAIT_TIMER]._seconds) == 4


def test_async_gradients_need_remote_workers() -> None:
    with pytest.raises(ValueError, match="needs remote workers"):
        AsyncGradients(make_fake_workers(0))


def test_concat_batches_emits_exactly_the_target_from_fragments_and_times_sampling() -> None:
    it = iter_list([fake_batch(100, start=100 * i) for i in range(25)]).combine(ConcatBatches(1000))
    out = list(it)
    assert [b.count for b in out] == [1000, 1000]
    assert np.array_equal(out[1]["obs"], np.arange(1000, 2000, dtype=np.float32))  # order and rows kept
    timer = it.metrics.timers[SAMPLE_TIMER]
    assert timer.has_units_processed() and timer.mean_units_processed == 1000


def test_concat_batches_overshoots_ignores_empty_batches_and_logs_large_overshoot(
        caplog: pytest.LogCaptureFixture) -> None:
    op = ConcatBatches(100)
    op.bind(MetricsContext())
    assert op(fake_batch(0)) == []
    assert op(fake_batch(60)) == []
    with caplog.at_level(logging.INFO, logger="flowrl.ops.rollout"):
        (out,) = op(fake_batch(90))
        assert out.count == 150 and "over 2x" not in caplog.text
        (big,) = op(fake_batch(250))
        assert big.count == 250 and "over 2x" in caplog.text


def test_concat_batches_counts_agent_steps_only_for_multi_agent_batches() -> None:
    op = ConcatBatches(10, count_steps_by="agent_steps")
    op.bind(MetricsContext())
    ma = MultiAgentBatch({"a": fake_batch(4), "b": fake_batch(4)}, 4)
    assert op(ma) == []
    (out,) = op(ma)  # 16 agent steps >= 10, though only 8 env steps
    assert out.count == 8 and out.agent_steps() == 16
    with pytest.raises(ValueError, match="single-agent SampleBatch"):
        op(fake_batch(4))
    with pytest.raises(ValueError, match="count_steps_by='steps'"):
        ConcatBatches(10, count_steps_by="steps")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_batch_size=0"):
        ConcatBatches(0)


def test_stages_reject_items_that_are_not_batches() -> None:
    op = ConcatBatches(10)
    op.bind(MetricsContext())
    for stage in (op, SelectExperiences(["a"]), StandardizeFields(["obs"])):
        with pytest.raises(ValueError, match="consumes SampleBatch or MultiAgentBatch items, got list"):
            stage([1, 2])


def test_select_experiences_keeps_the_env_count_and_passes_single_agent_batches() -> None:
    ma = MultiAgentBatch({"a": fake_batch(3), "b": fake_batch(5)}, 7)
    out = SelectExperiences(["b"])(ma)
    assert list(out.policy_batches) == ["b"] and out.count == 7
    single = fake_batch(3)
    assert SelectExperiences(["b"])(single) is single
    with pytest.raises(ValueError, match="list of policy ids"):
        SelectExperiences("b")


def test_standardize_fields_in_place_per_policy_and_names_missing_fields() -> None:
    rng = np.random.default_rng(0)
    ma = MultiAgentBatch({"a": fake_batch(50, advantages=rng.normal(5, 3, 50)),
                          "b": fake_batch(20, advantages=rng.normal(-2, 9, 20))}, 50)
    columns = {pid: b for pid, b in ma.policy_batches.items()}
    assert StandardizeFields(["advantages"])(ma) is ma
    for pid, b in ma.policy_batches.items():
        assert b is columns[pid]  # mutated in place
        assert abs(b["advantages"].mean()) < 1e-6 and abs(b["advantages"].std() - 1) < 1e-6
    single = fake_batch(4, advantages=[1.0, 2.0, 3.0, 4.0])
    StandardizeFields(["advantages"])(single)
    assert abs(single["advantages"].mean()) < 1e-9
    with pytest.raises(KeyError, match="no column 'advantages'.*'obs'"):
        StandardizeFields(["advantages"])(fake_batch(3))


def test_multi_agent_bulk_sync_rollouts_count_env_and_agent_steps() -> None:
    workers = make_fake_workers(1, rollout_fragment_length=10, env=lambda ctx: None,
                                policies={"a": PolicySpec(), "b": PolicySpec()},
                                policy_mapping_fn={"agent_0": "a", "agent_1": "b"})
    try:
        it = ParallelRollouts(workers)
        batch = next(it)
        assert isinstance(batch, MultiAgentBatch) and batch.count == 10 and batch.agent_steps() == 20
        assert it.metrics.counters[STEPS_SAMPLED_COUNTER] == 10
        assert it.metrics.counters[AGENT_STEPS_SAMPLED_COUNTER] == 20
        assert batch.policy_batches["a"][SAMPLE_INDEX].tolist() == [0] * 10
        assert batch.policy_batches["a"][WEIGHTS_VERSION].tolist() == [0] * 10
    finally:
        workers.stop()
