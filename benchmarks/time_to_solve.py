"""Every algorithm on CartPole-v1: wall seconds and env steps to a mean return of 150, then 450.

PG, A2C, A3C, PPO, DQN, Ape-X, IMPALA and APPO (each when its module imports) train with their defaults,
except for the settings in ``_SETTINGS`` (each with its reason: the seeded configurations that
tests/algorithms/ shows learning), one algorithm after another in one process on one Ray instance. Each
algorithm and seed gets a fresh WorkerSet and plan, driven by ``next()`` directly (no Trainer, so no
checkpointing or logging on the clock):

- start-up (the worker actors, the plan's construction) is timed apart; training time is the wall clock
  from the first ``next()`` of the plan;
- a threshold is reached at the first report whose ``episode_reward_mean`` (the mean over the last 100
  episodes) is at or above it: its training seconds and ``num_steps_sampled`` then are recorded
  (:func:`first_crossing`); a report comes at the first train step after ``--report-s`` seconds (0.5) since
  the last (``min_iter_time_s``, with no step gate: both gate reports only, never learning), so that, or one
  train step if longer, is the clock's resolution;
- each threshold has a step budget; a run stops when it has
  reached every threshold, when the lowest threshold it has not reached has used up its budget, or after
  ``--max-train-s`` seconds of training (:func:`stop_reason`). Not reached is reported as such, with the final
  return, never estimated.

``--quick``: threshold 150 only, the first of ``--seeds`` (0), small step budgets and at most 15 s of training
per algorithm (about 3 minutes for all 8 on 2 cores); several algorithms do not reach 150 inside that and say
so. The full run: 150 and 450, ``--seeds 0,1,2``, medians over the seeds (a seed that never got there counts as
infinitely slow, so a median that is not finite is "not reached").

Run: ``python benchmarks/time_to_solve.py [--quick] [--algos ppo,dqn] [--seeds 0,1,2] [--max-train-s S]``.
The last line is ``time_to_150_s_median=<x> time_to_450_s_median=<y>``: over the algorithms run, the median
of each algorithm's median training seconds to the threshold (``inf`` when most did not reach it, ``nan``
when it was not measured, as 450 in ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import flowrl  # noqa: E402,F401  (sets Ray's loopback variable before ray is imported)
from flowrl import runtime  # noqa: E402
from flowrl.testing.network import keep_traffic_on_loopback  # noqa: E402

import torch  # noqa: E402

from flowrl.workers import WorkerSet  # noqa: E402

keep_traffic_on_loopback()  # Ray's start-up probe of the cloud metadata address stays on this machine

try:  # run as a script (benchmarks/ on the path) or imported as benchmarks.time_to_solve
    from throughput import ALGOS, load, tuned  # type: ignore[import-not-found]
except ImportError:
    from benchmarks.throughput import ALGOS, load, tuned
THRESHOLDS = (150.0, 450.0)
QUICK_MAX_TRAIN_S = 15.0


@dataclass(frozen=True)
class Setting:
    """How one algorithm runs here.

    Attributes:
        overrides: config fields on top of the algorithm's defaults (the env, seed and reporting aside).
        budgets: env steps sampled by which each threshold must be reached, ``{150: ..., 450: ...}``.
        quick_budget: the step budget for 150 under ``--quick``.
    """

    overrides: Mapping[str, Any]
    budgets: Mapping[float, int]
    quick_budget: int


# Budgets to 150 are RLlib's learning gates for CartPole-v1 (its tuned examples); PG has none and takes
# test_pg's 100k. Budgets to 450 are larger caps of this benchmark's own (test_ppo's 300k for PPO).
_SETTINGS: dict[str, Setting] = {
    # PGConfig's default: no remote workers, the driver samples and learns (test_pg learns this way).
    "pg": Setting({}, {150: 100_000, 450: 300_000}, 50_000),
    # A2CConfig's defaults: 2 workers, lr 1e-4 (test_a2c's slow check: ~140k steps to 150).
    "a2c": Setting({}, {150: 500_000, 450: 1_000_000}, 100_000),
    # A3CConfig's defaults: 2 workers, fragments of 10, lr 1e-4 (test_a3c's slow check: ~40k steps).
    "a3c": Setting({}, {150: 200_000, 450: 500_000}, 60_000),
    # RLlib's generic PPO defaults (30 epochs at lr 5e-5) are not tuned for CartPole; its CartPole preset
    # (flowrl.presets: lr 3e-4, 6 epochs, on 2 workers x 4 envs x 500 steps, one round per 4000-step batch), as
    # ppo_cartpole.py and test_ppo_solves_cartpole_with_two_workers.
    "ppo": Setting(tuned("ppo"), {150: 100_000, 450: 300_000}, 60_000),
    # DQNConfig's default: no remote workers (test_dqn: ~20k steps to 150).
    "dqn": Setting({}, {150: 50_000, 450: 200_000}, 20_000),
    # Ape-X's defaults are for 32 workers on a cluster (learning_starts 50k, a 2M buffer, target updates every
    # 500k trained steps); its CartPole preset (test_apex's learning check) on 2 workers instead, which reaches 150
    # after ~60k steps.
    "apex": Setting({"num_workers": 2, **tuned("apex")}, {150: 250_000, 450: 500_000}, 40_000),
    # IMPALAConfig's and APPOConfig's defaults: 2 workers (test_impala: ~70k steps to 150; test_appo).
    "impala": Setting({}, {150: 500_000, 450: 1_000_000}, 100_000),
    "appo": Setting({}, {150: 200_000, 450: 500_000}, 100_000),
}
# An algorithm not listed above runs with its defaults and IMPALA's budgets, until it earns a reasoned entry.
_UNLISTED = Setting({}, {150: 500_000, 450: 1_000_000}, 100_000)


def init_ray(num_cpus: int, attempts: int = 3) -> None:
    """``runtime.init(num_cpus=...)``, tried again (after ``ray.shutdown()``) when Ray's node does not come up in
    time, which happens on a machine loaded by other work; the last failure is raised."""
    import ray

    for attempt in range(attempts):
        try:
            runtime.init(num_cpus=num_cpus, log_to_driver=False)
            return
        except Exception as error:  # Ray raises a bare Exception for a node that timed out starting up
            if "timed out during startup" not in str(error) or attempt == attempts - 1:
                raise
            print(f"Ray did not start ({error}); trying again", flush=True)
            ray.shutdown()
            time.sleep(5)


def setting_of(name: str) -> Setting:
    """How ``name`` runs here: its ``_SETTINGS`` entry, or the defaults with generous budgets."""
    return _SETTINGS.get(name, _UNLISTED)


@dataclass(frozen=True)
class Crossing:
    """Where a run first reported a return at or above a threshold: training seconds and env steps sampled."""

    seconds: float
    steps: int


def first_crossing(reports: Iterable[tuple[float, int, float]], threshold: float) -> Crossing | None:
    """The first of ``reports`` (``(training seconds, env steps sampled, mean return)``, in order) whose return is
    at or above ``threshold``; ``None`` if none is. A ``nan`` return (no episode finished yet) is below all.

    Examples:
        >>> reports = [(1.0, 1000, float("nan")), (2.0, 2000, 149.9), (3.0, 3000, 150.0), (4.0, 4000, 120.0)]
        >>> first_crossing(reports, 150)
        Crossing(seconds=3.0, steps=3000)
        >>> first_crossing(reports, 450) is None
        True
    """
    for seconds, steps, mean_return in reports:
        if mean_return >= threshold:
            return Crossing(seconds, steps)
    return None


def stop_reason(crossings: Mapping[float, Crossing | None], budgets: Mapping[float, int], steps: int,
                train_s: float, max_train_s: float | None) -> str | None:
    """Why a run stops now, or ``None`` to go on.

    ``"solved"``: every threshold is reached; ``"budget"``: the lowest threshold not reached has used up its
    step budget; ``"time"``: ``max_train_s`` seconds of training are spent.

    Examples:
        >>> budgets = {150: 100, 450: 300}
        >>> stop_reason({150: None, 450: None}, budgets, 50, 1.0, None) is None
        True
        >>> stop_reason({150: None, 450: None}, budgets, 100, 1.0, None)  # 150 not reached within its budget
        'budget'
        >>> stop_reason({150: Crossing(1.0, 80), 450: None}, budgets, 200, 2.0, None) is None
        True
        >>> stop_reason({150: Crossing(1.0, 80), 450: Crossing(2.0, 250)}, budgets, 250, 2.0, None)
        'solved'
        >>> stop_reason({150: None}, {150: 100}, 50, 15.0, 15.0)
        'time'
    """
    unreached = sorted(t for t, hit in crossings.items() if hit is None)
    if not unreached:
        return "solved"
    if steps >= budgets[unreached[0]]:
        return "budget"
    if max_train_s is not None and train_s >= max_train_s:
        return "time"
    return None


def median_or_inf(values: Sequence[float | None]) -> float:
    """The median of ``values`` with ``None`` (not reached) counting as infinitely slow; ``nan`` if empty.

    Examples:
        >>> median_or_inf([12.0, None, 10.0])
        12.0
        >>> median_or_inf([12.0, None, None])
        inf
        >>> median_or_inf([])
        nan
    """
    if not values:
        return math.nan
    return float(statistics.median(math.inf if v is None else v for v in values))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def make_config(module: Any, name: str, seed: int, report_s: float,
                overrides: Mapping[str, Any] | None = None) -> Any:
    """The algorithm's default config on CartPole-v1 with ``seed``, the reporting cadence and its ``_SETTINGS``
    (``overrides``, when given, instead of them)."""
    fields = setting_of(name).overrides if overrides is None else overrides
    return module.ALGORITHM.config_class(env="CartPole-v1", seed=seed, min_iter_time_s=report_s,
                                         timesteps_per_iteration=0, **fields)


def solve(module: Any, name: str, seed: int, thresholds: Sequence[float], budgets: Mapping[float, int],
          max_train_s: float | None, report_s: float = 0.5, verbose: bool = True,
          overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Trains ``name`` with ``seed`` on a fresh WorkerSet until :func:`stop_reason` says stop; the figures.

    Ray must be initialised. The worker set is stopped (and the plan closed) before returning. ``overrides``:
    config fields instead of the algorithm's ``_SETTINGS`` (see :func:`make_config`).
    """
    config = make_config(module, name, seed, report_s, overrides)
    start = time.perf_counter()
    workers = WorkerSet(policy_class=module.ALGORITHM.policy_class, config=config)
    reports: list[tuple[float, int, float]] = []
    crossings: dict[float, Crossing | None] = {t: None for t in thresholds}
    try:
        if workers.check_health(timeout_s=120):  # waits until every actor is up (it imports torch)
            raise RuntimeError(f"{name}: a rollout worker did not start")
        it = module.ALGORITHM.plan(workers, config)
        startup_s = time.perf_counter() - start
        train_start, cpu_start = time.perf_counter(), time.process_time()
        try:
            while True:
                result = next(it)
                train_s, cpu_s = time.perf_counter() - train_start, time.process_time() - cpu_start
                steps = int(result["info"]["num_steps_sampled"])
                ret = float(result.get("episode_reward_mean", math.nan))  # absent before the first episode
                reports.append((train_s, steps, ret))
                crossings = {t: first_crossing(reports, t) for t in thresholds}
                if verbose:
                    print(f"  {name} seed {seed}: {steps:>8} steps  return {ret:6.1f}  {train_s:6.1f} s", flush=True)
                if (reason := stop_reason(crossings, budgets, steps, train_s, max_train_s)) is not None:
                    break
        finally:
            it.close()
    finally:
        workers.stop()
    info = result["info"]
    return {"seed": seed, "workers": config.num_workers, "startup_s": round(startup_s, 2),
            "train_s": round(train_s, 2), "cpu_s": round(cpu_s, 2), "iterations": len(reports), "stopped_by": reason,
            "env_steps_sampled": steps, "env_steps_trained": int(info["num_steps_trained"]),
            "final_return": round(ret, 1),
            **{f"seconds_to_{int(t)}": None if c is None else round(c.seconds, 2) for t, c in crossings.items()},
            **{f"steps_to_{int(t)}": None if c is None else c.steps for t, c in crossings.items()}}


