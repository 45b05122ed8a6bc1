"""Sampling efficiency: one RolloutWorker with the MLP policy against its own envs stepping random actions.

Both sides run in this process on the same vectorised CartPole-v1 envs (flowrl's ``VectorEnv``,
same backend, same number of envs). The raw side steps random actions; the worker side calls
``RolloutWorker.sample()``, which adds one batched policy forward pass per step, the trajectory
bookkeeping and postprocessing. Runs alternate; the table shows medians of env steps/s.

The last line is ``sampling_efficiency=<worker / raw>`` (target >= 0.6; Sample Factory's training
throughput is 0.75 of pure simulation).

Run: ``python benchmarks/sampling.py [--quick] [--envs 8 32] [--fragment 200]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import flowrl  # noqa: E402
from flowrl.envs import VectorEnv  # noqa: E402
from flowrl.testing import TinyPGPolicy  # noqa: E402
from flowrl.workers import RolloutConfig, RolloutWorker  # noqa: E402


def raw_rate(env: VectorEnv, steps: int) -> float:
    rng = np.random.default_rng(0)
    env.reset()
    n = env.num_envs
    start = time.perf_counter()
    for _ in range(steps):
        env.step(rng.integers(0, 2, n))
    return steps * n / (time.perf_counter() - start)


def worker_rate(worker: RolloutWorker, samples: int) -> float:
    start = time.perf_counter()
    count = sum(worker.sample().count for _ in range(samples))
    return count / (time.perf_counter() - start)


def measure(num_envs: int, fragment: int, repeats: int, samples: int) -> dict[str, Any]:
    cfg = RolloutConfig(env="CartPole-v1", num_envs_per_worker=num_envs, rollout_fragment_length=fragment, seed=0)
    worker = RolloutWorker(policy_class=TinyPGPolicy, config=cfg)
    raw_env = VectorEnv("CartPole-v1", num_envs, seed=1, backend=cfg.vector_backend)
    sides: dict[str, Callable[[], float]] = {"worker": lambda: worker_rate(worker, samples),
                                              "raw": lambda: raw_rate(raw_env, fragment * samples)}
    for fn in sides.values():
        fn()  # warm-up
    rates: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(repeats):
        for name, fn in sides.items():
            rates[name].append(fn())
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {"num_envs": num_envs, "worker_steps_per_s": med["worker"], "raw_steps_per_s": med["raw"],
            "efficiency": med["worker"] / med["raw"], "samples": rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--fragment", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/sampling.json")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core per sampler, as a rollout worker actor has
    repeats, samples = (3, 2) if args.quick else (args.repeats, 5)
    results = [measure(n, args.fragment, repeats, samples) for n in args.envs]

    print(f"\nCartPole-v1, one RolloutWorker in-process (MLP 64-64, torch threads=1), fragment {args.fragment}, "
          f"median of {repeats} alternating runs\n")
    print("| envs per worker | worker env steps/s | raw env steps/s | worker / raw |")
    print("|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['num_envs']} | {r['worker_steps_per_s']:,.0f} | {r['raw_steps_per_s']:,.0f} | "
              f"{r['efficiency']:.3f} |")
    best = max(results, key=lambda r: r["efficiency"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "sampling", "sampling_efficiency": best["efficiency"],
                               "best_num_envs": best["num_envs"], "results": results,
                               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                           "python": platform.python_version(), "torch": torch.__version__,
                                           "flowrl": flowrl.__version__}}, indent=2))
    print(f"\nwrote {out}")
    print(f"sampling_efficiency={best['efficiency']:.3f}")


if __name__ == "__main__":
    main()
