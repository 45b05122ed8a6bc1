"""What per-operator profiling costs: the same plans run with profiling off and on (``flowrl.profiling``).

Two plans, each measured both ways:

- ``dummy``: the iter-overhead setting (``benchmarks/iter_overhead.py``): N shard actors that each spend ~5 ms
  per item (``time.sleep``, so 2 cores are not the bottleneck), gathered with ``gather_async(num_async=k)``, then
  three local stages (``for_each``, ``filter``, ``batch``), as a plan's driver side would have. Every run builds
  a fresh plan over the same actors (profiled: ``profiling.enable(plan)``) and pulls the same number of items;
  requests left in flight are drained outside the timer.
- ``a2c``: A2C on CartPole-v1 with 2 remote rollout workers, a train step per ``train()``
  (``min_iter_time_s=0``). Two trainers with the same seed, one with ``profile=True`` (profiled plan, weights
  versions stamped into every sampled row and staleness measured at train time) and one without; a run is
  ``--iters`` ``train()`` calls, after 3 warm-up calls each.

Runs alternate (ABBA order) for ``--repeats`` rounds; the table shows medians, JSON goes to
``benchmarks/results/profile_overhead.json``. Profiling off wraps nothing (the core builds the same stages as
ever), so "off" is plain flowrl. The last line is ``profile_overhead=<on/off time ratio - 1>`` for the worse of
the two plans (target < 0.05).

Run: ``python benchmarks/profile_overhead.py [--quick] [--workers 4] [--num-async 2] [--iters 20] [--repeats 5]``
(``--quick``: about a minute, mostly start-up).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterator

os.environ["RAY_AUTH_MODE"] = "disabled"  # before Ray is imported: silences its token warning

import flowrl  # noqa: E402  (before ray: flowrl.runtime keeps Ray on loopback)
from flowrl import profiling, runtime  # noqa: E402
from flowrl.testing.network import keep_traffic_on_loopback  # noqa: E402
from flowrl.algorithms.a2c import A2CConfig  # noqa: E402
from flowrl.iter import ParallelIteratorWorker, from_actors  # noqa: E402
from flowrl.trainer import Trainer  # noqa: E402

import ray  # noqa: E402,I001

keep_traffic_on_loopback()  # Ray's start-up probe of the cloud metadata address stays on this machine

WORK_S = 0.005
OUT = Path(__file__).resolve().parent / "results" / "profile_overhead.json"


class SleepyShard(ParallelIteratorWorker):
    """A shard whose items each take ~5 ms (as in iter_overhead.py)."""

    def __init__(self) -> None:
        def items() -> Iterator[int]:
            while True:
                time.sleep(WORK_S)
                yield 1

        super().__init__(items)

    def ping(self) -> None:
        """Returns once every call submitted before it has run (the actor runs calls in order)."""


class Keep:
    """A named stage, as a plan's operators are (a lambda would do as well)."""

    def __call__(self, item: int) -> int:
        return item

    def __repr__(self) -> str:
        return "Keep"


