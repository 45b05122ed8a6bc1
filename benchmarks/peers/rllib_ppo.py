"""RLlib PPO (new API stack) on CartPole-v1 with flowrl's PPO main job's hyperparameters; prints one JSON line.

Run with the peers' virtualenv (``bash benchmarks/peers/setup.sh`` creates it, with the Ray version flowrl runs on):
``benchmarks/peers/.venv/bin/python benchmarks/peers/rllib_ppo.py [--quick] [--seed 0] [--max-steps 300000]``.

Mapping from flowrl (``flowrl.cli.MAIN_JOB``, ``PPOConfig``) to RLlib's ``PPOConfig``:

========================================  =====================================================================
flowrl                                    RLlib (new API stack: RLModule, Learner, EnvRunner)
========================================  =====================================================================
2 workers x 4 envs, fragment 500          ``num_env_runners=2``, ``num_envs_per_env_runner=4``,
                                          ``rollout_fragment_length=500`` (1 CPU each); ``--envs-per-runner 1``
                                          gives RLlib's default (2 x 1 env, fragment 2000)
learner in the driver, 1 torch thread     ``num_learners=0`` (local learner), ``torch.set_num_threads(1)``
train_batch_size 4000                     ``train_batch_size_per_learner=4000``
sgd_minibatch_size 128, num_sgd_iter 6    ``minibatch_size=128``, ``num_epochs=6``, shuffled each epoch
lr 3e-4 (Adam), grad_clip None            ``lr=3e-4``, ``grad_clip=None``
gamma 0.99, lambda_ 1.0                   ``gamma=0.99``, ``lambda_=1.0``; advantages standardized per batch
clip_param 0.3, entropy_coeff 0           ``clip_param=0.3``, ``entropy_coeff=0.0``
vf_clip_param 10, vf_loss_coeff 1.0       ``vf_clip_param=10.0``, ``vf_loss_coeff=1.0``: not the same clip. RLlib's
                                          new stack clamps the squared value error at 10; flowrl clips the
                                          prediction PPO2-style (within 10 of the sampled value)
kl_coeff 0.2, kl_target 0.01, adaptive    ``use_kl_loss=True``, ``kl_coeff=0.2``, ``kl_target=0.01``; the same
                                          x1.5 / x0.5 rule, but RLlib reads the KL of the last minibatch, flowrl
                                          the mean over the last epoch's minibatches
separate 64-64 tanh pi and vf MLPs        ``DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh",
                                          vf_share_layers=False)``; RLlib's own initialisation
smoothed return over 100 episodes         ``metrics_num_episodes_for_smoothing=100``; ``episode_return_mean``
========================================  =====================================================================

Start-up (``ray.init``, building the algorithm and its env runners) is timed apart; training time runs from
the first ``train()`` call. RLlib counts env steps with ``num_env_steps_sampled_lifetime``.
"""

from __future__ import annotations

import time

from _common import Progress, emit, loopback_ray, parse_args, train_rllib

RUNNERS, TRAIN_BATCH = 2, 4000


def main() -> None:
    args = parse_args(__doc__, max_steps=300_000, quick_steps=8_000, add_arguments=lambda p: p.add_argument(
        "--envs-per-runner", type=int, default=4, help="envs per env runner (4: flowrl's 2 x 4; 1: RLlib's "
                                                       "default); the fragment keeps the batch 4000"))
    envs_per_runner = args.envs_per_runner
    if envs_per_runner < 1 or TRAIN_BATCH % (RUNNERS * envs_per_runner):
        raise SystemExit(f"--envs-per-runner={envs_per_runner}: {RUNNERS} runners x envs must divide the train "
                         f"batch {TRAIN_BATCH}; use 1, 2, 4 or 5")
    fragment = TRAIN_BATCH // (RUNNERS * envs_per_runner)
    loopback_ray()
    start = time.perf_counter()
    import gymnasium
    import ray
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    torch.set_num_threads(args.torch_threads)
    ray.init(num_cpus=RUNNERS, include_dashboard=False, log_to_driver=False)
    hyper = dict(lr=3e-4, train_batch_size_per_learner=TRAIN_BATCH, minibatch_size=128,
                 num_epochs=6, gamma=0.99, lambda_=1.0, clip_param=0.3, vf_clip_param=10.0, vf_loss_coeff=1.0,
                 entropy_coeff=0.0, use_kl_loss=True, kl_coeff=0.2, kl_target=0.01, grad_clip=None)
    config = (PPOConfig()
              .environment("CartPole-v1")
              .env_runners(num_env_runners=RUNNERS, num_envs_per_env_runner=envs_per_runner,
                           rollout_fragment_length=fragment, num_cpus_per_env_runner=1)
              .learners(num_learners=0)
              .training(**hyper)
              .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh",
                                                         vf_share_layers=False))
              .reporting(metrics_num_episodes_for_smoothing=100)
              .debugging(seed=args.seed))
    algo = config.build_algo()
    startup_s = time.perf_counter() - start
    progress = Progress(stop_return=args.stop_return, max_steps=args.max_steps)
    train_s = train_rllib(algo, progress)
    emit(benchmark="rllib_ppo", peer="rllib", version=ray.__version__,
         config={"num_env_runners": RUNNERS, "num_envs_per_env_runner": envs_per_runner,
                 "rollout_fragment_length": fragment, "num_learners": 0, **hyper,
                 "model": "fcnet [64, 64] tanh, vf_share_layers=False", "api_stack": "new",
                 "torch_threads": args.torch_threads, "seed": args.seed, "max_steps": args.max_steps},
         progress=progress, steps=progress.steps, train_s=train_s, startup_s=startup_s, out=args.out,
         versions={"ray": ray.__version__, "torch": torch.__version__, "gymnasium": gymnasium.__version__})


if __name__ == "__main__":
    main()
