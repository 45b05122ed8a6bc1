"""Recurrent sampling efficiency: one RolloutWorker with PPO's LSTM policy against the same worker with PPO's
feed-forward policy, on CartPole without velocities (``flowrl/StatelessCartPole-v1``).

Both workers run in this process with the same envs (8 per worker, fragment 250: the PPO+LSTM preset's), the same
MLP (64) and seed; the recurrent one also steps an LSTM (64 cells), carries one state per env, restarts it at
every episode end and stores ``state_in``/``state_out`` per row. Runs alternate; the table shows medians of env
steps/s and the bytes per row the state columns add.

The last line is ``recurrent_sampling_efficiency=<recurrent / feed-forward>`` (target >= 0.7).

Run: ``python benchmarks/recurrent_sampling.py [--quick] [--envs 8 32] [--fragment 250] [--cell GRU|LSTM]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch  # noqa: E402

import flowrl  # noqa: E402
from flowrl.algorithms.ppo import PPOConfig, PPOPolicy  # noqa: E402
from flowrl.config import ModelConfig  # noqa: E402
from flowrl.envs import STATELESS_CARTPOLE  # noqa: E402
from flowrl.workers import RolloutWorker  # noqa: E402


def worker_rate(worker: RolloutWorker, samples: int) -> float:
    start = time.perf_counter()
    count = sum(worker.sample().count for _ in range(samples))
    return count / (time.perf_counter() - start)


def make_worker(recurrent: bool, num_envs: int, fragment: int, cell: str) -> RolloutWorker:
    model = ModelConfig(hidden_sizes=(64,), use_lstm=recurrent, lstm_cell_size=64, lstm_cell=cell, max_seq_len=20)
    config = PPOConfig(env=STATELESS_CARTPOLE, num_envs_per_worker=num_envs, rollout_fragment_length=fragment,
                       train_batch_size=num_envs * fragment, sgd_minibatch_size=fragment, seed=0, model=model)
    return RolloutWorker(policy_class=PPOPolicy, config=config)


def measure(num_envs: int, fragment: int, repeats: int, samples: int, cell: str) -> dict[str, Any]:
    workers = {"recurrent": make_worker(True, num_envs, fragment, cell),
               "feed_forward": make_worker(False, num_envs, fragment, cell)}
    batch = workers["recurrent"].sample()  # warm-up, and the state columns' size
    state_bytes = sum(batch[k].nbytes for k in batch.keys() if k.startswith("state_")) / batch.count
    row_bytes = sum(batch[k].nbytes for k in batch.keys()) / batch.count
    workers["feed_forward"].sample()
    rates: dict[str, list[float]] = {k: [] for k in workers}
    for _ in range(repeats):
        for name, worker in workers.items():
            rates[name].append(worker_rate(worker, samples))
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {"num_envs": num_envs, "recurrent_steps_per_s": med["recurrent"],
            "feed_forward_steps_per_s": med["feed_forward"], "efficiency": med["recurrent"] / med["feed_forward"],
            "state_bytes_per_row": state_bytes, "row_bytes": row_bytes, "samples": rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--fragment", type=int, default=250)
    parser.add_argument("--cell", choices=["lstm", "gru"], default="lstm")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/recurrent_sampling.json")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core per sampler, as a rollout worker actor has
    repeats, samples = (3, 2) if args.quick else (args.repeats, 4)
    results = [measure(n, args.fragment, repeats, samples, args.cell) for n in args.envs]

    print(f"\n{STATELESS_CARTPOLE}, one RolloutWorker in-process (PPO, MLP 64, {args.cell.upper()} 64 vs none, torch "
          f"threads=1), fragment {args.fragment}, median of {repeats} alternating runs\n")
    print("| envs per worker | recurrent env steps/s | feed-forward env steps/s | recurrent / feed-forward | "
          "state bytes per row (of all) |")
    print("|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['num_envs']} | {r['recurrent_steps_per_s']:,.0f} | {r['feed_forward_steps_per_s']:,.0f} | "
              f"{r['efficiency']:.3f} | {r['state_bytes_per_row']:,.0f} ({r['row_bytes']:,.0f}) |")
    best = max(results, key=lambda r: r["efficiency"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "recurrent_sampling", "recurrent_sampling_efficiency": best["efficiency"],
                               "cell": args.cell, "results": results,
                               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                           "python": platform.python_version(), "torch": torch.__version__,
                                           "flowrl": flowrl.__version__}}, indent=2))
    print(f"\nwrote {out}")
    print(f"recurrent_sampling_efficiency={best['efficiency']:.3f}")


if __name__ == "__main__":
    main()
