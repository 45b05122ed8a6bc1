"""Stable-Baselines3 DQN on CartPole-v1 with flowrl's ``DQNConfig`` defaults where SB3 has them; one JSON line.

Run with the peers' virtualenv (``bash benchmarks/peers/setup.sh`` creates it):
``benchmarks/peers/.venv/bin/python benchmarks/peers/sb3_dqn.py [--quick] [--seed 0] [--max-steps 100000]``.

Mapping from flowrl's ``DQNConfig`` (its defaults, RLlib's) to ``stable_baselines3.DQN``:

========================================  =====================================================================
flowrl                                    Stable-Baselines3
========================================  =====================================================================
num_workers 0, 1 env                      ``make_vec_env(n_envs=1)``
fragment 4, one replay per fragment       ``train_freq=4``, ``gradient_steps=1`` (32 rows trained per 4 sampled)
train_batch_size 32                       ``batch_size=32``
lr 5e-4, Adam eps 1e-8, grad_clip 40      ``learning_rate=5e-4``, ``optimizer_kwargs={"eps": 1e-8}``,
                                          ``max_grad_norm=40``
gamma 0.99, n_step 1, Huber (delta 1)     ``gamma=0.99``; SB3's loss is ``smooth_l1_loss`` (Huber, delta 1)
target_network_update_freq 500            ``target_update_interval=500`` (env steps), ``tau=1.0``
buffer_size 50000, learning_starts 1000   ``buffer_size=50000``, ``learning_starts=1000``
epsilon 1.0 -> 0.02 over 10000 steps      ``exploration_initial_eps=1.0``, ``exploration_final_eps=0.02``,
                                          ``exploration_fraction=10000 / max_steps``
torso 64-64 tanh, heads [256] relu        ``net_arch=[64, 64, 256]``, ``Tanh`` throughout (one activation in SB3)
double_q, dueling                         not matched: SB3's DQN is plain (no double Q, no dueling heads)
prioritized replay (0.6, 0.4)             not matched: SB3's DQN replays uniformly
reports every 1000 steps (and 1 s)        the return is checked every 1000 env steps
========================================  =====================================================================

The return is the mean of the last 100 episodes (SB3's ``ep_info_buffer``). Start-up is timed apart.
"""

from __future__ import annotations

import time

from _common import Progress, emit, parse_args, sb3_reporter

REPORT_EVERY = 1000  # env steps, as flowrl's DQN timesteps_per_iteration


def main() -> None:
    args = parse_args(__doc__, max_steps=100_000, quick_steps=4_000)
    start = time.perf_counter()
    import gymnasium
    import stable_baselines3
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(args.torch_threads)
    hyper = dict(learning_rate=5e-4, buffer_size=50_000, learning_starts=1000, batch_size=32, tau=1.0, gamma=0.99,
                 train_freq=4, gradient_steps=1, target_update_interval=500, exploration_initial_eps=1.0,
                 exploration_final_eps=0.02, exploration_fraction=min(1.0, 10_000 / args.max_steps), max_grad_norm=40)
    model = DQN("MlpPolicy", make_vec_env("CartPole-v1", n_envs=1, seed=args.seed), seed=args.seed, device="cpu",
                policy_kwargs=dict(net_arch=[64, 64, 256], activation_fn=torch.nn.Tanh,
                                   optimizer_kwargs={"eps": 1e-8}), **hyper)
    startup_s = time.perf_counter() - start

    progress = Progress(stop_return=args.stop_return, max_steps=args.max_steps)
    model.learn(total_timesteps=args.max_steps, callback=sb3_reporter(progress, REPORT_EVERY))
    train_s = time.perf_counter() - progress.start
    emit(benchmark="sb3_dqn", peer="stable-baselines3", version=stable_baselines3.__version__,
         config={"n_envs": 1, **hyper, "net_arch": "[64, 64, 256] tanh", "adam_eps": 1e-8, "double_q": False,
                 "dueling": False, "prioritized_replay": False, "torch_threads": args.torch_threads,
                 "seed": args.seed, "max_steps": args.max_steps},
         progress=progress, steps=model.num_timesteps, train_s=train_s, startup_s=startup_s, out=args.out,
         versions={"stable-baselines3": stable_baselines3.__version__, "torch": torch.__version__,
                   "gymnasium": gymnasium.__version__})


if __name__ == "__main__":
    main()
