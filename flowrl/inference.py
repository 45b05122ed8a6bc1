"""Acting with a trained policy: :func:`load` builds only the policy of a checkpoint, no Ray, no workers.

A checkpoint of :meth:`flowrl.trainer.Trainer.save` holds each policy's state and spaces and the trainer's
config as data, so :func:`load` rebuilds the algorithm's policy class with the saved config (on the CPU
unless asked otherwise), restores its saved state (weights, exploration step, sampling RNG) and wraps it in
a :class:`TrainedPolicy`, which acts greedily unless told to explore. Nothing starts Ray, a rollout worker
or a trainer, and no env is built, so a checkpoint whose env was a callable loads too. A checkpoint written
before checkpoints held the spaces builds the config's env once to read them (for a ``"module:Id"`` env,
only when the caller names it: ``env=``, as nothing in a checkpoint may make flowrl import code).

Examples:
    >>> import tempfile
    >>> import gymnasium as gym
    >>> from flowrl.algorithms.pg import PGConfig
    >>> from flowrl.trainer import Trainer
    >>> trainer = Trainer("pg", PGConfig(num_workers=0, train_batch_size=100, seed=0))
    >>> _ = trainer.train()
    >>> run = tempfile.mkdtemp()
    >>> path = trainer.save(f"{run}/checkpoints")
    >>> trainer.stop()
    >>> policy = load(run)  # a run dir: its latest checkpoint
    >>> policy.policy_id, policy.algorithm, policy.checkpoint == path
    ('default_policy', 'pg', True)
    >>> env = gym.make("CartPole-v1")
    >>> obs, _ = env.reset(seed=0)
    >>> action = policy.compute_single_action(obs)
    >>> type(action), action in (0, 1)
    (<class 'int'>, True)
    >>> _ = env.step(action)
    >>> policy.compute_actions(np.zeros((3, 4), np.float32)).shape
    (3,)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

import gymnasium as gym
import numpy as np

from flowrl._checkpoint import (check_env_named, check_tree, checkpoint_algorithm, find_checkpoint, read_checkpoint,
                                restoring)
from flowrl.algorithms import ALGORITHMS, Algorithm, get_algorithm
from flowrl.config import PolicyConfig, TrainerConfig, config_from_data
from flowrl.filters import MeanStdFilter, make_filter
from flowrl.policy import Policy, space_from_data

__all__ = ["TrainedPolicy", "load", "load_policies"]


class TrainedPolicy:
    """A policy restored from a checkpoint, for acting: greedy (``explore=False``) unless told otherwise.

    Attributes:
        policy: the :class:`~flowrl.policy.Policy` itself (its model, ``compute_actions`` with extras, ...).
        policy_id: its id in the checkpoint (``"default_policy"`` for a single-agent algorithm).
        algorithm: the registered algorithm that trained it.
        checkpoint: the checkpoint directory it was loaded from.
        observation_space: one observation's space.
        action_space: one action's space.
        obs_filter: the observation filter it was trained with (``RolloutConfig.observation_filter``), as the
            checkpoint saved it; :meth:`compute_actions` applies it frozen (``None``: ``"NoFilter"``).
    """

    def __init__(self, policy: Policy, *, policy_id: str, algorithm: str, checkpoint: Path,
                 obs_filter: MeanStdFilter | None = None) -> None:
        self.policy, self.policy_id, self.algorithm, self.checkpoint = policy, policy_id, algorithm, checkpoint
        self.obs_filter = obs_filter
        self.observation_space: gym.Space[Any] = policy.observation_space
        self.action_space: gym.Space[Any] = policy.action_space
        self._state: tuple[np.ndarray, ...] | None = None  # a recurrent policy's state per episode it acts in
        self._prev_actions: np.ndarray | None = None  # ... and its last actions (for a model that reads them)

    @property
    def is_recurrent(self) -> bool:
        """Whether the policy carries a state from step to step (``model.use_lstm``, R2D2): :meth:`compute_actions`
        then remembers one state per episode of the batch; call :meth:`reset` when new episodes start."""
        return self.policy.is_recurrent

    def reset(self, batch_size: int = 1) -> None:
        """Starts ``batch_size`` new episodes: a recurrent policy's remembered state goes back to its initial one
        (nothing for a feed-forward policy)."""
        self._state = self.policy.initial_state(batch_size) if self.is_recurrent else None
        self._prev_actions = None

    def initial_state(self, batch_size: int = 1) -> tuple[np.ndarray, ...]:
        """The state ``batch_size`` episodes start from (``()`` for a feed-forward policy), for
        :meth:`compute_actions_with_state`."""
        return self.policy.initial_state(batch_size)

    def __repr__(self) -> str:
        return (f"TrainedPolicy({self.policy_id!r} of {self.algorithm!r}, {self.observation_space} -> "
                f"{self.action_space}, from {str(self.checkpoint)!r})")

    def compute_actions(self, obs_batch: Any, explore: bool = False, prev_rewards: Any = None) -> np.ndarray:
        """Actions for a batch of observations ``[B, *obs_shape]``: ``[B]`` ints for a Discrete action
        space, ``[B, *action_shape]`` for a Box (in its dtype, mapped onto its bounds as the env takes them, see
        ``PolicyConfig.normalize_actions``); sampled with ``explore``, else the most likely ones. A recurrent
        policy acts from the state it remembers for each of the ``B`` episodes (from :meth:`reset`, or from the
        initial state at the first call) and remembers the state after; one that reads the previous action and
        reward (``model.lstm_use_prev_action`` / ``lstm_use_prev_reward``) remembers its actions and takes the
        rewards the env gave for them as ``prev_rewards`` ``[B]`` (needed after the first step of the episodes).

        Raises:
            ValueError: observations of another shape than ``[B, *obs_shape]``; for a recurrent policy, a batch
                size other than the episodes it remembers (call :meth:`reset` with the new size).
        """
        obs = np.asarray(obs_batch, dtype=self.observation_space.dtype)
        shape = tuple(self.observation_space.shape or ())
        if obs.shape[1:] != shape or obs.ndim != len(shape) + 1:
            raise ValueError(f"observations of shape {obs.shape}; policy {self.policy_id!r} takes a batch "
                             f"[B, {', '.join(map(str, shape))}] ({self.observation_space}); for one observation "
                             f"use compute_single_action")
        if not self.is_recurrent:
            return self._env_actions(self.policy.compute_actions(self._filtered(obs), explore=explore)[0])
        state = self._state
        if state is None:
            state = self.policy.initial_state(len(obs))
        elif len(state[0]) != len(obs):
            raise ValueError(f"a batch of {len(obs)} observations, but this recurrent policy remembers the state of "
                             f"{len(state[0])} episodes; call reset(batch_size={len(obs)}) when new episodes start")
        prev = self._remembered_prev(len(obs), prev_rewards)
        policy_actions, _, self._state = self.policy.compute_actions_with_state(self._filtered(obs), state,
                                                                                explore=explore, prev=prev)
        if prev is not None:
            self._prev_actions = policy_actions
        return self._env_actions(policy_actions)

    def _remembered_prev(self, batch_size: int, prev_rewards: Any) -> tuple[np.ndarray, np.ndarray] | None:
        start = self.policy.initial_prev_inputs(batch_size)
        if start is None:
            return None
        if self._prev_actions is None:  # the episodes' first step: no previous action or reward
            return start
        if prev_rewards is None:
            if self.policy.model.prev_reward:
                raise ValueError(f"policy {self.policy_id!r} reads the previous reward: pass prev_rewards=[...] (the "
                                 f"rewards of the last actions) after the episodes' first step")
            prev_rewards = start[1]
        return self._prev_actions, np.asarray(prev_rewards, np.float32).reshape(batch_size)

    def compute_actions_with_state(self, obs_batch: Any, state: tuple[np.ndarray, ...], explore: bool = False,
                                   prev: tuple[np.ndarray, np.ndarray] | None = None
                                   ) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """A recurrent policy's actions for ``[B, *obs_shape]`` observations from ``state`` (``[B, ...]`` arrays,
        :meth:`initial_state` at an episode's start), and the state after them: ``(actions, new_state)``. The
        state is the caller's to keep; :meth:`compute_actions` keeps it for you. ``prev``: the previous policy
        actions and rewards, for a model that reads them (``policy.initial_prev_inputs(B)`` at the start).

        Raises:
            TypeError: a feed-forward policy (use :meth:`compute_actions`).
        """
        if not self.is_recurrent:
            raise TypeError(f"policy {self.policy_id!r} carries no state; use compute_actions(obs_batch)")
        obs = self._filtered(np.asarray(obs_batch, dtype=self.observation_space.dtype))
        actions, _, new_state = self.policy.compute_actions_with_state(obs, state, explore=explore, prev=prev)
        return self._env_actions(actions), new_state

    def _filtered(self, obs: np.ndarray) -> np.ndarray:
        return obs if self.obs_filter is None else self.obs_filter(obs, update=False)

    def _env_actions(self, actions: np.ndarray) -> np.ndarray:
        actions = self.policy.env_actions(actions)
        if isinstance(self.action_space, gym.spaces.Box):
            return actions.astype(self.action_space.dtype, copy=False)
        return actions

    def compute_single_action(self, obs: Any, explore: bool = False, prev_reward: float | None = None) -> Any:
        """The action for one observation, as the env takes it: a Python ``int`` for a Discrete action space,
        a numpy array of the action shape for a Box.

        Raises:
            ValueError: an observation of another shape than the observation space's.
        """
        one = np.asarray(obs, dtype=self.observation_space.dtype)
        if one.shape != tuple(self.observation_space.shape or ()):
            raise ValueError(f"an observation of shape {one.shape}; policy {self.policy_id!r} takes "
                             f"{self.observation_space} (shape {self.observation_space.shape}); for a batch use "
                             f"compute_actions")
        action = self.compute_actions(one[None], explore=explore,
                                      prev_rewards=None if prev_reward is None else [prev_reward])[0]
        return int(action) if isinstance(self.action_space, gym.spaces.Discrete) else action


def load(path: str | Path, policy_id: str | None = None, *, device: str = "cpu",
         env: str | None = None) -> TrainedPolicy:
    """The policy ``policy_id`` of a checkpoint, built without Ray, workers or a trainer.

    Args:
        path: a checkpoint directory, or a run directory (or its ``checkpoints/``), whose latest
            ``checkpoint_*`` is taken.
        policy_id: which policy of a multi-agent checkpoint; ``None`` for a single-agent one.
        device: where the model runs (``"cpu"``, ``"cuda"``, ``"cuda:N"``).
        env: the checkpoint's env id, named again; needed only to load a checkpoint without saved spaces
            whose env is ``"module:Id"`` (its env is built to find the spaces, which imports ``module``).

    Raises:
        ValueError: no checkpoint at ``path``, a checkpoint of an unregistered algorithm, one without a
            config, or one whose config cannot be rebuilt (see :func:`load_policies`); a missing
            ``policy_id`` (the message lists the checkpoint's ids); a malformed checkpoint or one of another
            model size (naming the file and the key).
    """
    checkpoint = find_checkpoint(path)
    algorithm, config, saved, filter_state = _read(checkpoint)
    ids = sorted(saved)
    wanted = policy_id if policy_id is not None else (ids[0] if len(ids) == 1 else None)
    if wanted not in saved:
        given = "no policy_id" if policy_id is None else f"policy_id={policy_id!r}"
        raise ValueError(f"{checkpoint} holds the policies {ids}; {given} names one of them: pass policy_id="
                         f"{ids[0]!r}, say, or load them all with flowrl.inference.load_policies(path)")
    return _build(algorithm, config, checkpoint, wanted, saved[wanted], device, env, filter_state)


def load_policies(path: str | Path, *, device: str = "cpu", env: str | None = None) -> dict[str, TrainedPolicy]:
    """Every policy of a checkpoint by id (one, ``"default_policy"``, for a single-agent algorithm), as
    :func:`load` builds them.

    The saved config is rebuilt from the checkpoint's data. Fields that held a callable (an env callable,
    a policy mapping, a plan hook) are not stored; the policy is built without them, as it never reads
    them. A multi-agent ``policies`` map whose policy classes or configs are not the config's defaults
    cannot be rebuilt, nor can an unregistered algorithm's checkpoint: build that policy yourself and
    ``set_state`` it from :func:`flowrl._checkpoint.read_checkpoint`'s tree.

    Raises:
        ValueError: as :func:`load`.
    """
    checkpoint = find_checkpoint(path)
    algorithm, config, saved, filter_state = _read(checkpoint)
    return {pid: _build(algorithm, config, checkpoint, pid, state, device, env, filter_state)
            for pid, state in sorted(saved.items())}


def _read(checkpoint: Path) -> tuple[Algorithm, TrainerConfig, dict[str, Any], Mapping[str, Any] | None]:
    """The checkpoint's algorithm, a config its policies can be built from, each policy's saved state and the
    local worker's observation filter state (``None``: none saved)."""
    name = checkpoint_algorithm(checkpoint)
    if name.lower() not in ALGORITHMS:
        raise ValueError(f"{checkpoint} is a checkpoint of {name!r}, which is not a registered algorithm "
                         f"({sorted(ALGORITHMS)}); build its policy and restore it with policy.set_state(...)")
    algorithm = get_algorithm(name)
    tree = read_checkpoint(checkpoint, algorithm=algorithm.name)
    check_tree(tree, checkpoint, {})
    data = tree.get("config")
    if data is None:
        raise ValueError(f"{checkpoint} holds no config (it was written before checkpoints stored theirs); build "
                         f"its policy with its config and restore it with policy.set_state(...)")
    check_tree(tree, checkpoint, {"config": dict, "local_worker.policies": dict})
    try:
        config = _policy_config(algorithm, data, checkpoint)
    except (KeyError, AttributeError, TypeError) as e:  # a crafted config
        raise ValueError(f"{checkpoint}: its config is malformed ({e!r:.200}); the checkpoint was not written by "
                         f"Trainer.save") from e
    return algorithm, config, dict(tree["local_worker"]["policies"]), tree["local_worker"].get("obs_filter")


