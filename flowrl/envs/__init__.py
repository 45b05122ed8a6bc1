"""Environments for rollout workers.

- :func:`make_env` builds a gymnasium env from an id or a callable ``EnvContext -> gymnasium.Env``;
  :func:`derive_seed` gives every worker and env its own seed from one config seed.
- :class:`VectorEnv` steps N copies of a single-agent env with same-step autoreset: every
  :class:`VectorStep` row is a real transition, with the true last observation in ``final_obs``.
- :class:`MultiAgentEnv` is the dict-keyed multi-agent protocol (``"__all__"`` ends the episode),
  :class:`MultiAgentCartPole` an example, :func:`make_policy_mapping` the validated agent -> policy map,
  and :class:`MultiAgentVectorEnv` the vector of multi-agent envs.
- :class:`StatelessCartPole` (gymnasium id ``flowrl/StatelessCartPole-v1``) is CartPole with the velocities
  hidden, the standard test of a policy's memory.
- Atari ids (``"ALE/Pong-v5"``) come with the papers' preprocessing (:mod:`flowrl.envs.atari`: 84x84 grey
  frames, frame skip and stack, a lost life ends the learning episode but not the game's statistics, marked by
  :data:`GAME_CONTINUES`); MinAtar ids (``"MinAtar/Breakout-v1"``, :mod:`flowrl.envs.minatar`) work as they are.
- :class:`PointGoal` (``flowrl/PointGoal-v0``) is the MAML paper's 2-D navigation to a hidden goal, a task
  distribution (``sample_tasks``/``set_task``, :mod:`flowrl.envs.tasks`) for meta-learning.
- :class:`PettingZooEnv` adapts a PettingZoo ``ParallelEnv`` to that protocol; PettingZoo is optional
  (``pip install "flowrl[pettingzoo]"``) and imported only when an env is wrapped.

Examples:
    >>> import numpy as np
    >>> env = VectorEnv("CartPole-v1", 4, seed=0)
    >>> env.reset().shape
    (4, 4)
    >>> step = env.step(np.ones(4, dtype=np.int64))
    >>> step.rewards.tolist()
    [1.0, 1.0, 1.0, 1.0]
"""

from __future__ import annotations

from flowrl.envs.base import GAME_CONTINUES, EnvContext, EnvSpec, EpisodeRecord, derive_seed, make_env
from flowrl.envs.memory import STATELESS_CARTPOLE, StatelessCartPole
from flowrl.envs.multi_agent import (MultiAgentCartPole, MultiAgentEnv, MultiAgentStep, MultiAgentVectorEnv,
                                     MultiAgentVectorStep, PolicyMapping, make_policy_mapping)
from flowrl.envs.pettingzoo import PettingZooEnv
from flowrl.envs.tasks import POINT_GOAL, PointGoal, has_task_protocol
from flowrl.envs.vector import AUTO_NATIVE_MIN_ENVS, SupportedSpace, VectorEnv, VectorStep

__all__ = ["EnvContext", "EnvSpec", "EpisodeRecord", "GAME_CONTINUES", "derive_seed", "make_env",
           "VectorEnv", "VectorStep", "SupportedSpace", "AUTO_NATIVE_MIN_ENVS",
           "MultiAgentEnv", "MultiAgentCartPole", "MultiAgentVectorEnv", "MultiAgentStep", "MultiAgentVectorStep",
           "PolicyMapping", "make_policy_mapping", "PettingZooEnv", "StatelessCartPole", "STATELESS_CARTPOLE",
           "PointGoal", "POINT_GOAL", "has_task_protocol"]
