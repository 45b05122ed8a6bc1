"""Every algorithm on CartPole-v1: env steps/s sampled and trained, and the learner's utilisation.

PG, A2C, A3C, PPO, DQN, Ape-X, IMPALA and APPO (each when its module imports) run with ``--workers`` remote
rollout workers x ``--envs-per-worker`` envs. Each algorithm gets one WorkerSet, reused by its ``--runs`` runs;
every run builds a fresh plan on it and measures from its first report that has trained something (so
start-up, the first weight broadcast and a replay buffer's ``learning_starts`` fill are apart) for
``--seconds`` of wall time, ending on the first report past that:

- env steps/s sampled and trained: the growth of ``num_steps_sampled`` / ``num_steps_trained`` over the window;
- learner utilisation: the seconds the driver's learner spent in the local worker's ``learn_on_batch``,
  ``compute_gradients`` and ``apply_gradients`` during the window (wrappers on the instance sum every call,
  from the plan's thread or a learner thread), divided by the window. The methods that ran are listed beside
  it: A3C computes its gradients on the rollout workers, so its figure is the driver's ``apply_gradients``
  time alone, not a learner's. The asynchronous plans' learner threads also report ``updates x mean grad
  time / wall`` (their ``learner_grad`` timer keeps the last 10 calls only) as a check; ``-`` elsewhere.

Each figure is the median of ``--runs`` runs; the algorithms run one after another in one process, on one Ray
instance, so their ratios are what to compare. Configs are each algorithm's defaults except
for reporting (a report at least every ``--report-s`` seconds, no step gate: ``min_iter_time_s`` and
``timesteps_per_iteration`` gate reports only, never learning) and the overrides in ``_OVERRIDES``, each with
its reason.

Run: ``python benchmarks/throughput.py [--quick] [--algos pg,ppo] [--workers 2,4] [--runs 3] [--seconds 20]``.
The last line is ``<algo>_env_steps_per_s=<median env steps sampled per second> ...``, one pair per algorithm in
``--algos`` order at the first worker count (``nan`` for one that failed), e.g.
``pg_env_steps_per_s=5012.3 a2c_env_steps_per_s=4410.0 ...``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import platform
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import flowrl  # noqa: E402,F401  (sets Ray's loopback variable before ray is imported)
from flowrl import runtime  # noqa: E402
from flowrl.testing.network import keep_traffic_on_loopback  # noqa: E402

import torch  # noqa: E402

from flowrl.algorithms import ALGORITHMS, get_algorithm  # noqa: E402
from flowrl.metrics import NUM_LEARNER_UPDATES  # noqa: E402
from flowrl.workers import WorkerSet  # noqa: E402

keep_traffic_on_loopback()  # Ray's start-up probe of the cloud metadata address stays on this machine


def _default_env(name: str) -> Any:
    """The ``env`` field's default of algorithm ``name``'s config (continuous-control ones: Pendulum-v1)."""
    return next(f.default for f in dataclasses.fields(get_algorithm(name).config_class) if f.name == "env")


# Every registered algorithm (flowrl.algorithms.ALGORITHMS, in its order) for CartPole's discrete actions: not the
# two-policy composition, which needs a multi-agent env, nor those for continuous actions (SAC, DDPG, ...: their
# config's default env is not CartPole-v1; benchmarks/sac_pendulum.py benchmarks SAC), nor those made to learn from
# a recorded dataset (benchmarks/offline.py measures MARWIL, BC and CQL on the datasets it records).
OFFLINE = ("marwil", "bc", "cql", "cql_dqn")
ALGOS = tuple(name for name in ALGORITHMS
              if name != "multiagent" and name not in OFFLINE and _default_env(name) == "CartPole-v1")
LEARNER_METHODS = ("learn_on_batch", "compute_gradients", "apply_gradients")
MEDIAN_KEYS = ("env_steps_per_s_sampled", "env_steps_per_s_trained", "learner_utilisation",
               "learner_utilisation_from_timer")


def tuned(name: str, *, without: Sequence[str] = ()) -> dict[str, Any]:
    """The settings of the algorithm's CartPole-v1 preset (:mod:`flowrl.presets`, what ``flowrl train --tuned``
    applies) as config fields, less those in ``without``.

    Examples:
        >>> tuned("ppo", without=["num_workers", "num_envs_per_worker", "rollout_fragment_length"])
        {'train_batch_size': 4000, 'sgd_minibatch_size': 128, 'num_sgd_iter': 6, 'lr': 0.0003}
    """
    from flowrl.cli import parse_overrides
    from flowrl.presets import find_preset

    preset = find_preset(name, "CartPole-v1")
    if preset is None:
        raise ValueError(f"flowrl.presets has no CartPole-v1 preset for {name!r}")
    fields = {".".join(path): value for path, value in parse_overrides(get_algorithm(name).config_class,
                                                                         preset.settings)}
    return {key: value for key, value in fields.items() if key not in without}


# Per-algorithm settings on top of its defaults (none for an algorithm not listed). Each needs a reason; the worker
# count, envs per worker, seed and the reporting cadence are set for all alike in make_config.
_OVERRIDES: dict[str, dict[str, Any]] = {
    "pg": {},
    "a2c": {},
    "a3c": {},
    # RLlib's generic PPO defaults (30 epochs, lr 5e-5) make one iteration ~6 s of SGD on 2 cores, longer than
    # a quick window; the tuned CartPole preset (the hyperparameters the peers run) instead: 6 epochs of minibatch
    # 128 at lr 3e-4. The fragment is set in make_config so one sampling round fills the 4000-step batch.
    "ppo": tuned("ppo", without=["num_workers", "num_envs_per_worker", "rollout_fragment_length"]),
    # DQN's defaults already start learning after 1000 steps; nothing to change.
    "dqn": {},
    # Ape-X's defaults are for 32 workers on a cluster: learning_starts 50k would put the whole window before the
    # first update, and 4 shards of a 2M buffer on 2 cores measure the shards, not the plan. One shard of 50k,
    # learning from 1000 steps.
    "apex": {"num_replay_buffer_shards": 1, "learning_starts": 1000, "buffer_size": 50_000},
    "impala": {},
    "appo": {},
}


class LearnerClock:
    """Wraps the learner methods of a worker (on the instance) and sums the seconds spent in each.

    Thread-safe: the asynchronous plans call ``learn_on_batch`` from their learner thread.

    Examples:
        >>> class Worker:
        ...     def learn_on_batch(self, batch): return {"n": batch}
        ...     def apply_gradients(self, grads): return None
        >>> worker = Worker()
        >>> clock = LearnerClock(worker)
        >>> worker.learn_on_batch(3), worker.learn_on_batch(4), worker.apply_gradients([])
        ({'n': 3}, {'n': 4}, None)
        >>> {name: calls for name, (_, calls) in clock.read().items()}
        {'learn_on_batch': 2, 'apply_gradients': 1}
    """

    def __init__(self, worker: Any, methods: Sequence[str] = LEARNER_METHODS) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, list[float]] = {}
        for name in methods:
            if callable(getattr(worker, name, None)):
                self._totals[name] = [0.0, 0]
                setattr(worker, name, self._timed(name, getattr(worker, name)))

    def _timed(self, name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                with self._lock:
                    total = self._totals[name]
                    total[0] += time.perf_counter() - start
                    total[1] += 1
        return timed

    def read(self) -> dict[str, tuple[float, int]]:
        """``{method: (seconds, calls)}`` so far, for every wrapped method."""
        with self._lock:
            return {name: (t[0], int(t[1])) for name, t in self._totals.items()}


def window_delta(before: dict[str, tuple[float, int]],
                 after: dict[str, tuple[float, int]]) -> tuple[float, dict[str, int]]:
    """The learner seconds between two :meth:`LearnerClock.read` snapshots, and the calls per method that ran.

    Examples:
        >>> window_delta({"learn_on_batch": (1.0, 10), "apply_gradients": (0.0, 0)},
        ...              {"learn_on_batch": (3.5, 15), "apply_gradients": (0.0, 0)})
        (2.5, {'learn_on_batch': 5})
    """
    seconds = sum(after[m][0] - before[m][0] for m in after)
    calls = {m: after[m][1] - before[m][1] for m in after if after[m][1] > before[m][1]}
    return seconds, calls


def median_of(runs: Sequence[dict[str, Any]], key: str) -> float | None:
    """The median of ``key`` over the runs that have it (``None`` values left out; ``None`` if none has it).

    Examples:
        >>> median_of([{"x": 3.0}, {"x": 1.0}, {"x": 2.0}], "x")
        2.0
        >>> median_of([{"x": None}, {"x": None}], "x") is None
        True
    """
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def load(name: str) -> Any | None:
    """The algorithm's module, or ``None`` if it is missing or does not import."""
    try:
        module = importlib.import_module(f"flowrl.algorithms.{name}")
    except ImportError as e:
        print(f"skipping {name}: flowrl/algorithms/{name}.py does not import ({e})", flush=True)
        return None
    return module if hasattr(module, "ALGORITHM") else None


