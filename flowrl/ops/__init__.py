"""The paper's operators: rollout, train, replay, concurrency and metrics, plus IMPALA's
tree aggregation.

A plan imports what it wires from here: ``from flowrl.ops import ParallelRollouts, ConcatBatches, ...``.
Each name also lives in its family module (``flowrl.ops.rollout``, ``.train``, ``.replay``,
``.concurrency``, ``.metrics``, ``.aggregation``).
"""

from __future__ import annotations

from flowrl.ops.aggregation import Aggregator, CountFreshSteps, make_aggregators
from flowrl.ops.concurrency import (ApexLearnerThread, Concurrently, Dequeue, Enqueue, LearnerThread, MinibatchBuffer,
                                    MultiGPULearnerThread)
from flowrl.ops.metrics import (AddReplayShardStats, CollectMetrics, CountSteps, OncePerTimeInterval,
                                OncePerTimestepsElapsed, ReportGate, StandardMetricsReporting, WarnAboutBadRewardScales)
from flowrl.ops.replay import (MixInReplay, Replay, StoreToReplayBuffer, UpdatePriorities, UpdateReplayShardPriorities,
                               WaitUntilTimestepsElapsed)
from flowrl.ops.rollout import AsyncGradients, ConcatBatches, ParallelRollouts, SelectExperiences, StandardizeFields
from flowrl.ops.train import (ApplyGradients, AverageGradients, BroadcastUpdateLearnerWeights, BroadcastWeights,
                              ComputeGradients, LearnOnBatch, MultiGPUTrainOneStep, RecordLearnerOutput, TrainOneStep,
                              UpdateKL, UpdateTargetAndKL, UpdateTargetNetwork, UpdateWorkerWeights, train_one_step)

__all__ = [
    # rollout
    "ParallelRollouts", "AsyncGradients", "ConcatBatches", "SelectExperiences", "StandardizeFields",
    # train
    "TrainOneStep", "train_one_step", "LearnOnBatch", "BroadcastWeights", "UpdateKL", "MultiGPUTrainOneStep", "ComputeGradients",
    "ApplyGradients", "AverageGradients", "UpdateTargetNetwork", "UpdateWorkerWeights",
    "BroadcastUpdateLearnerWeights", "RecordLearnerOutput", "UpdateTargetAndKL",
    # replay
    "StoreToReplayBuffer", "Replay", "UpdatePriorities", "UpdateReplayShardPriorities", "MixInReplay",
    "WaitUntilTimestepsElapsed",
    # concurrency
    "Concurrently", "Enqueue", "Dequeue", "MinibatchBuffer", "LearnerThread", "MultiGPULearnerThread",
    "ApexLearnerThread",
    # metrics
    "StandardMetricsReporting", "CollectMetrics", "ReportGate", "OncePerTimestepsElapsed", "OncePerTimeInterval",
    "CountSteps", "WarnAboutBadRewardScales", "AddReplayShardStats",
    # tree aggregation
    "Aggregator", "make_aggregators", "CountFreshSteps",
]
