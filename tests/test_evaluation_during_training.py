"""Evaluation during training (``evaluation_interval``): separate evaluation workers, whose episodes never reach
the learner, report under ``result["evaluation"]`` on the asked cadence; the plan draws the step; bad settings
are named."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from flowrl import executor
from flowrl.algorithms.multiagent import MultiAgentConfig
from flowrl.algorithms.ppo import PPOConfig
from flowrl.cli import main
from flowrl.trainer import Trainer

pytestmark = pytest.mark.usefixtures("local_executor")  # what is evaluated and counted, not Ray: see conftest.py

PPO = PPOConfig(seed=0, num_workers=2, train_batch_size=400, sgd_minibatch_size=100, num_sgd_iter=2,
                timesteps_per_iteration=0)
EVALUATED = dataclasses.replace(PPO, evaluation_interval=2, evaluation_num_workers=1, evaluation_duration=5)


def run(config: Any, reports: int) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    trainer = Trainer("ppo", config)
    try:
        results = [trainer.train() for _ in range(reports)]
        return results, trainer.get_policy().get_weights()
    finally:
        trainer.stop()


def test_evaluation_reports_on_its_cadence_and_never_reaches_the_learner() -> None:
    evaluated, weights = run(EVALUATED, 4)
    plain, plain_weights = run(PPO, 4)
    assert ["evaluation" in r for r in evaluated] == [False, True, False, True]
    for result in evaluated[1::2]:
        ev = result["evaluation"]
        assert ev["episodes_this_iter"] == 5 == len(ev["hist_stats"]["episode_reward"])
        assert ev["episode_reward_min"] <= ev["episode_reward_mean"] <= ev["episode_reward_max"]
        assert ev["timesteps_this_iter"] == sum(ev["hist_stats"]["episode_lengths"]) and ev["explore"] is False
    # the evaluation's steps are in no counter, and the learner saw exactly the batches of a run without it
    for a, b in zip(evaluated, plain):
        assert (a["timesteps_total"], a["info"]["num_steps_trained"], a["episodes_total"]) == \
            (b["timesteps_total"], b["info"]["num_steps_trained"], b["episodes_total"])
    assert all(np.array_equal(weights[k], plain_weights[k]) for k in plain_weights)


def test_an_evaluation_by_env_steps_runs_whole_episodes_in_the_driver() -> None:
    config = dataclasses.replace(PPO, evaluation_interval=1, evaluation_duration=300,
                                 evaluation_duration_unit="timesteps", evaluation_explore=True)
    (result,), _ = run(config, 1)
    ev = result["evaluation"]
    assert ev["timesteps_this_iter"] >= 300 and ev["explore"] is True
    assert ev["timesteps_this_iter"] == sum(ev["hist_stats"]["episode_lengths"])


def test_a_dead_evaluation_worker_is_recreated_and_the_cadence_survives_a_restore(tmp_path: Path) -> None:
    trainer = Trainer("ppo", EVALUATED)
    try:
        trainer.train()
        path = trainer.save(tmp_path)
        assert trainer.evaluation_workers is not None
        executor.kill(trainer.evaluation_workers.remote_workers()[0])
        assert trainer.train()["evaluation"]["episodes_this_iter"] == 5
    finally:
        trainer.stop()
    restored = Trainer.from_checkpoint(path, executor="local")
    try:
        assert restored.training_iteration == 1 and "evaluation" in restored.train()  # report 2, as before
    finally:
        restored.stop()


def test_multi_agent_evaluation_reports_each_policys_return() -> None:
    config = dataclasses.replace(MultiAgentConfig(seed=0, num_workers=0), evaluation_interval=1,
                                 evaluation_duration=4)
    trainer = Trainer("multiagent", config)
    try:
        ev = trainer.train()["evaluation"]
    finally:
        trainer.stop()
    assert ev["episodes_this_iter"] == 4 and set(ev["policy_reward_mean"]) == set(config.policies or {})


def test_a_parallel_evaluation_runs_during_its_reports_training_with_the_weights_before_it() -> None:
    parallel, weights = run(dataclasses.replace(EVALUATED, evaluation_parallel_to_training=True), 4)
    plain, plain_weights = run(PPO, 4)
    assert ["evaluation" in r for r in parallel] == [False, True, False, True]
    # launched when report 1 ended, so it evaluated report 1's weights: the same episodes as the first evaluation
    # of a run that evaluates after every report, the first one with report 1's weights
    every, _ = run(dataclasses.replace(EVALUATED, evaluation_interval=1), 1)
    assert parallel[1]["evaluation"] == every[0]["evaluation"]
    for a, b in zip(parallel, plain):  # and training never saw it
        assert (a["timesteps_total"], a["info"]["num_steps_trained"]) == (b["timesteps_total"],
                                                                        b["info"]["num_steps_trained"])
    assert all(np.array_equal(weights[k], plain_weights[k]) for k in plain_weights)


def test_a_parallel_evaluation_due_with_none_launched_runs_then() -> None:
    (first,), _ = run(dataclasses.replace(EVALUATED, evaluation_interval=1, evaluation_parallel_to_training=True), 1)
    assert first["evaluation"]["episodes_this_iter"] == 5  # report 1 had no report before it to launch it


@pytest.mark.on_ray
def test_a_parallel_evaluation_on_ray() -> None:
    config = dataclasses.replace(EVALUATED, num_cpus_per_worker=0, evaluation_parallel_to_training=True)
    results, _ = run(config, 2)
    assert "evaluation" not in results[0] and results[1]["evaluation"]["episodes_this_iter"] == 5
    assert results[1]["timesteps_total"] == 800


@pytest.mark.on_ray
def test_remote_evaluation_workers_on_ray() -> None:
    config = dataclasses.replace(EVALUATED, evaluation_interval=1, num_cpus_per_worker=0)
    results, _ = run(config, 1)
    assert results[0]["evaluation"]["episodes_this_iter"] == 5 and results[0]["timesteps_total"] == 400


def test_plan_show_draws_the_evaluation_step() -> None:
    done = CliRunner().invoke(main, ["plan", "show", "ppo", "--config", "evaluation_interval=3",
                                     "--config", "evaluation_num_workers=2"])
    assert done.exit_code == 0, done.output
    assert "Evaluate(every 3 reports: 10 episodes, greedy, on 2 workers)" in done.output
    done = CliRunner().invoke(main, ["plan", "show", "ppo", "--config", "evaluation_interval=3", "--config",
                                     "evaluation_num_workers=1", "--config", "evaluation_parallel_to_training=true"])
    assert "Evaluate(every 3 reports: 10 episodes, greedy, on 1 worker, in parallel with training)" in done.output


def test_the_cli_stops_on_the_evaluation_return_when_asked(tmp_path: Path) -> None:
    args = ["train", "pg", "--seed", "0", "--local", "--log-dir", str(tmp_path / "run"), "--stop-iters", "5",
            "--config", "train_batch_size=200", "--config", "timesteps_per_iteration=0",
            "--config", "evaluation_interval=2", "--config", "evaluation_duration=3"]
    done = CliRunner().invoke(main, [*args, "--stop-reward", "1", "--stop-reward-from", "evaluation"])
    assert done.exit_code == 0, done.output
    assert "evaluation/episode_reward_mean" in done.output  # met at the first evaluation: iteration 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "result.json").read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == [1, 2]
    header = (tmp_path / "run" / "progress.csv").read_text().splitlines()[0].split(",")
    assert "evaluation/episode_reward_mean" in header


@pytest.mark.parametrize("field, value, message", [
    ("evaluation_num_workers", -1, "evaluation_num_workers=-1"),
    ("evaluation_interval", -2, "evaluation_interval=-2"),
    ("evaluation_duration", 0, "evaluation_duration=0"),
    ("evaluation_duration_unit", "steps", "evaluation_duration_unit='steps'; use 'episodes' or 'timesteps'"),
    ("evaluation_parallel_to_training", True, "evaluation_parallel_to_training=True evaluates on remote evaluation "
                                              "workers .* but evaluation_num_workers=0; set evaluation_num_workers >= 1"),
])
def test_bad_evaluation_settings_are_named(field: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PPOConfig(**{field: value})


def test_stopping_on_the_evaluation_return_needs_an_evaluating_run() -> None:
    done = CliRunner().invoke(main, ["train", "pg", "--stop-reward", "100", "--stop-reward-from", "evaluation"])
    assert done.exit_code == 2 and "evaluation_interval=K" in done.output, done.output
