"""Scaling the learner: DD-PPO against PPO on the same workers, and a learner group of 2 CPU learners against the
driver's lone learner.

- ``ddppo``: CartPole-v1 with 2 and 4 workers (5 envs each, fragments of 100 steps), DD-PPO with its defaults (every
  worker learns on its own 500 steps, gradients all-reduced) against PPO with the same workers, once with the same
  update (train batches of every worker's fragment, minibatches of ``workers x 50`` rows, 10 epochs, DD-PPO's lr
  5e-4, no KL penalty: ``ppo``) and once with PPO's defaults (batches of 4000 steps, 30 epochs of minibatches of
  128, lr 5e-5: ``ppo_defaults``): env steps per second (after the first iteration) and the seconds and env steps
  to a smoothed return of 450, medians over ``--repeats`` seeds (each run stops at 450 or ``--max-steps``).
- ``learners``: PPO's learner step (``LearnOnBatch``, 2 epochs of minibatches of 1/4 of the batch, hidden layers
  256x256) on batches of 1k to 64k CartPole rows: learner samples (rows x epochs) per second with one learner (the
  driver) and with ``num_learners=2`` CPU learners; the crossover is the smallest batch at which the group is
  faster. ``--two-nodes`` measures the group again with its learners spread over a local two-node cluster
  (``placement_strategy="STRICT_SPREAD"``; both nodes are this machine).

Run: ``python benchmarks/learners.py [--quick] [--parts ddppo,learners] [--two-nodes] [--out PATH]``; the last line
is ``ddppo_vs_ppo_throughput_4w=... ddppo_vs_ppo_time_to_450_4w=... ddppo_vs_ppo_defaults_throughput_4w=...
ddppo_vs_ppo_defaults_steps_to_450_4w=... ddppo_vs_ppo_defaults_time_to_450_4w=... learner_group_crossover_rows=...``
(each above 1 where DD-PPO does better).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from flowrl import runtime
from flowrl.algorithms.ddppo import DDPPOConfig
from flowrl.algorithms.ppo import PPOConfig, PPOPolicy
from flowrl.config import ModelConfig
from flowrl.metrics import MetricsContext
from flowrl.ops import LearnOnBatch
from flowrl.sample_batch import SampleBatch
from flowrl.trainer import Trainer
from flowrl.workers import WorkerSet

PARTS = ("ddppo", "learners")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line.

    Examples:
        >>> args = parse_args(["--quick"])
        >>> args.repeats, args.max_steps, args.batches
        (1, 60000, [1000, 4000, 16000])
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {','.join(PARTS)}")
    parser.add_argument("--repeats", type=int, default=3, help="seeds per DD-PPO/PPO configuration")
    parser.add_argument("--max-steps", type=int, default=300_000, help="env steps a run may take to reach 450")
    parser.add_argument("--batches", default="1000,4000,16000,64000", help="learner batch sizes (rows)")
    parser.add_argument("--two-nodes", action="store_true", help="also measure the learner group on two local nodes")
    parser.add_argument("--quick", action="store_true", help="1 seed, 60k steps, batches up to 16k")
    parser.add_argument("--out", default="benchmarks/results/learners.json")
    args = parser.parse_args(argv)
    args.parts = args.parts.split(",")
    if unknown := set(args.parts) - set(PARTS):
        parser.error(f"--parts: unknown {sorted(unknown)}; use {','.join(PARTS)}")
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.quick:
        args.repeats, args.max_steps, args.batches = 1, min(args.max_steps, 60_000), [b for b in args.batches
                                                                                      if b <= 16_000]
    return args


def _configs(workers: int, seed: int) -> dict[str, Any]:
    """DD-PPO's defaults and PPO doing the same update on the same workers."""
    sampling = {"env": "CartPole-v1", "seed": seed, "num_workers": workers, "num_envs_per_worker": 5,
                "rollout_fragment_length": 100, "num_cpus_per_worker": min(1.0, 2.0 / workers)}
    ddppo = DDPPOConfig(**sampling)
    same_update = {"train_batch_size": ddppo.actual_train_batch_size,
                   "sgd_minibatch_size": workers * ddppo.sgd_minibatch_size, "num_sgd_iter": ddppo.num_sgd_iter,
                   "lr": ddppo.lr, "kl_coeff": ddppo.kl_coeff}
    return {"ddppo": ddppo, "ppo": PPOConfig(**sampling, **same_update), "ppo_defaults": PPOConfig(**sampling)}


def run_to_450(algo: str, config: Any, max_steps: int) -> dict[str, Any]:
    """One run until a smoothed return of 450 or ``max_steps``: steady env steps/s and the time and steps to 450."""
    trainer = Trainer(algo, config)
    try:
        first = trainer.train()
        start, steps0 = time.perf_counter(), first["timesteps_total"]
        result, solved_s, solved_steps = first, None, None
        while result["timesteps_total"] < max_steps:
            result = trainer.train()
            if solved_s is None and result.get("episode_reward_mean", 0.0) >= 450:
                solved_s, solved_steps = time.perf_counter() - start, result["timesteps_total"]
                break
        elapsed = time.perf_counter() - start
    finally:
        trainer.stop()
    return {"steps_per_s": (result["timesteps_total"] - steps0) / elapsed, "seconds_to_450": solved_s,
            "steps_to_450": solved_steps, "final_return": result.get("episode_reward_mean")}


def _median(values: Sequence[float | None]) -> float | None:
    """The median; ``None`` (inf) for a run that never solved counts as the slowest."""
    return statistics.median(math.inf if v is None else v for v in values) if values else None