def summarize(runs: Sequence[dict[str, Any]], thresholds: Sequence[float]) -> dict[str, Any]:
    """Medians over the seeds' runs; a threshold not reached by most seeds is ``None``.

    Examples:
        >>> runs = [{"seconds_to_150": 10.0, "steps_to_150": 3000, "final_return": 160.0},
        ...         {"seconds_to_150": None, "steps_to_150": None, "final_return": 90.0},
        ...         {"seconds_to_150": 14.0, "steps_to_150": 5000, "final_return": 155.0}]
        >>> summarize(runs, [150])
        {'seconds_to_150': 14.0, 'steps_to_150': 5000, 'final_return': 155.0, 'reached_150': '2/3'}
    """
    out: dict[str, Any] = {}
    for t in thresholds:
        seconds = _finite(median_or_inf([r[f"seconds_to_{int(t)}"] for r in runs]))
        steps = _finite(median_or_inf([r[f"steps_to_{int(t)}"] for r in runs]))
        out[f"seconds_to_{int(t)}"] = None if seconds is None else round(seconds, 2)
        out[f"steps_to_{int(t)}"] = None if steps is None else round(steps)
    out["final_return"] = statistics.median(r["final_return"] for r in runs) if runs else None
    for t in thresholds:
        out[f"reached_{int(t)}"] = f"{sum(r[f'steps_to_{int(t)}'] is not None for r in runs)}/{len(runs)}"
    return out


