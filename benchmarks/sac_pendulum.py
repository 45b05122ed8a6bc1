"""flowrl SAC on Pendulum-v1 (or LunarLanderContinuous-v3) at the settings SB3 and RLlib SAC match; one JSON.

The suite's ``sac`` group runs it beside Stable-Baselines3 and RLlib SAC (``peers/sb3_sac.py``,
``peers/rllib_sac.py``, whose docstrings map each setting): ``SACConfig`` with batch 256, [256, 256] relu actor
and twin critics, fragments of one step and one 256-row replay per stored step (one gradient step per env step),
learning starts 1,000, all through ``flowrl.trainer.Trainer("sac", config)``. The return is smoothed over the
last 20 episodes (``metrics_smoothing_episodes``, as the peers' windows), reported every 1,000 env steps
(``timesteps_per_iteration``). Start-up (the trainer, its worker) is timed apart; training time runs from the
first ``train()``.

``--env LunarLanderContinuous-v3`` (the suite's ``sac_lunar``, by name only): the same settings, to a smoothed
return of 200. It needs gymnasium's box2d extra (``pip install "gymnasium[box2d]"``); without it the script
says so and writes a JSON with ``skipped`` instead of figures (exit status 0).

Run: ``python benchmarks/sac_pendulum.py [--quick] [--seed 0] [--max-steps 30000] [--env Pendulum-v1]``.
The last line is ``sac_env_steps_per_s=<env steps sampled per second of training>``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import flowrl  # noqa: E402,F401  (sets Ray's loopback variable before ray is imported)

import torch  # noqa: E402

#: per env: the smoothed return the run stops at (its only threshold) and the step budgets (full, --quick)
ENVS: dict[str, tuple[float, int, int]] = {"Pendulum-v1": (-200.0, 30_000, 3_000),
                                           "LunarLanderContinuous-v3": (200.0, 300_000, 5_000)}
BOX2D_MISSING = ("skipped: LunarLanderContinuous-v3 needs gymnasium's box2d extra, which is not installed here; "
                 "install it with: pip install \"gymnasium[box2d]\"")
SMOOTHING_EPISODES = 20
REPORT_EVERY = 1000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--max-steps`` and ``--stop-return`` default to the env's budget and threshold.

    Examples:
        >>> args = parse_args(["--quick"])
        >>> args.env, args.max_steps, args.stop_return
        ('Pendulum-v1', 3000, -200.0)
        >>> parse_args(["--env", "LunarLanderContinuous-v3"]).stop_return
        200.0
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=sorted(ENVS), default="Pendulum-v1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many env steps")
    parser.add_argument("--stop-return", type=float, default=None, help="stop at this smoothed return")
    parser.add_argument("--torch-threads", type=int, default=1, help="intra-op threads of the learner")
    parser.add_argument("--quick", action="store_true", help="a few thousand env steps (env steps/s only)")
    parser.add_argument("--out", type=Path, default=None, help="JSON (default benchmarks/results/sac_<env>.json)")
    args = parser.parse_args(argv)
    threshold, full, quick = ENVS[args.env]
    args.max_steps = args.max_steps if args.max_steps is not None else full
    if args.quick:
        args.max_steps = min(args.max_steps, quick)
    args.stop_return = threshold if args.stop_return is None else args.stop_return
    args.threshold = threshold
    return args


def box2d_missing(env: str) -> str | None:
    """The skip message when ``env`` needs Box2D and it is not importable, else ``None``."""
    if env.startswith("LunarLander") and importlib.util.find_spec("Box2D") is None:
        return BOX2D_MISSING
    return None


def make_config(args: argparse.Namespace) -> Any:
    """The SAC config of the benchmark (the matched settings; the rest SACConfig's defaults)."""
    from flowrl.algorithms.sac import SACConfig

    return SACConfig(env=args.env, seed=args.seed, train_batch_size=256, actor_hiddens=(256, 256),
                     critic_hiddens=(256, 256), learning_starts=1000, rollout_fragment_length=1,
                     metrics_smoothing_episodes=SMOOTHING_EPISODES, timesteps_per_iteration=REPORT_EVERY)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Trains until the smoothed return reaches ``args.stop_return`` or ``args.max_steps`` env steps; the figures."""
    from flowrl.trainer import Trainer

    try:  # run as a script (benchmarks/ on the path) or imported as benchmarks.sac_pendulum
        from time_to_solve import init_ray  # type: ignore[import-not-found]
    except ImportError:
        from benchmarks.time_to_solve import init_ray

    torch.set_num_threads(args.torch_threads)
    start = time.perf_counter()
    init_ray(num_cpus=2)
    config = make_config(args)
    trainer = Trainer("sac", config)
    startup_s = time.perf_counter() - start
    reached: tuple[float, int] | None = None
    steps, ret, train_start, cpu_start = 0, math.nan, time.perf_counter(), time.process_time()
    try:
        while True:
            result = trainer.train()
            elapsed = time.perf_counter() - train_start
            steps = int(result["info"]["num_steps_sampled"])
            ret = float(result.get("episode_reward_mean", math.nan))
            print(f"  {steps:>7} steps  return {ret:8.1f}  {elapsed:7.1f} s", file=sys.stderr, flush=True)
            if reached is None and ret >= args.threshold:
                reached = (round(elapsed, 2), steps)
            if ret >= args.stop_return or steps >= args.max_steps:
                break
    finally:
        cpu_s = time.process_time() - cpu_start
        trainer.stop()
    key = int(args.threshold)
    return {"env_steps_sampled": steps, "train_s": round(elapsed, 2), "cpu_s": round(cpu_s, 2),
            "startup_s": round(startup_s, 2),
            "final_return": None if math.isnan(ret) else round(ret, 1),
            f"seconds_to_{key}": None if reached is None else reached[0],
            f"steps_to_{key}": None if reached is None else reached[1],
            "env_steps_per_s_sampled": round(steps / elapsed, 1) if elapsed > 0 else None,
            "config": {k: v for k, v in vars(config).items() if isinstance(v, (int, float, str, tuple, bool))}}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    name = "sac_" + args.env.split("-")[0].lower()
    out = args.out or Path(__file__).resolve().parent / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    skipped = box2d_missing(args.env)
    if skipped is not None:
        print(skipped, flush=True)
        out.write_text(json.dumps({"benchmark": name, "skipped": skipped}, indent=2) + "\n")
        return
    report = {"benchmark": name, "env": args.env, "quick": args.quick, "seed": args.seed, **run(args),
              "machine": {"platform": platform.platform(), "python": platform.python_version(),
                          "torch": torch.__version__}}
    print(f"\n| flowrl SAC, {args.env} | value |\n| --- | --- |")
    for key in ("env_steps_per_s_sampled", f"seconds_to_{int(args.threshold)}", f"steps_to_{int(args.threshold)}",
                "startup_s", "train_s", "final_return"):
        print(f"| {key} | {report.get(key)} |")
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"sac_env_steps_per_s={report['env_steps_per_s_sampled']}")


if __name__ == "__main__":
    main()
