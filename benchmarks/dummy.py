"""What the sampling microbenchmark and the scaling benchmark sample with: the paper's dummy policy, and envs.

- :class:`DummyPolicy`: one trainable scalar (the RLlib Flow paper's microbenchmark policy); acts uniformly at
  random with one numpy draw per step, so the workers' time goes to the env and to coordination, not to a model.
- :func:`sleepy_cartpole`: CartPole-v1 whose ``step`` also sleeps ``step_ms`` milliseconds: an env that *waits*
  (a simulator or a remote service) rather than computes, so that N workers can overlap on 2 cores.

:func:`rollout_config` builds the :class:`~flowrl.config.RolloutConfig` for both; :func:`ship_by_value` makes Ray
pickle this module's classes by value, so worker processes need not import ``benchmarks`` (the scripts run from
``benchmarks/``, which is not on a worker's path).

Examples:
    >>> import gymnasium as gym
    >>> p = DummyPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), rollout_config(seed=0))
    >>> list(p.get_weights()), p.get_weights()["w"].shape
    (['w'], ())
    >>> actions, extras = p.compute_actions(np.zeros((3, 4), np.float32))
    >>> actions.shape, sorted(extras)
    ((3,), ['action_dist_inputs', 'logp', 'vf_preds'])
    >>> env = sleepy_cartpole(EnvContext(worker_index=1, env_index=0, seed=0), step_ms=0.0)
    >>> env.reset(seed=0)[0].shape
    (4,)
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch

from flowrl.config import RolloutConfig
from flowrl.envs import EnvContext
from flowrl.policy import Policy
from flowrl.sample_batch import ACTION_DIST_INPUTS, LOGP, VF_PREDS


class ScalarModel(torch.nn.Module):
    """One trainable scalar ``w``: the whole of the dummy policy's weights."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))


class DummyPolicy(Policy):
    """The paper's dummy policy: weights are one trainable scalar; actions are uniform at random.

    It learns nothing useful: ``loss`` is ``w**2`` (so a learner step moves ``w`` and bumps the weights' version).
    """

    def __init__(self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: Any) -> None:
        super().__init__(observation_space, action_space, config)
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"DummyPolicy acts in a Discrete action space, got {action_space}")
        self.num_actions = int(action_space.n)
        self.model = ScalarModel()  # type: ignore[assignment]  # the base class's actor-critic is not used
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr)
        self.numpy_acting = None

    def compute_actions(self, obs: np.ndarray, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        n = len(obs)
        actions = self.act_random.integers(self.num_actions, size=n)
        return actions, {LOGP: np.full(n, -np.log(self.num_actions), np.float32),
                         VF_PREDS: np.zeros(n, np.float32),
                         ACTION_DIST_INPUTS: np.zeros((n, self.num_actions), np.float32)}

    def loss(self, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return self.model.w ** 2, {}  # type: ignore[operator]  # w is a Parameter


class _SleepyStep(gym.Wrapper[Any, Any, Any, Any]):
    def __init__(self, env: gym.Env[Any, Any], step_s: float) -> None:
        super().__init__(env)
        self.step_s = step_s

    def step(self, action: Any) -> Any:
        time.sleep(self.step_s)
        return self.env.step(action)


def sleepy_cartpole(ctx: EnvContext, step_ms: float) -> gym.Env[Any, Any]:
    """CartPole-v1 whose every step first sleeps ``step_ms`` ms (none when 0)."""
    env = gym.make("CartPole-v1")
    return _SleepyStep(env, step_ms / 1000) if step_ms > 0 else env


def rollout_config(*, num_workers: int = 0, step_ms: float = 0.0, fragment: int = 100, envs_per_worker: int = 1,
                   num_cpus_per_worker: float = 0, seed: int | None = None) -> RolloutConfig:
    """Workers of :class:`DummyPolicy` on :func:`sleepy_cartpole` (plain CartPole-v1 when ``step_ms`` is 0).

    ``num_cpus_per_worker`` defaults to 0: the workers wait more than they compute, and the
    benchmarks place more of them than the machine has cores.
    """
    env: str | Callable[[EnvContext], gym.Env[Any, Any]] = (
        "CartPole-v1" if step_ms == 0 else functools.partial(sleepy_cartpole, step_ms=step_ms))
    return RolloutConfig(env=env, num_workers=num_workers, rollout_fragment_length=fragment,
                         num_envs_per_worker=envs_per_worker, num_cpus_per_worker=num_cpus_per_worker,
                         vector_backend="loop", seed=seed)


def ship_by_value() -> None:
    """Makes Ray pickle this module's functions and classes by value (call it in the driver before the workers
    start): a worker process then needs no ``benchmarks`` package on its path."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