def _policy_config(algorithm: Algorithm, data: Mapping[str, Any], checkpoint: Path) -> TrainerConfig:
    """The saved config; where fields that held callables keep it from rebuilding, the config without them,
    unless one of them is the ``policies`` map (its policy classes and configs are not data)."""
    try:
        return config_from_data(algorithm.config_class, data)
    except ValueError as e:
        not_stored = data.get("not_stored") or {}
        custom = [path for path, entry in not_stored.items() if not entry.get("default")]
        if any(path.split(".")[-1] == "policies" for path in custom):
            raise ValueError(f"checkpoint {checkpoint}: {e}") from None
        relaxed = {**data, "not_stored": {}, "not_stored_are_defaults": True}
        try:
            return config_from_data(algorithm.config_class, relaxed)
        except (ValueError, TypeError) as again:
            raise ValueError(f"checkpoint {checkpoint}: {again}") from None


def _build(algorithm: Algorithm, config: TrainerConfig, checkpoint: Path, policy_id: str, state: Mapping[str, Any],
           device: str, env: str | None, filter_state: Mapping[str, Any] | None) -> TrainedPolicy:
    policy_class: type[Policy] = algorithm.policy_class
    policy_config: PolicyConfig = config
    if config.policies is not None:
        spec = config.policies[policy_id]
        policy_class, policy_config = spec.policy_class or policy_class, spec.config or config
    key = f"local_worker.policies.{policy_id}"
    with restoring(checkpoint, f"{key}.spaces"):
        spaces = state.get("spaces") or {}
        saved_spaces = spaces.get("observation") is not None and spaces.get("action") is not None
        if saved_spaces:
            obs_space, action_space = space_from_data(spaces["observation"]), space_from_data(spaces["action"])
    if not saved_spaces:
        check_env_named(checkpoint, config.env, env)  # building the env would import a "module:Id" env
        obs_space, action_space = _spaces_from_env(algorithm, config, policy_id)
    policy = policy_class(obs_space, action_space, dataclasses.replace(policy_config, device=device))
    with restoring(checkpoint, key):
        policy.set_state(state)
    obs_filter = None
    if config.observation_filter != "NoFilter":
        obs_filter = make_filter(config.observation_filter, tuple(obs_space.shape or ()))
        assert obs_filter is not None  # not "NoFilter"
        with restoring(checkpoint, "local_worker"):
            if filter_state is None:
                raise KeyError("obs_filter")
            obs_filter.set_state(filter_state)
    return TrainedPolicy(policy, policy_id=policy_id, algorithm=algorithm.name, checkpoint=checkpoint,
                         obs_filter=obs_filter)


def _spaces_from_env(algorithm: Algorithm, config: TrainerConfig,
                     policy_id: str) -> tuple[gym.Space[Any], gym.Space[Any]]:
    """A policy's spaces as a rollout worker finds them (for checkpoints written before they were stored):
    an in-process worker with one env, built and closed here."""
    from flowrl.workers import RolloutWorker

    worker = RolloutWorker(policy_class=algorithm.policy_class,
                           config=dataclasses.replace(config, num_workers=0, num_envs_per_worker=1, device="cpu"))
    try:
        policy = worker.get_policy(policy_id)
        return policy.observation_space, policy.action_space
    finally:
        worker.env.close()

