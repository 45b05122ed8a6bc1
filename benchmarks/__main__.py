"""The benchmark suite: ``python -m benchmarks all [--quick]``, or ``python -m benchmarks NAME [NAME ...]``.

Every run is a subprocess of its script (a fresh process and Ray instance each time), whose JSON the suite reads:

- ``rollout_overhead``: the paper's sampling microbenchmark, ParallelRollouts over rollout workers with a dummy
  policy against the plain hand-written Ray loops over the same actors (``benchmarks/rollout_overhead.py``, which
  alternates the two sides itself); its async ratio is the summary's ``overhead_ratio``.
- ``sampling``: one RolloutWorker against its raw envs (``benchmarks/sampling.py``, alternating, >= 3 rounds).
- ``throughput``: env steps/s sampled and trained for PG, A2C, A3C, PPO, DQN, Ape-X, IMPALA and APPO
  (``benchmarks/throughput.py``, medians of several windows).
- ``time_to_solve``: wall seconds and env steps to returns 150 and 450 for the same 8 (``benchmarks/time_to_solve.py``;
  ``--quick``: 150 only, capped at 15 s of training each).
- ``scaling``: 1 to 16 rollout workers on envs whose step sleeps 1 ms, one node and a local two-node cluster
  (``benchmarks/scaling.py``); efficiency against linear.
- ``loc``: lines of code of the A3C, PPO and Ape-X plans against hand-written Ray versions with the same
  numerics (``benchmarks/loc.py``, ``benchmarks/handwritten/``).
- ``ppo``: PPO on CartPole-v1 with flowrl's main job's hyperparameters, in rounds whose order rotates (drift
  hits every system alike): flowrl (``ppo_cartpole.py``), the minimal single-file PPO (``minimal_ppo.py``) and,
  when the peers' virtualenv exists, Stable-Baselines3 with 8 envs and RLlib with 2 env runners of 1 env each
  (RLlib's default of one env per runner) and of 4 envs each (flowrl's 2 x 4).
  Gives ``ppo_vs_sb3``, ``ppo_vs_rllib`` (2 x 1) and ``ppo_vs_rllib_2x4`` (flowrl / peer, medians of env steps/s)
  and ``ppo_time_to_450_vs_minimal`` (flowrl / minimal, medians of training seconds to a smoothed return of 450;
  a run that never gets there counts as infinitely slow).
- ``dqn``: flowrl DQN (``dqn_cartpole.py``) beside Stable-Baselines3 and RLlib DQN with flowrl's DQN defaults, and
  flowrl DQN at SB3's settings (``dqn_cartpole.py --matched``: no prioritized replay, dueling or double Q, SB3's
  64-64-256 tanh network; batch, replay ratio, target period, learning_starts and buffer are both sides' already).
  Gives ``dqn_vs_sb3_matched`` (flowrl matched / SB3, medians of env steps/s).
- ``sac``: SAC on Pendulum-v1 at matched settings (batch 256, [256, 256] MLPs, one gradient step per env step,
  learning starts 1,000): flowrl (``sac_pendulum.py``) beside Stable-Baselines3 and RLlib SAC; env steps/s and
  training seconds to a smoothed (20-episode) return of -200. Gives ``sac_vs_sb3`` and ``sac_vs_rllib``.
- ``recurrent_sampling``: one RolloutWorker with PPO's LSTM policy against one with its feed-forward policy on
  CartPole without velocities (``benchmarks/recurrent_sampling.py``, alternating); its ratio is the summary's
  ``recurrent_sampling_efficiency``, with the bytes per row the state columns take.
- ``ppo_lstm``: PPO with an LSTM on CartPole without velocities at the stateless-CartPole preset's settings: flowrl
  (``ppo_lstm.py``) beside Stable-Baselines3-contrib's RecurrentPPO and RLlib's PPO with ``use_lstm`` (their
  docstrings map each setting). Gives ``ppo_lstm_vs_rllib`` and ``ppo_lstm_vs_sb3`` (medians of env steps/s).
- ``evolution``: ES and ARS on CartPole, perturbed episodes per second with 2, 4 and 8 workers, and the bytes an
  evaluation puts on the wire for a small and a large policy (``benchmarks/evolution.py``).
- ``maml``: MAML on flowrl/PointGoal-v0 with 2 and 8 workers: a meta-iteration's seconds split into sampling
  at the barrier, the workers' inner steps and the driver's meta-update, with the plan's profile
  (``benchmarks/maml.py``).
- ``learners``: scaling the learner (``benchmarks/learners.py``): DD-PPO against PPO on the same 2 and 4 workers
  (env steps/s, seconds and env steps to 450), and PPO's learner step with 2 CPU learners (``num_learners=2``)
  against the driver's lone learner on batches of 1k to 64k rows (the crossover batch size).
- ``atari`` (not in ``all``: about 12 minutes): Atari frames per second (``benchmarks/atari.py``): flowrl's IMPALA
  and APPO Pong presets against the raw emulator on the same 2 cores and, when the peers' virtualenv exists,
  against RLlib's APPO and IMPALA at the same sizes (``peers/rllib_atari.py``); object-store and replay bytes per
  frame with and without LZ4; where a step's CPU time goes and the frames/s ceiling it sets.
- ``atari_learning`` (not in ``all``: about 15 minutes; ``--quick``: a 200k-frame smoke run): PPO's Pong preset
  trained towards a smoothed game score of -15 within 3M frames (``benchmarks/atari_learning.py``), with its
  learning curve PNG in the run directory.
- ``sac_lunar`` (not in ``all``): flowrl SAC on LunarLanderContinuous-v3, env steps and seconds to a smoothed
  return of 200 (``sac_pendulum.py --env LunarLanderContinuous-v3``); skipped, saying how to install it, without
  gymnasium's box2d extra.
- ``segment_tree`` (not in ``all``): prioritized replay's sum/min trees against a plain recursive Python tree,
  scalar and batched paths (``benchmarks/segment_tree.py``).
- ``iter_overhead`` (not in ``all``): flowrl's gathers against the *best* hand-written Ray loops over sleeping
  shard actors (``benchmarks/iter_overhead.py``).
- ``offline`` (not in ``all``: about 20 minutes; ``--quick``: one seed): recorded experience
  (``benchmarks/offline.py``): sampling with and without ``output=DIR``, the driver's memory while a dataset ten
  train batches large is read, and BC, MARWIL and CQL trained on datasets the script records (CartPole from an
  early-stopped PPO, Pendulum from a partly trained SAC) against their gates.
- a system's own name (``ppo_cartpole``, ``minimal_ppo``, ``sb3_ppo``, ``rllib_ppo_2x1``, ...) runs its rounds alone.

Round ``i`` runs every system with seed ``i``; ``--repeats`` rounds (3). ``--quick`` keeps the rounds but shrinks
the budgets (flowrl and the minimal PPO still run to 450, at most 150k steps; the peers run a fixed few thousand
steps, so their time to 450 is not measured) and finishes in under 15 minutes on 2 cores; the full suite runs
every PPO to 450 (at most 300k steps, the main job's cap) and takes about an hour.

Peers are skipped, with a note, when ``benchmarks/peers/.venv`` does not exist (``bash benchmarks/peers/setup.sh``).
Each benchmark prints a markdown table; everything goes to ``benchmarks/results/suite[_quick].json`` (each run's
JSON and log under ``benchmarks/results/suite[_quick]/``). The last line is::

    overhead_ratio=... ppo_vs_sb3=... ppo_vs_rllib=... ppo_time_to_450_vs_minimal=... ppo_vs_rllib_2x4=...
    sac_vs_sb3=... sac_vs_rllib=... dqn_vs_sb3_matched=... ppo_lstm_vs_rllib=... ppo_lstm_vs_sb3=...
    recurrent_sampling_efficiency=...

with ``nan`` for what was not measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
PEERS_PYTHON = HERE / "peers" / ".venv" / "bin" / "python"
SUMMARY_KEYS = ("overhead_ratio", "ppo_vs_sb3", "ppo_vs_rllib", "ppo_time_to_450_vs_minimal", "ppo_vs_rllib_2x4",
                "sac_vs_sb3", "sac_vs_rllib", "dqn_vs_sb3_matched", "ppo_lstm_vs_rllib", "ppo_lstm_vs_sb3",
                "recurrent_sampling_efficiency")
THRESHOLDS = (150, 450)  # CartPole's; a System may have its own


@dataclass(frozen=True)
class System:
    """One trainer run as a subprocess: which script, in which environment, with which budget."""

    name: str
    label: str
    script: str  # relative to benchmarks/
    peer: bool  # runs with the peers' virtualenv
    full: tuple[str, ...]
    quick: tuple[str, ...]
    thresholds: tuple[int, ...] = THRESHOLDS  # the smoothed returns whose seconds and steps it reports

    def budget(self, quick: bool) -> str:
        args = self.quick if quick else self.full
        steps = args[args.index("--max-steps") + 1]
        if "--stop-return" not in args:
            return f"{int(steps) // 1000}k steps"
        return f"to {args[args.index('--stop-return') + 1]}, <= {int(steps) // 1000}k steps"


_TO_450 = ("--stop-return", "450")
_TO_M200 = ("--stop-return", "-200")
_TO_150 = ("--stop-return", "150")
SYSTEMS = {s.name: s for s in (
    System("ppo_cartpole", "flowrl PPO (2 workers x 4 envs)", "ppo_cartpole.py", False,
           ("--max-steps", "300000", *_TO_450), ("--max-steps", "150000", *_TO_450)),
    System("minimal_ppo", "minimal single-file PPO (1 process, 8 envs)", "minimal_ppo.py", False,
           ("--max-steps", "300000", *_TO_450, "--quiet"), ("--max-steps", "150000", *_TO_450, "--quiet")),
    System("sb3_ppo", "Stable-Baselines3 PPO (8 envs, DummyVecEnv)", "peers/sb3_ppo.py", True,
           ("--max-steps", "300000", *_TO_450), ("--max-steps", "20000")),
    System("rllib_ppo_2x1", "RLlib PPO (2 env runners x 1 env)", "peers/rllib_ppo.py", True,
           ("--envs-per-runner", "1", "--max-steps", "300000", *_TO_450),
           ("--envs-per-runner", "1", "--max-steps", "6000")),
    System("rllib_ppo_2x4", "RLlib PPO (2 env runners x 4 envs)", "peers/rllib_ppo.py", True,
           ("--max-steps", "300000", *_TO_450), ("--max-steps", "12000")),
    System("dqn_cartpole", "flowrl DQN (defaults: local worker, 1 env)", "dqn_cartpole.py", False,
           ("--max-steps", "50000", *_TO_450), ("--max-steps", "5000")),
    System("sb3_dqn", "Stable-Baselines3 DQN (1 env)", "peers/sb3_dqn.py", True,
           ("--max-steps", "50000", *_TO_450), ("--max-steps", "5000")),
    System("rllib_dqn", "RLlib DQN (local env runner, 1 env)", "peers/rllib_dqn.py", True,
           ("--max-steps", "50000", *_TO_450), ("--max-steps", "3000")),
    System("dqn_cartpole_matched", "flowrl DQN at SB3's settings (no PER, dueling, double Q)", "dqn_cartpole.py",
           False, ("--matched", "--max-steps", "50000", *_TO_450), ("--matched", "--max-steps", "5000")),
    System("sac_pendulum", "flowrl SAC (local worker, 1 env)", "sac_pendulum.py", False,
           ("--max-steps", "30000", *_TO_M200), ("--max-steps", "3000"), (-200,)),
    System("sb3_sac", "Stable-Baselines3 SAC (1 env)", "peers/sb3_sac.py", True,
           ("--max-steps", "30000", *_TO_M200), ("--max-steps", "3000"), (-200,)),
    System("rllib_sac", "RLlib SAC (local env runner, 1 env)", "peers/rllib_sac.py", True,
           ("--max-steps", "30000", *_TO_M200), ("--max-steps", "3000"), (-200,)),
    System("ppo_lstm_cartpole", "flowrl PPO+LSTM (driver, 8 envs)", "ppo_lstm.py", False,
           ("--max-steps", "300000", *_TO_150), ("--max-steps", "20000"), (150,)),
    System("sb3_recurrent_ppo", "SB3-contrib RecurrentPPO (8 envs)", "peers/sb3_recurrent_ppo.py", True,
           ("--max-steps", "300000", *_TO_150), ("--max-steps", "20000"), (150,)),
    System("rllib_ppo_lstm", "RLlib PPO use_lstm (local env runner, 8 envs)", "peers/rllib_ppo_lstm.py", True,
           ("--max-steps", "300000", *_TO_150), ("--max-steps", "20000"), (150,)),
    System("sac_lunar", "flowrl SAC, LunarLanderContinuous-v3", "sac_pendulum.py", False,
           ("--env", "LunarLanderContinuous-v3", "--max-steps", "300000", "--stop-return", "200"),
           ("--env", "LunarLanderContinuous-v3", "--max-steps", "5000"), (200,)),
)}
#: benchmarks made of trainer runs in rotating rounds; a system's own name runs it alone
TRAINER_GROUPS: dict[str, tuple[str, ...]] = {
    "ppo": ("ppo_cartpole", "minimal_ppo", "sb3_ppo", "rllib_ppo_2x1", "rllib_ppo_2x4"),
    "dqn": ("dqn_cartpole", "sb3_dqn", "rllib_dqn", "dqn_cartpole_matched"),
    "sac": ("sac_pendulum", "sb3_sac", "rllib_sac"),
    "ppo_lstm": ("ppo_lstm_cartpole", "sb3_recurrent_ppo", "rllib_ppo_lstm"),
    **{name: (name,) for name in SYSTEMS}}
SCRIPTS = ("rollout_overhead", "sampling", "recurrent_sampling", "throughput", "time_to_solve", "scaling", "loc",
           "evolution", "maml", "learners", "atari", "atari_learning", "segment_tree", "iter_overhead", "offline")
# the long atari, atari_learning, sac_lunar and offline, and the microbenchmarks segment_tree and iter_overhead, by
# name only
ALL = (*SCRIPTS[:-5], "ppo", "dqn", "sac", "ppo_lstm")
NAMES = (*SCRIPTS, *TRAINER_GROUPS)


# -- command line and summary --------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The suite's command line; ``args.benchmarks`` is the names to run, ``all`` expanded, in order, once each.

    Examples:
        >>> parse_args(["all", "--quick"]).benchmarks
        ['rollout_overhead', 'sampling', 'recurrent_sampling', 'throughput', 'time_to_solve', 'scaling', 'loc',
         'evolution', 'maml', 'learners', 'ppo', 'dqn', 'sac', 'ppo_lstm']
        >>> parse_args(["minimal_ppo", "ppo", "minimal_ppo"]).benchmarks
        ['minimal_ppo', 'ppo']
    """
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", choices=("all", *NAMES), metavar="NAME",
                        help=f"all, or any of: {', '.join(NAMES)}")
    parser.add_argument("--quick", action="store_true", help="smaller budgets, same number of rounds (< 15 min)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of trainer runs (medians over them); >= 1")
    parser.add_argument("--peers-python", type=Path, default=PEERS_PYTHON,
                        help="the peers' virtualenv interpreter (default benchmarks/peers/.venv/bin/python)")
    parser.add_argument("--out", type=Path, default=None,
                        help="suite JSON (default benchmarks/results/suite[_quick].json)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats} must be >= 1 (3 or more for a median worth reading)")
    names = [n for name in args.names for n in (ALL if name == "all" else (name,))]
    args.benchmarks = list(dict.fromkeys(names))
    return args


