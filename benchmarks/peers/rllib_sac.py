"""RLlib SAC (new API stack) on Pendulum-v1 with the settings flowrl's SAC benchmark matches; one JSON line.

Run with the peers' virtualenv (``bash benchmarks/peers/setup.sh`` creates it, with the Ray version flowrl runs on):
``benchmarks/peers/.venv/bin/python benchmarks/peers/rllib_sac.py [--quick] [--seed 0] [--max-steps 30000]``.

Mapping from flowrl's ``SACConfig`` (as ``benchmarks/sac_pendulum.py`` runs it) to RLlib's ``SACConfig``:

========================================  =====================================================================
flowrl                                    RLlib (new API stack)
========================================  =====================================================================
num_workers 0, 1 env, fragment 1          ``num_env_runners=0`` (the local env runner samples),
                                          ``num_envs_per_env_runner=1``, ``rollout_fragment_length=1``
train_batch_size 256, one replay per      ``train_batch_size_per_learner=256``, ``training_intensity=None``
stored step                               (RLlib's native ratio: one 256-row update per env step)
actor and critics [256, 256] relu, twin   ``DefaultModelConfig(fcnet_hiddens=[256, 256], fcnet_activation=
Q                                         "relu", head_fcnet_hiddens=[])``, ``twin_q=True``; not exactly the
                                          same critics: RLlib's encode the observation and the action in two
                                          streams before the head
actor_lr = critic_lr = entropy_lr 3e-4    ``actor_lr=3e-4``, ``critic_lr=3e-4``, ``alpha_lr=3e-4``
gamma 0.99, tau 5e-3, n_step 1            ``gamma=0.99``, ``tau=0.005``, ``n_step=1``,
                                          ``target_network_update_freq=0`` (after every update)
initial_alpha 1.0, target_entropy auto    ``initial_alpha=1.0``, ``target_entropy="auto"``
buffer_size 100000, uniform replay        ``EpisodeReplayBuffer``, capacity 100000
learning_starts 1000                      ``num_steps_sampled_before_learning_starts=1000``
smoothed return over 20 episodes          ``metrics_num_episodes_for_smoothing=20``; reports after >= 1000
                                          env steps (``min_sample_timesteps_per_iteration=1000``,
                                          ``min_time_s_per_iteration=0``)
========================================  =====================================================================

Start-up (``ray.init``, building the algorithm) is timed apart; training time runs from the first ``train()``.
"""

from __future__ import annotations

import time

from _common import Progress, emit, loopback_ray, parse_args, train_rllib

THRESHOLDS = (-200.0,)


def main() -> None:
    args = parse_args(__doc__, max_steps=30_000, quick_steps=3_000, stop_return=THRESHOLDS[-1])
    loopback_ray()
    start = time.perf_counter()
    import gymnasium
    import ray
    import torch
    from ray.rllib.algorithms.sac import SACConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    torch.set_num_threads(args.torch_threads)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    hyper = dict(actor_lr=3e-4, critic_lr=3e-4, alpha_lr=3e-4, train_batch_size_per_learner=256, gamma=0.99,
                 tau=0.005, n_step=1, twin_q=True, initial_alpha=1.0, target_entropy="auto",
                 target_network_update_freq=0, training_intensity=None,
                 replay_buffer_config={"type": "EpisodeReplayBuffer", "capacity": 100_000},
                 num_steps_sampled_before_learning_starts=1000)
    config = (SACConfig()
              .environment("Pendulum-v1")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=1, rollout_fragment_length=1)
              .learners(num_learners=0)
              .training(**hyper)
              .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[256, 256], fcnet_activation="relu",
                                                         head_fcnet_hiddens=[]))
              .reporting(metrics_num_episodes_for_smoothing=20, min_sample_timesteps_per_iteration=1000,
                         min_time_s_per_iteration=0)
              .debugging(seed=args.seed))
    algo = config.build_algo()
    startup_s = time.perf_counter() - start
    progress = Progress(stop_return=args.stop_return, max_steps=args.max_steps, thresholds=THRESHOLDS)
    train_s = train_rllib(algo, progress)
    emit(benchmark="rllib_sac", peer="rllib", version=ray.__version__,
         config={"env": "Pendulum-v1", "num_env_runners": 0, "num_envs_per_env_runner": 1,
                 "rollout_fragment_length": 1, "num_learners": 0, **hyper,
                 "model": "fcnet [256, 256] relu, no head hiddens", "api_stack": "new",
                 "torch_threads": args.torch_threads, "seed": args.seed, "max_steps": args.max_steps},
         progress=progress, steps=progress.steps, train_s=train_s, startup_s=startup_s, out=args.out,
         versions={"ray": ray.__version__, "torch": torch.__version__, "gymnasium": gymnasium.__version__})


if __name__ == "__main__":
    main()
