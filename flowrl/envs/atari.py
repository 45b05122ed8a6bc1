"""Atari 2600 games through the Arcade Learning Environment (``ale-py``, whose wheel ships the ROMs), with the
standard preprocessing of the DQN / IMPALA / PPO papers built from gymnasium's own wrappers
(``pip install 'flowrl[atari]'``).

:func:`flowrl.envs.make_env` builds every id of the ``ALE`` namespace (``"ALE/Pong-v5"``, ``"ALE/Breakout-v5"``)
here, so ``env="ALE/Pong-v5"`` gives the agent what the papers' agents see:

- ``gymnasium.make(id, frameskip=1, **rest)``: the emulator, one frame a step, and v5's sticky actions
  (``repeat_action_probability=0.25``, Machado et al. 2018; pass ``0.0`` for the deterministic DQN protocol);
- ``gymnasium.wrappers.AtariPreprocessing``: up to ``noop_max`` (30) no-ops at reset, ``frame_skip`` (4) frames a
  step with the last two max-pooled, ``screen_size`` (84) square grey frames (``grayscale``);
- :class:`LifeLoss` (``terminal_on_life_loss``, on by default): losing a life ends the *learning* episode
  (``terminated``, no bootstrap past it), and the next ``reset()`` goes on with the same game (one no-op step)
  instead of starting a new one, as DeepMind's agents did. gymnasium's own ``terminal_on_life_loss`` restarts
  the whole game on that reset, so an agent would never see its later lives; flowrl keeps it off. The step that
  loses the life says ``info["game_continues"] = True``, so a :class:`flowrl.envs.VectorEnv` keeps the episode
  statistics (return, length, callbacks' episodes) running to the end of the game: ``episode_return_mean`` is
  the game score, as everyone quotes it;
- ``gymnasium.wrappers.FrameStackObservation`` (``frame_stack``, 4) with the frames moved last
  (:class:`ChannelsLast`): observations are ``uint8`` arrays of shape ``(84, 84, 4)``, which workers, batches and
  replay keep as they are and the model scales on the learner (the Nature CNN,
  :func:`flowrl.models.default_conv_filters`).

A worker restored from a checkpoint replays its envs' episodes exactly only while each is on the stretch that began
with its first, seeded reset; after a later reset (a new game, or play resumed after a lost life) the emulator and
its sticky-action generator are C++ state that the replay cannot recreate, so those envs start new episodes, with a
warning (``ale.cloneState`` could hold that state; not used yet).

Reward clipping is the rollout config's ``clip_rewards=1.0`` (batches clipped, statistics raw). The env config
takes the preprocessing keys above next to ``gymnasium.make``'s (``repeat_action_probability``, ``mode``,
``difficulty``, ``full_action_space``, ``max_episode_steps``); ``preprocess=False`` gives the bare emulator.

Examples:
    >>> from flowrl.envs import EnvContext, make_env
    >>> env = make_env("ALE/Pong-v5", EnvContext(seed=0))
    >>> obs, _ = env.reset(seed=0)
    >>> obs.shape, obs.dtype, env.action_space
    ((84, 84, 4), dtype('uint8'), Discrete(6))
    >>> make_env("ALE/Pong-v5", EnvContext(config={"preprocess": False})).observation_space.shape
    (210, 160, 3)
    >>> make_env("ALE/Pong-v5", EnvContext(config={"frame_stack": 0}))
    Traceback (most recent call last):
    ...
    ValueError: env 'ALE/Pong-v5': env_config frame_stack=0 must be an int >= 1 (frames stacked along the last axis; 4 is the papers' setting, 1 turns stacking off)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, SupportsFloat

import gymnasium
import numpy as np

from flowrl.envs.base import GAME_CONTINUES

if TYPE_CHECKING:
    from flowrl.envs.base import EnvContext

__all__ = ["PREPROCESSING", "GAME_CONTINUES", "LifeLoss", "ChannelsLast", "make_atari"]

#: The env config keys of flowrl's Atari preprocessing and their defaults (the rest go to ``gymnasium.make``).
PREPROCESSING: dict[str, Any] = {"preprocess": True, "noop_max": 30, "frame_skip": 4, "screen_size": 84,
                                 "grayscale": True, "terminal_on_life_loss": True, "frame_stack": 4}


_MEANINGS = {"noop_max": "no-ops at reset, 0 turns them off", "frame_skip": "emulator frames per step",
             "screen_size": "the square frame's side in pixels",
             "frame_stack": "frames stacked along the last axis; 4 is the papers' setting, 1 turns stacking off"}
_MINIMUM = {"noop_max": 0, "frame_skip": 1, "screen_size": 8, "frame_stack": 1}


class LifeLoss(gymnasium.Wrapper[Any, Any, Any, Any]):
    """Ends the learning episode when a life is lost, and goes on with the same game at the next ``reset()``.

    A step that loses a life (and does not end the game) returns ``terminated=True`` and
    ``info["game_continues"] = True``; the following ``reset()`` takes one no-op step instead of resetting the
    emulator (a real reset when the game is over, or when that no-op step ends it). Its reward, if any, is
    dropped (a no-op right after a life is lost scores nothing in the games we know of).
    """

    def __init__(self, env: gymnasium.Env[Any, Any]) -> None:
        super().__init__(env)
        self._lives = 0
        self._game_over = True

    def _ale_lives(self) -> int:
        return int(self.env.unwrapped.ale.lives())  # type: ignore[attr-defined]  # an ALE env: make_atari built it

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._game_over = terminated or truncated
        lives = self._ale_lives()
        if lives < self._lives and not self._game_over:
            terminated = True
            info = {**info, GAME_CONTINUES: True}
        self._lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if self._game_over or seed is not None:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(options=options)
        self._game_over = False
        self._lives = self._ale_lives()
        return obs, info


class ChannelsLast(gymnasium.ObservationWrapper[Any, Any, Any]):
    """``(frames, height, width, channels)`` stacks (gymnasium's ``FrameStackObservation`` over HWC frames) as
    ``(height, width, frames * channels)``, the HWC layout of flowrl's image encoders (frame-major channels:
    a grey stack's channel ``i`` is frame ``i``, oldest first)."""

    def __init__(self, env: gymnasium.Env[Any, Any]) -> None:
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gymnasium.spaces.Box) and len(space.shape) == 4, space
        self.observation_space = gymnasium.spaces.Box(self.observation(space.low), self.observation(space.high),
                                                      dtype=space.dtype)

    def observation(self, observation: Any) -> Any:
        frames, height, width, channels = observation.shape
        return np.moveaxis(observation, 0, 2).reshape(height, width, frames * channels)


