"""`flowrl plan show` draws a plan over stand-in workers (flowrl.plan_graph.stand_in_plan): nothing starts, and
the graph is the one a Trainer runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flowrl import plan_graph
from flowrl.algorithms import ALGORITHMS, get_algorithm
from flowrl.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.usefixtures("local_executor")  # the trainer's actors in this process: its defaults, in a blink
@pytest.mark.parametrize("name", sorted(set(ALGORITHMS) - {"ddppo"}))  # a process group: tests/algorithms/test_ddppo.py
def test_the_stand_in_plan_has_the_trainers_graph(name: str) -> None:
    algorithm = get_algorithm(name)
    config = algorithm.config_class()
    trainer = Trainer(algorithm, config)
    try:
        trained = plan_graph.to_text(plan_graph.build(trainer.plan))
    finally:
        trainer.stop()
    with plan_graph.stand_in_plan(algorithm, config) as plan:
        assert plan_graph.to_text(plan_graph.build(plan)) == trained


def test_plan_show_of_every_algorithm_starts_no_ray_and_draws_every_shard() -> None:
    script = f"""
import ray
from click.testing import CliRunner
from flowrl.algorithms import ALGORITHMS, get_algorithm
from flowrl.cli import main
for name in {sorted(ALGORITHMS)!r}:
    result = CliRunner().invoke(main, ["plan", "show", name])
    assert result.exit_code == 0, (name, result.output)
    n = get_algorithm(name).config_class().num_workers
    assert n == 0 or f"[shards={{n}}]" in result.output or f"({{n}} shards)" in result.output, (name, result.output)
    print(name, ray.is_initialized())
for name in ("impala", "appo"):  # tree aggregation: stand-in aggregators, no actors
    args = ["plan", "show", name, "--config", "num_workers=4", "--config", "num_aggregation_workers=2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0 and "Aggregators[2]" in result.output, (name, result.output)
    print(name, ray.is_initialized())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    expected = [*sorted(ALGORITHMS), "impala", "appo"]
    assert done.stdout.split() == [word for name in expected for word in (name, "False")]


def test_pulling_a_stand_in_plan_says_it_cannot_run() -> None:
    algorithm = get_algorithm("ppo")
    with plan_graph.stand_in_plan(algorithm, algorithm.config_class(num_workers=2)) as plan:
        with pytest.raises(RuntimeError, match="stand-in actors to draw its graph"):
            next(plan)
