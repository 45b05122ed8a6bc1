"""PPO with an LSTM on CartPole without velocities (``flowrl/StatelessCartPole-v1``): env steps/s sampled and trained,
and the training seconds to a smoothed return of 150.

The suite's ``ppo_lstm`` group runs it beside Stable-Baselines3-contrib's ``RecurrentPPO`` and RLlib's PPO with
``use_lstm`` (``peers/sb3_recurrent_ppo.py``, ``peers/rllib_ppo_lstm.py``, whose docstrings map each setting). The
settings are the PPO preset for this env (``flowrl train ppo --env flowrl/StatelessCartPole-v1 --tuned``): the
driver samples 8 envs x 250 steps (no remote workers), 2000-step train batches, 10 epochs of 250-row minibatches of
whole sequences (at most 20 steps), lr 1e-3, MLP 64 -> LSTM 64, value-loss weight 0.01, clip 0.2, lambda 0.95,
no KL penalty; without the preset's ``MeanStdFilter``, which the peers do not have. Start-up (Ray, the worker, the
plan) is timed apart; the return is the mean over the last 100 episodes, read at every iteration.

Run: ``python benchmarks/ppo_lstm.py [--quick] [--seed 0] [--max-steps 300000] [--stop-return 150]``.
The last line is one JSON record, as the peers print it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import flowrl  # noqa: E402,F401  (sets Ray's loopback variable before ray is imported)

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))  # the peers' stdlib-only clock and record
from _common import Progress, emit, parse_args  # noqa: E402

THRESHOLDS = (150.0,)
SETTINGS = ("observation_filter=NoFilter",)  # over the preset: the peers see raw observations


def make_config(seed: int) -> "flowrl.algorithms.ppo.PPOConfig":
    """The stateless CartPole PPO preset with :data:`SETTINGS` over it."""
    from flowrl._cli_config import build_config
    from flowrl.algorithms.ppo import PPOConfig
    from flowrl.envs import STATELESS_CARTPOLE
    from flowrl.presets import find_preset

    preset = find_preset("ppo", STATELESS_CARTPOLE)
    assert preset is not None
    config: PPOConfig = build_config(PPOConfig, preset.items([f"env={STATELESS_CARTPOLE}", f"seed={seed}",
                                                              *SETTINGS]))
    return config


def main() -> None:
    args = parse_args(__doc__, max_steps=300_000, quick_steps=20_000, stop_return=THRESHOLDS[-1])
    from flowrl.trainer import Trainer

    try:  # run as a script (benchmarks/ on the path) or imported as benchmarks.ppo_lstm
        from time_to_solve import init_ray  # type: ignore[import-not-found]
    except ImportError:
        from benchmarks.time_to_solve import init_ray

    torch.set_num_threads(args.torch_threads)
    start = time.perf_counter()
    init_ray(num_cpus=2)
    config = make_config(args.seed)
    trainer = Trainer("ppo", config)
    startup_s = time.perf_counter() - start
    progress = Progress(stop_return=args.stop_return, max_steps=args.max_steps, thresholds=THRESHOLDS)
    try:
        while True:
            result = trainer.train()
            if progress.update(steps=int(result["info"]["num_steps_sampled"]),
                               mean_return=float(result.get("episode_reward_mean", float("nan"))), log=True):
                break
        train_s = time.perf_counter() - progress.start
    finally:
        trainer.stop()
    emit(benchmark="ppo_lstm", peer="flowrl", version=flowrl.__version__,
         config={"preset": f"ppo on {config.env}", "over_the_preset": list(SETTINGS), "seed": args.seed,
                 "max_steps": args.max_steps, "torch_threads": args.torch_threads},
         progress=progress, steps=progress.steps, train_s=train_s, startup_s=startup_s, out=args.out,
         versions={"flowrl": flowrl.__version__, "torch": torch.__version__})


if __name__ == "__main__":
    main()