def make_config(module: Any, name: str, workers: int, args: argparse.Namespace) -> Any:
    """The algorithm's default config with the benchmark's common settings and its ``_OVERRIDES``."""
    extra = dict(_OVERRIDES.get(name, {}))
    if name == "ppo":  # one sampling round per train batch (fragment x envs x workers >= train_batch_size)
        batch = module.ALGORITHM.config_class().train_batch_size
        extra["rollout_fragment_length"] = math.ceil(batch / (max(1, workers) * args.envs_per_worker))
    return module.ALGORITHM.config_class(env="CartPole-v1", seed=args.seed, num_workers=workers,
                                         num_envs_per_worker=args.envs_per_worker, min_iter_time_s=args.report_s,
                                         timesteps_per_iteration=0, **extra)


def one_run(module: Any, config: Any, workers: WorkerSet, clock: LearnerClock, seconds: float) -> dict[str, Any]:
    """A fresh plan on ``workers``; figures over ``seconds`` of wall time after its first trained report."""
    it = module.ALGORITHM.plan(workers, config)
    try:
        result = next(it)
        while result["info"]["num_steps_trained"] == 0:
            result = next(it)
        t0, info0, clock0 = time.perf_counter(), result["info"], clock.read()
        updates0 = info0.get(NUM_LEARNER_UPDATES)
        while (elapsed := time.perf_counter() - t0) < seconds:
            result = next(it)
        busy, calls = window_delta(clock0, clock.read())
    finally:
        it.close()
    info = result["info"]
    from_timer = None
    if updates0 is not None and NUM_LEARNER_UPDATES in info:  # a learner thread's own timer
        grad_ms = info.get("timing_breakdown", {}).get("learner_grad_time_ms", 0.0)
        from_timer = (info[NUM_LEARNER_UPDATES] - updates0) * grad_ms / 1000 / elapsed
    return {"wall_s": round(elapsed, 2),
            "env_steps_per_s_sampled": (info["num_steps_sampled"] - info0["num_steps_sampled"]) / elapsed,
            "env_steps_per_s_trained": (info["num_steps_trained"] - info0["num_steps_trained"]) / elapsed,
            "learner_utilisation": busy / elapsed, "learner_utilisation_from_timer": from_timer,
            "learner_calls": calls, "learner_queue_mean": info.get("learner_queue", {}).get("size_mean")}


