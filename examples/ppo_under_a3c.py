"""PPO run with the A3C plan: an algorithm's policy, untouched, under another algorithm's dataflow.

The A3C plan (``AsyncGradients -> ApplyGradients(update_all=False) -> StandardMetricsReporting``) asks its
policy only for ``compute_gradients`` and ``apply_gradients``, which every flowrl policy has. So PPO's policy
(clipped surrogate, value loss, KL penalty) trains asynchronously: each remote worker computes PPO gradients
on its own fragment, the driver applies them as they arrive and sends fresh weights back to that worker alone::

    AsyncGradients(workers) -> ApplyGradients(workers, update_all=False) -> StandardMetricsReporting

Nothing new is written: the example pairs ``flowrl.algorithms.a3c.plan`` with ``PPOConfig`` and ``PPOPolicy``
in an :class:`~flowrl.algorithms.Algorithm`, which the Trainer runs like any registered one.

Run: ``python examples/ppo_under_a3c.py [--num-workers 2] [--stop-reward 100] [--max-steps 100000]``.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from flowrl.algorithms import Algorithm
from flowrl.algorithms.a3c import plan as a3c_plan
from flowrl.algorithms.ppo import PPOConfig, PPOPolicy
from flowrl.trainer import Trainer

PPO_UNDER_A3C = Algorithm("ppo_under_a3c", PPOConfig, PPOPolicy, a3c_plan)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--stop-reward", type=float, default=100.0)
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.num_workers < 1:
        parser.error(f"--num-workers={args.num_workers}: the A3C plan gathers gradients from remote workers; use >= 1")
    # one gradient step per 200-step fragment, so a larger learning rate than PPO's 5e-5 for 4000-step batches
    config = PPOConfig(env="CartPole-v1", num_workers=args.num_workers, num_cpus_per_worker=0.5, lr=1e-3,
                       seed=args.seed, timesteps_per_iteration=5000)
    trainer = Trainer(PPO_UNDER_A3C, config)
    print(f"plan: {trainer.plan!r}")
    try:
        while True:
            result = trainer.train()
            stats = result["info"]["learner"]["default_policy"]["learner_stats"]
            reward = result.get("episode_reward_mean", math.nan)  # absent until an episode has finished
            print(f"steps {result['timesteps_total']:7d}  return {reward:6.1f}  "
                  f"entropy {stats['entropy']:.3f}")
            if reward >= args.stop_reward or result["timesteps_total"] >= args.max_steps:
                return result
    finally:
        trainer.stop()


if __name__ == "__main__":
    main()