def format_summary(values: Mapping[str, float | None]) -> str:
    """The suite's last line: each ratio of ``SUMMARY_KEYS`` to 3 decimals, ``nan`` where not measured.

    Examples:
        >>> format_summary({"overhead_ratio": 0.9876, "ppo_vs_sb3": None, "ppo_time_to_450_vs_minimal": math.inf})
        'overhead_ratio=0.988 ppo_vs_sb3=nan ppo_vs_rllib=nan ppo_time_to_450_vs_minimal=nan ppo_vs_rllib_2x4=nan
         sac_vs_sb3=nan sac_vs_rllib=nan dqn_vs_sb3_matched=nan ppo_lstm_vs_rllib=nan ppo_lstm_vs_sb3=nan
         recurrent_sampling_efficiency=nan'
    """
    def fmt(value: float | None) -> str:
        return "nan" if value is None or not math.isfinite(value) else f"{value:.3f}"

    return " ".join(f"{key}={fmt(values.get(key))}" for key in SUMMARY_KEYS)


def rotate(items: Sequence[Any], k: int) -> list[Any]:
    """``items`` starting from index ``k`` (mod its length): round ``k``'s order, so each system takes each place.

    Examples:
        >>> rotate(["flowrl", "minimal", "sb3"], 1), rotate([], 2)
        (['minimal', 'sb3', 'flowrl'], [])
    """
    k = k % len(items) if items else 0
    return [*items[k:], *items[:k]]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def median_seconds_to(runs: Sequence[Mapping[str, Any]], threshold: int) -> float | None:
    """Median training seconds to ``threshold`` over the runs without an error; a run that never reached it counts
    as infinitely slow. ``None`` when there is no such run or the median did not reach it.

    Examples:
        >>> median_seconds_to([{"seconds_to_450": 30.0}, {"seconds_to_450": None}, {"seconds_to_450": 40.0}], 450)
        40.0
        >>> median_seconds_to([{"seconds_to_450": 30.0}, {"seconds_to_450": None}, {"error": "rc 1"}], 450) is None
        True
    """
    values = [math.inf if r.get(f"seconds_to_{threshold}") is None else float(r[f"seconds_to_{threshold}"])
              for r in runs if "error" not in r]
    med = _median(values)
    return None if med is None or math.isinf(med) else med