def bench(name: str, module: Any, num_workers: int, args: argparse.Namespace) -> dict[str, Any]:
    """``args.runs`` runs of ``name`` on one WorkerSet of ``num_workers``; their medians and each run."""
    config = make_config(module, name, num_workers, args)
    start = time.perf_counter()
    workers = WorkerSet(policy_class=module.ALGORITHM.policy_class, config=config)
    try:
        if workers.check_health(timeout_s=120):
            raise RuntimeError(f"{name}: a rollout worker did not start")
        startup_s = time.perf_counter() - start
        clock = LearnerClock(workers.local_worker())
        runs = []
        for i in range(args.runs):
            runs.append(one_run(module, config, workers, clock, args.seconds))
            r = runs[-1]
            print(f"{name} x{num_workers} run {i}: {r['env_steps_per_s_sampled']:.0f} sampled/s, "
                  f"{r['env_steps_per_s_trained']:.0f} trained/s, learner {100 * r['learner_utilisation']:.0f}% "
                  f"({', '.join(r['learner_calls']) or 'no learner calls'})", flush=True)
    finally:
        workers.stop()
    median = {k: (None if (v := median_of(runs, k)) is None else round(v, 3 if "util" in k else 1))
              for k in MEDIAN_KEYS}
    timed = sorted({m for r in runs for m in r["learner_calls"]}, key=LEARNER_METHODS.index)
    return {"algorithm": name, "workers": num_workers, "envs_per_worker": args.envs_per_worker,
            "rollout_fragment_length": config.rollout_fragment_length, "train_batch_size": config.train_batch_size,
            "overrides": _OVERRIDES.get(name, {}), "learner_timed": timed, "startup_s": round(startup_s, 2),
            "median": median,
            "runs": [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in runs]}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; ``--quick`` keeps the first worker count and caps runs at 2 and seconds at 3.

    Examples:
        >>> args = parse_args(["--quick", "--algos", "pg,a3c", "--workers", "2,4"])
        >>> args.algos, args.worker_counts, args.runs, args.seconds
        (['pg', 'a3c'], [2], 2, 3.0)
        >>> parse_args([]).out
        'benchmarks/results/throughput.json'
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--algos", default=",".join(ALGOS), help=f"comma-separated, from {','.join(ALGOS)}")
    parser.add_argument("--workers", default="2,4", help="remote rollout worker counts, comma-separated")
    parser.add_argument("--envs-per-worker", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3, help="runs per configuration; figures are their median")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured wall seconds per run")
    parser.add_argument("--report-s", type=float, default=1.0, help="min_iter_time_s: seconds per report")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, default=1, help="intra-op threads of the learner (driver)")
    parser.add_argument("--quick", action="store_true", help="the first worker count only, 2 runs of 3 s each")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/throughput[_quick].json)")
    args = parser.parse_args(argv)
    args.algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    unknown = sorted(set(args.algos) - set(ALGOS))
    if unknown:
        parser.error(f"--algos: unknown {unknown}; choose from {','.join(ALGOS)}")
    try:
        args.worker_counts = [int(n) for n in args.workers.split(",")]
    except ValueError:
        parser.error(f"--workers={args.workers!r} must be comma-separated ints, e.g. 2,4")
    if not args.worker_counts or min(args.worker_counts) < 1:
        parser.error(f"--workers={args.workers!r}: every count must be >= 1 (A3C needs remote workers)")
    if args.runs < 1 or args.seconds <= 0:
        parser.error(f"--runs={args.runs} must be >= 1 and --seconds={args.seconds} > 0")
    if args.quick:
        args.worker_counts, args.runs, args.seconds = args.worker_counts[:1], min(args.runs, 2), min(args.seconds, 3.0)
    args.out = args.out or f"benchmarks/results/throughput{'_quick' if args.quick else ''}.json"
    return args


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def table(results: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    """The markdown table of ``results`` (one row per algorithm and worker count)."""
    lines = [f"| flowrl, CartPole-v1, {args.envs_per_worker} envs/worker, median of {args.runs} x {args.seconds:g} s "
             f"| workers | env steps/s sampled | env steps/s trained | learner utilisation (what is timed) "
             f"| learner thread's timer | start-up s |", "| --- | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['algorithm']} | {r['workers']} | failed: {r['error'][:80]} | | | | |")
            continue
        m = r["median"]
        timed = ", ".join(r["learner_timed"]) or "nothing ran"
        if r["learner_timed"] == ["apply_gradients"]:
            timed += "; gradients computed on the workers"
        lines.append(f"| {r['algorithm']} (fragment {r['rollout_fragment_length']}, train batch "
                     f"{r['train_batch_size']}) | {r['workers']} | {m['env_steps_per_s_sampled']} "
                     f"| {m['env_steps_per_s_trained']} | {_pct(m['learner_utilisation'])} ({timed}) "
                     f"| {_pct(m['learner_utilisation_from_timer'])} | {r['startup_s']} |")
    return "\n".join(lines)


def summary_line(results: Sequence[dict[str, Any]], algos: Sequence[str], workers: int) -> str:
    """The last line: each algorithm's median env steps/s sampled at ``workers`` workers (``nan`` if missing).

    Examples:
        >>> summary_line([{"algorithm": "pg", "workers": 2, "median": {"env_steps_per_s_sampled": 5000.0}},
        ...               {"algorithm": "ppo", "workers": 2, "error": "boom"}], ["pg", "ppo"], 2)
        'pg_env_steps_per_s=5000.0 ppo_env_steps_per_s=nan'
    """
    found = {r["algorithm"]: r["median"]["env_steps_per_s_sampled"] for r in results
             if r["workers"] == workers and "error" not in r}
    return " ".join(f"{a}_env_steps_per_s={found.get(a, 'nan')}" for a in algos)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    runtime.init(num_cpus=max(args.worker_counts) + 2, log_to_driver=False)
    results: list[dict[str, Any]] = []
    for name in args.algos:
        module = load(name)
        for n in args.worker_counts if module is not None else []:
            try:
                results.append(bench(name, module, n, args))
            except Exception as e:  # one broken plan must not hide the others' figures
                print(f"{name} x{n} FAILED: {type(e).__name__}: {e}", flush=True)
                results.append({"algorithm": name, "workers": n, "error": f"{type(e).__name__}: {e}"})
    print("\n" + table(results, args))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "throughput", "quick": args.quick, "runs": args.runs,
                               "seconds": args.seconds, "envs_per_worker": args.envs_per_worker,
                               "report_s": args.report_s, "seed": args.seed, "results": results,
                               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                           "load_avg": os.getloadavg(), "python": platform.python_version(),
                                           "torch": torch.__version__}}, indent=2) + "\n")
    print(summary_line(results, args.algos, args.worker_counts[0]))


if __name__ == "__main__":
    main()
