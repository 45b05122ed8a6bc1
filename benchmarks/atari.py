"""Atari frames per second: flowrl's IMPALA and APPO against the raw emulator on the same cores, and bytes per frame.

All figures count *emulator frames* (an agent step is ``frame_skip`` = 4 frames), on ``--env`` (ALE/Pong-v5):

- **raw ALE**: ``--procs`` processes (2: the cores), each stepping ``--envs-per-worker`` envs with random actions
  for ``--seconds``, no policy and no learner: the bare emulator (v5's own 4-frame skip, 210x160 RGB, nothing
  resized) and the env stack flowrl's workers step (gymnasium's AtariPreprocessing, flowrl's life loss, frame
  stack: :mod:`flowrl.envs.atari`). The bare emulator's rate is the 1.0 of the ratios.
- **flowrl IMPALA / APPO**: each algorithm's ``ALE/Pong-v5`` preset (:mod:`flowrl.presets`: 2 workers x 16 envs,
  fragment 50, batch 800, the Nature CNN), its learner training in the driver on the same 2 cores; frames sampled
  and trained per second over ``--seconds`` after the first trained report (``benchmarks/throughput.py``'s
  method), and the learner's utilisation (seconds in ``learn_on_batch`` per wall second). IMPALA runs twice more:
  with ``compress_observations=True`` (batches cross Ray LZ4-compressed) and, with ``--tree``, 4 workers with
  and without one aggregation worker.
- **RLlib APPO / IMPALA** (when ``benchmarks/peers/.venv`` exists): ``benchmarks/peers/rllib_atari.py`` with the
  same env, runners, envs, fragment and batch, in a subprocess after flowrl's runs.
- **bytes per frame**: what one remote worker's 50-step fragment of 16 envs puts in Ray's object store (pickle
  protocol 5, out-of-band buffers counted), plain and LZ4-compressed; and what a replay buffer holds per stored
  agent step, plain and compressed (``est_size_bytes``), per frame.

- **where the CPU goes**: one core's microseconds per agent step in the env (from the preprocessed envs' own
  rate), in the policy's forward pass (timed on a worker-sized batch) and in the learner's update (its busy
  seconds per trained step), and the frames/s that ``--procs`` cores could reach at most with those costs.

Every flowrl figure is the median of ``--runs`` runs; the raw rates are measured before and after the flowrl runs
(and their mean used), so drift hits both sides. Run: ``python benchmarks/atari.py [--quick] [--tree]``. The last
line is ``atari_impala_vs_raw=... atari_appo_vs_raw=... atari_impala_vs_rllib=... atari_appo_vs_rllib=...
atari_bytes_per_frame=... atari_bytes_per_frame_lz4=...``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import pickle
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import flowrl  # noqa: E402,F401  (sets Ray's loopback variable before ray is imported)
from flowrl.testing.network import keep_traffic_on_loopback  # noqa: E402

keep_traffic_on_loopback()

HERE = Path(__file__).resolve().parent
PEERS_PYTHON = HERE / "peers" / ".venv" / "bin" / "python"
FRAME_SKIP = 4


# -- the raw emulator --------------------------------------------------------------------------------------------
def _step_randomly(env_id: str, preprocess: bool, num_envs: int, seconds: float, seed: int,
                   barrier: Any, result: Any) -> None:
    import numpy as np

    from flowrl.envs import VectorEnv

    env = VectorEnv(env_id, num_envs, seed=seed, backend="loop", config={"preprocess": preprocess})
    env.reset()
    rng = np.random.default_rng(seed)
    n = int(env.action_space.n)  # type: ignore[union-attr]
    for _ in range(20):  # warm-up
        env.step(rng.integers(0, n, num_envs))
    barrier.wait()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(rng.integers(0, n, num_envs))
        steps += num_envs
    result.put(steps / (time.perf_counter() - start))
    env.close()


def raw_frames_per_s(env_id: str, preprocess: bool, procs: int, num_envs: int, seconds: float) -> float:
    """Frames per second of ``procs`` processes stepping ``num_envs`` envs each with random actions, together."""
    ctx = mp.get_context("spawn")
    barrier, result = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_step_randomly, args=(env_id, preprocess, num_envs, seconds, i, barrier, result))
               for i in range(procs)]
    for w in workers:
        w.start()
    rates = [result.get(timeout=seconds + 120) for _ in workers]
    for w in workers:
        w.join()
    return sum(rates) * FRAME_SKIP


# -- flowrl ------------------------------------------------------------------------------------------------------
def preset_config(name: str, env_id: str, seed: int, extra: Sequence[str] = ()) -> Any:
    """``name``'s preset for ``env_id`` (the Pong one when the env has none), reporting every second, plus ``extra``."""
    from flowrl._cli_config import build_config
    from flowrl.algorithms import get_algorithm
    from flowrl.presets import find_preset

    preset = find_preset(name, env_id) or find_preset(name, "ALE/Pong-v5")
    assert preset is not None, name
    items = [f"env={env_id}", f"seed={seed}", "min_iter_time_s=1", "timesteps_per_iteration=0", *extra]
    return build_config(get_algorithm(name).config_class, list(preset.items(items)))


