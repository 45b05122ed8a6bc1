"""Task distributions for meta-learning (MAML): envs that draw tasks and switch to one.

The protocol (what MAML's plan calls, through :meth:`flowrl.envs.VectorEnv.call`): ``sample_tasks(n) -> list`` draws
``n`` tasks, ``set_task(task)`` makes the env play that task from its next reset on, ``get_task()`` returns it.
:class:`PointGoal` is the MAML paper's 2-D navigation (Finn et al. 2017, https://arxiv.org/abs/1703.03400): a point
starts at the origin, moves by its (clipped) action each step, and is rewarded by minus its distance to a goal
drawn uniformly from ``[-0.5, 0.5]^2``, which it does not observe: only the returns tell it where the goal is,
so one gradient step on a task's own episodes is worth a lot. Registered as ``flowrl/PointGoal-v0`` (100 steps).

Examples:
    >>> env = PointGoal()
    >>> tasks = env.sample_tasks(3)
    >>> len(tasks), tasks[0].shape
    (3, (2,))
    >>> env.set_task(np.array([0.3, 0.0]))
    >>> obs, _ = env.reset(seed=0)
    >>> obs.tolist(), round(env.step(np.array([0.1, 0.0], np.float32))[1], 3)
    ([0.0, 0.0], -0.2)
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

__all__ = ["PointGoal", "POINT_GOAL", "has_task_protocol"]

POINT_GOAL = "flowrl/PointGoal-v0"


def has_task_protocol(env: Any) -> bool:
    """Whether ``env`` (or a wrapper around it) offers ``sample_tasks`` and ``set_task``."""
    for name in ("sample_tasks", "set_task"):
        try:
            getattr(env, "get_wrapper_attr", lambda n: getattr(env, n))(name)
        except AttributeError:
            return False
    return True


class PointGoal(gymnasium.Env[np.ndarray, np.ndarray]):
    """2-D navigation to a hidden goal; observation: the position; action: a step in ``[-0.1, 0.1]^2``;
    reward: ``-|position - goal|`` after the step. The task is the goal."""

    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gymnasium.spaces.Box(-0.1, 0.1, (2,), np.float32)

    def __init__(self, goal: Any = None, resample_on_reset: bool = False) -> None:
        """``goal``: the first task (the origin by default); ``resample_on_reset``: every reset draws a new goal
        (the task mixture that a policy without adaptation trains on)."""
        self._goal = np.zeros(2, np.float64) if goal is None else np.asarray(goal, np.float64)
        self.resample_on_reset = bool(resample_on_reset)
        self._pos = np.zeros(2, np.float64)
        self._task_rng = np.random.default_rng()

    def sample_tasks(self, n: int) -> list[np.ndarray]:
        """``n`` goals, uniform in ``[-0.5, 0.5]^2`` (drawn from the generator the last seeded reset seeded)."""
        return [self._task_rng.uniform(-0.5, 0.5, 2) for _ in range(n)]

    def set_task(self, task: Any) -> None:
        goal = np.asarray(task, np.float64)
        if goal.shape != (2,) or not np.isfinite(goal).all():
            raise ValueError(f"PointGoal.set_task: a task is a goal (x, y), got {task!r}")
        self._goal = goal

    def get_task(self) -> np.ndarray:
        return self._goal.copy()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            self._task_rng = np.random.default_rng([seed, 1])
        if self.resample_on_reset:
            self._goal = self.sample_tasks(1)[0]
        self._pos = np.zeros(2, np.float64)
        return self._pos.astype(np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self._pos = self._pos + np.clip(np.asarray(action, np.float64), -0.1, 0.1)
        reward = -float(np.linalg.norm(self._pos - self._goal))
        return self._pos.astype(np.float32), reward, False, False, {}


if POINT_GOAL not in gymnasium.registry:
    gymnasium.register(POINT_GOAL, entry_point="flowrl.envs.tasks:PointGoal", max_episode_steps=100)
