"""Dead and hung actors end in a bounded time with a documented outcome: a dead Ape-X replay shard is
recreated (counted) or named in the error, a hung env.step ends in an error naming the worker or in its
replacement, and an Ape-X report after a worker was recreated still has its episode statistics."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray

from flowrl.algorithms.apex import ApexConfig
from flowrl.algorithms.pg import PGConfig
from flowrl.envs import EnvContext
from flowrl.iter import ShardTimeoutError, from_iterators
from flowrl.trainer import Trainer


class FixedLengthEnv(gym.Env[np.ndarray, int]):
    """Episodes of exactly ``length`` steps, reward 1 per step. With ``hang_at``, the ``hang_at``-th step of the
    env blocks (far longer than any test) instead of returning; with ``marker`` too, only the first env to
    get there blocks (it creates the marker file), so a replacement worker runs on."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int = 100, hang_at: int | None = None, marker: str | None = None) -> None:
        self.length, self.hang_at, self.marker = length, hang_at, marker
        self.t, self.steps = 0, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.steps += 1
        if self.steps == self.hang_at and (self.marker is None or not Path(self.marker).exists()):
            if self.marker is not None:
                Path(self.marker).touch()
            time.sleep(3600)  # the hang under test: nothing but a kill ends it
        self.t += 1
        return np.full(4, self.t / self.length, np.float32), 1.0, self.t >= self.length, False, {}


def make_env(context: EnvContext) -> FixedLengthEnv:
    return FixedLengthEnv(**context.config)


def _apex(**settings: Any) -> ApexConfig:
    base: dict[str, Any] = dict(seed=0, num_workers=0, num_replay_buffer_shards=2, learning_starts=64,
                                train_batch_size=32, buffer_size=1000, rollout_fragment_length=10,
                                timesteps_per_iteration=100, min_iter_time_s=0)
    return ApexConfig(**{**base, **settings})


# -- item 9: a dead Ape-X replay shard ----------------------------------------------------------------------

def test_a_dead_replay_shard_is_recreated_counted_and_training_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    trainer = Trainer("apex", _apex())
    try:
        trainer.train()
        shards = trainer.owned_state["replay_actors"]
        dead = shards[1]
        ray.kill(dead, no_restart=True)
        with caplog.at_level(logging.WARNING):
            result = trainer.train()  # before the fix: retried forever against the same dead shard
        assert result["info"]["num_replay_shards_recreated"] == 1
        assert shards[1] != dead and ray.get(shards[1].ping.remote()) == "ok"
        assert "replay shard(s) [1] of 2 died and were recreated empty" in caplog.text
        result = trainer.train()
        assert result["info"]["num_replay_shards_recreated"] == 1  # a counter: kept, not counted again
    finally:
        trainer.stop()


def test_a_dead_replay_shard_without_recreation_is_named() -> None:
    trainer = Trainer("apex", _apex(recreate_failed_workers=False))
    try:
        trainer.train()
        ray.kill(trainer.owned_state["replay_actors"][0], no_restart=True)
        with pytest.raises(RuntimeError, match=r"replay shard\(s\) \[0\] of 2 .*died.*recreate_failed_workers=True"):
            trainer.train()
    finally:
        trainer.stop()


def test_ignoring_worker_failures_never_drops_a_replay_shard() -> None:
    """Without recreation the run cannot go on with a shard short: named error, not an endless retry."""
    trainer = Trainer("apex", _apex(recreate_failed_workers=False, ignore_worker_failures=True))
    try:
        trainer.train()
        ray.kill(trainer.owned_state["replay_actors"][1], no_restart=True)
        with pytest.raises(RuntimeError, match=r"replay shard\(s\) \[1\] of 2"):
            trainer.train()
    finally:
        trainer.stop()


# -- item 17: a hung env.step -------------------------------------------------------------------------------

def _pg(**settings: Any) -> PGConfig:
    """One remote worker, 10 steps per train() call; its env hangs at its 15th step (in the second call). The
    timeout covers sampling only (a gather waits for its actors to start before it sends a request)."""
    env_config = {"length": 20, "hang_at": 15, **settings.pop("env_config", {})}
    return PGConfig(seed=0, env=make_env, env_config=env_config, num_workers=1, num_cpus_per_worker=0.5,
                    rollout_fragment_length=10, train_batch_size=10, timesteps_per_iteration=0, sample_timeout_s=2,
                    **settings)


