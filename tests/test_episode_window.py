"""The episode statistics' smoothing window outlives a checkpoint restore and a plan rebuild (so a resumed run
and a run that lost a worker continue their curve), and a report before the first finished episode carries no
nan that the logs would write or send to TensorBoard."""

from __future__ import annotations

import csv
import dataclasses
import logging
import math
import os
import signal
from pathlib import Path

import pytest
import ray

from flowrl.algorithms import Algorithm
from flowrl.config import TrainerConfig
from flowrl.logger import RunLogger, flatten_result
from flowrl.testing import FakeTrainerConfig, TinyPGPolicy, make_fake_trainer, tiny_pg_plan
from flowrl.trainer import Trainer

pg_plan = tiny_pg_plan

TINY_PG = Algorithm("tiny_pg", TrainerConfig, TinyPGPolicy, pg_plan)
CFG = TrainerConfig(num_workers=0, rollout_fragment_length=50, train_batch_size=100, seed=3, lr=0.01)


def test_a_restored_trainer_goes_on_with_the_saved_window(tmp_path: Path) -> None:
    trainer = Trainer(TINY_PG, CFG)
    trainer.train()
    before = trainer.train()["hist_stats"]["episode_reward"]
    path = trainer.save(tmp_path)
    trainer.stop()
    fresh = Trainer(TINY_PG, CFG)
    try:
        fresh.restore(path)
        result = fresh.train()
        window = result["hist_stats"]["episode_reward"]
        assert result["episodes_this_iter"] > 0 and len(window) == len(before) + result["episodes_this_iter"]
        assert window[:len(before)] == before  # the saved window, then this report's episodes
        assert result["episode_reward_mean"] == pytest.approx(sum(window) / len(window))
    finally:
        fresh.stop()


def test_a_checkpoint_written_before_the_window_was_saved_still_restores(tmp_path: Path) -> None:
    from flowrl._checkpoint import read_checkpoint, write_checkpoint

    trainer = Trainer(TINY_PG, CFG)
    try:
        trainer.train()
        path = trainer.save(tmp_path)
        state = read_checkpoint(path, algorithm="tiny_pg")
        del state["metrics"]["episode_window"]
        old = write_checkpoint(tmp_path, "old_checkpoint", state, algorithm="tiny_pg")
        trainer.restore(old)
        result = trainer.train()
        assert len(result["hist_stats"]["episode_reward"]) == result["episodes_this_iter"]  # a fresh window
    finally:
        trainer.stop()


# -- a plan rebuilt after a worker failure (fake workers) -------------------------------------------

def test_a_plan_rebuilt_after_a_worker_failure_goes_on_with_the_window() -> None:
    trainer = make_fake_trainer(FakeTrainerConfig(num_workers=2, rollout_fragment_length=10, train_batch_size=20,
                                                recreate_failed_workers=True))
    try:
        before = trainer.train()["hist_stats"]["episode_reward"]
        assert before
        pid = ray.get(trainer.workers.remote_workers()[0].apply.remote(lambda w: os.getpid()))
        os.kill(pid, signal.SIGKILL)
        after = trainer.train()  # the failed gather rebuilds the plan, then the report is retried
        window = after["hist_stats"]["episode_reward"]
        assert window[:len(before)] == before and len(window) == len(before) + after["episodes_this_iter"]
    finally:
        trainer.stop()


# -- no nan before the first finished episode --------------------------------------------------------

def test_a_report_without_a_finished_episode_is_logged_without_nan(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    config = dataclasses.replace(CFG, rollout_fragment_length=5, train_batch_size=5)  # no CartPole episode in 5 steps
    trainer = Trainer(TINY_PG, config)
    try:
        first = trainer.train()
        assert first["episodes_this_iter"] == 0 and "episode_reward_mean" not in first
        assert not [k for k, v in flatten_result(first).items() if not math.isfinite(v)]
        while "episode_reward_mean" not in (later := trainer.train()):
            pass
    finally:
        trainer.stop()
    with caplog.at_level(logging.WARNING), RunLogger(tmp_path) as logs:
        logs.log(first)
        logs.log(later)
        logs.log({**later, "training_iteration": 99, "info": {"learner": {"loss": math.nan}}})  # a diverged loss
    assert "NaN or Inf" not in caplog.text  # tensorboardX's warning: TensorBoard is sent no nan
    with open(tmp_path / "progress.csv", newline="") as f:
        header, *rows = list(csv.reader(f))
    assert all(len(row) == len(header) for row in rows)
    by_name = [dict(zip(header, row)) for row in rows]
    assert by_name[0]["episode_reward_mean"] == ""  # the column came later; the first row leaves it empty
    assert float(by_name[1]["episode_reward_mean"]) == pytest.approx(later["episode_reward_mean"])
    assert by_name[1]["training_iteration"] == str(later["training_iteration"])
    assert by_name[2]["info/learner/loss"] == "nan"  # the CSV keeps what happened
