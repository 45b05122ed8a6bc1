"""RLlib APPO or IMPALA (new API stack) on an Atari game at flowrl's Pong preset's sizes: frames per second sampled.

Run with the peers' virtualenv (``bash benchmarks/peers/setup.sh``, which installs ale-py and OpenCV there):
``benchmarks/peers/.venv/bin/python benchmarks/peers/rllib_atari.py --algo appo [--seconds 60]``.
``benchmarks/atari.py`` runs it beside flowrl's runs and reads its JSON.

Mapping from flowrl's ``ALE/Pong-v5`` presets (:mod:`flowrl.presets`) to RLlib's configs:

==============================================  ==========================================================
flowrl                                          RLlib (new API stack)
==============================================  ==========================================================
ALE/Pong-v5 with flowrl.envs.atari's            ``gym.make(env, frameskip=1)`` under RLlib's
preprocessing (noop 30, skip 4, max-pool,       ``wrap_atari_for_new_api_stack(framestack=4, dim=84)``
84x84 grey, stack 4, life loss)                 (the same steps, RLlib's own wrappers)
clip_rewards=1.0                                ``clip_rewards=True``
2 workers x 16 envs, fragment 50                ``num_env_runners=2``, ``num_envs_per_env_runner=16``,
                                                ``rollout_fragment_length=50``
learner in the driver, 1 torch thread           ``num_learners=0``, ``torch.set_num_threads(1)``
train_batch_size 800, lr 5e-4                   ``train_batch_size_per_learner=800``, ``lr=5e-4``
Nature CNN, one shared 256-unit ReLU layer      ``conv_filters=[[32,8,4],[64,4,2],[64,3,1]]``, ReLU,
                                                ``head_fcnet_hiddens=[256]``, ``vf_share_layers=True``
==============================================  ==========================================================

The clock starts after the first ``train()`` returned (start-up and the first weight sync apart); the figure is
``num_env_steps_sampled_lifetime`` growth x 4 frames per second of wall time over ``--seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from _common import loopback_ray

FRAME_SKIP = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=("appo", "impala"), default="appo")
    parser.add_argument("--env", default="ALE/Pong-v5")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--envs-per-runner", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    loopback_ray()
    import ale_py
    import gymnasium as gym
    import ray
    import torch
    from ray import tune
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack

    if args.algo == "appo":
        from ray.rllib.algorithms.appo import APPOConfig as Config
    else:
        from ray.rllib.algorithms.impala import IMPALAConfig as Config

    env_id = args.env

    def make(cfg: dict) -> gym.Env:
        gym.register_envs(ale_py)
        return wrap_atari_for_new_api_stack(gym.make(env_id, frameskip=1, **cfg), framestack=4, dim=84)

    torch.set_num_threads(1)
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    tune.register_env("flowrl-atari", make)
    config = (Config()
              .environment("flowrl-atari", clip_rewards=True)
              .env_runners(num_env_runners=2, num_envs_per_env_runner=args.envs_per_runner, rollout_fragment_length=50,
                           num_cpus_per_env_runner=1)
              .learners(num_learners=0)
              .training(train_batch_size_per_learner=800, lr=5e-4, entropy_coeff=0.01, vf_loss_coeff=0.5)
              .rl_module(model_config=DefaultModelConfig(conv_filters=[[32, 8, 4], [64, 4, 2], [64, 3, 1]],
                                                         conv_activation="relu", head_fcnet_hiddens=[256],
                                                         vf_share_layers=True))
              .debugging(seed=args.seed))
    start = time.perf_counter()
    algo = config.build_algo()
    startup_s = time.perf_counter() - start

    def sampled(result: dict) -> int:
        runners = result.get("env_runners", {})
        return int(runners.get("num_env_steps_sampled_lifetime", result.get("num_env_steps_sampled_lifetime", 0)))

    def trained(result: dict) -> int:
        learners = result.get("learners", {}).get("__all_modules__", {})
        return int(learners.get("num_env_steps_trained_lifetime", result.get("num_env_steps_trained_lifetime", 0)))

    try:
        first = algo.train()
        t0, s0, tr0 = time.perf_counter(), sampled(first), trained(first)
        while time.perf_counter() - t0 < args.seconds:
            last = algo.train()
        wall = time.perf_counter() - t0
        result = {"benchmark": f"rllib_atari_{args.algo}", "peer": "rllib", "version": ray.__version__,
                  "env": env_id, "envs_per_runner": args.envs_per_runner, "frames_per_s_sampled": (sampled(last) - s0) * FRAME_SKIP / wall,
                  "frames_per_s_trained": (trained(last) - tr0) * FRAME_SKIP / wall if trained(last) else None,
                  "wall_s": round(wall, 2), "startup_s": round(startup_s, 2),
                  "machine": {"platform": platform.platform(), "cpus": os.cpu_count()}}
    finally:
        algo.stop()
        ray.shutdown()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
