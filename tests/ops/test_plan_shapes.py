"""Whole plan shapes wired from the operators, against fake workers.

The IMPALA shape: async rollouts -> per-fragment weight sync -> ConcatBatches -> Enqueue into a learner
thread, and Dequeue of its output, in one async Concurrently.
"""

from __future__ import annotations

from typing import Any

import pytest
from flowrl import executor

from flowrl.config import PolicySpec
from flowrl.metrics import (DQN_AGENT_STEPS_TRAINED_COUNTER, NUM_LEARNER_UPDATES, PPO_AGENT_STEPS_TRAINED_COUNTER,
                            STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER)
from flowrl.ops.concurrency import Concurrently, Dequeue, Enqueue, LearnerThread
from flowrl.ops.metrics import CountSteps
from flowrl.ops.replay import MixInReplay, Replay, StoreToReplayBuffer
from flowrl.ops.rollout import ConcatBatches, ParallelRollouts, SelectExperiences
from flowrl.ops.train import BroadcastUpdateLearnerWeights, RecordLearnerOutput, TrainOneStep, UpdateTargetNetwork
from flowrl.replay_buffers import LocalReplayBuffer
from flowrl.sample_batch import AnyBatch, MultiAgentBatch
from flowrl.testing import WEIGHTS_VERSION, FakeConfig, FakeWorker, make_fake_workers
from flowrl.workers import WorkerSet

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

FRAGMENT, TRAIN_BATCH, QUEUE_SIZE, IN_FLIGHT = 10, 20, 2, 2


def impala_shape(workers: WorkerSet, learner: LearnerThread, delivered: dict[Any, list[int]],
                 replay_proportion: float = 0.0) -> Any:
    """IMPALA's plan; ``delivered`` records each worker's fragment versions."""

    def note_fragment(item: tuple[Any, AnyBatch]) -> tuple[Any, AnyBatch]:
        actor, batch = item
        delivered.setdefault(actor, []).append(int(batch[WEIGHTS_VERSION][0]))
        return item

    frags = (ParallelRollouts(workers, mode="async", num_async=IN_FLIGHT)
             .zip_with_source_actor()
             .for_each(note_fragment)
             .for_each(BroadcastUpdateLearnerWeights(learner, workers, broadcast_interval=1)))
    train_batches = frags.combine(MixInReplay(4 if replay_proportion else 0, replay_proportion, seed=0))
    enqueue_op = train_batches.combine(ConcatBatches(TRAIN_BATCH)).for_each(Enqueue(learner.inqueue))
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
            records = executor.get([w.get_record.remote() for w in workers.remote_workers()])
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


def test_replayed_batches_are_trained_but_never_counted_as_sampled() -> None:
    workers = make_fake_workers(1, rollout_fragment_length=FRAGMENT)
    learner = LearnerThread(workers.local_worker(), learner_queue_size=QUEUE_SIZE)
    learner.start()
    delivered: dict[Any, list[int]] = {}
    try:
        plan = impala_shape(workers, learner, delivered, replay_proportion=1.0)
        plan.take(10)
        fresh = sum(len(v) for v in delivered.values()) * FRAGMENT
        assert plan.metrics.counters[STEPS_SAMPLED_COUNTER] == fresh
        assert plan.metrics.counters[STEPS_TRAINED_COUNTER] == 10 * TRAIN_BATCH  # half of it replayed
        assert fresh < 10 * TRAIN_BATCH
    finally:
        learner.stop()
        learner.join(timeout=10)
        workers.stop()


def test_two_policies_share_one_rollout_stream_and_broadcast_only_their_own_weights() -> None:
    """The two-policy composition: duplicate() into a PPO sub-flow and a DQN sub-flow."""
    workers = make_fake_workers(1, rollout_fragment_length=50, env=lambda ctx: None,
                                policies={"ppo_policy": PolicySpec(), "dqn_policy": PolicySpec()},
                                policy_mapping_fn={"agent_0": "ppo_policy", "agent_1": "dqn_policy"})
    buf = LocalReplayBuffer(num_shards=1, learning_starts=100, capacity=1000, replay_batch_size=16)
    try:
        r1, r2 = ParallelRollouts(workers, mode="bulk_sync").duplicate(n=2)
        dqn_store = r1.for_each(SelectExperiences(["dqn_policy"])).for_each(StoreToReplayBuffer(local_buffer=buf))
        dqn_replay = (Replay(local_buffer=buf)
                      .for_each(CountSteps(DQN_AGENT_STEPS_TRAINED_COUNTER))
                      .for_each(TrainOneStep(workers, policies=["dqn_policy"]))
                      .for_each(UpdateTargetNetwork(workers, 100, policies=["dqn_policy"])))
        dqn_train = Concurrently([dqn_store, dqn_replay], mode="round_robin", output_indexes=[1])
        ppo_train = (r2.for_each(SelectExperiences(["ppo_policy"]))
                     .combine(ConcatBatches(100))
                     .for_each(CountSteps(PPO_AGENT_STEPS_TRAINED_COUNTER))
                     .for_each(TrainOneStep(workers, policies=["ppo_policy"], num_sgd_iter=2,
                                            sgd_minibatch_size=32)))
        plan = Concurrently([ppo_train, dqn_train], mode="async", output_indexes=[1])
        outputs = plan.take(12)
        counters = plan.metrics.counters
        assert counters[PPO_AGENT_STEPS_TRAINED_COUNTER] >= 200
        assert counters[DQN_AGENT_STEPS_TRAINED_COUNTER] >= 100
        for batch, info in outputs:  # only the DQN branch's (batch, learner_info) items come out
            assert isinstance(batch, MultiAgentBatch) and list(batch.policy_batches) == ["dqn_policy"]
            assert list(info) == ["dqn_policy"]
        local = workers.local_worker()
        assert local.versions["ppo_policy"] >= 4 and local.versions["dqn_policy"] == 12
        assert local.get_policy("dqn_policy").target_updates >= 1
        assert local.get_policy("ppo_policy").target_updates == 0
        record = executor.get(workers.remote_workers()[0].get_record.remote())
        sent = [set(versions) for versions, _ in record["set_weights_calls"][2:]]  # after the two full syncs
        assert {"ppo_policy"} in sent and {"dqn_policy"} in sent and all(len(s) == 1 for s in sent)
    finally:
        workers.stop()
