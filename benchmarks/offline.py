"""Offline data: what recording costs sampling, how reading a dataset uses the driver's memory, and the learning
gates of BC and MARWIL (CartPole) and CQL (Pendulum) on datasets this script records itself.

- ``writing``: one RolloutWorker (PPO's policy, CartPole-v1, 8 envs x 250 steps) sampling with and without
  ``output=DIR``, alternating rounds: env steps/s of each (medians) and their ratio, and the share of the recording
  run's sampling time that handing episodes to the writer took.
- ``reading``: a dataset of ``--read-rows`` rows of 84x84x4 uint8 frames (a random 10x10 patch in each, as Atari
  frames are mostly background; 10 files), read by ``ReadInput`` through Ray Data in items of ``--read-batch``
  rows (the dataset is 10 of them) with the default shuffle window: rows/s, and the driver's resident memory
  (sampled at every item) above what it held before the first read, against the dataset's size in memory: its own
  memory (USS) and its resident size (RSS, which also counts the pages of Ray's shared object store it mapped).
- ``bc_marwil``: PPO (defaults, seed 0) trains on CartPole-v1 until its smoothed return reaches ``--ppo-stop``;
  its policy then records 100k steps (8 envs), whose mean episode return is quoted. BC and MARWIL (defaults) each
  train 50 reports on that dataset per seed: the best and the last evaluation return, and the first report
  reaching 120 (BC's gate) and 150 (MARWIL's).
- ``cql``: SAC (defaults, seed 0) trains ``--sac-steps`` env steps on Pendulum-v1; its policy then records 50k
  steps. CQL (defaults) trains on them per seed until its evaluation return reaches -500 or ``--cql-reports``
  reports pass: reports, gradient steps and wall seconds to -500.

Run: ``python benchmarks/offline.py [--quick] [--parts writing,reading,bc_marwil,cql] [--seeds 101,202,303]
[--out PATH]``; the last line is ``output_sampling_ratio=... read_uss_growth_fraction=... bc_best=... marwil_best=...
cql_reports_to_minus_500=...`` (medians over seeds).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
import psutil
import torch

from flowrl import runtime
from flowrl.algorithms.bc import BCConfig
from flowrl.algorithms.cql import CQLConfig
from flowrl.algorithms.marwil import MARWILConfig
from flowrl.algorithms.ppo import PPOConfig, PPOPolicy
from flowrl.algorithms.sac import SACConfig, SACPolicy
from flowrl.offline import OutputWriter
from flowrl.ops.offline import ReadInput
from flowrl.policy import Policy
from flowrl.sample_batch import NEXT_OBS, OBS
from flowrl.testing import fake_episode, make_fake_workers
from flowrl.trainer import Trainer
from flowrl.workers import RolloutWorker

PARTS = ("writing", "reading", "bc_marwil", "cql")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line.

    Examples:
        >>> args = parse_args(["--quick"])
        >>> args.seeds, args.rounds, args.read_rows, args.cql_reports
        ([101], 3, 20000, 40)
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {','.join(PARTS)}")
    parser.add_argument("--seeds", default="101,202,303", help="the learners' seeds (BC, MARWIL, CQL)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of the writing measure")
    parser.add_argument("--read-rows", type=int, default=30_000, help="rows of the reading measure's dataset")
    parser.add_argument("--ppo-stop", type=float, default=100.0, help="PPO's smoothed return when it records")
    parser.add_argument("--sac-steps", type=int, default=4000, help="SAC's env steps before it records")
    parser.add_argument("--cql-reports", type=int, default=80, help="CQL's reports at most (1,000 steps each)")
    parser.add_argument("--quick", action="store_true", help="one seed, smaller datasets and budgets")
    parser.add_argument("--out", default="benchmarks/results/offline.json")
    args = parser.parse_args(argv)
    args.parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; use some of {','.join(PARTS)}")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    if args.quick:
        args.seeds, args.rounds, args.read_rows, args.cql_reports = args.seeds[:1], 3, 20_000, 40
    return args


def rss() -> int:
    return int(psutil.Process().memory_info().rss)


# -- writing ---------------------------------------------------------------------------------------------------

def sampling_rate(worker: RolloutWorker, samples: int) -> float:
    start, rows = time.perf_counter(), 0
    for _ in range(samples):
        rows += worker.sample().count
    return rows / (time.perf_counter() - start)


def part_writing(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    base = PPOConfig(seed=0, num_envs_per_worker=8, rollout_fragment_length=250)
    plain = RolloutWorker(policy_class=PPOPolicy, config=base)
    recording = RolloutWorker(policy_class=PPOPolicy, config=dataclasses.replace(base, output=str(directory)))
    for worker in (plain, recording):
        sampling_rate(worker, 5)  # warm up (and open the writer)
    plain_rates, recording_rates = [], []
    add_before, record_time = recording.output_writer.add_seconds, 0.0  # type: ignore[union-attr]
    for _ in range(args.rounds):
        plain_rates.append(sampling_rate(plain, 40))
        t0 = time.perf_counter()
        recording_rates.append(sampling_rate(recording, 40))
        record_time += time.perf_counter() - t0
    add_seconds = recording.output_writer.add_seconds - add_before  # type: ignore[union-attr]
    written = recording.close_output()
    return {"plain_steps_per_s": statistics.median(plain_rates),
            "recording_steps_per_s": statistics.median(recording_rates),
            "ratio": statistics.median(r / p for r, p in zip(recording_rates, plain_rates)),
            "add_share": add_seconds / record_time, "rows_written": written["rows"]}


# -- reading ---------------------------------------------------------------------------------------------------

def image_dataset(directory: Path, rows: int, files: int = 10, length: int = 250) -> int:
    """``rows`` rows of 84x84x4 uint8 frames in ``files`` files of whole episodes; their bytes in memory."""
    rng = np.random.default_rng(0)
    space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    per_file, eps_id = rows // files, 0
    for index in range(files):
        writer = OutputWriter(directory, worker_index=index + 1, observation_space=space,
                              action_space=gym.spaces.Discrete(2))
        for _ in range(per_file // length):
            episode = fake_episode(eps_id, length)
            frames = np.zeros((length, 84, 84, 4), np.uint8)
            frames[:, 30:40, 20:30] = rng.integers(0, 255, (length, 10, 10, 4))
            episode[OBS], episode[NEXT_OBS] = frames, frames
            writer.add([episode])
            eps_id += 1
        writer.close()
    return rows * (2 * 84 * 84 * 4 + 8 * 4 + 4 * 4)


def image_dataset_elsewhere(directory: Path, rows: int) -> int:
    """:func:`image_dataset`, written by a child process, so that what writing allocates stays out of this one's
    memory figures; the dataset's bytes in memory."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r}); "
            f"from benchmarks.offline import image_dataset; print(image_dataset(__import__('pathlib').Path("
            f"{str(directory)!r}), {rows}))")
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return int(done.stdout.split()[-1])


