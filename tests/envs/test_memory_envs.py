"""StatelessCartPole: CartPole-v1 with the velocities hidden, by id through gymnasium, flowrl's VectorEnv and the CLI."""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium.utils.env_checker import check_env

from flowrl.envs import STATELESS_CARTPOLE, StatelessCartPole, VectorEnv


def test_registered_with_cartpoles_time_limit_and_threshold() -> None:
    spec = gymnasium.spec(STATELESS_CARTPOLE)
    assert (spec.max_episode_steps, spec.reward_threshold) == (500, 475.0)
    env = gymnasium.make(STATELESS_CARTPOLE)
    assert env.observation_space.shape == (2,) and env.action_space == gymnasium.spaces.Discrete(2)
    full = gymnasium.make("CartPole-v1").observation_space
    np.testing.assert_array_equal(env.observation_space.high, full.high[[0, 2]])
    check_env(env.unwrapped, skip_render_check=True)


def test_observations_are_cartpoles_position_and_angle_with_the_same_dynamics() -> None:
    """Same seed and actions: the same episode as CartPole-v1, observed without x_dot and theta_dot."""
    stateless, full = gymnasium.make(STATELESS_CARTPOLE), gymnasium.make("CartPole-v1")
    rng = np.random.default_rng(0)
    for episode in range(3):
        obs, _ = stateless.reset(seed=episode)
        ref, _ = full.reset(seed=episode)
        np.testing.assert_array_equal(obs, ref[[0, 2]])
        done = False
        while not done:
            action = int(rng.integers(2))
            obs, reward, terminated, truncated, _ = stateless.step(action)
            ref, ref_reward, ref_terminated, ref_truncated, _ = full.step(action)
            np.testing.assert_array_equal(obs, ref[[0, 2]])
            assert (reward, terminated, truncated) == (ref_reward, ref_terminated, ref_truncated)
            done = terminated or truncated


def test_the_hidden_velocities_are_not_a_function_of_the_observation() -> None:
    """The same [x, theta] occurs with different velocities: one observation cannot tell them (memory must)."""
    env = StatelessCartPole()
    env.reset(seed=0)
    env.state = np.array([0.0, 0.5, 0.0, -0.5])
    first = env.step(1)[0]
    env.state = np.array([0.0, -0.5, 0.0, 0.5])
    second = env.step(1)[0]
    assert not np.array_equal(first, second)  # same start observation, different next one: velocities matter
    start_a, start_b = np.array([0.0, 0.5, 0.0, -0.5])[[0, 2]], np.array([0.0, -0.5, 0.0, 0.5])[[0, 2]]
    np.testing.assert_array_equal(start_a, start_b)


def test_a_vector_env_steps_it_by_id() -> None:
    env = VectorEnv(STATELESS_CARTPOLE, 3, seed=0)
    assert env.reset().shape == (3, 2)
    step = env.step(np.ones(3, dtype=np.int64))
    assert step.obs.shape == (3, 2) and step.rewards.tolist() == [1.0, 1.0, 1.0]