def flowrl_runs(name: str, config: Any, runs: int, seconds: float) -> dict[str, Any]:
    """``runs`` runs of ``name``'s plan on one WorkerSet; frames/s sampled and trained, the learner's share and
    seconds per trained step, and the policy's forward pass per step on a worker-sized batch."""
    import numpy as np
    from throughput import LearnerClock, median_of, one_run

    from flowrl.algorithms import get_algorithm
    from flowrl.workers import WorkerSet

    algorithm = get_algorithm(name)
    module = SimpleNamespace(ALGORITHM=algorithm)  # what one_run reads
    workers = WorkerSet(policy_class=algorithm.policy_class, config=config)
    try:
        if workers.check_health(timeout_s=180):
            raise RuntimeError(f"{name}: a rollout worker did not start")
        policy = workers.local_worker().policy_map["default_policy"]
        obs = np.stack([policy.observation_space.sample() for _ in range(config.num_envs_per_worker)])
        for _ in range(5):
            policy.sample_actions(obs)
        start = time.perf_counter()
        for _ in range(50):
            policy.sample_actions(obs)
        infer_s = (time.perf_counter() - start) / 50 / len(obs)
        clock = LearnerClock(workers.local_worker())
        done = []
        for i in range(runs):
            r = one_run(module, config, workers, clock, seconds)
            trained = r["env_steps_per_s_trained"]
            done.append({"frames_per_s_sampled": r["env_steps_per_s_sampled"] * FRAME_SKIP,
                         "frames_per_s_trained": trained * FRAME_SKIP,
                         "learner_utilisation": r["learner_utilisation"], "wall_s": r["wall_s"],
                         "learn_s_per_step": r["learner_utilisation"] / trained if trained else None})
            print(f"  {name} run {i}: {done[-1]['frames_per_s_sampled']:.0f} frames/s sampled, "
                  f"{done[-1]['frames_per_s_trained']:.0f} trained, learner {100 * r['learner_utilisation']:.0f}%",
                  flush=True)
    finally:
        workers.stop()
    median = {k: median_of(done, k) for k in ("frames_per_s_sampled", "frames_per_s_trained", "learner_utilisation",
                                              "learn_s_per_step")}
    return {"median": median, "infer_s_per_step": infer_s, "runs": done}


def cpu_budget(procs: int, preprocessed_frames_per_s: float, run: dict[str, Any]) -> dict[str, float]:
    """Where a step's CPU time goes (seconds of one core per agent step) and the frames/s that ``procs`` cores could
    reach at most if nothing else ran: the env (the preprocessed envs' own rate), the policy's forward pass on a
    worker's batch, and the learner's update per trained step."""
    env_s = procs / (preprocessed_frames_per_s / FRAME_SKIP)
    learn_s = run["median"]["learn_s_per_step"] or 0.0
    total = env_s + run["infer_s_per_step"] + learn_s
    return {"env_us": 1e6 * env_s, "inference_us": 1e6 * run["infer_s_per_step"], "learner_us": 1e6 * learn_s,
            "ceiling_frames_per_s": procs / total * FRAME_SKIP}


def bytes_per_frame(env_id: str, seed: int) -> dict[str, float]:
    """Object-store bytes per frame of one remote worker's fragment, plain and LZ4; replay bytes per frame."""
    from flowrl import executor
    from flowrl.algorithms import get_algorithm
    from flowrl.compression import mark_for_wire
    from flowrl.replay_buffers import LocalReplayBuffer
    from flowrl.workers import RolloutWorker

    config = preset_config("impala", env_id, seed)
    remote = executor.create_actor(RolloutWorker, policy_class=get_algorithm("impala").policy_class, config=config,
                                   worker_index=1)
    try:
        batches = [executor.get(remote.sample.remote()) for _ in range(4)]
    finally:
        executor.kill(remote)

    def wire_bytes(batch: Any) -> int:
        buffers: list[Any] = []
        head = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
        return len(head) + sum(memoryview(b).nbytes for b in buffers)

    frames = sum(b.count for b in batches) * FRAME_SKIP
    plain = sum(wire_bytes(b) for b in batches)
    packed = sum(wire_bytes(mark_for_wire(b.copy())) for b in batches)
    replay = {}
    for compress in (False, True):
        buffer = LocalReplayBuffer(learning_starts=0, capacity=10_000, compress=compress)
        for b in batches:
            buffer.add_batch(b)
        stored = buffer.stats(debug=True)["policy_default_policy"]["est_size_bytes"]
        replay["replay_bytes_per_frame" + ("_lz4" if compress else "")] = stored / frames
    return {"bytes_per_frame": plain / frames, "bytes_per_frame_lz4": packed / frames, **replay}


