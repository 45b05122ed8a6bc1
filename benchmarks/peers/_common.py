"""What the peer scripts share: their command line, the time-to-threshold clock and the JSON line they print.

Only the standard library here: the suite and pytest's doctest collection import nothing from the peer
virtualenv. Each peer script imports its framework inside ``main()``.

Examples:
    >>> progress = Progress(stop_return=450.0, max_steps=10_000, clock=iter([0.0, 2.0, 5.0]).__next__)
    >>> progress.update(steps=4000, mean_return=160.0), progress.update(steps=8000, mean_return=455.0)
    (False, True)
    >>> progress.reached
    {150.0: (2.0, 4000), 450.0: (5.0, 8000)}
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

THRESHOLDS = (150.0, 450.0)


def loopback_ray() -> None:
    """Before ``import ray``: keep a local Ray instance on 127.0.0.1, as flowrl's runtime does, and quiet."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def parse_args(doc: str, *, max_steps: int, quick_steps: int,
               add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
               stop_return: float = THRESHOLDS[-1]) -> argparse.Namespace:
    """The peers' common command line (plus a script's own options); ``--quick`` caps the run at ``quick_steps``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    if add_arguments is not None:
        add_arguments(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=max_steps, help="stop after this many env steps")
    parser.add_argument("--stop-return", type=float, default=stop_return, help="stop at this smoothed return")
    parser.add_argument("--torch-threads", type=int, default=1, help="intra-op threads of the learner")
    parser.add_argument("--quick", action="store_true", help=f"stop after {quick_steps:,} env steps")
    parser.add_argument("--out", default=None, help="also write the JSON result to this path")
    args = parser.parse_args()
    if args.quick:
        args.max_steps = min(args.max_steps, quick_steps)
    return args


class Progress:
    """Training wall seconds and env steps at which the smoothed return first reaches each threshold.

    The clock starts at construction; call :meth:`update` once per report (iteration) of the peer.
    ``thresholds``: CartPole's 150 and 450 by default (Pendulum's SAC benchmark: -200).
    """

    def __init__(self, *, stop_return: float, max_steps: int, clock: Callable[[], float] = time.perf_counter,
                 thresholds: tuple[float, ...] = THRESHOLDS) -> None:
        self.stop_return, self.max_steps, self.clock = stop_return, max_steps, clock
        self.start = clock()
        self.cpu_start = time.process_time()  # this process's CPU seconds: a figure the machine's load barely moves
        self.thresholds = tuple(float(t) for t in thresholds)
        self.reached: dict[float, tuple[float, int] | None] = {t: None for t in self.thresholds}
        self.mean_return, self.steps, self.reports = math.nan, 0, 0

    def update(self, *, steps: int, mean_return: float, log: bool = False) -> bool:
        """Records one report; returns whether training should stop (return or step budget reached)."""
        elapsed = self.clock() - self.start
        self.steps, self.mean_return, self.reports = steps, mean_return, self.reports + 1
        for t in self.thresholds:
            if self.reached[t] is None and mean_return >= t:
                self.reached[t] = (round(elapsed, 2), steps)
        if log:
            print(f"report {self.reports:4d}  {steps:>7} steps  return {mean_return:6.1f}  {elapsed:6.1f} s",
                  file=sys.stderr, flush=True)
        return mean_return >= self.stop_return or steps >= self.max_steps


def sb3_reporter(progress: Progress, every: int) -> Any:
    """A Stable-Baselines3 callback that, every ``every`` env steps, gives ``progress`` the mean return of SB3's
    episode window (``ep_info_buffer``) and stops training when it says so. SB3 is imported here, so this module
    stays importable without the peer virtualenv."""
    import numpy as np
    from stable_baselines3.common.callbacks import BaseCallback

    class Report(BaseCallback):  # type: ignore[misc]  # SB3's classes are untyped here
        def _on_step(self) -> bool:
            if self.num_timesteps % every:
                return True
            returns = [ep["r"] for ep in self.model.ep_info_buffer]
            mean_return = float(np.mean(returns)) if returns else float("nan")
            return not progress.update(steps=self.num_timesteps, mean_return=mean_return, log=True)

    return Report()


def train_rllib(algo: Any, progress: Progress) -> float:
    """Runs an RLlib ``Algorithm``'s ``train()`` until ``progress`` says stop, then stops it and Ray; returns the
    training seconds. Ray is imported here, so this module stays importable without the peer virtualenv."""
    import ray

    try:
        while True:
            result = algo.train()
            runners = result.get("env_runners", {})
            steps = int(runners.get("num_env_steps_sampled_lifetime", result.get("num_env_steps_sampled_lifetime", 0)))
            if progress.update(steps=steps, mean_return=float(runners.get("episode_return_mean", math.nan)), log=True):
                return time.perf_counter() - progress.start
    finally:
        algo.stop()
        ray.shutdown()


def emit(*, benchmark: str, peer: str, version: str, config: dict[str, Any], progress: Progress, steps: int,
         train_s: float, startup_s: float, out: str | None, versions: dict[str, str]) -> None:
    """Prints the result as one JSON line (the script's last line) and writes it to ``out`` if given."""
    result = {"benchmark": benchmark, "peer": peer, "version": version,
              "env_steps_per_s": round(steps / train_s, 1) if train_s > 0 else None,
              **{f"seconds_to_{int(t)}": None if hit is None else hit[0] for t, hit in progress.reached.items()},
              **{f"steps_to_{int(t)}": None if hit is None else hit[1] for t, hit in progress.reached.items()},
              "env_steps": steps, "train_s": round(train_s, 2), "startup_s": round(startup_s, 2),
              "cpu_s": round(time.process_time() - progress.cpu_start, 2),
              "final_return": None if math.isnan(progress.mean_return) else round(progress.mean_return, 1),
              "config": config, "versions": versions,
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}}
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)
