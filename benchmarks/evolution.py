"""ES and ARS on CartPole-v1: perturbed episodes evaluated per second with 2, 4 and 8 workers, and the bytes an
evaluation puts on the wire for a small and a large policy.

The policy is held still while it is timed (``stepsize`` 1e-12), so episodes keep their length and the rates
compare worker counts, not learning progress; every update still runs (ranking, the gradient estimate from the
shared noise table, the weight broadcast). One report is one update (``timesteps_per_iteration=0``). Workers ask
Ray for one logical CPU each; on 2 cores, 4 and 8 workers share them.

Bytes: what a worker sends back for a round (``Evaluations``: noise offsets, returns, lengths; pickled), per
perturbed episode, for a 4,610- and a 67,586-parameter MLP -- the same; and the weights the driver puts in the
object store once per update (one copy per node that all its workers read), per perturbed episode of that update.

Run: ``python benchmarks/evolution.py [--quick] [--workers 2 4 8] [--seconds 15] [--out PATH]``. The last line is
``evolution_es_evals_per_s_2=... evolution_ars_evals_per_s_2=... evolution_result_bytes_per_eval=...``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import platform
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from flowrl import runtime
from flowrl.algorithms.ars import ARSConfig, ARSPolicy
from flowrl.algorithms.es import ESConfig, ESPolicy
from flowrl.config import ModelConfig
from flowrl.evolution import EvolutionConfig, NoiseTable, PerturbationWorker
from flowrl.trainer import Trainer

NOISE_SIZE = 10_000_000
CONFIGS: dict[str, type[EvolutionConfig]] = {"es": ESConfig, "ars": ARSConfig}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line.

    Examples:
        >>> args = parse_args(["--quick"])
        >>> args.workers, args.seconds
        ([2, 4], 4.0)
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--seconds", type=float, default=15.0, help="timed seconds per algorithm and worker count")
    parser.add_argument("--quick", action="store_true", help="2 and 4 workers, 4 s each")
    parser.add_argument("--out", default="benchmarks/results/evolution.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.workers, args.seconds = [w for w in args.workers if w <= 4], min(args.seconds, 4.0)
    return args


def rate(algo: str, workers: int, seconds: float) -> dict[str, Any]:
    """Perturbed episodes and env steps per second of ``algo`` with ``workers`` remote workers."""
    config = CONFIGS[algo](env="CartPole-v1", num_workers=workers, seed=0, noise_size=NOISE_SIZE, stepsize=1e-12,
                           timesteps_per_iteration=0)
    trainer = Trainer(algo, config)
    try:
        trainer.train()  # the workers' start-up and first round stay out of the timing
        pairs, steps, updates = 0.0, 0, 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            result = trainer.train()
            pairs += result["info"]["learner"]["default_policy"]["learner_stats"]["num_pairs"]
            steps += result["timesteps_this_iter"]
            updates += 1
        elapsed = time.perf_counter() - start
    finally:
        trainer.stop()
    return {"algorithm": algo, "workers": workers, "evals_per_s": 2 * pairs / elapsed, "env_steps_per_s": steps / elapsed,
            "updates_per_s": updates / elapsed, "seconds": elapsed}


def wire_bytes(algo: str, hidden: tuple[int, ...]) -> dict[str, Any]:
    """Bytes per perturbed episode: a round's answer, and the update's weights (once per update)."""
    config = CONFIGS[algo](env="CartPole-v1", num_workers=0, seed=0, noise_size=NOISE_SIZE,
                           model=ModelConfig(hidden_sizes=hidden))
    policy_class = ESPolicy if algo == "es" else ARSPolicy
    worker = PerturbationWorker(policy_class=policy_class, config=config)
    worker.set_noise(NoiseTable(NOISE_SIZE, 0))
    pairs = config.pairs_per_worker
    answer = len(pickle.dumps(worker.evaluate(num_pairs=pairs)))
    weights = len(pickle.dumps(worker.get_weights()))
    episodes_per_update = 2 * config.pairs_per_iteration
    return {"algorithm": algo, "hidden": list(hidden), "params": worker.policy.num_params,
            "result_bytes_per_eval": answer / (2 * pairs), "weights_bytes_per_eval": weights / episodes_per_update}


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.getLogger("flowrl").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    runtime.init(num_cpus=max(args.workers) + 2, log_to_driver=False)
    rates = [rate(algo, n, args.seconds) for algo in CONFIGS for n in args.workers]
    sizes = [wire_bytes(algo, hidden) for algo in CONFIGS for hidden in ((64, 64), (256, 256))]
    print("| algorithm | workers | perturbed episodes/s | env steps/s | updates/s |\n| --- | ---: | ---: | ---: | ---: |")
    for r in rates:
        print(f"| {r['algorithm']} | {r['workers']} | {r['evals_per_s']:.0f} | {r['env_steps_per_s']:.0f} "
              f"| {r['updates_per_s']:.2f} |")
    print("\n| algorithm | hidden | parameters | answer bytes / episode | weights bytes / episode |\n"
          "| --- | --- | ---: | ---: | ---: |")
    for s in sizes:
        print(f"| {s['algorithm']} | {s['hidden']} | {s['params']:,} | {s['result_bytes_per_eval']:.0f} "
              f"| {s['weights_bytes_per_eval']:.0f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "evolution", "quick": args.quick, "seconds": args.seconds,
                               "rates": rates, "bytes": sizes,
                               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                           "python": platform.python_version(), "torch": torch.__version__}},
                              indent=2) + "\n")
    first = args.workers[0]
    by = {(r["algorithm"], r["workers"]): r for r in rates}
    print(f"evolution_es_evals_per_s_{first}={by['es', first]['evals_per_s']:.0f} "
          f"evolution_ars_evals_per_s_{first}={by['ars', first]['evals_per_s']:.0f} "
          f"evolution_result_bytes_per_eval={max(s['result_bytes_per_eval'] for s in sizes):.0f}")


if __name__ == "__main__":
    main()
