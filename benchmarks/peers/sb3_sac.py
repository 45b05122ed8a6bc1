"""Stable-Baselines3 SAC on Pendulum-v1 with the settings flowrl's SAC benchmark matches; prints one JSON line.

Run with the peers' virtualenv (``bash benchmarks/peers/setup.sh`` creates it):
``benchmarks/peers/.venv/bin/python benchmarks/peers/sb3_sac.py [--quick] [--seed 0] [--max-steps 30000]``.

Mapping from flowrl's ``SACConfig`` (as ``benchmarks/sac_pendulum.py`` runs it) to ``stable_baselines3.SAC``:

========================================  =====================================================================
flowrl                                    Stable-Baselines3
========================================  =====================================================================
num_workers 0, 1 env, fragment 1          ``make_vec_env(n_envs=1)``, ``train_freq=1``
one 256-row replay per stored step        ``batch_size=256``, ``gradient_steps=1`` (one gradient step per env
                                          step)
actor and critics [256, 256] relu, twin   ``net_arch=[256, 256]`` (pi and qf), ``ReLU``, ``n_critics=2``
Q
actor_lr = critic_lr = entropy_lr 3e-4    ``learning_rate=3e-4`` (one rate for all three, as SB3 has)
gamma 0.99, tau 5e-3                      ``gamma=0.99``, ``tau=0.005``
initial_alpha 1.0, target_entropy auto    ``ent_coef="auto_1.0"``, ``target_entropy="auto"`` (-dim(A))
buffer_size 100000, learning_starts 1000  ``buffer_size=100000``, ``learning_starts=1000``: SB3 samples
                                          uniform random actions before it, flowrl the untrained actor
smoothed return over 20 episodes          ``stats_window_size=20``; checked every 1000 env steps
========================================  =====================================================================

Start-up (imports, env, model) is timed apart. Time to -200 is the training seconds at the first check whose
smoothed return is at least -200.
"""

from __future__ import annotations

import time

from _common import Progress, emit, parse_args, sb3_reporter

REPORT_EVERY = 1000  # env steps, as flowrl's OffPolicyConfig.timesteps_per_iteration
THRESHOLDS = (-200.0,)


def main() -> None:
    args = parse_args(__doc__, max_steps=30_000, quick_steps=3_000, stop_return=THRESHOLDS[-1])
    start = time.perf_counter()
    import gymnasium
    import stable_baselines3
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(args.torch_threads)
    hyper = dict(learning_rate=3e-4, buffer_size=100_000, learning_starts=1000, batch_size=256, tau=0.005,
                 gamma=0.99, train_freq=1, gradient_steps=1, ent_coef="auto_1.0", target_entropy="auto",
                 stats_window_size=20)
    model = SAC("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=1, seed=args.seed), seed=args.seed, device="cpu",
                policy_kwargs=dict(net_arch=[256, 256], activation_fn=torch.nn.ReLU, n_critics=2), **hyper)
    startup_s = time.perf_counter() - start

    progress = Progress(stop_return=args.stop_return, max_steps=args.max_steps, thresholds=THRESHOLDS)
    model.learn(total_timesteps=args.max_steps, callback=sb3_reporter(progress, REPORT_EVERY))
    train_s = time.perf_counter() - progress.start
    emit(benchmark="sb3_sac", peer="stable-baselines3", version=stable_baselines3.__version__,
         config={"env": "Pendulum-v1", "n_envs": 1, **hyper, "net_arch": "pi and qf [256, 256] relu", "n_critics": 2,
                 "torch_threads": args.torch_threads, "seed": args.seed, "max_steps": args.max_steps},
         progress=progress, steps=model.num_timesteps, train_s=train_s, startup_s=startup_s, out=args.out,
         versions={"stable-baselines3": stable_baselines3.__version__, "torch": torch.__version__,
                   "gymnasium": gymnasium.__version__})


if __name__ == "__main__":
    main()
