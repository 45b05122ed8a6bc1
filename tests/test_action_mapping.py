"""Box actions reach the env mapped onto its bounds (``normalize_actions``) or clipped (``clip_actions``), while the
sampled batch keeps the policy's own actions; evaluation and ``flowrl.inference`` step the env the same way; an
unbounded space with ``normalize_actions`` is refused, naming the space."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from flowrl.algorithms.pg import PGConfig, PGPolicy
from flowrl.config import ModelConfig
from flowrl.envs import EnvContext, VectorEnv
from flowrl.evaluation import evaluate_policy
from flowrl.policy import env_action_map
from flowrl.sample_batch import ACTIONS
from flowrl.workers import RolloutWorker

LOW, HIGH = np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32)


class Recorder(gym.Env[np.ndarray, np.ndarray]):
    """A 2-D Box-action env that keeps every action it is given (class-level, one process) and ends after 5 steps."""

    seen: list[np.ndarray] = []

    def __init__(self, low: np.ndarray = LOW, high: np.ndarray = HIGH) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Box(low, high, dtype=np.float32)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        Recorder.seen.append(np.array(action, copy=True))
        self.t += 1
        return np.full(3, 0.1 * self.t, np.float32), 1.0, False, self.t >= 5, {}


def make_recorder(ctx: EnvContext) -> gym.Env[Any, Any]:
    return Recorder()


def make_unbounded(ctx: EnvContext) -> gym.Env[Any, Any]:
    return Recorder(np.full(2, -np.inf, np.float32), np.full(2, np.inf, np.float32))


def sample_once(**settings: Any) -> tuple[np.ndarray, np.ndarray]:
    """The actions the worker sampled and the ones the env received, for one fragment of 10 steps."""
    Recorder.seen.clear()
    config = PGConfig(env=make_recorder, num_workers=0, rollout_fragment_length=10, train_batch_size=10, seed=0,
                      model=ModelConfig(free_log_std=True), **settings)
    worker = RolloutWorker(policy_class=PGPolicy, config=config)
    batch = worker.sample()
    return np.asarray(batch[ACTIONS]), np.stack(Recorder.seen)


def test_the_env_gets_actions_mapped_onto_its_bounds_and_the_batch_keeps_the_policys() -> None:
    sampled, received = sample_once()
    expected = LOW + (np.clip(sampled, -1, 1) + 1) * (HIGH - LOW) / 2
    np.testing.assert_allclose(received, expected, rtol=1e-6)
    assert (received >= LOW).all() and (received <= HIGH).all()
    assert np.abs(sampled).max() > 1.0  # a unit Gaussian leaves [-1, 1]: the batch kept the unclipped draws


def test_without_normalize_actions_the_env_gets_them_clipped_or_as_they_are() -> None:
    sampled, received = sample_once(normalize_actions=False)
    np.testing.assert_array_equal(received, np.clip(sampled, LOW, HIGH))
    sampled, received = sample_once(normalize_actions=False, clip_actions=False)
    np.testing.assert_array_equal(received, sampled)


def test_an_unbounded_space_with_normalize_actions_is_refused_naming_the_space() -> None:
    config = PGConfig(env=make_unbounded, num_workers=0, rollout_fragment_length=10, train_batch_size=10)
    with pytest.raises(ValueError, match=r"action space Box\(-inf, inf, \(2,\), float32\) has infinite bounds.*"
                                         r"normalize_actions=False"):
        RolloutWorker(policy_class=PGPolicy, config=config)


def test_evaluation_steps_the_env_with_mapped_actions() -> None:
    policy = PGPolicy(Recorder().observation_space, Recorder().action_space, PGConfig(seed=0))
    Recorder.seen.clear()
    evaluate_policy(policy, VectorEnv(make_recorder, 1, seed=0), episodes=1)
    received = np.stack(Recorder.seen)
    greedy, _ = policy.compute_actions(np.zeros((1, 3), np.float32), explore=False)
    np.testing.assert_allclose(received[0], policy.env_actions(greedy)[0], rtol=1e-6)
    assert (received >= LOW).all() and (received <= HIGH).all()


def test_discrete_spaces_and_unset_options_leave_actions_alone() -> None:
    assert env_action_map(gym.spaces.Discrete(3), normalize=True, clip=True) is None
    assert env_action_map(gym.spaces.Box(-1.0, 1.0, (2,)), normalize=False, clip=False) is None