# -- RLlib ---------------------------------------------------------------------------------------------------------
def rllib_run(algo: str, args: argparse.Namespace) -> dict[str, Any]:
    if not PEERS_PYTHON.exists():
        return {"skipped": f"{PEERS_PYTHON} does not exist (bash benchmarks/peers/setup.sh)"}
    out = Path(args.out).with_name(f"atari_rllib_{algo}.json")
    out.unlink(missing_ok=True)
    cmd = [str(PEERS_PYTHON), str(HERE / "peers" / "rllib_atari.py"), "--algo", algo, "--env", args.env,
           "--envs-per-runner", str(args.envs_per_worker), "--seconds", str(args.seconds * args.runs), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not out.exists():
        return {"error": f"rc {proc.returncode}: {proc.stderr.strip().splitlines()[-3:]}"}
    return json.loads(out.read_text())


# -- the command line ------------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line.

    Examples:
        >>> args = parse_args(["--quick"])
        >>> args.runs, args.seconds, args.env
        (2, 10.0, 'ALE/Pong-v5')
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--env", default="ALE/Pong-v5")
    parser.add_argument("--algos", default="impala,appo")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured wall seconds per run")
    parser.add_argument("--procs", type=int, default=2, help="processes stepping the raw emulator")
    parser.add_argument("--envs-per-worker", type=int, default=16, help="the presets' 16; RLlib gets the same")
    parser.add_argument("--tree", action="store_true", help="also IMPALA on 4 workers, with and without aggregation")
    parser.add_argument("--no-rllib", action="store_true", help="skip RLlib even where its virtualenv exists")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2 runs of 10 s")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/atari[_quick].json)")
    args = parser.parse_args(argv)
    args.algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    if args.quick:
        args.runs, args.seconds = min(args.runs, 2), min(args.seconds, 10.0)
    args.out = args.out or f"benchmarks/results/atari{'_quick' if args.quick else ''}.json"
    return args


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not b else a / b


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:,.{digits}f}"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    sys.path.insert(0, str(HERE))  # throughput.py's run method
    import torch

    from flowrl import runtime

    torch.set_num_threads(1)
    print(f"raw emulator, {args.procs} processes x {args.envs_per_worker} envs, {args.seconds:g} s ...", flush=True)
    raw = {"bare": [raw_frames_per_s(args.env, False, args.procs, args.envs_per_worker, args.seconds)],
           "preprocessed": [raw_frames_per_s(args.env, True, args.procs, args.envs_per_worker, args.seconds)]}
    runtime.init(num_cpus=6, log_to_driver=False)
    results: dict[str, Any] = {}
    for name in args.algos:
        print(f"flowrl {name} ...", flush=True)
        results[name] = flowrl_runs(name, preset_config(name, args.env, args.seed,
                                                        [f"num_envs_per_worker={args.envs_per_worker}"]),
                                    args.runs, args.seconds)
    if "impala" in args.algos:
        print("flowrl impala, batches compressed on the wire ...", flush=True)
        results["impala_lz4"] = flowrl_runs("impala", preset_config(
            "impala", args.env, args.seed, [f"num_envs_per_worker={args.envs_per_worker}",
                                            "compress_observations=true"]), args.runs, args.seconds)
    if args.tree:
        for aggregators in (0, 1):
            key = f"impala_4w_{aggregators}agg"
            print(f"flowrl impala, 4 workers, {aggregators} aggregation workers ...", flush=True)
            results[key] = flowrl_runs("impala", preset_config(
                "impala", args.env, args.seed, ["num_workers=4", "num_envs_per_worker=4",
                                                f"num_aggregation_workers={aggregators}"]), args.runs, args.seconds)
    print("bytes per frame ...", flush=True)
    sizes = bytes_per_frame(args.env, args.seed)
    import ray

    ray.shutdown()  # its idle workers off the cores before the raw rates are measured again
    raw["bare"].append(raw_frames_per_s(args.env, False, args.procs, args.envs_per_worker, args.seconds))
    raw["preprocessed"].append(raw_frames_per_s(args.env, True, args.procs, args.envs_per_worker, args.seconds))
    bare, prep = statistics.mean(raw["bare"]), statistics.mean(raw["preprocessed"])
    rllib = {algo: rllib_run(algo, args) for algo in ("appo", "impala") if not args.no_rllib}

    lines = [f"| {args.env}, 2 cores, frames/s (4 a step) | frames/s sampled | frames/s trained | of raw ALE "
             f"| of the preprocessed envs | learner utilisation |", "| --- | ---: | ---: | ---: | ---: | ---: |",
             f"| raw ALE (bare emulator, {args.procs} processes x {args.envs_per_worker} envs, random actions) "
             f"| {_fmt(bare)} | - | 1.00 | - | - |",
             f"| the preprocessed envs flowrl steps (same processes) | {_fmt(prep)} | - | {_fmt(prep / bare, 2)} "
             f"| 1.00 | - |"]
    for key, r in results.items():
        m = r["median"]
        lines.append(f"| flowrl {key} | {_fmt(m['frames_per_s_sampled'])} | {_fmt(m['frames_per_s_trained'])} "
                     f"| {_fmt(_ratio(m['frames_per_s_sampled'], bare), 2)} "
                     f"| {_fmt(_ratio(m['frames_per_s_sampled'], prep), 2)} "
                     f"| {_fmt(100 * m['learner_utilisation'])}% |")
    for algo, r in rllib.items():
        if "frames_per_s_sampled" in r:
            lines.append(f"| RLlib {r.get('version', '')} {algo} (same runners, envs, fragment, batch) "
                         f"| {_fmt(r['frames_per_s_sampled'])} | {_fmt(r.get('frames_per_s_trained'))} "
                         f"| {_fmt(_ratio(r['frames_per_s_sampled'], bare), 2)} "
                         f"| {_fmt(_ratio(r['frames_per_s_sampled'], prep), 2)} | - |")
        else:
            lines.append(f"| RLlib {algo} | {r.get('skipped') or r.get('error')} | | | | |")
    lines += ["", "| bytes per frame | plain | LZ4 | ratio |", "| --- | ---: | ---: | ---: |",
              f"| a worker's batch in Ray's object store (obs and new_obs) | {_fmt(sizes['bytes_per_frame'])} "
              f"| {_fmt(sizes['bytes_per_frame_lz4'])} "
              f"| {_fmt(_ratio(sizes['bytes_per_frame'], sizes['bytes_per_frame_lz4']), 1)} |",
              f"| a one-step replay buffer's rows | {_fmt(sizes['replay_bytes_per_frame'])} "
              f"| {_fmt(sizes['replay_bytes_per_frame_lz4'])} "
              f"| {_fmt(_ratio(sizes['replay_bytes_per_frame'], sizes['replay_bytes_per_frame_lz4']), 1)} |"]
    budgets = {key: cpu_budget(args.procs, prep, r) for key, r in results.items()}
    lines += ["", f"| where an agent step's CPU goes (us of one core) | env (preprocessed) | policy forward "
                  f"| learner update | sum | ceiling on {args.procs} cores, frames/s | measured / ceiling |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for key, b in budgets.items():
        measured = results[key]["median"]["frames_per_s_sampled"]
        lines.append(f"| flowrl {key} | {_fmt(b['env_us'])} | {_fmt(b['inference_us'])} | {_fmt(b['learner_us'])} "
                     f"| {_fmt(b['env_us'] + b['inference_us'] + b['learner_us'])} | {_fmt(b['ceiling_frames_per_s'])} "
                     f"| {_fmt(_ratio(measured, b['ceiling_frames_per_s']), 2)} |")
    print("\n" + "\n".join(lines))

    def sampled(key: str, source: dict[str, Any]) -> float | None:
        r = source.get(key, {})
        return r.get("median", r).get("frames_per_s_sampled")

    summary = {"atari_impala_vs_raw": _ratio(sampled("impala", results), bare),
               "atari_appo_vs_raw": _ratio(sampled("appo", results), bare),
               "atari_impala_vs_rllib": _ratio(sampled("impala", results), sampled("impala", rllib)),
               "atari_appo_vs_rllib": _ratio(sampled("appo", results), sampled("appo", rllib)),
               "atari_bytes_per_frame": sizes["bytes_per_frame"],
               "atari_bytes_per_frame_lz4": sizes["bytes_per_frame_lz4"]}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "atari", "env": args.env, "quick": args.quick, "runs": args.runs,
                               "seconds": args.seconds, "raw_frames_per_s": raw, "flowrl": results, "rllib": rllib,
                               "sizes": sizes, "cpu_budget": budgets, "summary": summary,
                               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                           "load_avg": os.getloadavg(), "python": platform.python_version(),
                                           "torch": torch.__version__}}, indent=2) + "\n")
    print(" ".join(f"{k}={'nan' if v is None else round(v, 3)}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
