"""PPO on CartPole-v1 end to end: env steps/s sampled and trained, and wall seconds to mean return 150 and 450.

Hyperparameters are RLlib's tuned CartPole PPO (train_batch_size 4000, sgd_minibatch_size 128, num_sgd_iter 6,
lr 3e-4) with 1-2 remote rollout workers, as the peers in benchmarks/peers/ run it. Start-up (Ray, the worker
actors, the plan) is timed apart; every other figure is training time: the wall clock from the first
``next()`` of the plan. The return is the mean over the last 100 episodes (``episode_reward_mean``).

Reference figures on a 2-core machine with these hyperparameters (training time only): RLlib 2.60 PPO
323-479 env steps/s and 192-211 s to 450; Stable-Baselines3 1,717 steps/s and 128 s; a minimal single-file
PPO 2,300-2,700 steps/s and ~40 s.

The profile splits each iteration into sampling (the ``sample`` timer: waiting for the rollout round and
concatenating), learning (``learn``: the SGD epochs), the weight broadcast (``update``) and the rest
(advantage standardization, KL update, metrics collection).

Run: ``python benchmarks/ppo_cartpole.py [--quick] [--workers 2] [--envs-per-worker 4] [--seed 0]``.
The last line is ``ppo_env_steps_per_s=<env steps sampled per second of training>``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import flowrl  # noqa: E402,F401  (sets Ray's loopback variable before ray is imported)
from flowrl import runtime  # noqa: E402
from flowrl.testing.network import keep_traffic_on_loopback  # noqa: E402

import torch  # noqa: E402

from flowrl.algorithms.ppo import PPOConfig, PPOPolicy, plan  # noqa: E402
from flowrl.cli import build_config  # noqa: E402
from flowrl.metrics import (LEARN_ON_BATCH_TIMER, LOAD_BATCH_TIMER, SAMPLE_TIMER,  # noqa: E402
                            WORKER_UPDATE_TIMER, Timer)
from flowrl.presets import find_preset  # noqa: E402
from flowrl.workers import WorkerSet  # noqa: E402

keep_traffic_on_loopback()  # Ray's start-up probe of the cloud metadata address stays on this machine

THRESHOLDS = (150.0, 450.0)


def make_config(args: argparse.Namespace) -> PPOConfig:
    """RLlib's tuned CartPole PPO (flowrl.presets' preset) with the workers, envs and train batch given; one
    sampling round per train batch (fragment x envs x workers >= train batch)."""
    parallel = max(1, args.workers) * args.envs_per_worker
    preset = find_preset("ppo", "CartPole-v1")
    assert preset is not None  # flowrl.presets holds it: flowrl's main job
    return build_config(PPOConfig, preset.items([
        "env=CartPole-v1", f"seed={args.seed}", f"num_workers={args.workers}",
        f"num_envs_per_worker={args.envs_per_worker}",
        f"rollout_fragment_length={math.ceil(args.train_batch_size / parallel)}",
        f"train_batch_size={args.train_batch_size}", f"simple_optimizer={not args.load_once}", "min_iter_time_s=0"]))


def run(args: argparse.Namespace) -> dict[str, Any]:
    config = make_config(args)
    start = time.perf_counter()
    runtime.init(num_cpus=max(2, args.workers))
    workers = WorkerSet(policy_class=PPOPolicy, config=config)
    if workers.check_health(timeout_s=120):  # waits until every actor is up (it imports torch): start-up time
        raise RuntimeError("a rollout worker did not start")
    results = plan(workers, config)
    startup_s = time.perf_counter() - start
    reached: dict[float, tuple[float, int] | None] = {t: None for t in THRESHOLDS}
    names = {"sample": SAMPLE_TIMER, "learn": LEARN_ON_BATCH_TIMER, "update": WORKER_UPDATE_TIMER,
             "load": LOAD_BATCH_TIMER}
    for timer in names.values():  # each fires once per train step: keep every value to sum them up
        results.metrics.timers[timer] = Timer(window_size=1_000_000)
    iterations, train_start, result = 0, time.perf_counter(), {}
    try:
        while True:
            result = next(results)
            elapsed = time.perf_counter() - train_start
            iterations += 1
            ret, steps = result.get("episode_reward_mean", math.nan), result["timesteps_total"]
            for t in THRESHOLDS:
                if reached[t] is None and ret >= t:
                    reached[t] = (elapsed, steps)
            print(f"iter {iterations:3d}  {steps:>7} steps  return {ret:6.1f}  {elapsed:6.1f} s", flush=True)
            if ret >= args.stop_return or steps >= args.max_steps:
                break
    finally:
        workers.stop()
    train_s = time.perf_counter() - train_start
    phases = {phase: results.metrics.timers[timer].mean * iterations for phase, timer in names.items()}
    sampled, trained = result["info"]["num_steps_sampled"], result["info"]["num_steps_trained"]
    other = max(0.0, train_s - sum(phases.values()))
    return {
        "config": {"workers": args.workers, "envs_per_worker": args.envs_per_worker,
                   "rollout_fragment_length": config.rollout_fragment_length,
                   "train_batch_size": config.train_batch_size, "sgd_minibatch_size": config.sgd_minibatch_size,
                   "num_sgd_iter": config.num_sgd_iter, "lr": config.lr,
                   "learner": "TrainOneStep" if config.use_simple_optimizer else "MultiGPUTrainOneStep (load once)",
                   "seed": args.seed},
        "startup_s": round(startup_s, 2), "train_s": round(train_s, 2), "iterations": iterations,
        "env_steps_sampled": sampled, "env_steps_trained": trained,
        "env_steps_per_s_sampled": round(sampled / train_s, 1),
        "env_steps_per_s_trained": round(trained / train_s, 1),
        "final_return": round(result["episode_reward_mean"], 1),
        **{f"seconds_to_{int(t)}": None if hit is None else round(hit[0], 2) for t, hit in reached.items()},
        **{f"steps_to_{int(t)}": None if hit is None else hit[1] for t, hit in reached.items()},
        "profile_s": {**{k: round(v, 2) for k, v in phases.items()}, "other": round(other, 2)},
        "learn_samples_per_s_per_epoch": round(trained * config.num_sgd_iter / phases["learn"], 0)
        if phases["learn"] else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="remote rollout workers (0: sample in the driver)")
    parser.add_argument("--envs-per-worker", type=int, default=4)
    parser.add_argument("--train-batch-size", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=500_000)
    parser.add_argument("--stop-return", type=float, default=450.0)
    parser.add_argument("--load-once", action="store_true",
                        help="train with MultiGPUTrainOneStep on one CPU device (tensors loaded once per batch)")
    parser.add_argument("--torch-threads", type=int, default=1, help="intra-op threads of the learner (driver)")
    parser.add_argument("--quick", action="store_true", help="a short run: stop at return 150 or 60k steps")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/ppo_cartpole[_quick].json)")
    args = parser.parse_args()
    if args.quick:
        args.max_steps, args.stop_return = min(args.max_steps, 60_000), min(args.stop_return, 150.0)
    torch.set_num_threads(args.torch_threads)
    report = run(args)
    p = report["profile_s"]
    rows = [("env steps/s sampled", report["env_steps_per_s_sampled"]),
            ("env steps/s trained", report["env_steps_per_s_trained"]),
            *[(f"wall s to return {int(t)} (steps)",
               f"{report[f'seconds_to_{int(t)}']} ({report[f'steps_to_{int(t)}']})") for t in THRESHOLDS],
            ("start-up s (apart)", report["startup_s"]), ("training s", report["train_s"]),
            ("final return", report["final_return"]),
            ("profile s: sample / load / learn / update / other",
             f"{p['sample']} / {p['load']} / {p['learn']} / {p['update']} / {p['other']}"),
            ("learner samples/s per epoch", report["learn_samples_per_s_per_epoch"])]
    print(f"\n| flowrl PPO, CartPole-v1 ({report['config']['workers']} workers x {report['config']['envs_per_worker']} "
          f"envs, {report['config']['learner']}) | value |\n| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")
    out = Path(args.out or f"benchmarks/results/ppo_cartpole{'_quick' if args.quick else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "ppo_cartpole", "quick": args.quick, **report,
                               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                           "python": platform.python_version(), "torch": torch.__version__}},
                              indent=2) + "\n")
    print(f"ppo_env_steps_per_s={report['env_steps_per_s_sampled']}")


if __name__ == "__main__":
    main()
