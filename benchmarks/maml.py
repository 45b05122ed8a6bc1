"""MAML on flowrl/PointGoal-v0: where a meta-iteration's time goes (sampling at the barrier, the workers' inner
steps inside it, the driver's meta-update), with 2 workers (the default) and 8, and the adaptation it reaches.

Each result of MAML's plan carries ``sampling_s`` (the meta-iteration's seconds waiting at the barrier: the
workers' inner steps, then their samples), ``inner_adaptation_s`` (a worker's seconds in its inner steps, as it
reports them) and ``meta_update_s`` (the driver's ``maml_optimizer_steps`` learner steps). The table gives their
medians over the run, and the plan's profile (``profile=True``: per-operator time) of the last run is printed.

Run: ``python benchmarks/maml.py [--quick] [--iterations 30] [--out PATH]``. The last line is
``maml_sampling_s=... maml_inner_s=... maml_meta_update_s=... maml_adaptation_delta=...`` (2 workers).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from flowrl import runtime
from flowrl.algorithms.maml import MAMLConfig
from flowrl.trainer import Trainer


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line.

    Examples:
        >>> parse_args(["--quick"]).iterations
        5
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30, help="meta-iterations per worker count")
    parser.add_argument("--quick", action="store_true", help="5 meta-iterations")
    parser.add_argument("--out", default="benchmarks/results/maml.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.iterations = min(args.iterations, 5)
    return args


def run(workers: int, iterations: int, envs: int) -> tuple[dict[str, Any], str]:
    """Medians of a run's time split and its adaptation, and its profile table."""
    config = MAMLConfig(seed=0, num_workers=workers, num_envs_per_worker=envs,
                        num_cpus_per_worker=min(1.0, 2.0 / workers), profile=True)
    trainer = Trainer("maml", config)
    try:
        trainer.train()  # start-up stays out
        rows, start = [], time.perf_counter()
        for _ in range(iterations):
            rows.append(trainer.train())
        elapsed = time.perf_counter() - start
        profile = trainer.plan.profile()
    finally:
        trainer.stop()

    def median(key: str) -> float:
        return statistics.median(float(r[key]) for r in rows)

    return ({"workers": workers, "envs_per_worker": envs, "iteration_s": elapsed / iterations,
             "sampling_s": median("sampling_s"), "inner_adaptation_s": median("inner_adaptation_s"),
             "meta_update_s": median("meta_update_s"),
             "adaptation_delta_last10": statistics.mean(float(r["adaptation_delta"]) for r in rows[-10:]),
             "env_steps_per_iteration": rows[-1]["timesteps_this_iter"]}, profile)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.getLogger("flowrl").setLevel(logging.WARNING)
    runtime.init(num_cpus=2, log_to_driver=False)
    results, profile = [], ""
    for workers, envs in ((2, 10), (8, 5)):
        result, profile = run(workers, args.iterations, envs)
        results.append(result)
    print("| workers x envs | s / meta-iteration | sampling s | of it inner steps s | meta-update s "
          "| env steps / iteration | adaptation_delta (last 10) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['workers']} x {r['envs_per_worker']} | {r['iteration_s']:.2f} | {r['sampling_s']:.3f} "
              f"| {r['inner_adaptation_s']:.4f} | {r['meta_update_s']:.3f} | {r['env_steps_per_iteration']:,} "
              f"| {r['adaptation_delta_last10']:.2f} |")
    print(f"\nprofile of the {results[-1]['workers']}-worker run:\n{profile}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "maml", "quick": args.quick, "iterations": args.iterations,
                               "results": results,
                               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                           "python": platform.python_version(), "torch": torch.__version__}},
                              indent=2) + "\n")
    first = results[0]
    print(f"maml_sampling_s={first['sampling_s']:.3f} maml_inner_s={first['inner_adaptation_s']:.4f} "
          f"maml_meta_update_s={first['meta_update_s']:.3f} maml_adaptation_delta={first['adaptation_delta_last10']:.2f}")


if __name__ == "__main__":
    main()
