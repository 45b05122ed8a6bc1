"""Stable-Baselines3 PPO on CartPole-v1 with flowrl's PPO main job's hyperparameters; prints one JSON line.

Run with the peers' virtualenv (``bash benchmarks/peers/setup.sh`` creates it):
``benchmarks/peers/.venv/bin/python benchmarks/peers/sb3_ppo.py [--quick] [--seed 0] [--max-steps 300000]``.

Mapping from flowrl (``flowrl.cli.MAIN_JOB``, ``PPOConfig``) to ``stable_baselines3.PPO``:

========================================  =====================================================================
flowrl                                    Stable-Baselines3
========================================  =====================================================================
2 workers x 4 envs, fragment 500          ``make_vec_env(n_envs=8)`` (DummyVecEnv, one process), ``n_steps=500``
train_batch_size 4000                     8 x 500 = 4000 rows per rollout
sgd_minibatch_size 128, num_sgd_iter 6    ``batch_size=128``, ``n_epochs=6``
lr 3e-4, Adam eps 1e-8                    ``learning_rate=3e-4``, ``optimizer_kwargs={"eps": 1e-8}`` (SB3: 1e-5)
gamma 0.99, lambda_ 1.0                   ``gamma=0.99``, ``gae_lambda=1.0``
clip_param 0.3                            ``clip_range=0.3``
vf_clip_param 10 (PPO2-style)             ``clip_range_vf=10.0`` (PPO2-style; SB3 takes the clipped loss only,
                                          flowrl the max of the clipped and unclipped ones)
vf_loss_coeff 1.0, entropy_coeff 0        ``vf_coef=1.0``, ``ent_coef=0.0``
grad_clip None                            ``max_grad_norm=1e10`` (SB3 always clips; this never bites)
separate 64-64 tanh pi and vf MLPs        ``net_arch=dict(pi=[64, 64], vf=[64, 64])``, ``Tanh`` (SB3's default;
                                          its init is orthogonal throughout, flowrl's only in the heads)
advantages standardized per batch         ``normalize_advantage=True``: SB3 standardizes per minibatch
kl_coeff 0.2, adaptive (target 0.01)      not matched: SB3 has no KL penalty (``target_kl`` is early stopping,
                                          left off)
learner threads 1                         ``torch.set_num_threads(1)`` (``--torch-threads``)
========================================  =====================================================================

The return is the mean of the last 100 episodes (SB3's ``ep_info_buffer``), checked after each update as
flowrl reports after each train step. Start-up (imports, envs, model) is timed apart.
"""

from __future__ import annotations

import time
import warnings

from _common import Progress, emit, parse_args

N_ENVS, N_STEPS = 8, 500


def main() -> None:
    args = parse_args(__doc__, max_steps=300_000, quick_steps=8_000)
    start = time.perf_counter()
    import gymnasium
    import numpy as np
    import stable_baselines3
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(args.torch_threads)
    # 4000 rows in minibatches of 128 leave a last one of 32 each epoch, as in flowrl: intended
    warnings.filterwarnings("ignore", message="You have specified a mini-batch size")
    hyper = dict(n_steps=N_STEPS, batch_size=128, n_epochs=6, learning_rate=3e-4, gamma=0.99, gae_lambda=1.0,
                 clip_range=0.3, clip_range_vf=10.0, vf_coef=1.0, ent_coef=0.0, max_grad_norm=1e10,
                 normalize_advantage=True, target_kl=None)
    model = PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=args.seed), seed=args.seed, device="cpu",
                policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh,
                                   optimizer_kwargs={"eps": 1e-8}), **hyper)
    startup_s = time.perf_counter() - start

    class Report(BaseCallback):
        """After each update (at the start of the next rollout): record the return; stop when done."""

        stop = False

        def _check(self) -> None:
            returns = [ep["r"] for ep in self.model.ep_info_buffer]
            if self.num_timesteps:
                self.stop = progress.update(steps=self.num_timesteps, log=True,
                                            mean_return=float(np.mean(returns)) if returns else float("nan"))

        def _on_rollout_start(self) -> None:
            self._check()

        def _on_step(self) -> bool:
            return not self.stop

    progress = Progress(stop_return=args.stop_return, max_steps=args.max_steps)
    report = Report()
    model.learn(total_timesteps=args.max_steps, callback=report)
    if not report.stop:  # the step budget ended the run: report its last update
        report._check()
    train_s = time.perf_counter() - progress.start
    emit(benchmark="sb3_ppo", peer="stable-baselines3", version=stable_baselines3.__version__,
         config={"n_envs": N_ENVS, **hyper, "net_arch": "pi [64, 64], vf [64, 64], tanh", "adam_eps": 1e-8,
                 "torch_threads": args.torch_threads, "seed": args.seed, "max_steps": args.max_steps},
         progress=progress, steps=progress.steps, train_s=train_s, startup_s=startup_s, out=args.out,
         versions={"stable-baselines3": stable_baselines3.__version__, "torch": torch.__version__,
                   "gymnasium": gymnasium.__version__})


if __name__ == "__main__":
    main()
