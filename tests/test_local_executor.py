"""One plan, two executors: a synchronous plan gives bit-identical weights and counters under Ray and under the
local executor; an asynchronous one is deterministic under the local executor; and a local run can be debugged
as one program (a tracing hook sees inside the rollout workers, breakpoint() stops in this process, an error
shows the user's frame)."""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from types import FrameType
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from flowrl import executor
from flowrl.algorithms import get_algorithm
from flowrl.envs import EnvContext
from flowrl.trainer import Trainer
from flowrl.workers import RolloutWorker

# Small settings per algorithm, so that two iterations with 2 remote workers take seconds.
_REPLAY = dict(learning_starts=100, timesteps_per_iteration=200, buffer_size=5000)
SETTINGS: dict[str, dict[str, Any]] = {
    "pg": dict(rollout_fragment_length=50, timesteps_per_iteration=200),
    "a2c": dict(rollout_fragment_length=20, timesteps_per_iteration=200),
    "ppo": dict(rollout_fragment_length=50, train_batch_size=200, sgd_minibatch_size=50, num_sgd_iter=2),
    "dqn": dict(_REPLAY, rollout_fragment_length=4, train_batch_size=32),
    "sac": dict(_REPLAY, train_batch_size=32),
    "ddpg": dict(_REPLAY, train_batch_size=32),
    "td3": dict(_REPLAY, train_batch_size=32),
    "r2d2": dict(_REPLAY, train_batch_size=80),
    "a3c": dict(rollout_fragment_length=10, timesteps_per_iteration=200),
    "impala": dict(rollout_fragment_length=25, train_batch_size=100, timesteps_per_iteration=200),
    "appo": dict(rollout_fragment_length=25, train_batch_size=100, timesteps_per_iteration=200),
    "apex": dict(_REPLAY, num_replay_buffer_shards=2, train_batch_size=32, rollout_fragment_length=25),
    "apex_ddpg": dict(_REPLAY, num_replay_buffer_shards=2, train_batch_size=32, rollout_fragment_length=25),
    "multiagent": dict(timesteps_per_iteration=200),
}
SYNC = ["pg", "a2c", "ppo", "dqn", "sac", "ddpg", "td3", "r2d2"]
# Asynchronous plans: completion order, learner threads, or (multiagent, as SEMANTICS' two-policy composition
# specifies) an async union of the two branches; deterministic under the local executor only.
ASYNC = ["a3c", "impala", "appo", "apex", "apex_ddpg", "multiagent"]


@dataclass
class Outcome:
    learner: Any  # the local worker's state: weights, optimizer and RNG state of every policy
    remote: list[Any]  # each remote worker's state: its policies, envs and episode bookkeeping
    counters: dict[str, int]
    rewards: list[tuple[float | None, int]]  # each report's mean return (None before an episode ends), episodes


