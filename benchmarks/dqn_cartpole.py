"""flowrl DQN on CartPole-v1 with its defaults (RLlib's): env steps/s and wall seconds to mean return 150 and 450.

The suite's ``dqn`` group runs it beside Stable-Baselines3 and RLlib DQN (``peers/sb3_dqn.py``, ``peers/rllib_dqn.py``,
whose docstrings map each of ``DQNConfig``'s defaults to theirs): no remote workers, one env, fragments of 4 steps,
one 32-row replay per fragment, prioritized double dueling Q with a 500-step target update. The run is
``time_to_solve.solve`` (start-up timed apart; training time from the first ``next()`` of the plan; a report
every 0.5 s of training) with one step budget for both thresholds.

Run: ``python benchmarks/dqn_cartpole.py [--quick] [--seed 0] [--max-steps 50000] [--stop-return 450]``.
The last line is ``dqn_env_steps_per_s=<env steps sampled per second of training>``.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

from time_to_solve import load, runtime, solve, torch  # type: ignore[import-not-found]  # benchmarks/ on the path

THRESHOLDS = (150.0, 450.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=50_000, help="stop after this many env steps")
    parser.add_argument("--stop-return", type=float, default=450.0, help="stop at this smoothed return")
    parser.add_argument("--torch-threads", type=int, default=1, help="intra-op threads of the learner")
    parser.add_argument("--quick", action="store_true", help="stop after 5,000 env steps")
    parser.add_argument("--out", type=Path, default=None, help="JSON (default benchmarks/results/dqn_cartpole.json)")
    args = parser.parse_args()
    if args.quick:
        args.max_steps = min(args.max_steps, 5_000)
    thresholds = [t for t in THRESHOLDS if t <= args.stop_return] or [args.stop_return]
    torch.set_num_threads(args.torch_threads)
    runtime.init(num_cpus=2, log_to_driver=False)
    run = solve(load("dqn"), "dqn", args.seed, thresholds, {t: args.max_steps for t in thresholds}, None)
    rate = run["env_steps_sampled"] / run["train_s"]
    report = {"benchmark": "dqn_cartpole", "quick": args.quick, **run, "env_steps_per_s_sampled": round(rate, 1),
              "env_steps_per_s_trained": round(run["env_steps_trained"] / run["train_s"], 1),
              "config": {"algorithm": "dqn (DQNConfig defaults)", "max_steps": args.max_steps,
                         "stop_return": args.stop_return, "torch_threads": args.torch_threads},
              "machine": {"platform": platform.platform(), "python": platform.python_version(),
                          "torch": torch.__version__}}
    print("\n| flowrl DQN, CartPole-v1 (defaults) | value |\n| --- | --- |")
    for key in ("env_steps_per_s_sampled", "env_steps_per_s_trained", "seconds_to_150", "steps_to_150",
                "seconds_to_450", "steps_to_450", "startup_s", "train_s", "final_return"):
        print(f"| {key} | {report.get(key)} |")
    out = args.out or Path(__file__).resolve().parent / "results" / "dqn_cartpole.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"dqn_env_steps_per_s={rate:.1f}")


if __name__ == "__main__":
    main()
