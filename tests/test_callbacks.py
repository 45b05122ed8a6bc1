"""Callbacks (flowrl/callbacks.py): each hook runs where RLlib users expect it, custom metrics reach results,
progress.csv and TensorBoard, and a bad callbacks setting is named."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from flowrl.algorithms.a3c import A3CConfig
from flowrl.algorithms.multiagent import MultiAgentConfig
from flowrl.algorithms.pg import PGConfig
from flowrl.algorithms.ppo import PPOConfig
from flowrl.callbacks import Callbacks, Episode
from flowrl.cli import main
from flowrl.config import RolloutConfig, config_from_data, config_to_data
from flowrl.sample_batch import EPS_ID, SampleBatch
from flowrl.testing import TinyPGPolicy, tb_scalars
from flowrl.trainer import Trainer
from flowrl.workers import RolloutWorker

pytestmark = pytest.mark.usefixtures("local_executor")  # what the hooks see, not Ray: see conftest.py


class PoleAngle(Callbacks):
    """Reports each episode's largest pole angle (CartPole's observation 2) as a custom metric."""

    def on_episode_step(self, *, worker: Any, episode: Episode) -> None:
        episode.user_data.setdefault("angles", []).append(abs(float(episode.last_observation[2])))

    def on_episode_end(self, *, worker: Any, episode: Episode) -> None:
        episode.custom_metrics["max_pole_angle"] = max(episode.user_data["angles"])


class Recording(Callbacks):
    """Keeps what every hook saw, as plain data."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_episode_start(self, *, worker: Any, episode: Episode) -> None:
        assert episode.length == 0 and episode.total_reward == 0.0 and episode.last_observation is None
        self.calls.append(("start", episode.env_index, episode.episode_id))

    def on_episode_step(self, *, worker: Any, episode: Episode) -> None:
        self.calls.append(("step", episode.env_index, episode.episode_id, episode.length, episode.last_reward))

    def on_episode_end(self, *, worker: Any, episode: Episode) -> None:
        self.calls.append(("end", episode.env_index, episode.episode_id, episode.length, episode.total_reward))
        episode.custom_metrics["length_seen"] = episode.length

    def on_sample_end(self, *, worker: Any, samples: Any) -> None:
        self.calls.append(("sample", samples.count))


def test_episode_hooks_follow_each_env_and_agree_with_the_sampled_rows() -> None:
    config = RolloutConfig(seed=3, num_envs_per_worker=3, rollout_fragment_length=40, callbacks=Recording)
    worker = RolloutWorker(policy_class=TinyPGPolicy, config=config)
    calls: list[tuple[Any, ...]] = worker.callbacks.calls  # type: ignore[attr-defined]
    assert calls == [("start", i, i) for i in range(3)]
    batches = [worker.sample() for _ in range(3)]
    assert [c for c in calls if c[0] == "sample"] == [("sample", 120)] * 3
    assert sum(c[0] == "step" for c in calls) == 3 * 3 * 40  # every env, every step
    ends = [c for c in calls if c[0] == "end"]
    records = worker.get_metrics()
    assert len(ends) == len(records) > 3
    assert [(c[1], c[3], c[4]) for c in ends] == [(r.env_index, r.episode_length, r.episode_return) for r in records]
    assert [r.custom_metrics for r in records] == [{"length_seen": r.episode_length} for r in records]
    # the ids the hooks saw are those of the rows: each ended episode's rows have its id and its length
    rows = SampleBatch.concat(batches)
    for _, env_index, episode_id, length, _ in ends:
        assert int(np.sum(rows[EPS_ID] == episode_id)) == length
    starts = [c for c in calls if c[0] == "start"]
    assert len(starts) == 3 + len(ends) and len({c[2] for c in starts}) == len(starts)  # every start a new id


def test_a_worker_without_hooks_tracks_nothing_and_a_restored_one_starts_its_episodes_afresh() -> None:
    plain = RolloutWorker(policy_class=TinyPGPolicy, config=RolloutConfig(seed=1))
    assert plain._tracker is None
    config = RolloutConfig(seed=1, num_envs_per_worker=2, rollout_fragment_length=7, callbacks=Recording)
    source, target = (RolloutWorker(policy_class=TinyPGPolicy, config=config) for _ in range(2))
    source.sample()
    target.set_state(source.get_state())
    calls = target.callbacks.calls  # type: ignore[attr-defined]
    assert calls[-2:] == [("start", i, int(source._eps_id[i])) for i in range(2)]


def test_multi_agent_episodes_carry_custom_metrics_into_each_report() -> None:
    config = dataclasses.replace(MultiAgentConfig(seed=0, num_workers=0), callbacks=Recording)
    trainer = Trainer("multiagent", config)
    try:
        result = trainer.train()
    finally:
        trainer.stop()
    assert result["custom_metrics"]["length_seen_mean"] == pytest.approx(result["episode_len_mean"])