def median_steps_per_s(runs: Sequence[Mapping[str, Any]]) -> float | None:
    """Median env steps/s over the runs without an error (``None`` if none)."""
    return _median([float(r["env_steps_per_s"]) for r in runs if "error" not in r and r.get("env_steps_per_s")])


def median_steps_per_cpu_s(runs: Sequence[Mapping[str, Any]]) -> float | None:
    """Median env steps per CPU second of the training process, over the runs that report both (``None`` if none):
    for runs that sample and learn in one process, a figure that other processes' load barely moves.

    Examples:
        >>> median_steps_per_cpu_s([{"env_steps": 3000, "cpu_s": 2.0}, {"env_steps": 100, "cpu_s": None}])
        1500.0
    """
    return _median([float(r["env_steps"]) / float(r["cpu_s"]) for r in runs
                    if "error" not in r and r.get("env_steps") and r.get("cpu_s")])


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def summary_values(runs: Mapping[str, Sequence[Mapping[str, Any]]], overhead_ratio: float | None,
                   rate: Callable[[Sequence[Mapping[str, Any]]], float | None] = median_steps_per_s,
                   recurrent_sampling: float | None = None) -> dict[str, float | None]:
    """The summary's ratios from the trainer runs by system name (normalized records), rollout_overhead's ratio and
    recurrent_sampling's efficiency; ``rate`` gives a system's figure (env steps per wall second;
    :func:`median_steps_per_cpu_s`: per CPU second).

    Examples:
        >>> runs = {"ppo_cartpole": [{"env_steps_per_s": 3000.0, "seconds_to_450": 30.0}] * 3,
        ...         "minimal_ppo": [{"env_steps_per_s": 2500.0, "seconds_to_450": 40.0}] * 3,
        ...         "sb3_ppo": [{"env_steps_per_s": 2000.0, "seconds_to_450": None}] * 3}
        >>> format_summary(summary_values(runs, overhead_ratio=0.97))
        'overhead_ratio=0.970 ppo_vs_sb3=1.500 ppo_vs_rllib=nan ppo_time_to_450_vs_minimal=0.750 ppo_vs_rllib_2x4=nan
         sac_vs_sb3=nan sac_vs_rllib=nan dqn_vs_sb3_matched=nan ppo_lstm_vs_rllib=nan ppo_lstm_vs_sb3=nan
         recurrent_sampling_efficiency=nan'
    """
    flowrl = runs.get("ppo_cartpole", [])

    def vs(peer: str, ours: str = "ppo_cartpole") -> float | None:
        return _ratio(rate(runs.get(ours, [])), rate(runs.get(peer, [])))

    return {"overhead_ratio": overhead_ratio, "ppo_vs_sb3": vs("sb3_ppo"), "ppo_vs_rllib": vs("rllib_ppo_2x1"),
            "ppo_time_to_450_vs_minimal": _ratio(median_seconds_to(flowrl, 450),
                                                 median_seconds_to(runs.get("minimal_ppo", []), 450)),
            "ppo_vs_rllib_2x4": vs("rllib_ppo_2x4"), "sac_vs_sb3": vs("sb3_sac", "sac_pendulum"),
            "sac_vs_rllib": vs("rllib_sac", "sac_pendulum"),
            "dqn_vs_sb3_matched": vs("sb3_dqn", "dqn_cartpole_matched"),
            "ppo_lstm_vs_rllib": vs("rllib_ppo_lstm", "ppo_lstm_cartpole"),
            "ppo_lstm_vs_sb3": vs("sb3_recurrent_ppo", "ppo_lstm_cartpole"),
            "recurrent_sampling_efficiency": recurrent_sampling}