def dummy_run(actors: list[Any], n: int, k: int, profiled: bool) -> float:
    """Seconds to pull ``n`` items through a fresh dummy plan; the actors are idle again afterwards (untimed)."""
    plan = from_actors(actors).gather_async(num_async=k).for_each(Keep()).filter(Keep()).batch(4)
    if profiled:
        profiling.enable(plan)
    start = time.perf_counter()
    got = sum(len(items) for items in plan.take(n // 4))
    elapsed = time.perf_counter() - start
    ray.get([a.ping.remote() for a in actors])
    if got < n // 4 * 4:
        raise RuntimeError(f"the dummy plan returned {got} of {n} items")
    return elapsed


def a2c_run(trainer: Trainer, iters: int) -> tuple[float, int]:
    """Seconds for ``iters`` train() calls and the env steps they sampled."""
    start = time.perf_counter()
    steps = sum(trainer.train()["timesteps_this_iter"] for _ in range(iters))
    return time.perf_counter() - start, steps


def alternate(sides: dict[str, Callable[[], tuple[float, int]]], repeats: int) -> dict[str, Any]:
    """ABBA rounds of both sides; medians of seconds per run and of items per second."""
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for rep in range(repeats):
        for name in (list(sides) if rep % 2 == 0 else list(sides)[::-1]):  # drift hits both alike
            elapsed, items = sides[name]()
            seconds[name].append(elapsed)
            rates[name].append(items / elapsed)
    med = {name: statistics.median(v) for name, v in seconds.items()}
    return {"off_s_per_run": med["off"], "on_s_per_run": med["on"],
            "off_items_per_s": statistics.median(rates["off"]), "on_items_per_s": statistics.median(rates["on"]),
            "overhead": med["on"] / med["off"] - 1, "samples_s": seconds}


def measure_dummy(args: argparse.Namespace, repeats: int, seconds: float) -> dict[str, Any]:
    shard_cls = ray.remote(SleepyShard).options(**runtime.actor_options(num_cpus=0))
    actors = [shard_cls.remote() for _ in range(args.workers)]
    ray.get([a.ping.remote() for a in actors])
    try:
        warm = 20 * args.workers
        rate = warm / min(dummy_run(actors, warm, args.num_async, False), dummy_run(actors, warm, args.num_async, True))
        n = max(4 * args.workers, math.ceil(rate * seconds / 4) * 4)
        result = alternate({"off": lambda: (dummy_run(actors, n, args.num_async, False), n),
                            "on": lambda: (dummy_run(actors, n, args.num_async, True), n)}, repeats)
        return {"items_per_run": n, **result}
    finally:
        for actor in actors:
            ray.kill(actor)


def measure_a2c(args: argparse.Namespace, repeats: int, iters: int) -> tuple[dict[str, Any], str]:
    config = A2CConfig(env="CartPole-v1", seed=0, num_workers=2, timesteps_per_iteration=0)
    trainers = {"off": Trainer("a2c", config), "on": Trainer("a2c", dataclasses.replace(config, profile=True))}
    try:
        for trainer in trainers.values():
            a2c_run(trainer, 3)  # warm-up: actor start, first batches
        result = alternate({name: (lambda t=trainer: a2c_run(t, iters)) for name, trainer in trainers.items()},
                           repeats)
        table = trainers["on"].plan.profile()
        return {"iters_per_run": iters, "train_batch_size": config.train_batch_size, **result}, table
    finally:
        for trainer in trainers.values():
            trainer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4, help="shard actors of the dummy plan")
    parser.add_argument("--num-async", type=int, default=2, help="requests in flight per shard (dummy plan)")
    parser.add_argument("--iters", type=int, default=20, help="train() calls per A2C run")
    parser.add_argument("--repeats", type=int, default=5, help="runs per side and plan")
    parser.add_argument("--num-cpus", type=int, default=max(os.cpu_count() or 2, 5),
                        help="Ray's logical CPUs (two trainers hold 4 one-CPU workers)")
    parser.add_argument("--quick", action="store_true", help="3 repeats of short runs")
    args = parser.parse_args()
    repeats, seconds, iters = (3, 0.5, 5) if args.quick else (args.repeats, 2.0, args.iters)

    runtime.init(num_cpus=args.num_cpus, log_to_driver=False)
    try:
        results = {"dummy": measure_dummy(args, repeats, seconds)}
        results["a2c"], a2c_table = measure_a2c(args, repeats, iters)
    finally:
        ray.shutdown()

    print(f"\nProfiling off vs on, median of {repeats} alternating runs. dummy: {args.workers} shard actors "
          f"({WORK_S * 1000:.0f} ms of time.sleep per item), gather_async(num_async={args.num_async}) + 3 stages; "
          f"a2c: A2C on CartPole-v1, 2 remote workers, {iters} train() per run\n")
    print("| plan | items/run | off items/s | on items/s | on/off time - 1 |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        per_run = r.get("items_per_run", f"{r.get('iters_per_run')} iters")
        print(f"| {name} | {per_run} | {r['off_items_per_s']:,.0f} | {r['on_items_per_s']:,.0f} | "
              f"{r['overhead']:+.3f} |")
    print(f"\nthe A2C plan's profile (profiling on, all runs):\n{a2c_table}")
    worst = max(r["overhead"] for r in results.values())
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "benchmark": "profile_overhead", "profile_overhead": worst, "results": results,
        "params": {"workers": args.workers, "num_async": args.num_async, "iters": iters, "repeats": repeats,
                   "dummy_run_seconds": seconds, "work_s": WORK_S, "work": "time.sleep", "num_cpus": args.num_cpus,
                   "quick": args.quick},
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "python": platform.python_version(), "ray": ray.__version__,
                    "flowrl": flowrl.__version__}}, indent=2))
    print(f"\nwrote {OUT}")
    print(f"profile_overhead={worst:.3f}")


if __name__ == "__main__":
    main()
