"""Environments that need memory: a policy that sees only the current observation cannot solve them well.

:class:`StatelessCartPole` is CartPole-v1 with the velocities hidden: the observation is the cart's position and
the pole's angle only, so a policy has to infer both velocities from what it saw before (a recurrent policy can,
a feed-forward one cannot). The dynamics, rewards, episode ends and seeding are CartPole-v1's, unchanged. It is
registered with gymnasium as ``flowrl/StatelessCartPole-v1`` (500-step time limit, as CartPole-v1), so that
``flowrl train ppo --env flowrl/StatelessCartPole-v1`` and ``gymnasium.make`` find it by id once ``flowrl`` is
imported.

Examples:
    >>> import gymnasium
    >>> env = gymnasium.make(STATELESS_CARTPOLE)
    >>> obs, _ = env.reset(seed=0)
    >>> obs.shape, env.spec.max_episode_steps
    ((2,), 500)
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

__all__ = ["StatelessCartPole", "STATELESS_CARTPOLE", "VISIBLE"]

STATELESS_CARTPOLE = "flowrl/StatelessCartPole-v1"
"""The gymnasium id of :class:`StatelessCartPole`."""

VISIBLE = (0, 2)
"""The indices of CartPole's observation ``[x, x_dot, theta, theta_dot]`` that stay visible: position and angle."""


class StatelessCartPole(CartPoleEnv):
    """CartPole whose observation is ``[x, theta]`` (the cart's position and the pole's angle), without the two
    velocities; everything else is :class:`gymnasium.envs.classic_control.cartpole.CartPoleEnv`'s.

    Examples:
        >>> env = StatelessCartPole()
        >>> obs, _ = env.reset(seed=1)
        >>> bool(np.array_equal(obs, env.state[[0, 2]].astype(np.float32)))
        True
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        full = self.observation_space
        assert isinstance(full, gymnasium.spaces.Box)  # CartPole's
        self.observation_space = gymnasium.spaces.Box(full.low[list(VISIBLE)], full.high[list(VISIBLE)],
                                                      dtype=np.float32)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)  # type: ignore[no-untyped-call]
        return obs[list(VISIBLE)], reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        return obs[list(VISIBLE)], info


if STATELESS_CARTPOLE not in gymnasium.registry:
    gymnasium.register(STATELESS_CARTPOLE, entry_point=StatelessCartPole, max_episode_steps=500,
                       reward_threshold=475.0)