class LearnStat(Callbacks):
    def on_learn_on_batch(self, *, policy: Any, train_batch: Any, result: dict[str, Any]) -> None:
        result["rows_seen"] = train_batch.count

    def on_train_result(self, *, trainer: Any, result: dict[str, Any]) -> None:
        result["reports_seen"] = trainer.training_iteration


@pytest.mark.parametrize("config", [
    PGConfig(seed=0, num_workers=0, train_batch_size=100),  # the worker's learn_on_batch
    PPOConfig(seed=0, num_workers=0, train_batch_size=128, sgd_minibatch_size=64, num_sgd_iter=1,
              simple_optimizer=False),  # the multi-device learner's step
    A3CConfig(seed=0, num_workers=1, rollout_fragment_length=20),  # compute_gradients on a worker
], ids=["pg", "ppo-multi-device", "a3c"])
def test_learn_and_train_hooks_add_to_learner_stats_and_results(config: Any) -> None:
    trainer = Trainer(type(config).__name__.removesuffix("Config").lower(), dataclasses.replace(config,
                                                                                               callbacks=LearnStat))
    try:
        results = [trainer.train() for _ in range(2)]
    finally:
        trainer.stop()
    assert [r["reports_seen"] for r in results] == [1, 2]
    stats = results[-1]["info"]["learner"]["default_policy"]["learner_stats"]
    assert stats["rows_seen"] > 0


def test_a_custom_metric_reaches_results_progress_csv_and_tensorboard(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["train", "pg", "--env", "CartPole-v1", "--seed", "0", "--stop-iters", "2", "--local",
            "--config", "train_batch_size=400", "--config", "timesteps_per_iteration=0",
            "--config", f"callbacks={__name__}:PoleAngle", "--log-dir", str(run_dir)]
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 0, done.output
    results = [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]
    with open(run_dir / "progress.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    scalars = tb_scalars(run_dir / "tb")
    for stat in ("mean", "min", "max"):
        key = f"max_pole_angle_{stat}"
        values = [r["custom_metrics"][key] for r in results]
        assert all(0 < v < 0.3 for v in values)  # CartPole ends an episode one step past 12 degrees (0.21 rad)
        assert [float(r[f"custom_metrics/{key}"]) for r in rows] == pytest.approx(values)
        assert [v for _, v in scalars[f"custom_metrics/{key}"]] == pytest.approx(values, rel=1e-6)
    # the checkpoint keeps the import path: a resume runs the hooks with nothing more said
    done = CliRunner().invoke(main, ["train", "pg", "--resume", str(run_dir), "--stop-iters", "3", "--local"])
    assert done.exit_code == 0, done.output
    last = json.loads((run_dir / "result.json").read_text().splitlines()[-1])
    assert last["training_iteration"] == 3 and "max_pole_angle_mean" in last["custom_metrics"]


@pytest.mark.on_ray
def test_remote_workers_run_the_hooks_on_ray() -> None:
    trainer = Trainer("pg", PGConfig(seed=0, num_workers=2, num_cpus_per_worker=0, train_batch_size=400,
                                     callbacks=PoleAngle))
    try:
        result = trainer.train()
    finally:
        trainer.stop()
    assert result["episodes_this_iter"] > 0 and 0 < result["custom_metrics"]["max_pole_angle_mean"] < 0.3


def test_a_path_round_trips_through_checkpoint_data_and_a_class_is_kept_out() -> None:
    data = config_to_data(PGConfig(callbacks="flowrl.callbacks:Callbacks"))
    assert config_from_data(PGConfig, data).callbacks == "flowrl.callbacks:Callbacks"
    data = config_to_data(PGConfig(callbacks=PoleAngle))
    assert data["not_stored"]["callbacks"]["value"] == "PoleAngle"  # a class is not data, as a callable env
    assert not data["not_stored_are_defaults"]


@pytest.mark.parametrize("value, message", [
    ("nowhere", r"callbacks='nowhere' is not an import path"),
    ("flowrl.nowhere:Mine", r"cannot import module 'flowrl.nowhere'"),
    ("flowrl.callbacks:Mine", r"module 'flowrl.callbacks' has no 'Mine'"),
    ("flowrl.callbacks:Episode", r"not a subclass of flowrl.callbacks.Callbacks"),
    (int, r"not a subclass of flowrl.callbacks.Callbacks"),
])
def test_a_bad_callbacks_setting_is_named_with_the_fix(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        PGConfig(callbacks=value)
    assert "package.module:ClassName" in str(info.value)


def test_a_bad_callbacks_path_on_the_command_line_is_a_usage_error() -> None:
    done = CliRunner().invoke(main, ["train", "pg", "--config", "callbacks=flowrl.nowhere:Mine", "--stop-iters", "1"])
    assert done.exit_code == 2 and "callbacks='flowrl.nowhere:Mine'" in done.output, done.output
