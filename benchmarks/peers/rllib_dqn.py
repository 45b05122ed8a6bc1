"""RLlib DQN (new API stack) on CartPole-v1 with flowrl's ``DQNConfig`` defaults; prints one JSON line.

Run with the peers' virtualenv (``bash benchmarks/peers/setup.sh`` creates it, with the Ray version flowrl runs on):
``benchmarks/peers/.venv/bin/python benchmarks/peers/rllib_dqn.py [--quick] [--seed 0] [--max-steps 100000]``.

flowrl's ``DQNConfig`` defaults are RLlib's, so most settings map one to one:

========================================  =====================================================================
flowrl                                    RLlib (new API stack)
========================================  =====================================================================
num_workers 0, 1 env, fragment 4          ``num_env_runners=0`` (the local env runner samples),
                                          ``num_envs_per_env_runner=1``, ``rollout_fragment_length=4``
train_batch_size 32, one replay per       ``train_batch_size_per_learner=32``, ``training_intensity=None``
fragment                                  (RLlib's native ratio: 32 trained per 4 sampled)
lr 5e-4, Adam eps 1e-8, grad_clip 40      ``lr=5e-4``, ``adam_epsilon=1e-8``, ``grad_clip=40``
gamma 0.99, n_step 1, Huber, double_q,    ``gamma=0.99``, ``n_step=1``, ``td_error_loss_fn="huber"``,
dueling                                   ``double_q=True``, ``dueling=True``
target_network_update_freq 500            ``target_network_update_freq=500``, ``tau=1.0``
buffer 50000, prioritized (0.6, 0.4)      ``PrioritizedEpisodeReplayBuffer``, capacity 50000, alpha 0.6, beta 0.4
                                          (an episode buffer: flowrl's holds transitions)
learning_starts 1000                      ``num_steps_sampled_before_learning_starts=1000``
epsilon 1.0 -> 0.02 over 10000 steps      ``epsilon=[(0, 1.0), (10000, 0.02)]``
torso 64-64 tanh, heads [256] relu        ``DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh",
                                          head_fcnet_hiddens=[256], head_fcnet_activation="relu")``
reports: >= 1000 steps and >= 1 s         ``min_sample_timesteps_per_iteration=1000``,
                                          ``min_time_s_per_iteration=1``
========================================  =====================================================================

Start-up (``ray.init``, building the algorithm) is timed apart; training time runs from the first ``train()``.
"""

from __future__ import annotations

import time

from _common import Progress, emit, loopback_ray, parse_args, train_rllib


def main() -> None:
    args = parse_args(__doc__, max_steps=100_000, quick_steps=4_000)
    loopback_ray()
    start = time.perf_counter()
    import gymnasium
    import ray
    import torch
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    torch.set_num_threads(args.torch_threads)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    hyper = dict(lr=5e-4, train_batch_size_per_learner=32, adam_epsilon=1e-8, grad_clip=40.0, gamma=0.99, n_step=1,
                 td_error_loss_fn="huber", double_q=True, dueling=True, target_network_update_freq=500, tau=1.0,
                 replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 50_000, "alpha": 0.6,
                                       "beta": 0.4},
                 num_steps_sampled_before_learning_starts=1000, epsilon=[(0, 1.0), (10_000, 0.02)],
                 training_intensity=None)
    config = (DQNConfig()
              .environment("CartPole-v1")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=1, rollout_fragment_length=4)
              .learners(num_learners=0)
              .training(**hyper)
              .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh",
                                                         head_fcnet_hiddens=[256], head_fcnet_activation="relu"))
              .reporting(metrics_num_episodes_for_smoothing=100, min_sample_timesteps_per_iteration=1000,
                         min_time_s_per_iteration=1)
              .debugging(seed=args.seed))
    algo = config.build_algo()
    startup_s = time.perf_counter() - start
    progress = Progress(stop_return=args.stop_return, max_steps=args.max_steps)
    train_s = train_rllib(algo, progress)
    emit(benchmark="rllib_dqn", peer="rllib", version=ray.__version__,
         config={"num_env_runners": 0, "num_envs_per_env_runner": 1, "rollout_fragment_length": 4, "num_learners": 0,
                 **hyper, "model": "fcnet [64, 64] tanh, heads [256] relu", "api_stack": "new",
                 "torch_threads": args.torch_threads, "seed": args.seed, "max_steps": args.max_steps},
         progress=progress, steps=progress.steps, train_s=train_s, startup_s=startup_s, out=args.out,
         versions={"ray": ray.__version__, "torch": torch.__version__, "gymnasium": gymnasium.__version__})


if __name__ == "__main__":
    main()
