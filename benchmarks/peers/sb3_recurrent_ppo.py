"""Stable-Baselines3-contrib RecurrentPPO on CartPole without velocities with the settings of flowrl's PPO+LSTM
benchmark; prints one JSON line.

Run with the peers' virtualenv (``bash benchmarks/peers/setup.sh`` creates it):
``benchmarks/peers/.venv/bin/python benchmarks/peers/sb3_recurrent_ppo.py [--quick] [--seed 0] [--max-steps N]``.

Mapping from flowrl (the PPO preset for ``flowrl/StatelessCartPole-v1``, as ``benchmarks/ppo_lstm.py`` runs it) to
``sb3_contrib.RecurrentPPO``:

========================================  =====================================================================
flowrl                                    SB3-contrib
========================================  =====================================================================
driver samples 8 envs x 250 steps         ``make_vec_env(n_envs=8)`` (DummyVecEnv), ``n_steps=250``
train batch 2000, minibatch 250, 10       ``batch_size=250``, ``n_epochs=10`` (its minibatches also keep
epochs                                    sequences whole; a sequence is an episode's piece in the rollout,
                                          not cut at 20 steps)
MLP 64 -> LSTM 64 shared by pi and vf     ``lstm_hidden_size=64``, ``shared_lstm=True``,
                                          ``enable_critic_lstm=False``, ``net_arch=[64]`` after the LSTM (SB3's
                                          order: features -> LSTM -> MLP)
lr 1e-3, clip 0.2, gamma 0.99, lambda     ``learning_rate=1e-3``, ``clip_range=0.2``, ``gamma=0.99``,
0.95, vf_loss_coeff 0.01, entropy 0, no   ``gae_lambda=0.95``, ``vf_coef=0.01``, ``ent_coef=0``; SB3 has no KL
KL penalty, value clip 10                 penalty; ``clip_range_vf=None`` (no value clipping)
advantages standardized per batch         per minibatch (``normalize_advantage=True``)
smoothed return over 100 episodes         ``stats_window_size=100``; checked every 2000 env steps
========================================  =====================================================================

Start-up (imports, envs, model) is timed apart.
"""

from __future__ import annotations

import time

from _common import Progress, emit, parse_args, sb3_reporter
from memory_env import make_env

THRESHOLDS = (150.0,)
REPORT_EVERY = 2000  # env steps: one rollout of 8 x 250


def main() -> None:
    args = parse_args(__doc__, max_steps=300_000, quick_steps=20_000, stop_return=THRESHOLDS[-1])
    start = time.perf_counter()
    import gymnasium
    import sb3_contrib
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(args.torch_threads)
    hyper = dict(n_steps=250, batch_size=250, n_epochs=10, learning_rate=1e-3, clip_range=0.2, gamma=0.99,
                 gae_lambda=0.95, vf_coef=0.01, ent_coef=0.0, stats_window_size=100)
    policy_kwargs = dict(lstm_hidden_size=64, n_lstm_layers=1, shared_lstm=True, enable_critic_lstm=False,
                         net_arch=[64])
    model = RecurrentPPO("MlpLstmPolicy", make_vec_env(make_env, n_envs=8, seed=args.seed), seed=args.seed,
                         device="cpu", policy_kwargs=policy_kwargs, **hyper)
    startup_s = time.perf_counter() - start
    progress = Progress(stop_return=args.stop_return, max_steps=args.max_steps, thresholds=THRESHOLDS)
    model.learn(total_timesteps=args.max_steps, callback=sb3_reporter(progress, REPORT_EVERY))
    train_s = time.perf_counter() - progress.start
    emit(benchmark="sb3_recurrent_ppo", peer="sb3-contrib", version=sb3_contrib.__version__,
         config={"env": "StatelessCartPole (500-step limit)", "n_envs": 8, **hyper, **policy_kwargs,
                 "torch_threads": args.torch_threads, "seed": args.seed, "max_steps": args.max_steps},
         progress=progress, steps=model.num_timesteps, train_s=train_s, startup_s=startup_s, out=args.out,
         versions={"sb3-contrib": sb3_contrib.__version__, "torch": torch.__version__,
                   "gymnasium": gymnasium.__version__})


if __name__ == "__main__":
    main()
