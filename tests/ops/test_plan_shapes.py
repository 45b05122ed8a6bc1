"""Whole plan shapes wired from the operators, against fake workers (SEMANTICS.md §6 items 32 and 44).

The IMPALA shape: async rollouts -> per-fragment weight sync -> ConcatBatches -> Enqueue into a learner
thread, and Dequeue of its output, in one async Concurrently.
"""

from __future__ import annotations

from typing import Any

import pytest
import ray

from flowrl.metrics import NUM_LEARNER_UPDATES, STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER
from flowrl.ops.concurrency import Concurrently, Dequeue, Enqueue, LearnerThread
from flowrl.ops.rollout import ConcatBatches, ParallelRollouts
from flowrl.ops.train import BroadcastUpdateLearnerWeights, RecordLearnerOutput
from flowrl.sample_batch import AnyBatch
from flowrl.testing import WEIGHTS_VERSION, FakeConfig, FakeWorker, make_fake_workers
from flowrl.workers import WorkerSet

FRAGMENT, TRAIN_BATCH, QUEUE_SIZE, IN_FLIGHT = 10, 20, 2, 2


def impala_shape(workers: WorkerSet, learner: LearnerThread, delivered: dict[Any, list[int]]) -> Any:
    """The plan of SEMANTICS.md §4.7 without replay; ``delivered`` records each worker's fragment versions."""

    def note_fragment(item: tuple[Any, AnyBatch]) -> tuple[Any, AnyBatch]:
        actor, batch = item
        delivered.setdefault(actor, []).append(int(batch[WEIGHTS_VERSION][0]))
        return item

    frags = (ParallelRollouts(workers, mode="async", num_async=IN_FLIGHT)
             .zip_with_source_actor()
             .for_each(note_fragment)
             .for_each(BroadcastUpdateLearnerWeights(learner, workers, broadcast_interval=1)))
    enqueue_op = frags.combine(ConcatBatches(TRAIN_BATCH)).for_each(Enqueue(learner.inqueue))
    dequeue_op = Dequeue(learner.outqueue, check=learner.is_alive).for_each(RecordLearnerOutput())
    return Concurrently([enqueue_op, dequeue_op], mode="async", output_indexes=[1])


def test_impala_shape_is_throttled_by_a_slow_learner_and_keeps_workers_current() -> None:
    workers = make_fake_workers(2, rollout_fragment_length=FRAGMENT, learn_delay_s=0.03)
    learner = LearnerThread(workers.local_worker(), learner_queue_size=QUEUE_SIZE)
    learner.start()
    delivered: dict[Any, list[int]] = {}
    try:
        plan = impala_shape(workers, learner, delivered)
        counters = plan.metrics.counters
        for _ in range(15):
            next(plan)
            assert learner.inqueue.qsize() <= QUEUE_SIZE
            # sampling waits for the learner: what was sampled but not trained is bounded by the queue,
            # the batch being learned, the one Enqueue retries, learned-but-undequeued output and one
            # partial concatenation -- never the thousands an unthrottled fake would sample
            assert counters[STEPS_SAMPLED_COUNTER] - counters[STEPS_TRAINED_COUNTER] <= \
                (QUEUE_SIZE + 4) * TRAIN_BATCH + TRAIN_BATCH
            records = ray.get([w.get_record.remote() for w in workers.remote_workers()])
            for actor, record in zip(workers.remote_workers(), records):
                # requests in flight or done but not yet consumed, per worker
                assert record["sample_calls"] - len(delivered.get(actor, [])) <= IN_FLIGHT
        assert counters[NUM_LEARNER_UPDATES] == 15
        assert counters[STEPS_TRAINED_COUNTER] == 15 * TRAIN_BATCH  # only from the learner's out-queue
        assert workers.local_worker().learn_calls[:15] == [TRAIN_BATCH] * 15
        for actor in workers.remote_workers():
            versions = delivered[actor]
            assert versions == sorted(versions) and versions[-1] >= 3  # each worker follows the learner
    finally:
        learner.stop()
        learner.join(timeout=10)
        workers.stop()


class _DyingWorker(FakeWorker):
    def learn_on_batch(self, batch: AnyBatch) -> dict[str, dict[str, Any]]:
        if len(self.learn_calls) == 2:
            raise ArithmeticError("the learner diverged")
        return super().learn_on_batch(batch)


def test_a_dead_learner_surfaces_from_the_plan_as_an_error_not_a_hang() -> None:
    workers = make_fake_workers(1, rollout_fragment_length=FRAGMENT)
    learner = LearnerThread(_DyingWorker(config=FakeConfig(rollout_fragment_length=FRAGMENT)),
                            learner_queue_size=QUEUE_SIZE)
    learner.start()
    try:
        plan = impala_shape(workers, learner, {})
        assert len(plan.take(2)) == 2
        with pytest.raises(RuntimeError, match="Dequeue check") as raised:
            next(plan)
        assert isinstance(raised.value.__cause__, ArithmeticError)
    finally:
        learner.stop()
        learner.join(timeout=10)
        workers.stop()
