"""Evaluating a policy: the returns of N complete episodes, greedy by default (``flowrl evaluate``).

:func:`evaluate_policy` steps a :class:`~flowrl.envs.VectorEnv` (the same env and observation handling
as a rollout worker) with ``policy.compute_actions(obs, explore=...)`` until every env has finished its
share of the episodes. Each env contributes its *first* episodes, so short episodes are not
over-counted (taking whichever N finish first across envs would favour them).
:func:`evaluate_checkpoint` rebuilds the policy of a registered algorithm from a checkpoint's saved
config and weights. Single-agent only.

Examples:
    >>> import gymnasium as gym
    >>> from flowrl.envs import VectorEnv
    >>> from flowrl.policy import Policy, PolicyConfig
    >>> env = VectorEnv("CartPole-v1", 4, seed=0)
    >>> policy = Policy(env.observation_space, env.action_space, PolicyConfig(seed=0))
    >>> result = evaluate_policy(policy, env, episodes=6)
    >>> len(result.returns), result.min <= result.mean <= result.max
    (6, True)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flowrl._checkpoint import read_checkpoint
from flowrl.envs import VectorEnv
from flowrl.policy import Policy
from flowrl.sample_batch import DEFAULT_POLICY_ID
from flowrl.trainer import load_checkpoint_config

__all__ = ["EvaluationResult", "evaluate_policy", "evaluate_checkpoint", "MAX_EVAL_ENVS"]

MAX_EVAL_ENVS = 16
"""At most this many envs are stepped together by :func:`evaluate_checkpoint`."""


@dataclass(frozen=True)
class EvaluationResult:
    """The returns and lengths of the evaluated episodes, in order of each env's episodes.

    Attributes:
        returns: one return per episode.
        lengths: one length (env steps) per episode.
        explore: whether actions were sampled (True) or greedy (False).
    """

    returns: tuple[float, ...]
    lengths: tuple[int, ...]
    explore: bool = False

    @property
    def mean(self) -> float:
        """The mean return."""
        return float(np.mean(self.returns))

    @property
    def min(self) -> float:
        """The lowest return."""
        return float(np.min(self.returns))

    @property
    def max(self) -> float:
        """The highest return."""
        return float(np.max(self.returns))


def _check_episodes(episodes: object) -> None:
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"episodes={episodes!r} must be an int >= 1 (complete episodes to evaluate)")


def evaluate_policy(policy: Policy, env: VectorEnv, *, episodes: int, explore: bool = False) -> EvaluationResult:
    """The first episodes of each env of ``env`` (``episodes`` in all), acting with ``policy``.

    Args:
        policy: acts through ``compute_actions(obs, explore=explore)``.
        env: a fresh vector env (it is reset here); env ``i`` runs ``episodes // N`` episodes, plus one for
            the first ``episodes % N`` envs. Its episodes must end (a time limit or a terminal state).
        episodes: how many complete episodes, >= 1.
        explore: sample actions (True) or take the most likely one (False, greedy).

    Raises:
        ValueError: ``episodes < 1``.
    """
    _check_episodes(episodes)
    n = env.num_envs
    quota = [episodes // n + (1 if i < episodes % n else 0) for i in range(n)]
    per_env: list[list[tuple[float, int]]] = [[] for _ in range(n)]
    obs = env.reset()
    while any(len(done) < want for done, want in zip(per_env, quota)):
        actions, _ = policy.compute_actions(obs, explore=explore)
        step = env.step(actions)
        for ep in step.episodes:
            if len(per_env[ep.env_index]) < quota[ep.env_index]:
                per_env[ep.env_index].append((float(ep.episode_return), int(ep.episode_length)))
        obs = step.obs
    finished = [ep for done in per_env for ep in done]
    return EvaluationResult(returns=tuple(r for r, _ in finished), lengths=tuple(n for _, n in finished),
                            explore=explore)


def evaluate_checkpoint(checkpoint_path: str | Path, *, episodes: int, explore: bool = False,
                        seed: int | None = 0) -> EvaluationResult:
    """Rebuilds a checkpoint's policy (its algorithm's policy class, saved config and weights, on the CPU)
    and evaluates it on the config's env with :func:`evaluate_policy`.

    Args:
        checkpoint_path: a checkpoint written by :meth:`flowrl.trainer.Trainer.save` of a registered algorithm.
        episodes: complete episodes to run, >= 1.
        explore: sample actions (True) or act greedily (False).
        seed: seeds the envs (and the action sampling with ``explore``); ``None`` is random.

    Raises:
        ValueError: as :func:`flowrl.trainer.load_checkpoint_config`, a multi-agent config, or ``episodes < 1``.
    """
    _check_episodes(episodes)
    algorithm, config = load_checkpoint_config(checkpoint_path)
    if config.policies is not None:
        raise ValueError(f"{checkpoint_path} is a multi-agent checkpoint ({algorithm.name!r}, policies "
                         f"{sorted(config.policies)}); evaluation supports single-agent configs only, so evaluate "
                         f"its policies from Python (Trainer.from_checkpoint(path).get_policy(policy_id))")
    state = read_checkpoint(checkpoint_path, algorithm=algorithm.name)
    env = VectorEnv(config.env, min(episodes, MAX_EVAL_ENVS), seed=seed, config=config.env_config)
    try:
        policy = algorithm.policy_class(env.observation_space, env.action_space,
                                        dataclasses.replace(config, seed=seed, device="cpu"))
        policy.set_weights(state["local_worker"]["policies"][DEFAULT_POLICY_ID]["weights"])
        return evaluate_policy(policy, env, episodes=episodes, explore=explore)
    finally:
        env.close()