def _cell(value: Any, digits: int = 1) -> str:
    if value is None:
        return "not reached"
    if isinstance(value, (int, float)):
        return f"{value:,.{digits}f}"
    return str(value)


def budget_text(budgets: Mapping[float, int], max_train_s: float | None) -> str:
    """The budget column: each threshold's step budget, and the training-time cap if any.

    Examples:
        >>> budget_text({150: 100_000, 450: 300_000}, None)
        '150 by 100k, 450 by 300k steps'
        >>> budget_text({150: 60_000}, 15.0)
        '150 by 60k steps; 15 s'
    """
    text = ", ".join(f"{int(t)} by {n // 1000}k" for t, n in sorted(budgets.items())) + " steps"
    return text + (f"; {max_train_s:g} s" if max_train_s is not None else "")


def table(results: Sequence[dict[str, Any]], seeds: Sequence[int]) -> str:
    """The markdown table, one row per algorithm (medians over ``seeds``; '-' where not measured)."""
    lines = [f"| algorithm (CartPole-v1, median of seeds {','.join(map(str, seeds))}) | workers | s to 150 "
             f"| steps to 150 | s to 450 | steps to 450 | final return | budget |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['algorithm']} | {r.get('workers', '')} | failed: {r['error'][:80]} | | | | | |")
            continue
        m = r["median"]
        cells = [("-" if f"{kind}_to_{t}" not in m else _cell(m[f"{kind}_to_{t}"], 1 if kind == "seconds" else 0))
                 for t in (150, 450) for kind in ("seconds", "steps")]
        lines.append(f"| {r['algorithm']} | {r['workers']} | {' | '.join(cells)} | {_cell(m['final_return'])} "
                     f"| {r['budget']} |")
    return "\n".join(lines)


