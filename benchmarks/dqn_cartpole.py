"""flowrl DQN on CartPole-v1 with its defaults (RLlib's): env steps/s and wall seconds to mean return 150 and 450.

The suite's ``dqn`` group runs it beside Stable-Baselines3 and RLlib DQN (``peers/sb3_dqn.py``, ``peers/rllib_dqn.py``,
whose docstrings map each of ``DQNConfig``'s defaults to theirs): no remote workers, one env, fragments of 4 steps,
one 32-row replay per fragment, prioritized double dueling Q with a 500-step target update. The run is
``time_to_solve.solve`` (start-up timed apart; training time from the first ``next()`` of the plan; a report
every 0.5 s of training) with one step budget for both thresholds.

``--matched`` (the suite's ``dqn_cartpole_matched``): the settings Stable-Baselines3's DQN has, so that the two
compute the same thing per step: ``MATCHED`` turns prioritized replay, dueling heads and double Q off and gives
flowrl SB3's network, a 64-64-256 tanh MLP with a linear Q head (``peers/sb3_dqn.py``'s ``net_arch``). Batch 32,
one replay per 4-step fragment (8 rows trained per env step), a target copy every 500 env steps,
learning_starts 1000 and a 50000-step buffer are both sides' already.

Run: ``python benchmarks/dqn_cartpole.py [--quick] [--matched] [--seed 0] [--max-steps 50000] [--stop-return 450]``.
The last line is ``dqn_env_steps_per_s=<env steps sampled per second of training>``.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

from time_to_solve import init_ray, load, solve, torch  # type: ignore[import-not-found]  # benchmarks/ on the path

from flowrl.config import ModelConfig

THRESHOLDS = (150.0, 450.0)
#: DQNConfig fields that make flowrl's DQN compute what SB3's plain DQN computes (--matched)
MATCHED = {"prioritized_replay": False, "dueling": False, "double_q": False, "hiddens": (),
           "model": ModelConfig(hidden_sizes=(64, 64, 256), activation="tanh")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=50_000, help="stop after this many env steps")
    parser.add_argument("--stop-return", type=float, default=450.0, help="stop at this smoothed return")
    parser.add_argument("--torch-threads", type=int, default=1, help="intra-op threads of the learner")
    parser.add_argument("--quick", action="store_true", help="stop after 5,000 env steps")
    parser.add_argument("--matched", action="store_true", help="SB3 DQN's settings (MATCHED) instead of defaults")
    parser.add_argument("--out", type=Path, default=None, help="JSON (default benchmarks/results/dqn_cartpole.json)")
    args = parser.parse_args()
    if args.quick:
        args.max_steps = min(args.max_steps, 5_000)
    thresholds = [t for t in THRESHOLDS if t <= args.stop_return] or [args.stop_return]
    torch.set_num_threads(args.torch_threads)
    init_ray(num_cpus=2)
    run = solve(load("dqn"), "dqn", args.seed, thresholds, {t: args.max_steps for t in thresholds}, None,
                overrides=MATCHED if args.matched else None)
    rate = run["env_steps_sampled"] / run["train_s"]
    report = {"benchmark": "dqn_cartpole", "quick": args.quick, **run, "env_steps_per_s_sampled": round(rate, 1),
              "env_steps_per_s_trained": round(run["env_steps_trained"] / run["train_s"], 1),
              "env_steps_per_cpu_s": round(run["env_steps_sampled"] / run["cpu_s"], 1) if run["cpu_s"] > 0 else None,
              "config": {"algorithm": "dqn (SB3's settings: MATCHED)" if args.matched else "dqn (DQNConfig defaults)",
                         "matched": {k: str(v) for k, v in MATCHED.items()} if args.matched else None,
                         "max_steps": args.max_steps,
                         "stop_return": args.stop_return, "torch_threads": args.torch_threads},
              "machine": {"platform": platform.platform(), "python": platform.python_version(),
                          "torch": torch.__version__}}
    print(f"\n| flowrl DQN, CartPole-v1 ({'matched to SB3' if args.matched else 'defaults'}) | value |\n| --- | --- |")
    for key in ("env_steps_per_s_sampled", "env_steps_per_s_trained", "seconds_to_150", "steps_to_150",
                "seconds_to_450", "steps_to_450", "startup_s", "train_s", "final_return"):
        print(f"| {key} | {report.get(key)} |")
    name = "dqn_cartpole_matched" if args.matched else "dqn_cartpole"
    out = args.out or Path(__file__).resolve().parent / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"dqn_env_steps_per_s={rate:.1f}")


if __name__ == "__main__":
    main()
