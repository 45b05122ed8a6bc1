"""RLlib PPO (new API stack) with ``use_lstm`` on CartPole without velocities, with the settings of flowrl's PPO+LSTM
benchmark; prints one JSON line.

Run with the peers' virtualenv (``bash benchmarks/peers/setup.sh`` creates it, with the Ray version flowrl runs on):
``benchmarks/peers/.venv/bin/python benchmarks/peers/rllib_ppo_lstm.py [--quick] [--seed 0] [--max-steps N]``.

Mapping from flowrl (the PPO preset for ``flowrl/StatelessCartPole-v1``, as ``benchmarks/ppo_lstm.py`` runs it) to
RLlib's ``PPOConfig``:

========================================  =====================================================================
flowrl                                    RLlib (new API stack: RLModule, Learner, EnvRunner)
========================================  =====================================================================
driver samples 8 envs x 250 steps         ``num_env_runners=0`` (the local env runner samples),
                                          ``num_envs_per_env_runner=8``, ``rollout_fragment_length=250``
learner in the driver, 1 torch thread     ``num_learners=0`` (local learner), ``torch.set_num_threads(1)``
train batch 2000, minibatch 250, 10       ``train_batch_size_per_learner=2000``, ``minibatch_size=250``,
epochs                                    ``num_epochs=10``
MLP 64 -> LSTM 64 shared by pi and vf,    ``DefaultModelConfig(fcnet_hiddens=[64], use_lstm=True,
sequences of at most 20 steps             lstm_cell_size=64, max_seq_len=20, vf_share_layers=True)``
lr 1e-3, clip 0.2, gamma 0.99, lambda     ``lr=1e-3``, ``clip_param=0.2``, ``gamma=0.99``, ``lambda_=0.95``,
0.95, vf_loss_coeff 0.01, entropy 0, no   ``vf_loss_coeff=0.01``, ``entropy_coeff=0``, ``use_kl_loss=False``,
KL penalty, value clip 10                 ``vf_clip_param=10`` (RLlib clamps the squared error instead)
smoothed return over 100 episodes         ``metrics_num_episodes_for_smoothing=100``; ``episode_return_mean``
========================================  =====================================================================

Start-up (``ray.init``, building the algorithm) is timed apart; training time runs from the first ``train()`` call.
"""

from __future__ import annotations

import time

from _common import Progress, emit, loopback_ray, parse_args, train_rllib
from memory_env import make_env

THRESHOLDS = (150.0,)


def main() -> None:
    args = parse_args(__doc__, max_steps=300_000, quick_steps=6_000, stop_return=THRESHOLDS[-1])
    loopback_ray()
    start = time.perf_counter()
    import gymnasium
    import ray
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.tune.registry import register_env

    torch.set_num_threads(args.torch_threads)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    register_env("StatelessCartPole", make_env)
    hyper = dict(lr=1e-3, train_batch_size_per_learner=2000, minibatch_size=250, num_epochs=10, gamma=0.99,
                 lambda_=0.95, clip_param=0.2, vf_clip_param=10.0, vf_loss_coeff=0.01, entropy_coeff=0.0,
                 use_kl_loss=False)
    model = dict(fcnet_hiddens=[64], use_lstm=True, lstm_cell_size=64, max_seq_len=20, vf_share_layers=True)
    config = (PPOConfig()
              .environment("StatelessCartPole")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=8, rollout_fragment_length=250)
              .learners(num_learners=0)
              .training(**hyper)
              .rl_module(model_config=DefaultModelConfig(**model))
              .reporting(metrics_num_episodes_for_smoothing=100)
              .debugging(seed=args.seed))
    algo = config.build_algo()
    startup_s = time.perf_counter() - start
    progress = Progress(stop_return=args.stop_return, max_steps=args.max_steps, thresholds=THRESHOLDS)
    train_s = train_rllib(algo, progress)
    emit(benchmark="rllib_ppo_lstm", peer="rllib", version=ray.__version__,
         config={"env": "StatelessCartPole (500-step limit)", "num_env_runners": 0, "num_envs_per_env_runner": 8,
                 "rollout_fragment_length": 250, "num_learners": 0, **hyper, "model": model, "api_stack": "new",
                 "torch_threads": args.torch_threads, "seed": args.seed, "max_steps": args.max_steps},
         progress=progress, steps=progress.steps, train_s=train_s, startup_s=startup_s, out=args.out,
         versions={"ray": ray.__version__, "torch": torch.__version__, "gymnasium": gymnasium.__version__})


if __name__ == "__main__":
    main()