def test_a_hung_env_step_is_a_timeout_error_naming_the_worker() -> None:
    trainer = Trainer("pg", _pg(recreate_failed_workers=False))
    try:
        trainer.train()  # steps 1-10
        with pytest.raises(TimeoutError, match=r"remote worker 1 of 1 delivered no sample within "
                                               r"sample_timeout_s=2 s.*raise sample_timeout_s"):
            trainer.train()  # step 15 hangs: before the fix, train() never returned
    finally:
        trainer.stop()


def test_a_hung_env_step_in_an_async_plan_is_named_too() -> None:
    """Ape-X polls its rollouts without blocking while it replays and learns: the timeout still fires."""
    config = _apex(num_workers=1, num_cpus_per_worker=0.5, env=make_env, env_config={"length": 20, "hang_at": 5},
                   sample_timeout_s=2, recreate_failed_workers=False)
    trainer = Trainer("apex", config)
    try:
        with pytest.raises(TimeoutError, match=r"remote worker 1 of 1 delivered no sample within sample_timeout_s=2"):
            trainer.train()
    finally:
        trainer.stop()


def test_a_hung_worker_is_replaced_when_recreation_is_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    marker = tmp_path / "hung-once"
    trainer = Trainer("pg", _pg(env_config={"marker": str(marker)}))
    try:
        trainer.train()
        hung = trainer.workers.remote_workers()[0]
        with caplog.at_level(logging.WARNING):
            result = trainer.train()
        assert marker.exists() and trainer.workers.remote_workers()[0] != hung
        assert "remote worker 1 of 1 delivered no sample" in caplog.text and "killing and recreating" in caplog.text
        assert result["training_iteration"] == 2 and result["timesteps_total"] == 20
    finally:
        trainer.stop()


def test_a_worker_that_hangs_again_after_its_replacement_ends_the_call() -> None:
    """Replacing a worker whose env hangs deterministically would loop: the second hang in one call raises."""
    trainer = Trainer("pg", _pg(env_config={"hang_at": 5}))
    try:
        with pytest.raises(TimeoutError, match="again after it was replaced in this train"):
            trainer.train()
    finally:
        trainer.stop()


def _stalls_after_one() -> Any:
    yield 1
    time.sleep(3600)
    yield 2


@pytest.mark.parametrize("gather", ["gather_async", "batch_across_shards"])
def test_gathers_with_a_timeout_name_the_shard_that_delivers_nothing(gather: str) -> None:
    pi = from_iterators([lambda: iter(range(10**6)), _stalls_after_one])
    it = getattr(pi, gather)(timeout_s=0.5)
    try:
        with pytest.raises(ShardTimeoutError, match=r"shard 1 delivered nothing for 0.5 s") as caught:
            for _ in range(10**7):  # shard 0 never stops delivering: the async gather must still notice shard 1
                next(it)
        assert caught.value.shard_index == 1 and caught.value.timeout_s == 0.5
    finally:
        for actor, _ in pi._pairs():
            ray.kill(actor, no_restart=True)


def test_sample_timeout_is_validated() -> None:
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="sample_timeout_s=.* must be a number > 0, or None"):
            PGConfig(sample_timeout_s=bad)
    for bad in (math.inf, math.nan):
        with pytest.raises(ValueError, match="sample_timeout_s=.* must be a finite number"):
            PGConfig(sample_timeout_s=bad)
    for wrong in (True, "10"):  # the shared check of float fields: a type error
        with pytest.raises(TypeError, match="sample_timeout_s=.* must be a number or None"):
            PGConfig(sample_timeout_s=wrong)  # type: ignore[arg-type]
    assert PGConfig(sample_timeout_s=None).sample_timeout_s is None


# -- item 20: Ape-X's episode statistics after a worker was recreated ---------------------------------------

def test_apex_report_after_a_recreated_worker_keeps_its_episode_statistics() -> None:
    """The report's statistics come from the lowest-epsilon worker (the last one; here the only one), whose
    replacement has finished no 100-step episode by the next report: only the carried-over window gives it a
    value."""
    config = _apex(num_workers=1, num_cpus_per_worker=0.5, num_replay_buffer_shards=1, env=make_env,
                   env_config={"length": 100}, timesteps_per_iteration=20)
    trainer = Trainer("apex", config)
    try:
        result = trainer.train()
        while "episode_reward_mean" not in result and result["training_iteration"] < 200:
            result = trainer.train()
        assert result["episode_reward_mean"] == 100.0
        ray.kill(trainer.workers.remote_workers()[-1], no_restart=True)
        result = trainer.train()
        assert math.isfinite(result.get("episode_reward_mean", math.nan)), sorted(result)
        assert result["episode_reward_mean"] == 100.0 and result["num_healthy_workers"] == 1
    finally:
        trainer.stop()
