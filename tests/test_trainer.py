"""The Trainer: one next() per train(), checkpoints, determinism and worker failure."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray

from flowrl.algorithms import Algorithm
from flowrl.config import TrainerConfig
from flowrl.iter import LocalIterator
from flowrl.ops.metrics import StandardMetricsReporting
from flowrl.ops.rollout import ConcatBatches, ParallelRollouts
from flowrl.ops.train import TrainOneStep
from flowrl.testing import FakeConfig, FakeTrainerConfig, TinyPGPolicy, make_fake_trainer, tiny_pg_plan
from flowrl.trainer import Trainer
from flowrl.workers import WorkerSet


pg_plan = tiny_pg_plan

TINY_PG = Algorithm("tiny_pg", TrainerConfig, TinyPGPolicy, pg_plan)
CFG = TrainerConfig(num_workers=0, rollout_fragment_length=25, train_batch_size=50, seed=5, lr=0.01,
                    batch_mode="complete_episodes")

WALL_CLOCK = {"time_this_iter_s", "time_total_s", "timers"}


def comparable(result: dict[str, Any]) -> str:
    kept = {k: v for k, v in result.items() if k not in WALL_CLOCK}
    kept["info"] = {k: v for k, v in kept["info"].items() if k != "timing_breakdown"}
    return json.dumps(kept, sort_keys=True, default=lambda x: np.asarray(x).tolist())


def test_train_is_exactly_one_next_of_the_plan() -> None:
    trainer = Trainer(TINY_PG, CFG)
    pulls = []
    trainer._plan = trainer.plan.for_each(lambda r: pulls.append(1) or r)
    first, second = trainer.train(), trainer.train()
    assert len(pulls) == 2
    assert (first["training_iteration"], second["training_iteration"]) == (1, 2)
    assert second["timesteps_total"] > first["timesteps_total"] > 0
    assert second["time_total_s"] >= second["time_this_iter_s"] > 0
    assert second["episodes_total"] == first["episodes_this_iter"] + second["episodes_this_iter"]
    trainer.stop()


def test_a_seeded_sync_plan_gives_identical_results_apart_from_wall_clock() -> None:
    runs = []
    for _ in range(2):
        trainer = Trainer(TINY_PG, CFG)
        runs.append([comparable(trainer.train()) for _ in range(3)])
        trainer.stop()
    assert runs[0] == runs[1]


def test_save_train_restore_rewinds_counters_weights_and_optimizer(tmp_path: Path) -> None:
    trainer = Trainer(TINY_PG, CFG)
    trainer.train()
    path = trainer.save(tmp_path)
    assert path.parent == tmp_path and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    saved_weights = trainer.get_policy().get_weights()
    saved_adam = trainer.get_policy().optimizer.state_dict()["state"][0]["exp_avg"].clone()
    at_save = trainer.plan.metrics.counters["num_steps_sampled"]
    after_two = [trainer.train() for _ in range(2)][-1]["timesteps_total"]
    trainer.restore(path)
    assert trainer.training_iteration == 1
    for name, w in trainer.get_policy().get_weights().items():
        np.testing.assert_array_equal(w, saved_weights[name])
    assert bool((trainer.get_policy().optimizer.state_dict()["state"][0]["exp_avg"] == saved_adam).all())
    again = trainer.train()
    assert at_save < again["timesteps_total"] < after_two  # counters rewound, reports keep flowing
    trainer.stop()


def test_a_restore_in_a_fresh_trainer_continues_bit_identically(tmp_path: Path) -> None:
    uninterrupted = Trainer(TINY_PG, CFG)
    uninterrupted.train()
    path = uninterrupted.save(tmp_path)
    # the episode-statistics window is not checkpointed; counters, learner stats and weights are
    expected = [json.loads(comparable(uninterrupted.train()))["info"] for _ in range(2)]
    fresh = Trainer(TINY_PG, CFG)
    fresh.restore(path)
    assert [json.loads(comparable(fresh.train()))["info"] for _ in range(2)] == expected
    for a, b in zip(fresh.get_policy().get_weights().values(), uninterrupted.get_policy().get_weights().values()):
        np.testing.assert_array_equal(a, b)
    uninterrupted.stop()
    fresh.stop()


def test_foreign_newer_or_damaged_checkpoints_are_refused(tmp_path: Path) -> None:
    trainer = Trainer(TINY_PG, CFG)
    trainer.train()
    path = trainer.save(tmp_path / "ok")
    other = Trainer(dataclasses.replace(TINY_PG, name="other_pg"), CFG)
    with pytest.raises(ValueError, match="checkpoint of 'tiny_pg', not 'other_pg'"):
        other.restore(path)
    manifest = path / "manifest.json"
    original = manifest.read_text()
    manifest.write_text(original.replace('"format_version": 1', '"format_version": 99'))
    with pytest.raises(ValueError, match="format 99, newer"):
        trainer.restore(path)
    manifest.write_text(original)
    arrays = path / "arrays.npz"
    arrays.write_bytes(arrays.read_bytes()[:-50])
    with pytest.raises(ValueError, match="arrays.npz is missing, truncated or altered"):
        trainer.restore(path)
    with pytest.raises(ValueError, match="missing or unreadable"):
        trainer.restore(tmp_path / "nothing_here")
    trainer.stop()
    other.stop()


def test_config_class_and_learner_devices_are_checked() -> None:
    with pytest.raises(TypeError, match="needs a FakeConfig"):
        Trainer(Algorithm("fake", FakeConfig, TinyPGPolicy, pg_plan), CFG)
    with pytest.raises(ValueError, match="num_gpus=4 but torch sees"):
        Trainer(TINY_PG, dataclasses.replace(CFG, num_gpus=4))
    with pytest.raises(ValueError, match="unknown algorithm 'nope'"):
        Trainer("nope")


# -- worker failure (fake workers) -------------------------------------------------------------------

def kill(actor: Any) -> None:
    pid = ray.get(actor.apply.remote(lambda w: os.getpid()))
    os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("recreate", [True, False])
def test_a_killed_worker_is_recreated_or_dropped_and_counters_continue(recreate: bool) -> None:
    config = FakeTrainerConfig(num_workers=2, rollout_fragment_length=10, train_batch_size=20,
                               recreate_failed_workers=recreate, ignore_worker_failures=not recreate)
    trainer = make_fake_trainer(config)
    try:
        closed = []
        trainer.plan.on_close(lambda: closed.append(True))
        before = trainer.train()
        assert before["num_healthy_workers"] == 2
        kill(trainer.workers.remote_workers()[0])
        after = trainer.train()
        assert closed == [True]  # the old plan was closed (its learner threads would stop here)
        assert after["timesteps_total"] > before["timesteps_total"]  # counters carried over
        assert after["timesteps_this_iter"] == after["timesteps_total"] - before["timesteps_total"]
        assert after["num_healthy_workers"] == (2 if recreate else 1)
        if recreate:  # the replacement got the learner's current weights
            record = ray.get(trainer.workers.remote_workers()[0].get_record.remote())
            local_version = trainer.workers.local_worker().versions["default_policy"]
            assert record["versions"]["default_policy"] >= local_version - 1
    finally:
        trainer.stop()


def test_a_worker_failure_propagates_when_neither_flag_is_set() -> None:
    config = FakeTrainerConfig(num_workers=1, rollout_fragment_length=10, train_batch_size=10,
                               recreate_failed_workers=False, ignore_worker_failures=False)
    trainer = make_fake_trainer(config)
    try:
        trainer.train()
        kill(trainer.workers.remote_workers()[0])
        with pytest.raises(Exception) as raised:
            trainer.train()
        assert isinstance(raised.value, ray.exceptions.RayActorError) or \
            isinstance(raised.value.__cause__, ray.exceptions.RayActorError)
    finally:
        trainer.stop()


def stored_pg_plan(workers: WorkerSet, config: TrainerConfig, *,
                   replay_buffer: Any = None) -> LocalIterator[dict[str, Any]]:
    from flowrl.ops.replay import StoreToReplayBuffer
    from flowrl.replay_buffers import LocalReplayBuffer

    buf = replay_buffer if replay_buffer is not None else LocalReplayBuffer(learning_starts=0, capacity=1000)
    train_op = (ParallelRollouts(workers).for_each(StoreToReplayBuffer(local_buffer=buf))
                .combine(ConcatBatches(config.train_batch_size)).for_each(TrainOneStep(workers)))
    return StandardMetricsReporting(train_op, workers, config)


@pytest.mark.parametrize("store", [True, False])
def test_trainer_owned_state_reaches_every_plan_and_is_checkpointed_on_request(tmp_path: Path, store: bool) -> None:
    from flowrl.replay_buffers import LocalReplayBuffer

    algo = Algorithm("stored_pg", TrainerConfig, TinyPGPolicy, stored_pg_plan,
                     make_owned_state=lambda cfg: {"replay_buffer": LocalReplayBuffer(learning_starts=0,
                                                                                      capacity=1000)})
    trainer = Trainer(algo, dataclasses.replace(CFG, store_buffer_in_checkpoints=store))
    buf = trainer.owned_state["replay_buffer"]
    trainer.train()
    added = buf.num_added
    assert added >= CFG.train_batch_size  # the plan stored into the trainer's buffer
    path = trainer.save(tmp_path)
    trainer.train()
    assert buf.num_added > added
    trainer.restore(path)
    assert (buf.num_added == added) is store  # replay data rewinds only when checkpoints hold it
    trainer.stop()


def test_a_malformed_plan_is_refused_before_launch_and_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[bool] = []
    stopped: list[bool] = []

    def leaky_plan(workers: WorkerSet, config: TrainerConfig) -> LocalIterator[dict[str, Any]]:
        rollouts, unused = ParallelRollouts(workers, mode="bulk_sync").duplicate(2)  # one child never consumed
        return pg_plan_from(rollouts, workers, config).on_close(lambda: closed.append(True))

    original_stop = WorkerSet.stop
    monkeypatch.setattr(WorkerSet, "stop", lambda self: stopped.append(True) or original_stop(self))
    with pytest.raises(ValueError, match="duplicate\\[1\\].* is never consumed"):
        Trainer(Algorithm("leaky", TrainerConfig, TinyPGPolicy, leaky_plan), dataclasses.replace(CFG, num_workers=1))
    assert closed == [True] and stopped == [True]  # the plan closed and the remote worker stopped


def pg_plan_from(rollouts: LocalIterator[Any], workers: WorkerSet, config: TrainerConfig) -> LocalIterator[dict[str, Any]]:
    train_op = rollouts.combine(ConcatBatches(config.train_batch_size)).for_each(TrainOneStep(workers))
    return StandardMetricsReporting(train_op, workers, config)
