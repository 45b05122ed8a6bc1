"""Dataflow overhead of flowrl's iterator core against the best hand-written Ray loops.

N shard actors of one class each spend ~5 ms per item (``time.sleep``, so that 2 cores are not the
bottleneck and both sides measure coordination, not CPU contention). The same actors serve both sides:

- sync:  ``from_actors(actors).gather_sync()`` vs ``ray.get([a.produce.remote() for a in actors])`` per round;
- async: ``from_actors(actors).gather_async(num_async=k)`` vs a ``ray.wait`` loop with k requests in flight
  per actor, batched waits (every ready result at once, a blocking wait only when none is) and
  resubmission to the actor whose result arrived.

Each mode is warmed up once (which also sizes the runs to ~2 s unless ``--items`` is given), then
flowrl and hand-written runs alternate (ABBA order) for ``--repeats`` rounds, each pulling the same
number of items; requests left in flight are drained outside the timer. The table shows medians of
items/s; JSON goes to ``benchmarks/results/iter_overhead.json``. The last line is
``overhead_ratio=<worse of the two flowrl / hand-written ratios>`` (target >= 0.95).

Run: ``python benchmarks/iter_overhead.py [--quick] [--workers 4] [--num-async 2] [--items N] [--repeats 5]``
(``--quick``: ~20 s; default: about a minute).
"""

from __future__ import annotations

import argparse
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
from flowrl import runtime  # noqa: E402
from flowrl.testing.network import keep_traffic_on_loopback  # noqa: E402
from flowrl.iter import ParallelIteratorWorker, from_actors  # noqa: E402

import ray  # noqa: E402,I001

keep_traffic_on_loopback()  # Ray's start-up probe of the cloud metadata address stays on this machine

WORK_S = 0.005
Actors = list[Any]  # Ray actor handles of SleepyShard
OUT = Path(__file__).resolve().parent / "results" / "iter_overhead.json"


class SleepyShard(ParallelIteratorWorker):
    """A shard whose items each take ~5 ms; ``produce()`` is the same work for the hand-written loops."""

    def __init__(self) -> None:
        def items() -> Iterator[int]:
            while True:
                yield self.produce()

        super().__init__(items)
        self.count = 0

    def produce(self) -> int:
        time.sleep(WORK_S)
        self.count += 1
        return self.count

    def ping(self) -> None:
        """Returns once every call submitted before it has run (the actor runs calls in order)."""


def hand_sync(actors: Actors, n: int, k: int) -> int:
    got = 0
    for _ in range(n // len(actors)):
        got += len(ray.get([a.produce.remote() for a in actors]))
    return got


def hand_async(actors: Actors, n: int, k: int) -> int:
    pending = {a.produce.remote(): a for a in actors for _ in range(k)}
    got = 0
    while got < n:
        refs = list(pending)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        if not ready:
            ready, _ = ray.wait(refs, num_returns=1)
        for ref in ready:
            actor = pending.pop(ref)
            pending[actor.produce.remote()] = actor
        got += len(ray.get(ready))
    return got  # requests still in flight are drained by timed(), outside the timer


def flowrl_sync(actors: Actors, n: int, k: int) -> int:
    return len(from_actors(actors).gather_sync().take(n))


def flowrl_async(actors: Actors, n: int, k: int) -> int:
    return len(from_actors(actors).gather_async(num_async=k).take(n))


Run = Callable[[Actors, int, int], int]
MODES: dict[str, dict[str, Run]] = {"sync": {"flowrl": flowrl_sync, "hand": hand_sync},
                                    "async": {"flowrl": flowrl_async, "hand": hand_async}}


def timed(run: Run, actors: Actors, n: int, k: int) -> float:
    """Items/s of one run; afterwards waits (untimed) until the actors are idle again."""
    start = time.perf_counter()
    got = run(actors, n, k)
    elapsed = time.perf_counter() - start
    ray.get([a.ping.remote() for a in actors])
    if got < n:
        raise RuntimeError(f"{run.__name__} returned {got} of {n} items")
    return got / elapsed


def measure(runs: dict[str, Run], actors: Actors, k: int, items: int | None,
            seconds: float, repeats: int) -> dict[str, Any]:
    w = len(actors)
    warm = {name: timed(run, actors, 20 * w, k) for name, run in runs.items()}  # also the first init
    n = items or max(w, round(max(warm.values()) * seconds))
    n = math.ceil(n / w) * w  # whole sync rounds, so both sides pull exactly n items
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for rep in range(repeats):
        for name in (list(runs) if rep % 2 == 0 else list(runs)[::-1]):  # ABBA: drift hits both alike
            samples[name].append(timed(runs[name], actors, n, k))
    med = {name: statistics.median(v) for name, v in samples.items()}
    return {"items_per_run": n, "flowrl_items_per_s": med["flowrl"], "hand_items_per_s": med["hand"],
            "ratio": med["flowrl"] / med["hand"], "samples": samples, "warmup": warm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4, help="shard actors")
    parser.add_argument("--num-async", type=int, default=2, help="requests in flight per actor (async)")
    parser.add_argument("--items", type=int, default=None, help="items per run (default: ~2 s per run)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per side and mode")
    parser.add_argument("--num-cpus", type=int, default=os.cpu_count() or 2, help="Ray's logical CPUs")
    parser.add_argument("--quick", action="store_true", help="~20 s in all: 3 repeats of ~0.5 s runs")
    args = parser.parse_args()
    repeats, seconds = (3, 0.5) if args.quick else (args.repeats, 2.0)
    k, w = args.num_async, args.workers

    runtime.init(num_cpus=args.num_cpus, log_to_driver=False)
    try:
        shard_cls = ray.remote(SleepyShard).options(**runtime.actor_options(num_cpus=0))
        actors: Actors = [shard_cls.remote() for _ in range(w)]
        ray.get([a.ping.remote() for a in actors])
        results = {mode: measure(runs, actors, k, args.items, seconds, repeats) for mode, runs in MODES.items()}
    finally:
        ray.shutdown()

    print(f"\n{w} shard actors, {WORK_S * 1000:.0f} ms of time.sleep per item (a sleep, so 2 cores are not "
          f"the bottleneck; ideal {w / WORK_S:,.0f} items/s), num_async={k}, median of {repeats} "
          f"alternating runs\n")
    print("| mode | items/run | flowrl items/s | hand-written items/s | flowrl / hand-written |")
    print("|---|---:|---:|---:|---:|")
    for mode, r in results.items():
        label = "gather_sync()" if mode == "sync" else f"gather_async(num_async={k})"
        print(f"| {label} | {r['items_per_run']} | {r['flowrl_items_per_s']:,.0f} | "
              f"{r['hand_items_per_s']:,.0f} | {r['ratio']:.3f} |")
    worst = min(r["ratio"] for r in results.values())
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "benchmark": "iter_overhead", "overhead_ratio": worst, "results": results,
        "params": {"workers": w, "num_async": k, "items": args.items, "repeats": repeats, "run_seconds": seconds,
                   "work_s": WORK_S, "work": "time.sleep", "num_cpus": args.num_cpus, "quick": args.quick},
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "python": platform.python_version(), "ray": ray.__version__,
                    "flowrl": flowrl.__version__}}, indent=2))
    print(f"\nwrote {OUT}")
    print(f"overhead_ratio={worst:.3f}")


if __name__ == "__main__":
    main()
