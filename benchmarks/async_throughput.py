"""The asynchronous plans on CartPole-v1: env steps/s sampled and trained, and the learner's utilisation.

IMPALA, APPO and Ape-X (each when its module imports) run with 2-4 remote rollout workers. Every run builds
a fresh plan and measures from its first report that has trained something (so start-up, the first weight
sync and Ape-X's ``learning_starts`` fill are apart) for ``--seconds`` of wall time:

- env steps/s sampled and trained: the growth of ``num_steps_sampled`` / ``num_steps_trained`` over the window;
- learner utilisation: seconds the learner thread spent inside ``learn_on_batch`` during the window, divided by
  the window (a wrapper on the local worker's method sums every call; the learner threads' own ``learner_grad``
  timers only keep the last 10 calls, so ``updates x mean grad time / wall`` is reported beside it as a check).

Each figure is the median of ``--runs`` runs; the algorithms run side by side in one process, on one Ray
instance, so their ratios are what to compare (PERFORMANCE.md). Configs are each algorithm's defaults except
for the knobs listed in the table (Ape-X: one replay shard, ``learning_starts`` 1000, a 50k buffer).

Run: ``python benchmarks/async_throughput.py [--quick] [--workers 2,4] [--runs 3] [--seconds 20]``.
The last line is ``async_env_steps_per_s=<IMPALA's env steps sampled per second, the first worker count>``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import flowrl  # noqa: E402,F401  (sets Ray's loopback variable before ray is imported)
from flowrl import runtime  # noqa: E402

import torch  # noqa: E402

from flowrl.metrics import NUM_LEARNER_UPDATES  # noqa: E402
from flowrl.workers import WorkerSet  # noqa: E402

ALGOS = ("impala", "appo", "apex")
_OVERRIDES: dict[str, dict[str, Any]] = {
    "impala": {},
    "appo": {},
    "apex": {"num_replay_buffer_shards": 1, "learning_starts": 1000, "buffer_size": 50_000,
             "timesteps_per_iteration": 0},
}


class _LearnClock:
    """Wraps a worker's ``learn_on_batch`` (on the instance) and sums the seconds spent in it."""

    def __init__(self, worker: Any) -> None:
        self.total_s, self.calls = 0.0, 0
        self._lock = threading.Lock()
        inner = worker.learn_on_batch

        def timed(batch: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(batch)
            finally:
                with self._lock:
                    self.total_s += time.perf_counter() - start
                    self.calls += 1

        worker.learn_on_batch = timed

    def read(self) -> tuple[float, int]:
        with self._lock:
            return self.total_s, self.calls


def load(name: str) -> Any | None:
    """The algorithm's module, or ``None`` if it is missing or does not import."""
    try:
        module = importlib.import_module(f"flowrl.algorithms.{name}")
    except ImportError as e:
        print(f"skipping {name}: flowrl/algorithms/{name}.py does not import ({e})", flush=True)
        return None
    return module if hasattr(module, "ALGORITHM") else None


def make_config(module: Any, name: str, workers: int, args: argparse.Namespace) -> Any:
    return module.ALGORITHM.config_class(env="CartPole-v1", seed=args.seed, num_workers=workers,
                                         num_envs_per_worker=args.envs_per_worker,
                                         min_iter_time_s=args.report_s, **_OVERRIDES[name])


def one_run(module: Any, config: Any, workers: WorkerSet, clock: _LearnClock, seconds: float) -> dict[str, Any]:
    """A fresh plan on ``workers``; figures over ``seconds`` of wall time after its first trained report."""
    it = module.ALGORITHM.plan(workers, config)
    try:
        result = next(it)
        while result["info"]["num_steps_trained"] == 0:
            result = next(it)
        t0, info0 = time.perf_counter(), result["info"]
        busy0, calls0 = clock.read()
        updates0 = info0.get(NUM_LEARNER_UPDATES, 0)
        while (elapsed := time.perf_counter() - t0) < seconds:
            result = next(it)
        busy, calls = clock.read()
    finally:
        it.close()
    info = result["info"]
    updates = info.get(NUM_LEARNER_UPDATES, 0) - updates0
    grad_ms = info.get("timing_breakdown", {}).get("learner_grad_time_ms", 0.0)
    return {"wall_s": round(elapsed, 2),
            "env_steps_per_s_sampled": (info["num_steps_sampled"] - info0["num_steps_sampled"]) / elapsed,
            "env_steps_per_s_trained": (info["num_steps_trained"] - info0["num_steps_trained"]) / elapsed,
            "learner_utilisation": (busy - busy0) / elapsed,
            "learner_utilisation_from_timer": updates * grad_ms / 1000 / elapsed,
            "learn_calls": calls - calls0, "learner_updates": updates,
            "learner_queue_mean": info.get("learner_queue", {}).get("size_mean")}


def bench(name: str, module: Any, num_workers: int, args: argparse.Namespace) -> dict[str, Any]:
    config = make_config(module, name, num_workers, args)
    start = time.perf_counter()
    workers = WorkerSet(policy_class=module.ALGORITHM.policy_class, config=config)
    try:
        if workers.check_health(timeout_s=120):
            raise RuntimeError(f"{name}: a rollout worker did not start")
        startup_s = time.perf_counter() - start
        clock = _LearnClock(workers.local_worker())
        runs = []
        for i in range(args.runs):
            runs.append(one_run(module, config, workers, clock, args.seconds))
            r = runs[-1]
            print(f"{name} x{num_workers} run {i}: {r['env_steps_per_s_sampled']:.0f} sampled/s, "
                  f"{r['env_steps_per_s_trained']:.0f} trained/s, learner {100 * r['learner_utilisation']:.0f}%",
                  flush=True)
    finally:
        workers.stop()
    keys = ("env_steps_per_s_sampled", "env_steps_per_s_trained", "learner_utilisation",
            "learner_utilisation_from_timer")
    median = {k: round(statistics.median(r[k] for r in runs), 3 if "util" in k else 1) for k in keys}
    return {"algorithm": name, "workers": num_workers, "envs_per_worker": args.envs_per_worker,
            "rollout_fragment_length": config.rollout_fragment_length, "train_batch_size": config.train_batch_size,
            "overrides": _OVERRIDES[name], "startup_s": round(startup_s, 2), "median": median,
            "runs": [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in runs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default=",".join(ALGOS), help="comma-separated, from impala,appo,apex")
    parser.add_argument("--workers", default="2,4", help="remote rollout worker counts, comma-separated (2-4)")
    parser.add_argument("--envs-per-worker", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3, help="runs per configuration; figures are their median")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured wall seconds per run")
    parser.add_argument("--report-s", type=float, default=1.0, help="min_iter_time_s: seconds per report")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, default=1, help="intra-op threads of the learner (driver)")
    parser.add_argument("--quick", action="store_true", help="2 workers only, 2 runs of 5 s each")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/async_throughput"
                                                    "[_quick].json)")
    args = parser.parse_args()
    worker_counts = [int(n) for n in args.workers.split(",")]
    if args.quick:
        worker_counts, args.runs, args.seconds = worker_counts[:1], min(args.runs, 2), min(args.seconds, 5.0)
    torch.set_num_threads(args.torch_threads)
    runtime.init(num_cpus=max(worker_counts) + 2, log_to_driver=False)
    results: list[dict[str, Any]] = []
    for name in args.algos.split(","):
        module = load(name)
        for n in worker_counts if module is not None else []:
            try:
                results.append(bench(name, module, n, args))
            except Exception as e:  # one broken plan must not hide the others' figures
                print(f"{name} x{n} FAILED: {type(e).__name__}: {e}", flush=True)
                results.append({"algorithm": name, "workers": n, "error": f"{type(e).__name__}: {e}"})

    print(f"\n| flowrl, CartPole-v1, {args.envs_per_worker} envs/worker, median of {args.runs} x {args.seconds:g} s "
          f"| workers | env steps/s sampled | env steps/s trained | learner utilisation (timer estimate) "
          f"| start-up s |\n| --- | --- | --- | --- | --- | --- |")
    for r in results:
        if "error" in r:
            print(f"| {r['algorithm']} | {r['workers']} | failed: {r['error'][:80]} | | | |")
            continue
        m = r["median"]
        print(f"| {r['algorithm']} (fragment {r['rollout_fragment_length']}, train batch {r['train_batch_size']}) "
              f"| {r['workers']} | {m['env_steps_per_s_sampled']} | {m['env_steps_per_s_trained']} "
              f"| {100 * m['learner_utilisation']:.0f}% ({100 * m['learner_utilisation_from_timer']:.0f}%) "
              f"| {r['startup_s']} |")
    out = Path(args.out or f"benchmarks/results/async_throughput{'_quick' if args.quick else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "async_throughput", "quick": args.quick, "runs": args.runs,
                               "seconds": args.seconds, "results": results,
                               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                           "load_avg": os.getloadavg(), "python": platform.python_version(),
                                           "torch": torch.__version__}}, indent=2) + "\n")
    impala = [r for r in results if r["algorithm"] == "impala" and "error" not in r]
    value = impala[0]["median"]["env_steps_per_s_sampled"] if impala else "nan"
    print(f"async_env_steps_per_s={value}")


if __name__ == "__main__":
    main()
