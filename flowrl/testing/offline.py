"""Recorded datasets for tests and doctests, written the way rollout workers write them (:mod:`flowrl.offline`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from flowrl.offline import OutputWriter
from flowrl.sample_batch import (ACTIONS, ENV_ID, EPS_ID, LOGP, NEXT_OBS, OBS, REWARDS, TERMINATEDS, TRUNCATEDS, T,
                                 SampleBatch)

__all__ = ["fake_episode", "record_fake_episodes", "record_cartpole_controller"]


def fake_episode(eps_id: int, length: int, obs_dim: int = 4) -> SampleBatch:
    """One CartPole-shaped episode: ``obs[t] = eps_id + t / 100`` in every dimension, actions ``t % 2``, reward 1
    per step, the last row terminated, the behaviour policy's ``logp`` log(0.5).

    Examples:
        >>> fake_episode(7, 3)[OBS][:, 0].tolist(), fake_episode(7, 3)[TERMINATEDS].tolist()
        ([7.0, 7.010000228881836, 7.019999980926514], [False, False, True])
    """
    t = np.arange(length)
    obs = np.repeat((eps_id + t / 100).astype(np.float32)[:, None], obs_dim, axis=1)
    return SampleBatch({EPS_ID: np.full(length, eps_id, np.int64), T: t, ENV_ID: np.zeros(length, np.int64),
                        OBS: obs, ACTIONS: (t % 2).astype(np.int64), REWARDS: np.ones(length, np.float32),
                        TERMINATEDS: t == length - 1, TRUNCATEDS: np.zeros(length, bool),
                        NEXT_OBS: obs + np.float32(0.01), LOGP: np.full(length, np.log(0.5), np.float32)})


def record_fake_episodes(directory: str | Path, *, episodes: int, length: int, obs_dim: int = 4,
                         worker_index: int = 1) -> str:
    """Writes ``episodes`` :func:`fake_episode` s (ids 0, 1, ...) into ``directory`` as a worker in CartPole-v1
    would (with ``obs_dim`` other than 4: spaces ``Box(-inf, inf, (obs_dim,))`` and ``Discrete(2)``); returns the
    directory."""
    if obs_dim == 4:
        env = gym.make("CartPole-v1")
        observation_space, action_space = env.observation_space, env.action_space
        env.close()
    else:
        observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        action_space = gym.spaces.Discrete(2)
    writer = OutputWriter(directory, worker_index=worker_index, observation_space=observation_space,
                          action_space=action_space)
    writer.add([fake_episode(i, length, obs_dim) for i in range(episodes)])
    writer.close()
    return str(directory)


def record_cartpole_controller(directory: str | Path, *, steps: int, epsilon: float, seed: int = 0) -> str:
    """Records about ``steps`` CartPole-v1 steps (whole episodes) of a hand-written controller into ``directory``:
    push towards the side the pole falls to (``angle + angular velocity > 0``: right), a uniformly random action
    with probability ``epsilon`` instead; ``logp`` is the controller's probability of each action. With
    ``epsilon=0.3`` its episodes return about 130 on average (random play: about 22); returns the directory."""
    env = gym.make("CartPole-v1")
    writer = OutputWriter(directory, worker_index=1, observation_space=env.observation_space,
                          action_space=env.action_space)
    rng, recorded, eps_id = np.random.default_rng(seed), 0, 0
    while recorded < steps:
        obs, _ = env.reset(seed=int(rng.integers(2**31)))
        rows: dict[str, list[Any]] = {k: [] for k in (OBS, ACTIONS, REWARDS, TERMINATEDS, TRUNCATEDS, NEXT_OBS, LOGP)}
        done = False
        while not done:
            greedy = int(obs[2] + obs[3] > 0)
            action = int(rng.integers(2)) if rng.random() < epsilon else greedy
            next_obs, reward, terminated, truncated, _ = env.step(action)
            chance = 1 - epsilon / 2 if action == greedy else epsilon / 2
            for key, value in ((OBS, obs), (ACTIONS, action), (REWARDS, reward), (TERMINATEDS, terminated),
                               (TRUNCATEDS, truncated), (NEXT_OBS, next_obs), (LOGP, np.log(chance))):
                rows[key].append(value)
            obs, done = next_obs, terminated or truncated
        length = len(rows[OBS])
        writer.add([SampleBatch({EPS_ID: np.full(length, eps_id, np.int64), T: np.arange(length),
                                 ENV_ID: np.zeros(length, np.int64), OBS: np.array(rows[OBS], np.float32),
                                 ACTIONS: np.array(rows[ACTIONS], np.int64),
                                 REWARDS: np.array(rows[REWARDS], np.float32),
                                 TERMINATEDS: np.array(rows[TERMINATEDS]), TRUNCATEDS: np.array(rows[TRUNCATEDS]),
                                 NEXT_OBS: np.array(rows[NEXT_OBS], np.float32),
                                 LOGP: np.array(rows[LOGP], np.float32)})])
        recorded, eps_id = recorded + length, eps_id + 1
    writer.close()
    env.close()
    return str(directory)