def part_ddppo(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for workers in (2, 4):
        runs: dict[str, list[dict[str, Any]]] = {"ddppo": [], "ppo": [], "ppo_defaults": []}
        for seed in range(args.repeats):
            order = sorted(_configs(workers, seed).items())
            for name, config in order[seed % 3:] + order[:seed % 3]:  # each takes each place once in 3 seeds
                runs[name].append(run_to_450("ddppo" if name == "ddppo" else "ppo", config, args.max_steps))
        for name, results in runs.items():
            rows.append({"workers": workers, "algo": name, "runs": results,
                         "steps_per_s": _median([r["steps_per_s"] for r in results]),
                         "seconds_to_450": _median([r["seconds_to_450"] for r in results]),
                         "steps_to_450": _median([r["steps_to_450"] for r in results])})
    return rows


def learner_rate(batch: SampleBatch, num_learners: int, repeats: int = 3, **placement: Any) -> float:
    """Learner samples (rows x epochs) per second of PPO's learner step on ``batch``; the median of ``repeats``."""
    config = PPOConfig(env="CartPole-v1", seed=0, num_workers=0, train_batch_size=batch.count,
                       sgd_minibatch_size=batch.count // 4, num_learners=num_learners,
                       model=ModelConfig(hidden_sizes=[256, 256]), **placement)
    workers = WorkerSet(policy_class=PPOPolicy, config=config)
    try:
        op = LearnOnBatch(workers, num_sgd_iter=2, sgd_minibatch_size=batch.count // 4)
        op.bind(MetricsContext())
        op(batch)  # warm-up: the learners' first step
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            op(batch)
            times.append(time.perf_counter() - start)
    finally:
        workers.stop()
    return 2 * batch.count / statistics.median(times)


def cartpole_batch(rows: int) -> SampleBatch:
    config = PPOConfig(env="CartPole-v1", seed=0, num_workers=0, num_envs_per_worker=10, rollout_fragment_length=100)
    worker = WorkerSet(policy_class=PPOPolicy, config=config).local_worker()
    parts = [worker.sample() for _ in range(math.ceil(rows / 1000))]
    return SampleBatch.concat(parts)[:rows]


def part_learners(args: argparse.Namespace, **placement: Any) -> list[dict[str, Any]]:
    rows = []
    for size in args.batches:
        batch = cartpole_batch(size)
        one, two = learner_rate(batch, 1), learner_rate(batch, 2, **placement)
        rows.append({"rows": size, "one_learner": one, "two_learners": two, "ratio": two / one})
    return rows


def two_node_learners(args: argparse.Namespace) -> list[dict[str, Any]]:
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    runtime.init(address=cluster.address, log_to_driver=False)
    try:
        return part_learners(args, placement_strategy="STRICT_SPREAD")
    finally:
        ray.shutdown()
        cluster.shutdown()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.getLogger("flowrl").setLevel(logging.WARNING)
    runtime.init(num_cpus=4, log_to_driver=False)
    out: dict[str, Any] = {"benchmark": "learners", "quick": args.quick, "repeats": args.repeats,
                           "max_steps": args.max_steps}
    summary = {}
    if "ddppo" in args.parts:
        rows = out["ddppo"] = part_ddppo(args)
        print("| workers | algorithm | env steps/s | s to 450 | env steps to 450 |\n| ---: | --- | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['workers']} | {r['algo']} | {r['steps_per_s']:,.0f} | {r['seconds_to_450']:.1f} "
                  f"| {r['steps_to_450']:,.0f} |")
        by = {(r["workers"], r["algo"]): r for r in rows}
        summary["ddppo_vs_ppo_throughput_4w"] = by[4, "ddppo"]["steps_per_s"] / by[4, "ppo"]["steps_per_s"]
        summary["ddppo_vs_ppo_time_to_450_4w"] = by[4, "ppo"]["seconds_to_450"] / by[4, "ddppo"]["seconds_to_450"]
        summary["ddppo_vs_ppo_defaults_throughput_4w"] = (by[4, "ddppo"]["steps_per_s"]
                                                          / by[4, "ppo_defaults"]["steps_per_s"])
        summary["ddppo_vs_ppo_defaults_steps_to_450_4w"] = (by[4, "ppo_defaults"]["steps_to_450"]
                                                            / by[4, "ddppo"]["steps_to_450"])
        summary["ddppo_vs_ppo_defaults_time_to_450_4w"] = (by[4, "ppo_defaults"]["seconds_to_450"]
                                                           / by[4, "ddppo"]["seconds_to_450"])
    if "learners" in args.parts:
        rows = out["learners"] = part_learners(args)
        if args.two_nodes:
            out["learners_two_nodes"] = two_node_learners(args)
        for title, table in (("one node", rows), ("two local nodes", out.get("learners_two_nodes"))):
            if table is None:
                continue
            print(f"\nlearner samples/s ({title}):\n| batch rows | 1 learner | 2 learners | ratio |\n"
                  f"| ---: | ---: | ---: | ---: |")
            for r in table:
                print(f"| {r['rows']:,} | {r['one_learner']:,.0f} | {r['two_learners']:,.0f} | {r['ratio']:.2f} |")
        faster = [r["rows"] for r in rows if r["ratio"] > 1.0]
        summary["learner_group_crossover_rows"] = min(faster) if faster else math.inf
    out["summary"] = summary
    out["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                      "torch": torch.__version__}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
