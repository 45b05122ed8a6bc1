"""flowrl.contracts: the real classes and the fakes keep the contracts (mypy checks them statically; this is the
runtime side), operators refuse an object that lacks a contract's method at construction, and neither the contracts
nor flowrl.testing import torch. Also: flowrl.ops exports exactly its family modules' names."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import flowrl.ops
from flowrl.contracts import PolicyLike, PriorityUpdater, ReplayReader, ReplayWriter, WorkerLike, check_conforms
from flowrl.ops import Replay, StoreToReplayBuffer, UpdatePriorities
from flowrl.replay_buffers import LocalReplayBuffer, SimpleReplayBuffer
from flowrl.testing import FakeConfig, FakeWorker


def test_the_fakes_and_buffers_have_the_contracts_methods() -> None:
    worker = FakeWorker(config=FakeConfig(rollout_fragment_length=2))
    assert isinstance(worker, WorkerLike) and isinstance(worker.get_policy(), PolicyLike)
    local = LocalReplayBuffer(learning_starts=0)
    assert all(isinstance(local, p) for p in (ReplayWriter, ReplayReader, PriorityUpdater))
    simple = SimpleReplayBuffer(2)
    assert isinstance(simple, ReplayWriter) and isinstance(simple, ReplayReader)
    assert not isinstance(simple, PriorityUpdater)  # uniform: nothing to update


class Writer:
    def add_batch(self, batch: Any) -> None:
        pass


class NotCallable:
    replay = None  # an attribute of that name is not the method


@pytest.mark.parametrize("make, method", [
    (lambda: StoreToReplayBuffer(local_buffer=object()), "add_batch"),
    (lambda: Replay(local_buffer=Writer()), "replay"),
    (lambda: Replay(local_buffer=NotCallable()), "replay"),
    (lambda: UpdatePriorities(SimpleReplayBuffer(2)), "update_priorities"),
])
def test_replay_operators_refuse_a_buffer_without_the_method_at_construction(make: Any, method: str) -> None:
    with pytest.raises(ValueError, match=rf"local_buffer=.* has no {method}\(\) method; pass a replay buffer"):
        make()


def test_check_conforms_names_the_protocol_without_a_fix() -> None:
    check_conforms(Writer(), ReplayWriter, "x")
    with pytest.raises(ValueError, match=r"x=.* has no replay\(\) method; .* flowrl\.contracts\.ReplayReader$"):
        check_conforms(Writer(), ReplayReader, "x")


@pytest.mark.parametrize("module", ["flowrl.contracts", "flowrl.testing"])
def test_importing_stays_free_of_torch(module: str) -> None:
    code = f"import sys, {module}; assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_flowrl_ops_exports_its_family_modules_names() -> None:
    from flowrl.ops import (aggregation, concurrency, decentralized, evolution, meta, metrics, offline, replay, rollout,
                            train)

    families = [rollout, train, replay, concurrency, metrics, aggregation, evolution, meta, decentralized, offline]
    assert flowrl.ops.__all__ == [name for family in families for name in family.__all__]
    assert len(set(flowrl.ops.__all__)) == len(flowrl.ops.__all__)
    for family in families:
        for name in family.__all__:
            assert getattr(flowrl.ops, name) is getattr(family, name)
    # the names it exported when the list was written by hand, plus aggregation's aggregator_groups, the
    # sequence layout of R2D2's replay (PadSequences), and the evolution strategies', MAML's, DD-PPO's and offline
    # input's families
    assert sorted(flowrl.ops.__all__) == sorted([
        "ParallelRollouts", "AsyncGradients", "ConcatBatches", "SelectExperiences", "StandardizeFields", "PadSequences",
        "TrainOneStep", "train_one_step", "LearnOnBatch", "BroadcastWeights", "UpdateKL", "MultiGPUTrainOneStep",
        "ComputeGradients", "ApplyGradients", "AverageGradients", "UpdateTargetNetwork", "UpdateWorkerWeights",
        "BroadcastUpdateLearnerWeights", "RecordLearnerOutput", "UpdateTargetAndKL",
        "StoreToReplayBuffer", "Replay", "UpdatePriorities", "UpdateReplayShardPriorities", "MixInReplay",
        "WaitUntilTimestepsElapsed",
        "Concurrently", "Enqueue", "Dequeue", "MinibatchBuffer", "LearnerThread", "MultiGPULearnerThread",
        "ApexLearnerThread",
        "StandardMetricsReporting", "CollectMetrics", "ReportGate", "OncePerTimestepsElapsed", "OncePerTimeInterval",
        "CountSteps", "WarnAboutBadRewardScales", "AddReplayShardStats",
        "Aggregator", "make_aggregators", "aggregator_groups", "CountFreshSteps",
        "ParallelEvaluations", "CollectEvaluations", "ApplyEvolutionUpdate", "centered_ranks", "Estimator",
        "SetTasks", "InnerAdaptation", "MetaUpdate", "TASK_INDEX", "ADAPTATION_ROUND", "mean_episode_return",
        "check_task_env", "standardized_advantages",
        "form_process_group", "AllReduceTrainOneStep", "GroupStep", "RecordGroupTraining",
        "ReadInput", "INPUT_COLUMNS", "RecentEpisodes", "EstimateOffPolicy"])