def run(name: str, executor_name: str, iterations: int = 2, seed: int = 7, **fields: Any) -> Outcome:
    """``iterations`` reports of ``name`` with 2 workers (``fields``: more config, e.g. ``record=PATH``)."""
    algorithm = get_algorithm(name)
    config = algorithm.config_class(seed=seed, num_workers=2, executor=executor_name,  # type: ignore[call-arg]
                                    **SETTINGS[name], **fields)
    trainer = Trainer(algorithm, config)
    try:
        results = [trainer.train() for _ in range(iterations)]
        remote = executor.get([w.get_state.remote() for w in trainer.workers.remote_workers()])
        return Outcome(learner=trainer.workers.local_worker().get_state(), remote=remote,
                       counters=dict(trainer.plan.metrics.counters),
                       rewards=[(r.get("episode_reward_mean"), r["episodes_total"]) for r in results])
    finally:
        trainer.stop()


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two nested states differ, bit for bit (arrays by dtype, shape and every byte)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: lengths {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        x, y = np.asarray(a), np.asarray(b)
        same = x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        return [] if same else [f"{path}: arrays differ"]
    return [] if type(a) is type(b) and a == b else [f"{path}: {a!r:.60} != {b!r:.60}"]


def assert_identical(x: Outcome, y: Outcome) -> None:
    assert x.counters == y.counters
    assert x.rewards == y.rewards
    assert differences(x.learner, y.learner) == []
    assert differences(x.remote, y.remote) == []


@pytest.mark.parametrize("name", SYNC)
def test_a_sync_plan_gives_bit_identical_weights_and_counters_under_both_executors(name: str) -> None:
    on_ray, local = run(name, "ray"), run(name, "local")
    assert local.counters["num_steps_trained"] > 0  # it learned: the states compared are not the initial ones
    assert_identical(on_ray, local)


@pytest.mark.parametrize("name", ASYNC)
def test_an_async_plan_is_deterministic_under_the_local_executor(name: str) -> None:
    first, second = run(name, "local", iterations=3), run(name, "local", iterations=3)
    assert first.counters["num_steps_trained"] > 0
    assert_identical(first, second)


def test_the_comparison_sees_a_different_seed() -> None:  # the identity checks above can fail
    a, b = run("pg", "local", iterations=1, seed=1), run("pg", "local", iterations=1, seed=2)
    assert differences(a.learner, b.learner) and a.rewards != b.rewards


# ---------------------------------------------------------------------------------------------
# Debugging: one process, one program.

class Fragile(gym.Env[np.ndarray, int]):
    """CartPole that calls ``breakpoint()`` at its 5th step in worker 2 (``at_step_5="break"``) or raises there
    (``"fail"``)."""

    def __init__(self, ctx: EnvContext) -> None:
        self.inner, self.ctx, self.steps = gym.make("CartPole-v1"), ctx, 0
        self.observation_space, self.action_space = self.inner.observation_space, self.inner.action_space

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return self.inner.reset(seed=seed)

    def step(self, action: int) -> Any:
        self.steps += 1
        if self.steps == 5 and self.ctx.worker_index == 2:
            if self.ctx.config.get("at_step_5") == "fail":
                raise ValueError("the env failed at its 5th step")
            if self.ctx.config.get("at_step_5") == "break":
                breakpoint()
        return self.inner.step(action)


def local_pg(**env_config: Any) -> Trainer:
    config = get_algorithm("pg").config_class(env=Fragile, env_config=env_config, num_workers=2, executor="local",
                                             rollout_fragment_length=20, timesteps_per_iteration=40, seed=0)
    return Trainer("pg", config)


def test_a_tracing_hook_sees_the_frames_inside_the_rollout_workers() -> None:
    seen: set[int] = set()

    def tracer(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == "sample":
            worker = frame.f_locals.get("self")
            if isinstance(worker, RolloutWorker):
                seen.add(worker.worker_index)

    trainer = local_pg()
    try:
        sys.settrace(tracer)
        trainer.train()
    finally:
        sys.settrace(None)
        trainer.stop()
    assert seen == {1, 2}  # both remote workers sampled in this thread, under the hook


def test_breakpoint_in_a_remote_workers_env_stops_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    stops: list[tuple[int, int]] = []

    def hook(*args: Any, **kwargs: Any) -> None:
        caller = sys._getframe(1)
        stops.append((os.getpid(), caller.f_locals["self"].ctx.worker_index))

    monkeypatch.setattr(sys, "breakpointhook", hook)  # (the test session's Ray set a hook of its own)
    trainer = local_pg(at_step_5="break")
    try:
        trainer.train()
    finally:
        trainer.stop()
    assert stops == [(os.getpid(), 2)]


def test_an_error_in_a_remote_workers_env_shows_the_users_frame() -> None:
    trainer = local_pg(at_step_5="fail")
    try:
        with pytest.raises(ValueError, match="failed at its 5th step") as info:
            trainer.train()
    finally:
        trainer.stop()
    last = traceback.extract_tb(info.value.__traceback__)[-1]
    assert (last.name, last.filename) == ("step", __file__)
