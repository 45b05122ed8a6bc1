"""Sampling efficiency: one RolloutWorker with the MLP policy against its own envs stepping random actions.

Both sides run in this process on the same vectorised CartPole-v1 envs (flowrl's ``VectorEnv``,
same backend, same number of envs). The raw side steps random actions; the worker side calls
``RolloutWorker.sample()``, which adds one batched policy forward pass per step, the trajectory
bookkeeping and postprocessing. Runs alternate; the table shows medians of env steps/s.

The last line is ``sampling_efficiency=<worker / raw>`` (target >= 0.6; Sample Factory's training
throughput is 0.75 of pure simulation).

``--backends`` instead compares the vector backends a worker can step its envs with (``vector_backend``): the
in-process loop against gymnasium's ``AsyncVectorEnv`` (one subprocess per env) and, where it is installed (the
``envpool`` extra) and has the env, EnvPool's C++ envs; on CartPole-v1, Acrobot-v1 (a slower Python step) and
CartPole plus ``--slow-ms`` ms of CPU per step (standing in for a Python-level simulator), raw stepping and
``RolloutWorker.sample()``, with ratios over the loop.

Run: ``python benchmarks/sampling.py [--quick] [--envs 8 32] [--fragment 200]`` or
``python benchmarks/sampling.py --backends [--envs 4] [--slow-ms 1]``.
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


def slow_cartpole(ctx: Any) -> Any:
    """CartPole-v1 whose every step also spins the CPU for ``ctx.config["ms"]`` milliseconds (one core, as a
    Python-level simulator would)."""
    import gymnasium

    class Slow(gymnasium.Wrapper):  # type: ignore[type-arg]
        def __init__(self, env: Any, ms: float) -> None:
            super().__init__(env)
            self.seconds = ms / 1000

        def step(self, action: Any) -> Any:
            end = time.perf_counter() + self.seconds
            while time.perf_counter() < end:
                pass
            return self.env.step(action)

    return Slow(gymnasium.make("CartPole-v1"), float(ctx.config.get("ms", 1.0)))


def _envpool_ids() -> set[str]:
    try:
        import envpool
    except ImportError:
        return set()
    return set(envpool.list_all_envs())


def compare_backends(num_envs: int, fragment: int, repeats: int, slow_ms: float) -> list[dict[str, Any]]:
    """Per env, every backend that can step it, raw and in a worker, with its ratio over the loop."""
    rows = []
    pool = _envpool_ids()
    for label, env, env_config in (("CartPole-v1", "CartPole-v1", {}), ("Acrobot-v1", "Acrobot-v1", {}),
                                   (f"CartPole-v1 + {slow_ms:g} ms/step", slow_cartpole, {"ms": slow_ms})):
        backends = ["loop", "async"] + (["envpool"] if isinstance(env, str) and env in pool else [])
        rates: dict[str, list[float]] = {}
        made = {}
        for backend in backends:
            cfg = RolloutConfig(env=env, env_config=env_config, num_envs_per_worker=num_envs,
                                rollout_fragment_length=fragment, seed=0, vector_backend=backend)  # type: ignore[arg-type]
            made[backend] = (RolloutWorker(policy_class=TinyPGPolicy, config=cfg),
                             VectorEnv(env, num_envs, seed=1, config=env_config, backend=backend))  # type: ignore[arg-type]
        try:
            for backend, (worker, raw) in made.items():  # warm-up
                worker_rate(worker, 1), raw_rate(raw, fragment)
            for _ in range(repeats):
                for backend, (worker, raw) in made.items():
                    rates.setdefault(f"{backend}_raw", []).append(raw_rate(raw, fragment))
                    rates.setdefault(f"{backend}_worker", []).append(worker_rate(worker, 1))
        finally:
            for worker, raw in made.values():
                worker.env.close()
                raw.close()
        med = {k: statistics.median(v) for k, v in rates.items()}
        for backend in backends:
            rows.append({"env": label, "num_envs": num_envs, "backend": backend,
                         "raw_steps_per_s": med[f"{backend}_raw"], "worker_steps_per_s": med[f"{backend}_worker"],
                         "raw_over_loop": med[f"{backend}_raw"] / med["loop_raw"],
                         "worker_over_loop": med[f"{backend}_worker"] / med["loop_worker"],
                         "samples": {"raw": rates[f"{backend}_raw"], "worker": rates[f"{backend}_worker"]}})
    return rows


def main_backends(args: argparse.Namespace) -> None:
    repeats = 3 if args.quick else args.repeats
    rows = [row for n in args.envs for row in compare_backends(n, args.fragment, repeats, args.slow_ms)]
    print(f"\nvector backends: one RolloutWorker in-process (MLP 64-64, torch threads=1), fragment {args.fragment}, "
          f"median of {repeats} alternating runs, env steps/s; envpool where EnvPool has the env and is installed\n")
    print("| env | envs | backend | raw | raw / loop | worker | worker / loop |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['env']} | {r['num_envs']} | {r['backend']} | {r['raw_steps_per_s']:,.0f} | {r['raw_over_loop']:.2f} | "
              f"{r['worker_steps_per_s']:,.0f} | {r['worker_over_loop']:.2f} |")
    out = Path(args.out.replace("sampling.json", "vector_backends.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "vector_backends", "results": rows,
                               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                           "python": platform.python_version(), "torch": torch.__version__,
                                           "flowrl": flowrl.__version__}}, indent=2))
    print(f"\nwrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--fragment", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/sampling.json")
    parser.add_argument("--backends", action="store_true", help="compare the loop, async and envpool vector backends")
    parser.add_argument("--slow-ms", type=float, default=1.0, help="--backends: extra work per step of the slow env")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core per sampler, as a rollout worker actor has
    if args.backends:
        main_backends(args)
        return
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
