"""A2C with DQN-style replay mixed in: a plan composed by a user from flowrl's public operators only.

Each fresh fragment is stored in a replay buffer on its way to A2C's usual train step; a second sub-flow
replays stored rows into the same learner. ``Concurrently(round_robin)`` interleaves each fresh train batch
with ``replay_ratio`` replayed ones, so the learner sees every sample ``1 + replay_ratio`` times on average::

    fresh  = ParallelRollouts(bulk_sync) -> StoreToReplayBuffer -> ConcatBatches -> TrainOneStep
    replay = Replay -> TrainOneStep
    Concurrently([fresh, replay], round_robin, weights [1, replay_ratio]) -> StandardMetricsReporting

The A2C policy is used as it is: replayed rows carry the advantages computed when they were sampled, so
replay adds slightly off-policy gradient steps (no importance correction); that is the experiment.

Run: ``python examples/a2c_with_replay.py [--replay-ratio 1] [--stop-reward 150] [--max-steps 100000]``.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from flowrl.algorithms import Algorithm
from flowrl.algorithms.a2c import A2CConfig, ActorCriticPolicy
from flowrl.iter import LocalIterator
from flowrl.ops import (ConcatBatches, Concurrently, ParallelRollouts, Replay, StandardMetricsReporting,
                        StoreToReplayBuffer, TrainOneStep)
from flowrl.replay_buffers import LocalReplayBuffer
from flowrl.trainer import Trainer
from flowrl.workers import WorkerSet


def make_replay_buffer(config: A2CConfig) -> dict[str, Any]:
    """Trainer-owned state: a uniform buffer of the last 10 train batches, replaying train-batch-sized draws."""
    return {"replay_buffer": LocalReplayBuffer(learning_starts=config.train_batch_size,
                                               capacity=10 * config.train_batch_size,
                                               replay_batch_size=config.train_batch_size, seed=config.seed)}


def a2c_with_replay_plan(workers: WorkerSet, config: A2CConfig, *, replay_buffer: LocalReplayBuffer,
                         replay_ratio: float = 1.0) -> LocalIterator[dict[str, Any]]:
    """A2C's fresh train step, with every fragment also stored and replayed ``replay_ratio`` times as often."""
    fresh_op = (ParallelRollouts(workers, mode="bulk_sync")
                .for_each(StoreToReplayBuffer(local_buffer=replay_buffer))
                .combine(ConcatBatches(config.train_batch_size))
                .for_each(TrainOneStep(workers)))
    replay_op = Replay(local_buffer=replay_buffer).for_each(TrainOneStep(workers))
    train_op = Concurrently([fresh_op, replay_op], mode="round_robin", output_indexes=[0],
                            round_robin_weights=[1, replay_ratio])
    return StandardMetricsReporting(train_op, workers, config)


def algorithm(replay_ratio: float = 1.0) -> Algorithm:
    """The composed plan as an algorithm the Trainer runs (checkpoints, failure recovery, metrics)."""
    return Algorithm("a2c_with_replay", A2CConfig, ActorCriticPolicy,
                     lambda workers, config, **state: a2c_with_replay_plan(workers, config, replay_ratio=replay_ratio,
                                                                           **state),
                     make_owned_state=make_replay_buffer)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replay-ratio", type=float, default=1.0)
    parser.add_argument("--stop-reward", type=float, default=150.0)
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = A2CConfig(env="CartPole-v1", num_workers=0, lr=1e-3, seed=args.seed, min_iter_time_s=0,
                       timesteps_per_iteration=2000)
    trainer = Trainer(algorithm(args.replay_ratio), config)
    print(f"plan: {trainer.plan!r}")
    try:
        while True:
            result = trainer.train()
            reward = result.get("episode_reward_mean", math.nan)  # absent until an episode has finished
            print(f"steps {result['timesteps_total']:7d}  return {reward:6.1f}  "
                  f"trained {result['info']['num_steps_trained']:7d}")
            if reward >= args.stop_reward or result["timesteps_total"] >= args.max_steps:
                return result
    finally:
        trainer.stop()


if __name__ == "__main__":
    main()
