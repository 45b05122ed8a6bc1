"""``python -m flowrl``: the main job, or, with arguments, the ``flowrl`` command line.

With no arguments it trains PPO on CartPole-v1 with two rollout workers and RLlib's tuned settings
(train batch 4000, minibatch 128, 6 epochs, lr 3e-4) until the smoothed return reaches 450 or 300k env
steps have been sampled. It is exactly ``flowrl train`` with :data:`flowrl.cli.MAIN_JOB`'s arguments, so
it writes the same run directory: ``progress.csv``, ``result.json``, TensorBoard events, a checkpoint
and ``learning_curve.png``. With arguments, ``python -m flowrl train ...`` is ``flowrl train ...``.
"""

from __future__ import annotations

import sys

from flowrl.cli import MAIN_JOB, main as cli


def main() -> None:
    args = sys.argv[1:]
    if not args:
        print("main job: flowrl " + " ".join(MAIN_JOB), flush=True)
    cli(args=args or list(MAIN_JOB), prog_name="python -m flowrl")


if __name__ == "__main__":
    main()
