"""CartPole without velocities for the peers, the same env as ``flowrl/StatelessCartPole-v1``: CartPole-v1's
dynamics, rewards, ends and 500-step limit, observing ``[x, theta]`` only. Only gymnasium is needed (the peers'
virtualenv has no flowrl). RLlib's example env of the same name leaves out the time limit, so both peers use this.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

VISIBLE = [0, 2]


class StatelessCartPole(CartPoleEnv):  # type: ignore[misc]  # gymnasium's classes are untyped here
    def __init__(self, config: Any = None) -> None:
        super().__init__()
        full = self.observation_space
        self.observation_space = gymnasium.spaces.Box(full.low[VISIBLE], full.high[VISIBLE], dtype=np.float32)

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs[VISIBLE], reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        obs, info = super().reset(seed=seed, options=options)
        return obs[VISIBLE], info


def make_env(config: Any = None) -> gymnasium.Env:
    """The env with CartPole-v1's 500-step time limit."""
    return gymnasium.wrappers.TimeLimit(StatelessCartPole(), max_episode_steps=500)
