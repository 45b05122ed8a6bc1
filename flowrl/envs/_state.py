"""Plain-data env state: RNG states as JSON-able dicts, and the wrapper that makes an episode replayable.

A gymnasium env's simulator state is not plain data in general, but a gymnasium env is a deterministic
function of its ``np_random`` generator, its reset seed and the actions it was given. So a vector env
saves, for each env, the generator's state at the start of the episode in progress (or the seed of that
reset), the actions since then, and the generator's current state; restoring replays the episode from
its start. The replay costs at most one episode of steps per env, and is exact for every env that draws
its randomness from ``np_random`` only (all of gymnasium's own envs); it is checked against the saved
generator state and a fingerprint of the saved observation.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping, SupportsFloat

import gymnasium
import numpy as np

__all__ = ["to_plain", "rng_state", "set_rng_state", "env_rng", "load_env_rng", "digest", "EpisodeRecorder",
           "MAX_REPLAY_STEPS"]

# Bit generators whose state a checkpoint may name (never an arbitrary attribute of numpy.random).
_BIT_GENERATORS = {"PCG64": np.random.PCG64, "PCG64DXSM": np.random.PCG64DXSM, "Philox": np.random.Philox,
                   "SFC64": np.random.SFC64, "MT19937": np.random.MT19937}


def to_plain(value: Any) -> Any:
    """``value`` with numpy arrays and scalars turned into lists and Python numbers (JSON-able).

    Examples:
        >>> to_plain({"a": np.arange(2), "b": (np.float32(0.5), [np.int64(1)])})
        {'a': [0, 1], 'b': [0.5, [1]]}
    """
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def rng_state(generator: np.random.Generator) -> dict[str, Any]:
    """The generator's ``bit_generator.state`` as plain data."""
    state: dict[str, Any] = to_plain(generator.bit_generator.state)
    return state


def set_rng_state(generator: np.random.Generator, state: Mapping[str, Any], what: str) -> np.random.Generator:
    """Loads ``state`` into ``generator``, or into a new generator when the bit generator differs.

    Returns:
        The generator that now holds ``state`` (``generator`` itself unless the kinds differed).

    Raises:
        ValueError: ``state`` names an unknown bit generator or does not fit it.
    """
    name = state.get("bit_generator") if isinstance(state, Mapping) else None
    if name not in _BIT_GENERATORS:
        raise ValueError(f"{what}: RNG state {state!r:.120} names bit generator {name!r}; expected one of "
                         f"{sorted(_BIT_GENERATORS)} (a state saved by get_state())")
    if generator.bit_generator.state["bit_generator"] != name:
        generator = np.random.Generator(_BIT_GENERATORS[name]())
    try:
        generator.bit_generator.state = dict(state)
    except (TypeError, ValueError, KeyError) as err:
        raise ValueError(f"{what}: cannot load RNG state {state!r:.120} ({err}); pass a state saved by "
                         f"get_state()") from err
    return generator


def env_rng(env: gymnasium.Env[Any, Any]) -> np.random.Generator:
    """The base env's ``np_random`` (created, unseeded, on first access as gymnasium does)."""
    generator: np.random.Generator = env.unwrapped.np_random
    return generator


def load_env_rng(env: gymnasium.Env[Any, Any], state: Mapping[str, Any], what: str) -> None:
    """Loads ``state`` into the base env's ``np_random``, in place when the bit generator matches."""
    current = env_rng(env)
    loaded = set_rng_state(current, state, what)
    if loaded is not current:
        env.unwrapped.np_random = loaded


MAX_REPLAY_STEPS = 100_000
"""An episode longer than this is not kept for replay (its restore starts a new episode instead)."""


def digest(obs: Any) -> str:
    """A short fingerprint of an observation: checks that a replay reached the saved one."""
    return hashlib.sha256(np.ascontiguousarray(np.asarray(obs)).tobytes()).hexdigest()[:16]


