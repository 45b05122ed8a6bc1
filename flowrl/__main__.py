"""``python -m flowrl``: the main job — PPO on CartPole-v1 with two rollout workers, until it solves it.

Trains with RLlib's tuned CartPole settings (train batch 4000, minibatch 128, 6 epochs, lr 3e-4) and
prints one line per ``train()`` until the smoothed return reaches ``--stop-reward`` (default 450) or
``--max-steps`` env steps have been sampled.
"""

from __future__ import annotations

import argparse

from flowrl import runtime
from flowrl.algorithms.ppo import PPOConfig
from flowrl.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m flowrl", description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--stop-reward", type=float, default=450.0)
    parser.add_argument("--max-steps", type=int, default=300_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    runtime.init(num_cpus=max(2, args.num_workers + 1))
    config = PPOConfig(env="CartPole-v1", num_workers=args.num_workers, num_envs_per_worker=4,
                       rollout_fragment_length=500, train_batch_size=4000, sgd_minibatch_size=128,
                       num_sgd_iter=6, lr=3e-4, seed=args.seed)
    trainer = Trainer("ppo", config)
    print(f"plan: {trainer.plan!r}")
    try:
        while True:
            result = trainer.train()
            print(f"iter {result['training_iteration']:3d}  steps {result['timesteps_total']:7d}  "
                  f"return {result['episode_reward_mean']:6.1f}  "
                  f"{result['timesteps_this_iter'] / result['time_this_iter_s']:7.0f} env steps/s")
            if result["episode_reward_mean"] >= args.stop_reward or result["timesteps_total"] >= args.max_steps:
                break
    finally:
        trainer.stop()
    print(f"done: return {result['episode_reward_mean']:.1f} after {result['timesteps_total']} env steps "
          f"and {result['time_total_s']:.1f} s of training")


if __name__ == "__main__":
    main()
