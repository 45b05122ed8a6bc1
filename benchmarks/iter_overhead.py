"""Dataflow overhead of flowrl's iterator core against the best hand-written Ray loops.

N shard actors each spend ~5 ms per item (a sleep, so that 2 cores are not the bottleneck and both
sides measure coordination, not CPU contention). The same actors serve both sides:

- sync:  flowrl ``from_actors(actors).gather_sync()`` vs ``ray.get([a.produce.remote() for a in actors])``
  per round;
- async: flowrl ``gather_async(num_async=k)`` vs a ``ray.wait`` loop with k requests in flight per
  actor, batched waits (all ready results at once) and resubmission to the actor whose result arrived.

Runs alternate flowrl and hand-written, repeated; the table shows medians of items/s and the ratio.
The last line is ``overhead_ratio=<worst ratio>`` (target >= 0.95).

Run: ``python benchmarks/iter_overhead.py [--quick] [--workers 4] [--num-async 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterator

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from flowrl import runtime  # noqa: E402  (first: it keeps Ray on loopback)
from flowrl.iter import ParallelIteratorWorker, from_actors  # noqa: E402

import ray  # noqa: E402,I001

WORK_S = 0.005


class SleepyShard(ParallelIteratorWorker):
    """A shard whose items each take ~5 ms; ``produce()`` is the same work for hand-written loops."""

    def __init__(self) -> None:
        def items() -> Iterator[int]:
            while True:
                yield self.produce()

        super().__init__(items)
        self.count = 0

    def ping(self) -> str:
        return "ok"

    def produce(self) -> int:
        time.sleep(WORK_S)
        self.count += 1
        return self.count


def hand_sync(actors: list[Any], n: int) -> int:
    got = 0
    while got < n:
        got += len(ray.get([a.produce.remote() for a in actors]))
    return got


def hand_async(actors: list[Any], n: int, k: int) -> int:
    pending = {a.produce.remote(): a for a in actors for _ in range(k)}
    got = 0
    while got < n:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
        if not ready:
            ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            actor = pending.pop(ref)
            pending[actor.produce.remote()] = actor
        got += len(ray.get(ready))
    ray.get(list(pending))  # drain, so the next run starts from idle actors
    return got


def flowrl_run(actors: list[Any], n: int, mode: str, k: int) -> int:
    it = from_actors(actors).gather_sync() if mode == "sync" else from_actors(actors).gather_async(num_async=k)
    got = len(it.take(n))
    ray.get([a.ping.remote() for a in actors])  # outstanding requests finish before the next run
    return got


def rate(fn: Callable[[], int]) -> float:
    start = time.perf_counter()
    items = fn()
    return items / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--num-async", type=int, default=2)
    parser.add_argument("--items", type=int, default=None, help="items per run (default: ~2 s of work)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="~20 s in all")
    parser.add_argument("--out", default="benchmarks/results/iter_overhead.json")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    items = args.items or int((0.5 if args.quick else 2.0) * args.workers / WORK_S)

    runtime.init(num_cpus=max(4, args.workers + 2), log_to_driver=False)
    actor_cls = ray.remote(SleepyShard).options(**runtime.actor_options(num_cpus=0))
    actors = [actor_cls.remote() for _ in range(args.workers)]
    ray.get([a.ping.remote() for a in actors])

    sides: dict[str, dict[str, Callable[[], int]]] = {
        "sync": {"flowrl": lambda: flowrl_run(actors, items, "sync", args.num_async),
                 "hand-written": lambda: hand_sync(actors, items)},
        "async": {"flowrl": lambda: flowrl_run(actors, items, "async", args.num_async),
                  "hand-written": lambda: hand_async(actors, items, args.num_async)},
    }
    results: dict[str, dict[str, Any]] = {}
    for mode, fns in sides.items():
        for fn in fns.values():  # warm-up: worker processes, code paths, first initialisation
            fn()
        samples: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(repeats):
            for name, fn in fns.items():  # alternate, so drift hits both sides alike
                samples[name].append(rate(fn))
        med = {name: statistics.median(v) for name, v in samples.items()}
        results[mode] = {"flowrl_items_per_s": med["flowrl"], "hand_items_per_s": med["hand-written"],
                         "ratio": med["flowrl"] / med["hand-written"], "samples": samples}

    ideal = args.workers / WORK_S
    print(f"\n{args.workers} shard actors, {WORK_S * 1000:.0f} ms (sleep) per item, num_async={args.num_async}, "
          f"{items} items per run, median of {repeats} alternating runs; ideal {ideal:,.0f} items/s\n")
    print("| mode | flowrl items/s | hand-written items/s | flowrl / hand-written |")
    print("|---|---:|---:|---:|")
    for mode, r in results.items():
        label = "gather_sync" if mode == "sync" else f"gather_async(num_async={args.num_async})"
        print(f"| {label} | {r['flowrl_items_per_s']:,.0f} | {r['hand_items_per_s']:,.0f} | {r['ratio']:.3f} |")
    worst = min(r["ratio"] for r in results.values())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "iter_overhead", "overhead_ratio": worst, "results": results,
        "params": {"workers": args.workers, "num_async": args.num_async, "items": items, "repeats": repeats,
                   "work_s": WORK_S},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "ray": ray.__version__}}, indent=2))
    ray.shutdown()
    print(f"\nwrote {out}")
    print(f"overhead_ratio={worst:.3f}")


if __name__ == "__main__":
    main()