class EpisodeRecorder(gymnasium.Wrapper[Any, Any, Any, Any]):
    """Remembers how the episode in progress started and the actions taken since, so it can be replayed.

    ``episode_start`` is ``{"seed": s}`` after ``reset(seed=s)``, else ``{"rng": state}`` (the base env's
    generator state just before the reset). ``episode_actions`` holds the actions since that reset, or
    ``None`` once the episode passed ``MAX_REPLAY_STEPS``. ``last_obs`` is the last observation returned.
    """

    def __init__(self, env: gymnasium.Env[Any, Any]) -> None:
        super().__init__(env)
        self.episode_start: dict[str, Any] = {}
        self.episode_actions: list[Any] | None = []
        self.last_obs: Any = None
        #: ``(state, what)`` for :meth:`restore_pending`: how a vector env in another process hands each env its
        #: own saved state (one ``set_attr`` for all envs, then one ``call``)
        self.pending_restore: tuple[Mapping[str, Any], str] | None = None

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.episode_start = {"seed": int(seed)} if seed is not None else {"rng": rng_state(env_rng(self.env))}
        self.episode_actions = []
        self.last_obs, info = self.env.reset(seed=seed, options=options)
        return self.last_obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        actions = self.episode_actions
        if actions is not None:
            if len(actions) < MAX_REPLAY_STEPS:
                # An array action may be a view of the caller's buffer: keep a copy.
                actions.append(np.array(action) if isinstance(action, np.ndarray) else action)
            else:
                self.episode_actions = None
        self.last_obs, reward, terminated, truncated, info = self.env.step(action)
        return self.last_obs, reward, terminated, truncated, info

    def get_replay_state(self) -> dict[str, Any]:
        """The episode's start and actions, the generator's current state and the last observation's
        fingerprint, as plain data."""
        return {"episode_start": to_plain(self.episode_start), "episode_actions": to_plain(self.episode_actions),
                "rng": rng_state(env_rng(self.env)), "obs_digest": digest(self.last_obs)}

    def restore_pending(self, action_dtype: np.dtype[Any] | None) -> tuple[Any, bool]:
        """:meth:`restore` of the ``pending_restore`` state (then cleared)."""
        if self.pending_restore is None:
            raise RuntimeError("EpisodeRecorder.restore_pending: no state was set in pending_restore")
        (state, what), self.pending_restore = self.pending_restore, None
        return self.restore(state, action_dtype, what)

    def restore(self, state: Mapping[str, Any], action_dtype: np.dtype[Any] | None, what: str) -> tuple[Any, bool]:
        """Replays the saved episode; returns ``(observation to act on next, exact)``.

        When the episode cannot be replayed exactly (it was too long to keep, or replaying it does not
        reach the saved generator state and observation: the env is not a deterministic function of its
        seed, ``np_random`` and actions), the env starts a new episode from the saved generator state
        instead and ``exact`` is False.

        Args:
            state: a :meth:`get_replay_state` result.
            action_dtype: the dtype of array actions (a Box action space), or ``None`` for integer actions.
            what: names the env in error messages.

        Raises:
            ValueError: a malformed state.
        """
        try:
            start, actions, current, saved_digest = (state["episode_start"], state["episode_actions"], state["rng"],
                                                     state["obs_digest"])
        except (KeyError, TypeError) as err:
            raise ValueError(f"{what}: state {state!r:.120} lacks {err}; pass a state saved by get_state()") from err
        if not isinstance(start, Mapping) or not ({"seed", "rng"} & set(start)):
            raise ValueError(f"{what}: episode_start={start!r:.120} must hold 'seed' or 'rng'")
        if actions is not None:
            if "seed" in start:
                obs, _ = self.reset(seed=int(start["seed"]))
            else:
                load_env_rng(self.env, start["rng"], what)
                obs, _ = self.reset()
            ended = False
            for action in actions:
                act = np.asarray(action, dtype=action_dtype) if action_dtype is not None else action
                obs, _, terminated, truncated, _ = self.step(act)
                ended = ended or bool(terminated or truncated)
            if not ended and rng_state(env_rng(self.env)) == to_plain(current) and digest(obs) == saved_digest:
                return obs, True
        load_env_rng(self.env, current, what)
        obs, _ = self.reset()
        return obs, False