def summary_line(results: Sequence[dict[str, Any]], thresholds: Sequence[float]) -> str:
    """``time_to_150_s_median=... time_to_450_s_median=...``: the median over algorithms of their median seconds.

    Examples:
        >>> results = [{"median": {"seconds_to_150": 10.0}}, {"median": {"seconds_to_150": None}},
        ...            {"median": {"seconds_to_150": 30.0}}, {"error": "boom"}]
        >>> summary_line(results, [150])
        'time_to_150_s_median=30.0 time_to_450_s_median=nan'
    """
    parts = []
    for t in THRESHOLDS:
        value = math.nan
        if t in thresholds:
            value = median_or_inf([r["median"][f"seconds_to_{int(t)}"] for r in results if "error" not in r])
        parts.append(f"time_to_{int(t)}_s_median={round(value, 2) if math.isfinite(value) else value}")
    return " ".join(parts)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line. ``--quick``: threshold 150, the first seed, quick budgets and a 15 s training cap.

    Examples:
        >>> args = parse_args(["--quick", "--algos", "ppo,dqn", "--seeds", "3,4"])
        >>> args.algos, args.seeds, args.thresholds, args.max_train_s, args.out
        (['ppo', 'dqn'], [3], [150.0], 15.0, 'benchmarks/results/time_to_solve_quick.json')
        >>> full = parse_args([])
        >>> full.seeds, full.thresholds, full.max_train_s
        ([0, 1, 2], [150.0, 450.0], None)
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--algos", default=",".join(ALGOS), help=f"comma-separated, from {','.join(ALGOS)}")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds; figures are medians over them")
    parser.add_argument("--max-train-s", type=float, default=None,
                        help=f"cap on each run's training seconds (default none; {QUICK_MAX_TRAIN_S:g} with --quick)")
    parser.add_argument("--report-s", type=float, default=0.5,
                        help="min_iter_time_s: the least seconds between reports (the clock's resolution)")
    parser.add_argument("--torch-threads", type=int, default=1, help="intra-op threads of the learner (driver)")
    parser.add_argument("--quick", action="store_true",
                        help=f"threshold 150 only, the first seed, small budgets, <= {QUICK_MAX_TRAIN_S:g} s each")
    parser.add_argument("--out", default=None,
                        help="JSON path (default benchmarks/results/time_to_solve[_quick].json)")
    args = parser.parse_args(argv)
    args.algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    unknown = sorted(set(args.algos) - set(ALGOS))
    if unknown or not args.algos:
        parser.error(f"--algos: unknown {unknown}; choose from {','.join(ALGOS)}")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds={args.seeds!r} must be comma-separated ints, e.g. 0,1,2")
    if args.max_train_s is not None and args.max_train_s <= 0:
        parser.error(f"--max-train-s={args.max_train_s} must be > 0")
    args.thresholds = list(THRESHOLDS)
    if args.quick:
        args.seeds, args.thresholds = args.seeds[:1], [THRESHOLDS[0]]
        args.max_train_s = QUICK_MAX_TRAIN_S if args.max_train_s is None else min(args.max_train_s, QUICK_MAX_TRAIN_S)
    args.out = args.out or f"benchmarks/results/time_to_solve{'_quick' if args.quick else ''}.json"
    return args