def _settings(env_id: str, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The preprocessing settings (defaults filled in, each checked) and the rest of the env config."""
    given = sorted(key for key in config if key in PREPROCESSING and key != "preprocess")
    settings = {key: config.pop(key, default) for key, default in PREPROCESSING.items()}
    if settings["preprocess"] is False and given:
        raise ValueError(f"env {env_id!r}: env_config {', '.join(given)} shape the preprocessing, which "
                         f"preprocess=false turns off; drop them, or keep the preprocessing")
    for key in ("preprocess", "grayscale", "terminal_on_life_loss"):
        if not isinstance(settings[key], bool):
            raise ValueError(f"env {env_id!r}: env_config {key}={settings[key]!r} must be true or false")
    for key, low in _MINIMUM.items():
        value = settings[key]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"env {env_id!r}: env_config {key}={value!r} must be an int >= {low} ({_MEANINGS[key]})")
    if settings["preprocess"] and config.get("frameskip", 1) != 1:
        raise ValueError(f"env {env_id!r}: env_config frameskip={config['frameskip']!r} would skip frames twice "
                         f"(the preprocessing skips frame_skip={settings['frame_skip']} frames a step); set "
                         f"frame_skip instead, or preprocess=false for the emulator's own frame skipping")
    if settings["preprocess"] and "obs_type" in config:
        raise ValueError(f"env {env_id!r}: env_config obs_type={config['obs_type']!r} is set by the preprocessing "
                         f"(grey or RGB frames, as grayscale says); drop it, or set preprocess=false")
    return settings, config


def _quiet_ale() -> None:
    """Keeps the emulator's banner (printed by every env it builds, so by every worker) to errors only."""
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)


def make_atari(env_id: str, ctx: EnvContext) -> gymnasium.Env[Any, Any]:
    """The ALE game ``env_id`` (an id in gymnasium's registry, ``ale_py`` imported) with the preprocessing the
    module docstring describes, set by ``ctx.config``.

    Raises:
        ValueError: a preprocessing key of the wrong type or range, ``frameskip`` other than 1 with the
            preprocessing on, or OpenCV (which AtariPreprocessing resizes with) not installed.
    """
    settings, kwargs = _settings(env_id, dict(ctx.config))
    _quiet_ale()
    if not settings["preprocess"]:
        return gymnasium.make(env_id, **kwargs)
    # The emulator's own observation is never read (AtariPreprocessing reads the screen itself); a grey one costs
    # a third of an RGB copy per frame: 9% more steps/s, the same frames.
    obs_type = "grayscale" if settings["grayscale"] else "rgb"
    env: gymnasium.Env[Any, Any] = gymnasium.make(env_id, **{**kwargs, "frameskip": 1, "obs_type": obs_type})
    try:
        import cv2  # noqa: F401  # AtariPreprocessing resizes with OpenCV; asked here for a message with our extra
    except ImportError as err:
        env.close()
        raise ValueError(f"env {env_id!r}: the Atari preprocessing resizes frames with OpenCV, which does not import "
                         f"here ({err}): pip install 'flowrl[atari]' (or opencv-python-headless), or pass "
                         f"env_config preprocess=false for the bare emulator") from err
    env = gymnasium.wrappers.AtariPreprocessing(
        env, noop_max=settings["noop_max"], frame_skip=settings["frame_skip"], screen_size=settings["screen_size"],
        terminal_on_life_loss=False, grayscale_obs=settings["grayscale"], grayscale_newaxis=True)
    if settings["terminal_on_life_loss"]:
        env = LifeLoss(env)
    if settings["frame_stack"] > 1:
        env = ChannelsLast(gymnasium.wrappers.FrameStackObservation(env, settings["frame_stack"]))
    return env
