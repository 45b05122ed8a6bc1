"""The RLlib Flow paper's sampling microbenchmark: ParallelRollouts against the plain hand-written Ray loop.

N rollout worker actors (:class:`flowrl.workers.RolloutWorker`) sample CartPole-v1 with the paper's dummy policy
(one trainable scalar, random actions: ``benchmarks/dummy.py``), so their time goes to the env and to
coordination. The same actors serve both sides:

- bulk_sync: ``ParallelRollouts(workers, mode="bulk_sync")`` against ``ray.get([w.sample.remote() for w in
  workers])`` and one ``concat_batches`` per round; both sides make the same calls, so parity is the ceiling;
- async: ``ParallelRollouts(workers, mode="async", num_async=k)`` against the straightforward loop:
  ``ray.wait(refs, num_returns=1)``, ``ray.get`` of that one result and a new ``sample`` request to the worker
  it came from, ``k`` requests in flight per worker. flowrl's gather collects *every* ready result per
  ``ray.wait`` (batched waits), which is how the paper's dataflow ran slightly faster than hand-written RLlib.
  On Ray 2.60 here a wait that must time out (the probe, whenever not every request is done) costs ~80 us and one
  that a finished request satisfies ~4 us, so the probe pays off only when several results are ready at once;
  the plain loop's ``num_returns=1`` is cheap but takes finished requests in no fair order (a slow consumer can
  leave one worker's results waiting indefinitely), which flowrl must not do.

Both sides count the env steps they receive (flowrl into ``num_steps_sampled``) and pull the same number of
fragments per run. Throughput is measured in steady state: a run's window opens once its first fragment (bulk_sync:
its first round) is in and closes when the last has been received; what comes before is the side's start-up,
reported apart. For flowrl that is building the plan: ``ParallelRollouts`` broadcasts the weights to every worker
and sets up the shards, ~10 ms more than the hand loop's first fragment, which a training run pays once and which
would otherwise take ~1% of every 1-s window here, as the alternating runs rebuild the plan each time. Each mode is
warmed up once (which also sizes the runs to ``--seconds``), then the sides' runs alternate for ``--repeats``
rounds, each round in the next of the sides' orders (two sides: AB, BA; three: all six in turn); requests left in
flight are drained outside the window. Figures are medians of env steps/s. The suite's ``overhead_ratio`` is the
async ratio (target >= 1.0). Async runs a third side, an identical copy of the hand-written loop (``control``):
``control / hand`` is the noise floor, how far apart two identical sides come out here (0.94-1.05 per run on 2 cores).
Each ratio is also given paired: the median over rounds of the ratio within a round, whose sides ran back
to back, so drift between rounds cancels.
Beside the ratios, each side's driver CPU time per fragment in the window (all the driver's threads, Ray's
included): the coordination cost itself, which moves far less from run to run than throughput does.

Run: ``python benchmarks/rollout_overhead.py [--quick] [--workers 4] [--num-async 2] [--fragment 50]``
(``--quick``: ~1 minute; default: ~2.5 minutes). The last line is ``overhead_ratio=<async flowrl / hand-written>``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import flowrl  # noqa: E402  (before ray: flowrl.runtime keeps Ray on loopback)
from flowrl import runtime  # noqa: E402
from flowrl.testing.network import keep_traffic_on_loopback  # noqa: E402
from flowrl.metrics import STEPS_SAMPLED_COUNTER  # noqa: E402
from flowrl.ops.rollout import ParallelRollouts, concat_batches  # noqa: E402
from flowrl.workers import WorkerSet  # noqa: E402

import ray  # noqa: E402,I001

keep_traffic_on_loopback()  # Ray's start-up probe of the cloud metadata address stays on this machine

try:  # run as a script (benchmarks/ on the path) or imported as benchmarks.rollout_overhead
    import dummy  # type: ignore[import-not-found,no-redef]
except ImportError:
    from benchmarks import dummy  # type: ignore[no-redef]

OUT = Path(__file__).resolve().parent / "results" / "rollout_overhead.json"


class Window:
    """The timed part of one run: from :meth:`start`, which a side calls once its first fragment (bulk_sync: its
    first round) is in, to the run's end. What comes before is the side's start-up, reported apart: building a
    plan broadcasts the weights and sets up the shards once, where a training run builds it once for good."""

    def __init__(self) -> None:
        self.created, self.started, self.started_cpu = time.perf_counter(), math.nan, math.nan

    def start(self) -> None:
        self.started, self.started_cpu = time.perf_counter(), time.process_time()


# -- the two sides: after one untimed fragment (round), each pulls `n` fragments (async) or `n // N` rounds
# (bulk_sync) inside the window and returns the env steps it received there ------------------------------
def flowrl_sync(workers: WorkerSet, n: int, k: int, window: Window) -> int:
    it = ParallelRollouts(workers, mode="bulk_sync")
    next(it)
    before = it.metrics.counters[STEPS_SAMPLED_COUNTER]
    window.start()
    for _ in itertools.islice(it, n // len(workers.remote_workers())):  # not take(): that would keep them all
        pass
    return int(it.metrics.counters[STEPS_SAMPLED_COUNTER] - before)


def hand_sync(workers: WorkerSet, n: int, k: int, window: Window) -> int:
    remote, steps = workers.remote_workers(), 0
    concat_batches(ray.get([w.sample.remote() for w in remote]))
    window.start()
    for _ in range(n // len(remote)):
        steps += concat_batches(ray.get([w.sample.remote() for w in remote])).count
    return steps


def flowrl_async(workers: WorkerSet, n: int, k: int, window: Window) -> int:
    it = ParallelRollouts(workers, mode="async", num_async=k)
    next(it)
    before = it.metrics.counters[STEPS_SAMPLED_COUNTER]
    window.start()
    for _ in itertools.islice(it, n):
        pass
    return int(it.metrics.counters[STEPS_SAMPLED_COUNTER] - before)


def hand_async(workers: WorkerSet, n: int, k: int, window: Window) -> int:
    pending = {w.sample.remote(): w for w in workers.remote_workers() for _ in range(k)}
    steps = 0
    for i in range(n + 1):
        if i == 1:
            window.start()
        [ref], _ = ray.wait(list(pending), num_returns=1)
        worker = pending.pop(ref)
        batch = ray.get(ref)
        pending[worker.sample.remote()] = worker
        steps += batch.count if i else 0
    return steps  # requests still in flight are drained by timed(), outside the window


def hand_async_control(workers: WorkerSet, n: int, k: int, window: Window) -> int:
    """The same hand-written loop run as a third side: ``control / hand`` is how far apart two identical sides
    come out on this machine, the noise floor against which to read ``flowrl / hand``."""
    return hand_async(workers, n, k, window)


Run = Callable[[WorkerSet, int, int, Window], int]
MODES: dict[str, dict[str, Run]] = {"bulk_sync": {"flowrl": flowrl_sync, "hand": hand_sync},
                                    "async": {"flowrl": flowrl_async, "hand": hand_async,
                                              "control": hand_async_control}}


def timed(run: Run, workers: WorkerSet, n: int, k: int) -> tuple[float, float, float]:
    """``(env steps/s in the window, start-up seconds before it, driver CPU seconds per fragment in it)`` of one
    run; afterwards waits (untimed) until every worker is idle again. The driver's CPU time counts all its threads
    (Ray's own included): on a machine that the workers keep busy, it is CPU taken from them."""
    window = Window()
    steps = run(workers, n, k, window)
    end, end_cpu = time.perf_counter(), time.process_time()
    ray.get([w.ping.remote() for w in workers.remote_workers()])  # an actor runs its calls in order
    if math.isnan(window.started):
        raise RuntimeError(f"{run.__name__} never started its timed window; call window.start() after the first "
                           f"fragment")
    expected = n * workers.config.rollout_fragment_length * workers.config.num_envs_per_worker
    if steps != expected:
        raise RuntimeError(f"{run.__name__} sampled {steps} env steps in its window, expected {expected}")
    return steps / (end - window.started), window.started - window.created, (end_cpu - window.started_cpu) / n


def paired_ratio(side: list[float], base: list[float]) -> float:
    """Median over rounds of ``side[i] / base[i]``: each round runs every side once, back to back, so the drift
    between rounds (other load, CPU clocks) cancels within a pair; read it beside the ratio of the medians.

    Examples:
        >>> paired_ratio([10.0, 20.0, 30.0], [10.0, 25.0, 25.0])
        1.0
    """
    if not side or len(side) != len(base):
        raise ValueError(f"paired_ratio needs two equally long non-empty lists, got {len(side)} and {len(base)}")
    return statistics.median(s / b for s, b in zip(side, base))


def measure(runs: dict[str, Run], workers: WorkerSet, k: int, seconds: float, repeats: int) -> dict[str, Any]:
    w = len(workers.remote_workers())
    warm = {name: timed(run, workers, 10 * w, k)[0] for name, run in runs.items()}
    steps_per_fragment = workers.config.rollout_fragment_length * workers.config.num_envs_per_worker
    n = max(w, round(max(warm.values()) * seconds / steps_per_fragment))
    n = math.ceil(n / w) * w  # whole bulk_sync rounds, so both sides pull exactly n fragments
    samples: dict[str, list[float]] = {name: [] for name in runs}
    startup: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    orders = list(itertools.permutations(runs))  # two sides: AB, BA (ABBA); three: the six orders in turn
    for rep in range(repeats):
        for name in orders[rep % len(orders)]:  # every side in every position alike: drift hits all alike
            rate, startup_s, cpu_s = timed(runs[name], workers, n, k)
            samples[name].append(rate)
            startup[name].append(startup_s)
            cpu[name].append(cpu_s)
    med = {name: statistics.median(v) for name, v in samples.items()}
    startup_ms = {name: 1e3 * statistics.median(v) for name, v in startup.items()}
    cpu_us = {name: 1e6 * statistics.median(v) for name, v in cpu.items()}
    return {"fragments_per_run": n, "flowrl_steps_per_s": med["flowrl"], "hand_steps_per_s": med["hand"],
            "ratio": med["flowrl"] / med["hand"], "control_ratio": med["control"] / med["hand"] if "control" in med
            else None, "paired_ratio": paired_ratio(samples["flowrl"], samples["hand"]),
            "control_paired_ratio": paired_ratio(samples["control"], samples["hand"]) if "control" in med else None,
            "flowrl_startup_ms": startup_ms["flowrl"],
            "hand_startup_ms": startup_ms["hand"], "flowrl_driver_cpu_us_per_fragment": cpu_us["flowrl"],
            "hand_driver_cpu_us_per_fragment": cpu_us["hand"], "samples": samples, "startup_s": startup,
            "driver_cpu_s_per_fragment": cpu, "warmup": warm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4, help="rollout worker actors")
    parser.add_argument("--num-async", type=int, default=2, help="sample requests in flight per worker (async)")
    parser.add_argument("--fragment", type=int, default=50, help="env steps per sample() (rollout_fragment_length)")
    parser.add_argument("--step-ms", type=float, default=0.0, help="sleep per env step (0: plain CartPole)")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per run (sized at warm-up)")
    parser.add_argument("--repeats", type=int, default=6, help="runs per side and mode (medians)")
    parser.add_argument("--num-cpus", type=int, default=os.cpu_count() or 2, help="Ray's logical CPUs")
    parser.add_argument("--quick", action="store_true", help="~1 minute in all: 6 repeats of ~1 s runs")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    repeats, seconds = (6, 1.0) if args.quick else (args.repeats, args.seconds)
    k = args.num_async

    runtime.init(num_cpus=args.num_cpus, log_to_driver=False)
    dummy.ship_by_value()
    workers = WorkerSet(policy_class=dummy.DummyPolicy,
                        config=dummy.rollout_config(num_workers=args.workers, step_ms=args.step_ms,
                                                    fragment=args.fragment, seed=0))
    try:
        if workers.check_health(timeout_s=120):
            raise RuntimeError("a rollout worker did not start within 120 s")
        results = {mode: measure(runs, workers, k, seconds, repeats) for mode, runs in MODES.items()}
    finally:
        workers.stop()
        ray.shutdown()

    env = "CartPole-v1" if args.step_ms == 0 else f"CartPole-v1 sleeping {args.step_ms:g} ms per step"
    print(f"\n{args.workers} rollout workers, dummy policy (one scalar), {env}, fragments of {args.fragment} steps, "
          f"num_async={k}; median of {repeats} alternating runs; env steps/s from each side's first fragment (round) "
          f"on, its start-up before that apart\n")
    print("| mode | fragments/run | flowrl env steps/s | hand-written env steps/s | flowrl / hand-written | "
          "driver CPU us/fragment, flowrl / hand-written | start-up ms, flowrl / hand-written |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode, r in results.items():
        label = "bulk_sync (ray.get per round)" if mode == "bulk_sync" else f"async (ray.wait num_returns=1, k={k})"
        print(f"| {label} | {r['fragments_per_run']} | {r['flowrl_steps_per_s']:,.0f} | "
              f"{r['hand_steps_per_s']:,.0f} | {r['ratio']:.3f} | {r['flowrl_driver_cpu_us_per_fragment']:.0f} / "
              f"{r['hand_driver_cpu_us_per_fragment']:.0f} | {r['flowrl_startup_ms']:.1f} / "
              f"{r['hand_startup_ms']:.1f} |")
    ratio, control = results["async"]["ratio"], results["async"]["control_ratio"]
    print(f"\ncontrol: the hand-written async loop against an identical copy of itself came out at "
          f"{control:.3f} (the noise floor of the ratio above)")
    paired = results["async"]
    print(f"paired (median over rounds of each round's ratio, drift cancelled): async flowrl / hand-written "
          f"{paired['paired_ratio']:.3f}, control / hand-written {paired['control_paired_ratio']:.3f}; bulk_sync "
          f"{results['bulk_sync']['paired_ratio']:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "rollout_overhead", "overhead_ratio": ratio, "bulk_sync_ratio": results["bulk_sync"]["ratio"],
        "async_control_ratio": control,
        "results": results,
        "params": {"workers": args.workers, "num_async": k, "fragment": args.fragment, "step_ms": args.step_ms,
                   "repeats": repeats, "run_seconds": seconds, "num_cpus": args.num_cpus, "quick": args.quick},
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "load_avg": os.getloadavg(),
                    "python": platform.python_version(), "ray": ray.__version__,
                    "flowrl": flowrl.__version__}}, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    print(f"overhead_ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