def budgets_for(name: str, thresholds: Sequence[float], quick: bool) -> dict[float, int]:
    """The step budget of each threshold for ``name`` (``--quick``: its quick budget for 150).

    Examples:
        >>> budgets_for("ppo", [150.0, 450.0], quick=False), budgets_for("ppo", [150.0], quick=True)
        ({150.0: 100000, 450.0: 300000}, {150.0: 60000})
    """
    setting = setting_of(name)
    return {t: setting.quick_budget if quick else setting.budgets[t] for t in thresholds}


def bench(name: str, module: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Every seed of ``name``; the runs and their medians."""
    budgets = budgets_for(name, args.thresholds, args.quick)
    runs = [solve(module, name, seed, args.thresholds, budgets, args.max_train_s, args.report_s)
            for seed in args.seeds]
    for r in runs:
        hits = ", ".join(f"{int(t)}: not reached" if r[f"steps_to_{int(t)}"] is None
                         else f"{int(t)}: {r[f'seconds_to_{int(t)}']} s, {r[f'steps_to_{int(t)}']} steps"
                         for t in args.thresholds)
        print(f"{name} seed {r['seed']}: {hits}; final return {r['final_return']} ({r['stopped_by']})", flush=True)
    return {"algorithm": name, "workers": runs[0]["workers"], "overrides": dict(setting_of(name).overrides),
            "budgets": {str(int(t)): n for t, n in budgets.items()}, "max_train_s": args.max_train_s,
            "budget": budget_text(budgets, args.max_train_s), "median": summarize(runs, args.thresholds),
            "runs": runs}


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    runtime.init(num_cpus=4, log_to_driver=False)  # 2 rollout workers at 1 CPU each, and room to spare
    results: list[dict[str, Any]] = []
    for name in args.algos:
        module = load(name)
        if module is None:
            continue
        try:
            results.append(bench(name, module, args))
        except Exception as e:  # one broken plan must not hide the others' figures
            print(f"{name} FAILED: {type(e).__name__}: {e}", flush=True)
            results.append({"algorithm": name, "error": f"{type(e).__name__}: {e}"})
    print("\n" + table(results, args.seeds))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "time_to_solve", "quick": args.quick, "seeds": args.seeds,
                               "thresholds": args.thresholds, "max_train_s": args.max_train_s,
                               "report_s": args.report_s, "results": results,
                               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                           "load_avg": os.getloadavg(), "python": platform.python_version(),
                                           "torch": torch.__version__}}, indent=2) + "\n")
    print(summary_line(results, args.thresholds))


if __name__ == "__main__":
    main()
