"""A stand-in for EnvPool's gymnasium API, for tests of ``VectorEnv(backend="envpool")`` where EnvPool is not
installed (it is an optional extra of several hundred MB).

It keeps the parts of EnvPool's behaviour the adapter relies on: ``make_gymnasium(task_id, num_envs, seed)`` seeds
env ``i`` with ``seed + i`` at its first reset; ``step(actions, env_id=None)`` steps the given envs only and says
which in ``info["env_id"]``; an env that ended is reset by its *next* step (NEXT_STEP autoreset: the action is
ignored, the reward is 0 and nothing ends); ``list_all_envs()`` names the ids it makes. Install it with
``monkeypatch.setitem(sys.modules, "envpool", envpool_stub)``.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

__all__ = ["make_gymnasium", "list_all_envs", "StubEnvPool"]

_IDS = ("CartPole-v1", "Pendulum-v1")


def list_all_envs() -> list[str]:
    return list(_IDS)


class StubEnvPool:
    """``num_envs`` gymnasium envs behind EnvPool's batched, NEXT_STEP-autoreset interface."""

    def __init__(self, task_id: str, num_envs: int, seed: int, **kwargs: Any) -> None:
        self.envs = [gymnasium.make(task_id, **kwargs) for _ in range(num_envs)]
        self.seed = seed
        self.seeded = False
        self.pending_reset = np.zeros(num_envs, dtype=bool)
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space

    def reset(self) -> tuple[np.ndarray, dict[str, Any]]:
        seeds = [self.seed + i if not self.seeded else None for i in range(len(self.envs))]
        self.seeded = True
        self.pending_reset[:] = False
        obs = np.stack([env.reset(seed=s)[0] for env, s in zip(self.envs, seeds)])
        return obs, {"env_id": np.arange(len(self.envs), dtype=np.int32)}

    def step(self, actions: np.ndarray, env_id: np.ndarray | None = None) -> tuple[Any, ...]:
        ids = np.arange(len(self.envs)) if env_id is None else np.asarray(env_id)
        obs, rewards, terminateds, truncateds = [], [], [], []
        for action, i in zip(actions, ids):
            if self.pending_reset[i]:
                o, r, te, tr = self.envs[i].reset()[0], 0.0, False, False
                self.pending_reset[i] = False
            else:
                o, r, te, tr, _ = self.envs[i].step(action.item() if action.shape == () else action)
                self.pending_reset[i] = te or tr
            obs.append(o)
            rewards.append(r)
            terminateds.append(te)
            truncateds.append(tr)
        return (np.stack(obs), np.asarray(rewards, dtype=np.float32), np.asarray(terminateds),
                np.asarray(truncateds), {"env_id": ids.astype(np.int32)})

    def close(self) -> None:
        for env in self.envs:
            env.close()


def make_gymnasium(task_id: str, num_envs: int = 1, seed: int = 42, **kwargs: Any) -> StubEnvPool:
    if task_id not in _IDS:
        raise ValueError(f"the stub makes {_IDS}, not {task_id!r}")
    return StubEnvPool(task_id, num_envs, seed, **kwargs)