def normalize(raw: Mapping[str, Any], thresholds: Sequence[int] = THRESHOLDS) -> dict[str, Any]:
    """The fields the suite reads from a trainer script's JSON (flowrl's scripts and the peers name a few apart);
    a script that skipped itself (a missing optional dependency) gives ``{"skipped": why}``."""
    if raw.get("skipped"):
        return {"skipped": raw["skipped"]}
    return {"env_steps_per_s": raw.get("env_steps_per_s", raw.get("env_steps_per_s_sampled")),
            "env_steps": raw.get("env_steps", raw.get("env_steps_sampled")),
            **{f"{kind}_to_{t}": raw.get(f"{kind}_to_{t}") for t in thresholds for kind in ("seconds", "steps")},
            "train_s": raw.get("train_s"), "startup_s": raw.get("startup_s"), "final_return": raw.get("final_return"),
            "cpu_s": raw.get("cpu_s"), "version": raw.get("version")}


# -- running --------------------------------------------------------------------------------------------
class Suite:
    """Runs subprocesses, keeps their logs and JSON under ``runs_dir`` and collects what they report."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.quick = args, args.quick
        self.runs_dir = RESULTS / ("suite_quick" if args.quick else "suite")
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.timeout_s = 600 if args.quick else 1800
        self.peers = args.peers_python.exists()
        self.trainer_runs: dict[str, list[dict[str, Any]]] = {}
        self.reports: dict[str, Any] = {}

    def run(self, tag: str, cmd: list[str], out: Path | None) -> dict[str, Any]:
        """Runs ``cmd`` (log to ``runs_dir/tag.log``); returns the JSON at ``out``, or ``{"error": ...}``."""
        log = self.runs_dir / f"{tag}.log"
        if out is not None:
            out.unlink(missing_ok=True)
        start = time.perf_counter()
        with log.open("w") as f:
            rc: int | str
            try:
                rc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    timeout=self.timeout_s).returncode
            except subprocess.TimeoutExpired:
                rc = f"timed out after {self.timeout_s} s"
        wall = time.perf_counter() - start
        if rc != 0 or (out is not None and not out.exists()):
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            print(f"  {tag}: FAILED ({'rc ' + str(rc) if rc != 0 else 'no JSON'}; log {log})\n    "
                  + "\n    ".join(tail), flush=True)
            return {"error": f"rc {rc}" if rc != 0 else "no JSON written", "log": str(log), "wall_s": round(wall, 1)}
        data: dict[str, Any] = json.loads(out.read_text()) if out is not None else {}
        data["wall_s"] = round(wall, 1)
        return data

    # -- the scripts that alternate inside themselves --------------------------------------------------
    def script(self, name: str) -> None:
        out = RESULTS / "iter_overhead.json" if name == "iter_overhead" else self.runs_dir / f"{name}.json"
        extra = ["--quick"] if self.quick and name != "loc" else []
        if name == "throughput" and self.quick:
            extra += ["--workers", "2"]
        if name != "iter_overhead":  # it always writes benchmarks/results/iter_overhead.json
            extra += ["--out", str(out)]
        print(f"\n## {name}\n", flush=True)
        data = self.run(name, [sys.executable, str(HERE / f"{name}.py"), *extra], out)
        self.reports[name] = data
        if "error" not in data:
            print(markdown_tables((self.runs_dir / f"{name}.log").read_text(errors="replace")), flush=True)

    # -- trainer runs in rotating rounds --------------------------------------------------------------
    def trainers(self, group: str) -> None:
        systems = [SYSTEMS[n] for n in TRAINER_GROUPS[group]]
        print(f"\n## {group}\n", flush=True)
        if not self.peers and any(s.peer for s in systems):
            print(f"note: skipping the peers ({', '.join(s.name for s in systems if s.peer)}): "
                  f"{self.args.peers_python} does not exist; create it with `bash benchmarks/peers/setup.sh`",
                  flush=True)
            systems = [s for s in systems if not s.peer]
        skipped: set[str] = set()
        for rnd in range(self.args.repeats):
            for system in rotate(systems, rnd):
                if system.name in skipped:
                    continue
                python = str(self.args.peers_python) if system.peer else sys.executable
                tag = f"{system.name}_seed{rnd}"
                out = self.runs_dir / f"{tag}.json"
                cmd = [python, str(HERE / system.script), "--seed", str(rnd), "--out", str(out),
                       *(system.quick if self.quick else system.full)]
                raw = self.run(tag, cmd, out)
                record = {"seed": rnd, **({"error": raw["error"]} if "error" in raw else
                                          normalize(raw, system.thresholds)), "wall_s": raw["wall_s"]}
                if "skipped" in record:  # the same in every round: say it once, record nothing
                    print(f"  {system.name}: {record['skipped']}", flush=True)
                    skipped.add(system.name)
                    continue
                self.trainer_runs.setdefault(system.name, []).append(record)
                if "error" not in record:
                    to = "; ".join(f"{t}: {_num(record[f'seconds_to_{t}'])} s" for t in system.thresholds)
                    print(f"  round {rnd + 1}/{self.args.repeats} {system.name}: "
                          f"{_num(record['env_steps_per_s'])} env steps/s; {to} ({record['wall_s']} s wall)",
                          flush=True)
        if systems:
            trainer_table([s for s in systems if s.name in self.trainer_runs], self.trainer_runs, self.quick)


def _num(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, (int, float)) else str(value)


def trainer_table(systems: Sequence[System], runs: Mapping[str, Sequence[Mapping[str, Any]]], quick: bool) -> None:
    """One row per system; the ratio column compares with the group's flowrl system (its first, not a peer), the
    threshold columns are the first system's (CartPole's 150 and 450, Pendulum's -200)."""
    if not systems:
        return
    flowrl = next((s for s in systems if not s.peer), None)
    flowrl_rate = median_steps_per_s(runs.get(flowrl.name, [])) if flowrl is not None else None
    thresholds, last = systems[0].thresholds, systems[0].thresholds[-1]
    heads = " | ".join(f"s to {t}" for t in thresholds)
    print(f"\n| system | budget | runs ok | env steps/s (median) | flowrl / this | steps per CPU-s | {heads} "
          f"| steps to {last} | start-up s |\n|---|---|---:|---:|---:|---:|{'---:|' * len(thresholds)}---:|---:|")
    for s in systems:
        rs = runs[s.name]
        ok = [r for r in rs if "error" not in r]
        rate = median_steps_per_s(rs)
        steps_last = _median([float(r[f"steps_to_{last}"]) for r in ok if r.get(f"steps_to_{last}") is not None])
        ratio = _ratio(flowrl_rate, rate)
        to = " | ".join(_num(median_seconds_to(rs, t), 1) for t in thresholds)
        print(f"| {s.label} | {s.budget(quick)} | {len(ok)}/{len(rs)} | {_num(rate)} | {_num(ratio, 2)} "
              f"| {_num(median_steps_per_cpu_s(rs))} | {to} | {_num(steps_last)} "
              f"| {_num(_median([float(r['startup_s']) for r in ok if r.get('startup_s') is not None]), 1)} |")