def part_reading(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    dataset_bytes = image_dataset_elsewhere(directory, args.read_rows)
    batch = args.read_rows // 10
    workers = make_fake_workers(0, rollout_fragment_length=batch, input=str(directory), input_epochs=1,
                                input_shuffle_rows=batch)
    process = psutil.Process()
    baseline, uss, rss, rows = process.memory_full_info(), [], [], 0
    start = time.perf_counter()
    for item in ReadInput(workers):
        rows += item.count
        now = process.memory_full_info()
        uss.append(now.uss - baseline.uss)
        rss.append(now.rss - baseline.rss)
    seconds = time.perf_counter() - start
    return {"rows": rows, "train_batch_rows": batch, "rows_per_s": rows / seconds, "dataset_bytes": dataset_bytes,
            "uss_growth_first_item": uss[0], "uss_growth_max": max(uss), "rss_growth_max": max(rss),
            "uss_growth_fraction": max(uss) / dataset_bytes, "shuffle_window_bytes": dataset_bytes // 10}


# -- learning gates ------------------------------------------------------------------------------------------------

def record(policy_class: type[Policy], config: Any, weights: Any, directory: Path, steps: int) -> float:
    """Samples ``steps`` with ``weights`` into ``directory``; the mean return of the episodes it finished."""
    worker = RolloutWorker(policy_class=policy_class, config=dataclasses.replace(config, output=str(directory)))
    worker.set_weights(weights)
    rows = 0
    while rows < steps:
        rows += worker.sample().count
    worker.close_output()
    return float(np.mean([e.episode_return for e in worker.get_metrics()]))


def train_to(name: str, config: Any, stop: float) -> Any:
    trainer = Trainer(name, config)
    try:
        while trainer.train()["episode_reward_mean"] < stop:
            pass
        return trainer.workers.local_worker().get_weights()
    finally:
        trainer.stop()


def learn(name: str, config: Any, reports: int, targets: Sequence[float]) -> dict[str, Any]:
    trainer = Trainer(name, config)
    returns, start, reached = [], time.perf_counter(), {}
    try:
        for report in range(1, reports + 1):
            result = trainer.train()
            returns.append(result["evaluation"]["episode_reward_mean"])
            for target in targets:
                if returns[-1] >= target and target not in reached:
                    reached[target] = {"report": report, "seconds": time.perf_counter() - start,
                                       "steps_trained": result["info"]["num_steps_trained"]}
            if len(reached) == len(targets) and name == "cql":
                break
    finally:
        trainer.stop()
    return {"best": max(returns), "last": returns[-1], "returns": returns, "reached": reached,
            "seconds": time.perf_counter() - start}


def part_bc_marwil(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    weights = train_to("ppo", PPOConfig(seed=0), args.ppo_stop)
    behaviour = record(PPOPolicy, PPOConfig(seed=1, num_envs_per_worker=8, rollout_fragment_length=250), weights,
                       directory, 100_000)
    runs = {name: [learn(name, cls(seed=seed, input=str(directory)), 50, (120.0, 150.0)) for seed in args.seeds]
            for name, cls in (("bc", BCConfig), ("marwil", MARWILConfig))}
    return {"behaviour_return": behaviour, "runs": runs}


def part_cql(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    trainer = Trainer("sac", SACConfig(seed=0))
    try:
        while (result := trainer.train())["timesteps_total"] < args.sac_steps:
            pass
        sac_return = result["episode_reward_mean"]
        weights = trainer.workers.local_worker().get_weights()
    finally:
        trainer.stop()
    behaviour = record(SACPolicy, SACConfig(seed=1, num_envs_per_worker=10, rollout_fragment_length=200), weights,
                       directory, 50_000)
    runs = [learn("cql", CQLConfig(seed=seed, input=str(directory)), args.cql_reports, (-500.0,))
            for seed in args.seeds]
    return {"sac_return": sac_return, "behaviour_return": behaviour, "runs": runs}


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.getLogger("flowrl").setLevel(logging.WARNING)
    runtime.init(num_cpus=4, log_to_driver=False)
    out: dict[str, Any] = {"benchmark": "offline", "quick": args.quick, "seeds": args.seeds}
    summary: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        if "writing" in args.parts:
            w = out["writing"] = part_writing(args, root / "writing")
            print(f"| sampling | env steps/s |\n| --- | ---: |\n| plain | {w['plain_steps_per_s']:,.0f} |\n"
                  f"| recording | {w['recording_steps_per_s']:,.0f} |\n\nrecording / plain {w['ratio']:.3f}; "
                  f"handing episodes over took {100 * w['add_share']:.2f}% of the recording run's sampling time\n")
            summary["output_sampling_ratio"] = w["ratio"]
        if "reading" in args.parts:
            r = out["reading"] = part_reading(args, root / "reading")
            print(f"read {r['rows']:,} rows ({r['dataset_bytes'] / 2**20:,.0f} MiB in memory, 10 train batches of "
                  f"{r['train_batch_rows']:,}; the shuffle window one of them) at {r['rows_per_s']:,.0f} rows/s; the "
                  f"driver's own memory grew {r['uss_growth_first_item'] / 2**20:,.0f} MiB at the first item and "
                  f"{r['uss_growth_max'] / 2**20:,.0f} MiB at most ({100 * r['uss_growth_fraction']:.1f}% of the "
                  f"dataset); its resident size {r['rss_growth_max'] / 2**20:,.0f} MiB at most\n")
            summary["read_uss_growth_fraction"] = r["uss_growth_fraction"]
        if "bc_marwil" in args.parts:
            b = out["bc_marwil"] = part_bc_marwil(args, root / "cartpole")
            print(f"CartPole dataset: 100k steps of PPO stopped at a smoothed {args.ppo_stop:g}; its episodes return "
                  f"{b['behaviour_return']:.1f}\n\n| algorithm | seed | best | last | report >= 120 | report >= 150 "
                  f"| seconds |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
            for name, runs in b["runs"].items():
                for seed, run in zip(args.seeds, runs):
                    firsts = [run["reached"].get(t, {}).get("report", "-") for t in (120.0, 150.0)]
                    print(f"| {name} | {seed} | {run['best']:.1f} | {run['last']:.1f} | {firsts[0]} | {firsts[1]} "
                          f"| {run['seconds']:.0f} |")
                summary[f"{name}_best"] = statistics.median(run["best"] for run in runs)
            print()
        if "cql" in args.parts:
            c = out["cql"] = part_cql(args, root / "pendulum")
            print(f"Pendulum dataset: 50k steps of SAC after {args.sac_steps:,} env steps (smoothed return "
                  f"{c['sac_return']:.1f}); its episodes return {c['behaviour_return']:.1f}\n\n| seed | best | "
                  f"reports to -500 | gradient steps | seconds |\n| ---: | ---: | ---: | ---: | ---: |")
            for seed, run in zip(args.seeds, c["runs"]):
                hit = run["reached"].get(-500.0)
                print(f"| {seed} | {run['best']:.1f} | {hit['report'] if hit else '-'} | "
                      f"{hit['steps_trained'] // 256 if hit else '-'} | {hit['seconds'] if hit else math.nan:.0f} |")
            summary["cql_reports_to_minus_500"] = statistics.median(
                run["reached"][-500.0]["report"] if -500.0 in run["reached"] else math.inf for run in c["runs"])
    out["summary"] = summary
    out["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                      "torch": torch.__version__}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