def markdown_tables(log: str) -> str:
    """The markdown tables a script printed (its ``|`` lines, each table with the line just above it).

    Examples:
        >>> print(markdown_tables("start\\nN workers\\n| a | b |\\n|---|---|\\n| 1 | 2 |\\nwrote x\\nlast=1"))
        N workers
        | a | b |
        |---|---|
        | 1 | 2 |
    """
    lines, out = log.splitlines(), []
    for i, line in enumerate(lines):
        if line.startswith("|"):
            if i and not lines[i - 1].startswith("|"):
                caption = next((c for c in reversed(lines[:i]) if c.strip()), "")
                out += ["", caption] if out else [caption]
            out.append(line)
    return "\n".join(out)


def _machine() -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "load_avg": os.getloadavg(), "git_commit": commit}


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    suite = Suite(args)
    start, machine = time.perf_counter(), _machine()
    print(f"benchmarks: {', '.join(args.benchmarks)}{' (quick)' if args.quick else ''}; {args.repeats} rounds of "
          f"trainer runs; peers {'from ' + str(args.peers_python) if suite.peers else 'not installed'}", flush=True)
    for name in args.benchmarks:
        if name in SCRIPTS:
            suite.script(name)
        else:
            suite.trainers(name)
    overhead = suite.reports.get("rollout_overhead", {}).get("overhead_ratio")
    recurrent = suite.reports.get("recurrent_sampling", {}).get("recurrent_sampling_efficiency")
    values = summary_values(suite.trainer_runs, overhead, recurrent_sampling=recurrent)
    per_cpu = summary_values(suite.trainer_runs, None, rate=median_steps_per_cpu_s)
    line = format_summary(values)
    out = args.out or RESULTS / f"suite{'_quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmarks": args.benchmarks, "quick": args.quick, "repeats": args.repeats,
                               "summary": values, "summary_line": line, "summary_per_cpu_s": per_cpu,
                               "scripts": suite.reports,
                               "trainer_runs": suite.trainer_runs, "wall_s": round(time.perf_counter() - start, 1),
                               "machine": {**machine, "load_avg_end": os.getloadavg()}}, indent=2) + "\n")
    print(f"\nwrote {out} ({time.perf_counter() - start:.0f} s in all)")
    print("the same ratios per CPU second of training: " + format_summary(per_cpu).replace("overhead_ratio=nan ", ""))
    print(line)


if __name__ == "__main__":
    main()
