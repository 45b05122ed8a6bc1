"""N copies of a single-agent env stepped together: :class:`VectorEnv` and its :class:`VectorStep`.

A finished env is reset inside the same ``step()`` ("same-step" autoreset): the step reports the
transition's true last observation in ``final_obs`` and the reset observation in ``obs``, so every
row of every step is a real transition. (gymnasium's default NEXT_STEP mode instead returns the last
observation as ``obs`` and spends the env's next step on the reset: a row whose action is ignored and
whose reward is 0.)

Examples:
    >>> env = VectorEnv("CartPole-v1", 2, seed=0, backend="loop")
    >>> obs = env.reset()
    >>> obs.shape, obs.dtype
    ((2, 4), dtype('float32'))
    >>> lengths = []
    >>> for _ in range(30):  # always push right: the pole falls within ~10 steps
    ...     step = env.step(np.ones(2, dtype=np.int64))
    ...     lengths += [ep.episode_length for ep in step.episodes]
    >>> len(lengths) >= 4, all(8 <= n <= 15 for n in lengths)
    (True, True)
    >>> env.close()
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, Mapping, Protocol, Union, cast

import gymnasium
import numpy as np
import numpy.typing as npt
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from flowrl.envs._state import MAX_REPLAY_STEPS, EpisodeRecorder, rng_state, set_rng_state
from flowrl.envs.base import GAME_CONTINUES, EnvContext, EnvSpec, EpisodeRecord, check_seed, derive_seed, make_env
from flowrl.validation import check_int

__all__ = ["VectorEnv", "VectorStep", "SupportedSpace", "Backend", "AUTO_NATIVE_MIN_ENVS", "MAX_REPLAY_STEPS"]

SupportedSpace = Union[gymnasium.spaces.Box, gymnasium.spaces.Discrete]
"""The observation and action spaces a :class:`VectorEnv` batches."""

Backend = Literal["auto", "loop", "gymnasium", "async", "envpool"]
_BACKENDS = ("auto", "loop", "gymnasium", "async", "envpool")
_STATE_FORMAT = "flowrl.envs.VectorEnv/1"

# The "auto" rule, measured with VectorEnv itself (CartPole-v1, random actions, env steps/s, median of
# 3 runs of 40k steps; 2-core shared dev machine, Python 3.11, gymnasium 1.4, numpy 2.4; runs vary by
# ~20%, the ratios much less). See the envs report for the script.
#
#     num_envs   loop    gymnasium: native CartPoleVectorEnv   gymnasium: SyncVectorEnv
#         1       66k     24k                                    41k
#         2       84k     46k                                    56k
#         4       97k     87k                                    67k
#         6      100k    123k                                    70k
#         8      102k    156k                                    72k
#        32      105k    452k                                    80k
#
# (a bare gymnasium.make CartPole with a hand-written reset: ~120k.) So "auto" takes the native
# vectorised env from AUTO_NATIVE_MIN_ENVS envs up for ids that have one, and the loop otherwise;
# SyncVectorEnv never beats the loop (it copies and concatenates observations and builds info dicts).
AUTO_NATIVE_MIN_ENVS = 6
"""From this many envs up, ``backend="auto"`` uses gymnasium's numpy-vectorised env when the id has one."""

_NATIVE_CARTPOLE = "gymnasium.envs.classic_control.cartpole:CartPoleVectorEnv"
# Config keys the vectorised CartPole takes; any other key (say disable_env_checker) means SyncVectorEnv.
_NATIVE_CARTPOLE_KWARGS = frozenset({"max_episode_steps", "sutton_barto_reward", "render_mode"})


def _check_space(space: object, role: str, where: str) -> SupportedSpace:
    if isinstance(space, (gymnasium.spaces.Box, gymnasium.spaces.Discrete)):
        return space
    raise ValueError(f"{where}: {role} space {space!r} ({type(space).__name__}) is not supported; VectorEnv "
                     f"batches gymnasium.spaces.Box and Discrete only (wrap the env, e.g. with "
                     f"gymnasium.wrappers.FlattenObservation, or write a MultiAgentEnv)")


def _empty_batch(space: SupportedSpace, n: int) -> npt.NDArray[Any]:
    if isinstance(space, gymnasium.spaces.Discrete):
        return np.empty(n, dtype=np.int64)
    return np.empty((n, *space.shape), dtype=space.dtype)


def _has_native_cartpole(env: EnvSpec, config: Mapping[str, Any]) -> bool:
    """Whether ``env`` is an id whose vector entry point is the numpy ``CartPoleVectorEnv`` taking ``config``."""
    if not isinstance(env, str) or env not in gymnasium.registry:
        return False
    spec = gymnasium.registry[env]
    entry = spec.vector_entry_point
    return ((entry is CartPoleVectorEnv or entry == _NATIVE_CARTPOLE) and not spec.additional_wrappers
            and set(config) <= _NATIVE_CARTPOLE_KWARGS)


@dataclass(frozen=True)
class VectorStep:
    """What one :meth:`VectorEnv.step` returns: one real transition per env (new arrays every step).

    Attributes:
        obs: ``[N, *obs_shape]``, what each env acts on next; the reset observation where an episode ended.
        final_obs: ``[N, *obs_shape]``, the transition's true next observation for every env (the terminal
            or truncation observation where an episode ended, equal to ``obs`` elsewhere): the ``new_obs``
            to store and to bootstrap a truncated episode from.
        rewards: float32 ``[N]``.
        terminateds: bool ``[N]``, the episode reached a terminal state (do not bootstrap).
        truncateds: bool ``[N]``, the episode was cut short, e.g. by a time limit (bootstrap from final_obs).
        episodes: the episodes that finished at this step.
    """

    obs: npt.NDArray[Any]
    final_obs: npt.NDArray[Any]
    rewards: npt.NDArray[np.float32]
    terminateds: npt.NDArray[np.bool_]
    truncateds: npt.NDArray[np.bool_]
    episodes: list[EpisodeRecord]

    @property
    def dones(self) -> npt.NDArray[np.bool_]:
        """``terminateds | truncateds``: the envs whose episode ended (and that were reset) at this step."""
        return self.terminateds | self.truncateds


_StepArrays = tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[np.float32], npt.NDArray[np.bool_],
                    npt.NDArray[np.bool_], "list[int]"]
"""obs, final_obs, rewards, terminateds, truncateds, and the envs whose ended episode goes on for its statistics
(``info["game_continues"]``, :data:`flowrl.envs.base.GAME_CONTINUES`)."""


class _Impl(Protocol):
    """A backend: steps N envs with same-step autoreset; its state is plain data."""

    kind: str  # the get_state() layout: "per_env", "native_cartpole" or "envpool"
    observation_space: SupportedSpace
    action_space: SupportedSpace

    def reset(self, seeds: list[int | None] | None) -> npt.NDArray[Any]: ...
    def step(self, actions: npt.NDArray[Any]) -> _StepArrays: ...
    def get_state(self) -> Any: ...
    def set_state(self, state: Any) -> tuple[npt.NDArray[Any], list[bool]]: ...
    def close(self) -> None: ...


def _recorded(env: EnvSpec, ctx: EnvContext) -> EpisodeRecorder:
    return EpisodeRecorder(make_env(env, ctx))


class _PerEnvState:
    """get_state()/set_state() for the backends that hold N separate (recorded) gymnasium envs."""

    kind = "per_env"
    observation_space: SupportedSpace
    action_space: SupportedSpace

    def _recorders(self) -> list[EpisodeRecorder]:
        raise NotImplementedError

    def get_state(self) -> Any:
        return [env.get_replay_state() for env in self._recorders()]

    def set_state(self, state: Any) -> tuple[npt.NDArray[Any], list[bool]]:
        envs = self._recorders()
        if not isinstance(state, list) or len(state) != len(envs):
            raise ValueError(f"VectorEnv.set_state: state['envs'] must be a list of {len(envs)} env states, got "
                             f"{state!r:.120}; pass a state saved by get_state() of a VectorEnv of that size")
        dtype = None if isinstance(self.action_space, gymnasium.spaces.Discrete) else self.action_space.dtype
        obs = _empty_batch(self.observation_space, len(envs))
        exact = []
        for i, (env, env_state) in enumerate(zip(envs, state)):
            obs[i], ok = env.restore(env_state, dtype, what=f"VectorEnv.set_state: env {i}")
            exact.append(ok)
        return obs, exact


class _LoopImpl(_PerEnvState):
    """A Python loop over N gymnasium envs."""

    def __init__(self, contexts: list[EnvContext], env: EnvSpec) -> None:
        self.envs: list[EpisodeRecorder] = []
        try:
            for ctx in contexts:
                self.envs.append(_recorded(env, ctx))
            self.observation_space = _check_space(self.envs[0].observation_space, "observation", repr(env))
            self.action_space = _check_space(self.envs[0].action_space, "action", repr(env))
            for i, e in enumerate(self.envs[1:], start=1):
                if e.observation_space != self.observation_space or e.action_space != self.action_space:
                    raise ValueError(f"env {env!r}: env {i} has spaces ({e.observation_space}, {e.action_space}) but "
                                     f"env 0 has ({self.observation_space}, {self.action_space}); every env of a "
                                     f"VectorEnv needs the same spaces")
        except BaseException:
            self.close()
            raise
        self._discrete_actions = isinstance(self.action_space, gymnasium.spaces.Discrete)
        probe = _empty_batch(self.observation_space, len(self.envs))
        self._obs_shape, self._obs_dtype = probe.shape, probe.dtype

    def _recorders(self) -> list[EpisodeRecorder]:
        return self.envs

    def reset(self, seeds: list[int | None] | None) -> npt.NDArray[Any]:
        obs = _empty_batch(self.observation_space, len(self.envs))
        for i, env in enumerate(self.envs):
            obs[i] = env.reset(seed=None if seeds is None else seeds[i])[0]
        return obs

    def step(self, actions: npt.NDArray[Any]) -> _StepArrays:
        # Python lists, one array each at the end: a numpy item assignment per env and field costs more
        # than the env step of a cheap simulator such as CartPole.
        acts: list[Any] = actions.tolist() if self._discrete_actions else list(actions)
        final = np.empty(self._obs_shape, self._obs_dtype)
        obs = np.empty(self._obs_shape, self._obs_dtype)
        rewards, terminateds, truncateds = [], [], []
        continues: list[int] = []
        for i, env in enumerate(self.envs):
            o, r, te, tr, info = env.step(acts[i])
            final[i] = o
            rewards.append(float(r))
            terminateds.append(bool(te))
            truncateds.append(bool(tr))
            if te or tr:
                if info.get(GAME_CONTINUES):
                    continues.append(i)
                o, _ = env.reset()
            obs[i] = o
        return (obs, final, np.array(rewards, dtype=np.float32), np.array(terminateds, dtype=np.bool_),
                np.array(truncateds, dtype=np.bool_), continues)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class _SyncImpl(_PerEnvState):
    """gymnasium's ``SyncVectorEnv`` in SAME_STEP autoreset mode (the true last obs in ``infos['final_obs']``)."""

    def __init__(self, contexts: list[EnvContext], env: EnvSpec) -> None:
        self._adopt(SyncVectorEnv([partial(_recorded, env, ctx) for ctx in contexts], copy=False,
                                  autoreset_mode=AutoresetMode.SAME_STEP), env)

    def _adopt(self, vec: Any, env: EnvSpec) -> None:
        self.vec = vec
        try:
            self.observation_space = _check_space(self.vec.single_observation_space, "observation", repr(env))
            self.action_space = _check_space(self.vec.single_action_space, "action", repr(env))
        except BaseException:
            self.close()
            raise

    def _recorders(self) -> list[EpisodeRecorder]:
        return cast(list[EpisodeRecorder], self.vec.envs)  # each built by _recorded above

    def reset(self, seeds: list[int | None] | None) -> npt.NDArray[Any]:
        obs, _ = self.vec.reset(seed=seeds)
        return np.array(obs)

    def step(self, actions: npt.NDArray[Any]) -> _StepArrays:
        obs_buffer, rewards, terminateds, truncateds, infos = self.vec.step(actions)
        obs = np.array(obs_buffer)  # copy=False above: the next step reuses the buffer
        final = obs.copy()
        done = terminateds | truncateds
        continues: list[int] = []
        if done.any():
            final_obs = infos["final_obs"]
            for i in np.flatnonzero(done):
                final[i] = final_obs[i]
            final_info = infos.get("final_info", {})
            if GAME_CONTINUES in final_info:
                continues = np.flatnonzero(done & final_info[f"_{GAME_CONTINUES}"]
                                           & final_info[GAME_CONTINUES].astype(bool)).tolist()
        return obs, final, rewards.astype(np.float32), terminateds, truncateds, continues

    def close(self) -> None:
        self.vec.close()


class _AsyncImpl(_SyncImpl):
    """gymnasium's ``AsyncVectorEnv``: each env in a subprocess of its own (started by a fork server, so a worker's
    threads are never forked), observations through shared memory, SAME_STEP autoreset. The state is the per-env
    layout, read and restored inside the subprocesses."""

    def __init__(self, contexts: list[EnvContext], env: EnvSpec) -> None:
        self._adopt(AsyncVectorEnv([partial(_recorded, env, ctx) for ctx in contexts], shared_memory=True, copy=False,
                                   context="forkserver", autoreset_mode=AutoresetMode.SAME_STEP), env)

    def get_state(self) -> Any:
        return list(self.vec.call("get_replay_state"))

    def set_state(self, state: Any) -> tuple[npt.NDArray[Any], list[bool]]:
        n = self.vec.num_envs
        if not isinstance(state, list) or len(state) != n:
            raise ValueError(f"VectorEnv.set_state: state['envs'] must be a list of {n} env states, got "
                             f"{state!r:.120}; pass a state saved by get_state() of a VectorEnv of that size")
        dtype = None if isinstance(self.action_space, gymnasium.spaces.Discrete) else self.action_space.dtype
        self.vec.set_attr("pending_restore", [(s, f"VectorEnv.set_state: env {i}") for i, s in enumerate(state)])
        restored = self.vec.call("restore_pending", dtype)
        obs = _empty_batch(self.observation_space, n)
        for i, (o, _) in enumerate(restored):
            obs[i] = o
        return obs, [bool(ok) for _, ok in restored]


class _NativeCartPoleImpl:
    """gymnasium's numpy-vectorised CartPole, with the reset moved into the step that ends an episode.

    ``CartPoleVectorEnv`` knows only NEXT_STEP autoreset (``make_vec`` refuses ``vector_kwargs`` such as
    ``autoreset_mode`` for a vector entry point, and the class takes no such argument), so this adapter
    does at the end of the step exactly what that env would do at the start of the next one: draw
    ``uniform(low, high, size=(4, k))`` from the env's generator for the k finished envs (the same draws in
    the same order), zero their step counters and clear ``prev_done``. One generator serves all N envs,
    so its trajectories differ from N separately seeded envs. The simulator state is plain numbers, so
    its get_state/set_state is direct and always exact.
    """

    kind = "native_cartpole"

    def __init__(self, env_id: str, num_envs: int, config: Mapping[str, Any]) -> None:
        self.vec = gymnasium.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **config)
        if type(self.vec) is not CartPoleVectorEnv:
            self.vec.close()
            raise TypeError(f"{env_id!r}: make_vec built {type(self.vec).__name__}, not CartPoleVectorEnv")
        # CartPoleVectorEnv keeps its simulator in attributes typed only by their None defaults
        # (state, steps, prev_done, low, high): handle it as Any.
        self._sim: Any = self.vec
        self.num_envs = num_envs
        self.observation_space = _check_space(self.vec.single_observation_space, "observation", repr(env_id))
        self.action_space = _check_space(self.vec.single_action_space, "action", repr(env_id))

    def reset(self, seeds: list[int | None] | None) -> npt.NDArray[Any]:
        obs, _ = self.vec.reset(seed=None if seeds is None else seeds[0])
        return np.asarray(obs)

    def step(self, actions: npt.NDArray[Any]) -> _StepArrays:
        final, rewards, terminateds, truncateds, _ = self.vec.step(actions)
        done = terminateds | truncateds
        obs = final.copy()
        if done.any():
            sim = self._sim
            sim.state[:, done] = sim.np_random.uniform(low=sim.low, high=sim.high, size=(4, int(done.sum())))
            sim.steps[done] = 0
            sim.prev_done[:] = False
            obs[done] = sim.state[:, done].T
        return obs, final, rewards.astype(np.float32, copy=False), terminateds, truncateds, []

    def get_state(self) -> Any:
        sim = self._sim
        return {"rng": rng_state(sim.np_random), "physics": sim.state.tolist(), "steps": sim.steps.tolist()}

    def set_state(self, state: Any) -> tuple[npt.NDArray[Any], list[bool]]:
        what = "VectorEnv.set_state (native CartPole)"
        try:
            physics = np.asarray(state["physics"], dtype=np.float64)
            steps = np.asarray(state["steps"], dtype=np.int32)
            rng = state["rng"]
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{what}: state['envs']={state!r:.120} is malformed ({err}); pass a state saved by "
                             f"get_state()") from err
        if physics.shape != (4, self.num_envs) or steps.shape != (self.num_envs,):
            raise ValueError(f"{what}: physics shape {physics.shape} / steps shape {steps.shape}; expected "
                             f"(4, {self.num_envs}) / ({self.num_envs},), a state of a VectorEnv of that size")
        sim = self._sim
        current = sim.np_random
        loaded = set_rng_state(current, rng, what)
        if loaded is not current:
            sim.np_random = loaded
        sim.state, sim.steps = physics, steps
        sim.prev_done = np.zeros(self.num_envs, dtype=np.bool_)
        return np.asarray(physics.T, dtype=np.float32), [True] * self.num_envs

    def close(self) -> None:
        self.vec.close()


class _EnvPoolImpl:
    """EnvPool's C++ envs (``envpool.make_gymnasium``: one pool, its own threads), with the reset moved into the step
    that ends an episode: EnvPool resets a finished env on its *next* step (NEXT_STEP), so this adapter steps the
    finished envs once more at once, with an action EnvPool ignores, and returns their reset observations.

    EnvPool seeds env ``i`` of the pool with ``seed + i`` itself (``seed`` is ``derive_seed(seed, worker_index,
    0)`` folded into EnvPool's int32), so its trajectories are not the loop's; and its simulators live in C++, so a saved state cannot hold
    them: restoring one starts every env on a new episode."""

    kind = "envpool"
    cannot_replay = "EnvPool's simulator state lives in C++ and cannot be saved"

    def __init__(self, env_id: str, num_envs: int, seed: int | None, config: Mapping[str, Any]) -> None:
        backend = os.environ.get("MPLBACKEND")
        try:
            import envpool
        except ImportError as e:
            raise ValueError(f"backend='envpool' needs EnvPool, which does not import here ({e}); install it with "
                             f"pip install 'flowrl[envpool]', or use backend='auto'") from None
        finally:  # importing EnvPool sets MPLBACKEND=Agg for the whole process (its jumanji renderer): undone
            if backend is None:
                os.environ.pop("MPLBACKEND", None)
            else:
                os.environ["MPLBACKEND"] = backend
        known = envpool.list_all_envs()
        if env_id not in known:
            close = [k for k in known if k.split("-")[0].lower() == env_id.split("-")[0].lower()]
            raise ValueError(f"backend='envpool': EnvPool has no env {env_id!r}"
                             f"{f' (it has {close})' if close else ''}; envpool.list_all_envs() lists its ids")
        pool_seed = 0 if seed is None else seed % (2**31 - num_envs)  # EnvPool takes an int32 and adds the index
        self.vec = envpool.make_gymnasium(env_id, num_envs=num_envs, seed=pool_seed, **config)
        self.num_envs = num_envs
        try:
            self.observation_space = _check_space(self.vec.observation_space, "observation", repr(env_id))
            self.action_space = _check_space(self.vec.action_space, "action", repr(env_id))
        except BaseException:
            self.close()
            raise
        self._discrete = isinstance(self.action_space, gymnasium.spaces.Discrete)

    @staticmethod
    def _ordered(arrays: tuple[Any, ...], info: Mapping[str, Any]) -> tuple[Any, ...]:
        order = np.argsort(info["env_id"])
        return tuple(np.asarray(a)[order] for a in arrays)

    def reset(self, seeds: list[int | None] | None) -> npt.NDArray[Any]:
        obs, info = self.vec.reset()
        return cast(npt.NDArray[Any], self._ordered((obs,), info)[0])

    def step(self, actions: npt.NDArray[Any]) -> _StepArrays:
        acts = actions.astype(np.int32) if self._discrete else actions
        obs_raw, rewards_raw, terminateds_raw, truncateds_raw, info = self.vec.step(acts)
        final, rewards, terminateds, truncateds = self._ordered(
            (obs_raw, rewards_raw, terminateds_raw, truncateds_raw), info)
        done = np.flatnonzero(terminateds | truncateds)
        obs = final.copy()
        if done.size:
            ignored = np.zeros((done.size, *acts.shape[1:]), dtype=acts.dtype)  # a resetting env ignores its action
            reset_obs, _, _, _, reset_info = self.vec.step(ignored, env_id=done.astype(np.int32))
            obs[np.asarray(reset_info["env_id"])] = reset_obs
        return (obs, final, np.asarray(rewards, dtype=np.float32), np.asarray(terminateds, dtype=np.bool_),
                np.asarray(truncateds, dtype=np.bool_), [])

    def get_state(self) -> Any:
        return {"note": self.cannot_replay}

    def set_state(self, state: Any) -> tuple[npt.NDArray[Any], list[bool]]:
        return self.reset(None), [False] * self.num_envs

    def close(self) -> None:
        self.vec.close()


class VectorEnv:
    """N copies of one single-agent env, stepped together with same-step autoreset.

    Env ``i`` is built by :func:`make_env` with ``EnvContext(worker_index, env_index=i,
    seed=derive_seed(seed, worker_index, i), config)``. The first :meth:`reset` seeds env ``i`` with that
    seed; later resets (and the automatic ones) are unseeded, so each env's generator runs on.

    Backends (all keep the :class:`VectorStep` contract):

    - ``"loop"``: a Python loop over N gymnasium envs.
    - ``"gymnasium"``: gymnasium's vector API. For an id with a numpy-vectorised version (CartPole-v0/v1)
      it is ``gymnasium.make_vec(id, vectorization_mode="vector_entry_point")``: one generator for all N
      envs, seeded with ``derive_seed(seed, worker_index, 0)``, so *different trajectories from the loop*
      for the same seed; gymnasium offers only NEXT_STEP autoreset there, and an adapter moves the reset
      into the ending step. Otherwise (another id, a callable, or an env config with keys the vectorised
      env does not take) it is ``SyncVectorEnv`` in SAME_STEP autoreset mode, seeded env by env like the
      loop, which it then matches step for step.
    - ``"async"``: gymnasium's ``AsyncVectorEnv``, each env in a subprocess of its own (shared-memory
      observations, SAME_STEP autoreset), seeded env by env like the loop, which it matches step for step. It
      pays only where one env step costs more than a round trip between processes; never chosen by ``"auto"``.
      Measured on 2 cores, 4 envs (``benchmarks/sampling.py --backends``): 0.19x the loop's steps/s on CartPole,
      1.11x with 0.2 ms of CPU per step, 1.49x with 1 ms.
    - ``"envpool"``: EnvPool's C++ envs for an id EnvPool knows (``envpool.list_all_envs()``; the ``envpool``
      extra), the env config passed to ``envpool.make_gymnasium``. EnvPool seeds its envs itself from
      ``derive_seed(seed, worker_index, 0)``, so *different trajectories from the loop*, and a restored state
      starts every env on a new episode (its simulators cannot be saved). Never chosen by ``"auto"``. Measured
      on 2 cores (worker steps/s over the loop's): CartPole 0.71x with 4 envs, 1.20x with 16; Acrobot 1.64x and
      4.55x.
    - ``"auto"``: the faster one as measured: the vectorised CartPole from ``AUTO_NATIVE_MIN_ENVS`` (6)
      envs up, else the loop.

    :meth:`get_state` is plain, JSON-able data. For the per-env backends it holds each env's generator
    state, how its episode in progress started (the reset seed, or the generator state just before that
    reset), the actions since and a fingerprint of its current observation; :meth:`set_state` replays the
    episode, so the continuation is exact for envs whose randomness comes from ``np_random`` (all of
    gymnasium's). For the vectorised CartPole it holds the generator state and the simulator arrays.

    Args:
        env: a gymnasium id or a callable ``EnvContext -> gymnasium.Env``.
        num_envs: N >= 1.
        seed: the config seed (an int >= 0), or ``None`` for unseeded envs.
        worker_index: the owning worker's index (the seeds derive from it).
        config: env keyword arguments (``gymnasium.make(id, **config)``), also handed to a callable as
            ``ctx.config``.
        backend: ``"auto"``, ``"loop"``, ``"gymnasium"``, ``"async"`` or ``"envpool"``.

    Attributes:
        num_envs: N.
        observation_space: one env's observation space (a Box or a Discrete).
        action_space: one env's action space (a Box or a Discrete).
        backend: the backend in use, ``"loop"``, ``"gymnasium"``, ``"async"`` or ``"envpool"``.

    Raises:
        ValueError: ``num_envs < 1``, an unknown backend or env id, a negative seed or index, or an
            observation or action space other than Box and Discrete.
        TypeError: ``config`` is not a mapping, or the env callable returned something that is not an env.

    Examples:
        >>> env = VectorEnv("CartPole-v1", 8, seed=0)
        >>> env
        VectorEnv('CartPole-v1', num_envs=8, backend='gymnasium' (vectorised CartPole))
        >>> env.observation_space.shape, env.action_space
        ((4,), Discrete(2))
        >>> env.reset().shape
        (8, 4)
        >>> step = env.step(np.zeros(8, dtype=np.int64))
        >>> step.rewards.dtype, step.terminateds.shape, bool((step.final_obs == step.obs).all())
        (dtype('float32'), (8,), True)
        >>> VectorEnv("CartPole-v1", 0)
        Traceback (most recent call last):
        ...
        ValueError: num_envs=0 must be an int >= 1 (envs stepped together by one worker)
    """

    def __init__(self, env: EnvSpec, num_envs: int, *, seed: int | None = None, worker_index: int = 0,
                 config: Mapping[str, Any] | None = None, backend: Backend = "auto") -> None:
        check_int("num_envs", num_envs, 1, "envs stepped together by one worker")
        if backend not in _BACKENDS:
            raise ValueError(f"backend={backend!r} is not one of {_BACKENDS}; use 'auto' unless you measured")
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(f"config={config!r} must be a mapping of env keyword arguments or None")
        self.seed = check_seed(seed)
        self.num_envs, self.worker_index = int(num_envs), worker_index
        self.config: dict[str, Any] = dict(config or {})
        self._env_spec = env
        contexts = [EnvContext(worker_index=worker_index, env_index=i, seed=derive_seed(self.seed, worker_index, i),
                               config=self.config) for i in range(self.num_envs)]
        native = _has_native_cartpole(env, self.config)
        if backend == "auto":
            backend = "gymnasium" if native and self.num_envs >= AUTO_NATIVE_MIN_ENVS else "loop"
        self.backend: Literal["loop", "gymnasium", "async", "envpool"] = backend
        self._impl: _Impl
        if backend == "envpool":
            if not isinstance(env, str):
                raise ValueError(f"backend='envpool' builds envs by EnvPool id; {env!r} is a callable: use another "
                                 f"backend")
            self._impl = _EnvPoolImpl(env, self.num_envs, contexts[0].seed, self.config)
        elif backend == "loop":
            self._impl = _LoopImpl(contexts, env)
        elif backend == "async":
            self._impl = _AsyncImpl(contexts, env)
        elif native:
            self._impl = _NativeCartPoleImpl(cast(str, env), self.num_envs, self.config)  # native: env is an id
        else:
            self._impl = _SyncImpl(contexts, env)
        self.observation_space: SupportedSpace = self._impl.observation_space
        self.action_space: SupportedSpace = self._impl.action_space
        self._seeds = [ctx.seed for ctx in contexts]
        self._first_reset_pending = True
        self._obs: npt.NDArray[Any] | None = None
        self._returns = np.zeros(self.num_envs, dtype=np.float64)
        self._lengths = np.zeros(self.num_envs, dtype=np.int64)
        self._action_shape = (self.num_envs, *(self.action_space.shape or ()))  # Space.shape is Optional
        self._action_range: tuple[int, int] | None = None
        if isinstance(self.action_space, gymnasium.spaces.Discrete):
            start = int(self.action_space.start)
            self._action_range = (start, start + int(self.action_space.n))
        self._closed = False

    def __repr__(self) -> str:
        detail = ""
        if isinstance(self._impl, _NativeCartPoleImpl):
            detail = " (vectorised CartPole)"
        elif isinstance(self._impl, _AsyncImpl):  # (a _SyncImpl too)
            detail = " (AsyncVectorEnv)"
        elif isinstance(self._impl, _SyncImpl):
            detail = " (SyncVectorEnv)"
        elif isinstance(self._impl, _EnvPoolImpl):
            detail = " (EnvPool)"
        spec = self._env_spec
        name = spec if isinstance(spec, str) else getattr(spec, "__qualname__", repr(spec))
        return f"VectorEnv({name!r}, num_envs={self.num_envs}, backend={self.backend!r}{detail})"

    @property
    def current_obs(self) -> npt.NDArray[Any]:
        """``[N, *obs_shape]`` (a copy): what each env acts on next, from the last reset, step or set_state.

        Raises:
            RuntimeError: before the first :meth:`reset`.
        """
        if self._obs is None:
            raise RuntimeError("VectorEnv has no observation yet; call reset() first")
        return self._obs.copy()

    def reset(self) -> npt.NDArray[Any]:
        """Resets every env and returns ``[N, *obs_shape]``; episodes in progress are dropped unrecorded.

        The first call seeds env ``i`` with ``derive_seed(seed, worker_index, i)``; later calls do not seed.
        """
        self._check_open()
        seeds = self._seeds if self._first_reset_pending else None
        self._obs = self._impl.reset(seeds)
        self._first_reset_pending = False
        self._returns[:] = 0.0
        self._lengths[:] = 0
        return self._obs.copy()

    def step(self, actions: npt.ArrayLike) -> VectorStep:
        """Steps every env once; a finished env is reset within this step.

        Args:
            actions: ``[N]`` integers for a Discrete action space, ``[N, *shape]`` for a Box.

        Returns:
            A :class:`VectorStep` of new arrays (later steps do not change them).

        Raises:
            ValueError: actions of the wrong shape, or a non-integer dtype or out-of-range value for a
                Discrete space.
            RuntimeError: before :meth:`reset`, or after :meth:`close`.
        """
        self._check_open()
        if self._obs is None:
            raise RuntimeError("VectorEnv.step() before reset(); call reset() first")
        acts = np.asarray(actions)
        if acts.shape != self._action_shape:
            raise ValueError(f"actions.shape={acts.shape}; expected {self._action_shape} (num_envs={self.num_envs} "
                             f"x the action space {self.action_space})")
        if self._action_range is not None:
            if acts.dtype.kind not in "iu":
                raise ValueError(f"actions.dtype={acts.dtype}; {self.action_space} needs integer actions "
                                 f"(cast with actions.astype(np.int64))")
            low, high = self._action_range
            listed = acts.tolist() if self.num_envs <= 64 else [int(acts.min()), int(acts.max())]  # ~0.3 vs 5 us
            if min(listed) < low or max(listed) >= high:
                raise ValueError(f"actions {acts.tolist()} fall outside {self.action_space} (valid: {low}..{high - 1})")
        else:
            acts = acts.astype(self.action_space.dtype, copy=False)
        obs, final, rewards, terminateds, truncateds, continues = self._impl.step(acts)
        self._returns += rewards
        self._lengths += 1
        episodes: list[EpisodeRecord] = []
        ended = np.flatnonzero(terminateds | truncateds).tolist()
        if continues:  # a lost life: the learning episode ended, the game (and its statistics) goes on
            ended = [i for i in ended if i not in continues]
        if ended:
            for i in ended:
                episodes.append(EpisodeRecord(env_index=i, episode_return=float(self._returns[i]),
                                              episode_length=int(self._lengths[i])))
            self._returns[ended] = 0.0
            self._lengths[ended] = 0
        self._obs = obs
        return VectorStep(obs=obs.copy(), final_obs=final, rewards=rewards, terminateds=terminateds,
                          truncateds=truncateds, episodes=episodes)

    def call(self, method: str, *args: Any) -> list[Any]:
        """``env.method(*args)`` on every env, in order, through any wrappers (gymnasium's ``get_wrapper_attr``):
        how MAML sets each worker's task (``call("set_task", task)``).

        Raises:
            ValueError: a backend whose envs are not gymnasium envs (the vectorised CartPole, EnvPool); or an env
                without ``method``, named.

        Examples:
            >>> env = VectorEnv("flowrl/PointGoal-v0", 2, seed=0, backend="loop")
            >>> env.call("set_task", [0.5, 0.5])
            [None, None]
            >>> [goal.tolist() for goal in env.call("get_task")]
            [[0.5, 0.5], [0.5, 0.5]]
        """
        self._check_open()
        if isinstance(self._impl, _AsyncImpl):  # (a _SyncImpl too) its envs live in other processes
            return list(self._impl.vec.call(method, *args))
        if isinstance(self._impl, _LoopImpl):
            envs: list[Any] = self._impl.envs
        elif isinstance(self._impl, _SyncImpl):
            envs = list(self._impl.vec.envs)
        else:
            raise ValueError(f"VectorEnv.call({method!r}): the {self.backend!r} backend does not run gymnasium envs "
                             f"whose methods can be called; use vector_backend='loop'")
        out = []
        for i, env in enumerate(envs):
            try:
                fn = env.get_wrapper_attr(method)
            except AttributeError:
                raise ValueError(f"VectorEnv.call: env {i} ({self._env_spec!r}) has no method {method!r}") from None
            out.append(fn(*args))
        return out

    def get_state(self) -> dict[str, Any]:
        """The envs' RNG and episode state plus the running episode returns and lengths, as plain data.

        Returns:
            A JSON-able dict (numbers, strings, lists, dicts) for :meth:`set_state`.

        Examples:
            >>> import json
            >>> a = VectorEnv("CartPole-v1", 2, seed=3, backend="loop")
            >>> _ = a.reset(); _ = a.step(np.array([0, 1]))
            >>> saved = json.loads(json.dumps(a.get_state()))
            >>> b = VectorEnv("CartPole-v1", 2, seed=99, backend="loop")
            >>> b.set_state(saved)
            >>> bool((b.current_obs == a.current_obs).all())
            True
            >>> bool((a.step(np.array([1, 1])).obs == b.step(np.array([1, 1])).obs).all())
            True
        """
        self._check_open()
        started = self._obs is not None
        return {"format": _STATE_FORMAT, "kind": self._impl.kind, "num_envs": self.num_envs, "started": started,
                "episode_returns": self._returns.tolist(), "episode_lengths": self._lengths.tolist(),
                "envs": self._impl.get_state() if started else None}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores a :meth:`get_state` result (also after a JSON round trip); the next :meth:`step`
        continues as the saved env would have, given the same actions.

        The observation to act on next is then :attr:`current_obs`. Per-env states restore into either
        per-env backend (the loop or SyncVectorEnv). An env whose episode cannot be replayed exactly (an
        env that is not deterministic given its ``np_random``, or an episode longer than
        ``MAX_REPLAY_STEPS``) starts a new episode from its saved generator state instead, with a
        ``RuntimeWarning``, and its running return and length restart at 0.

        Raises:
            ValueError: a state of another format, layout or number of envs, or a malformed one.
        """
        self._check_open()
        if not isinstance(state, Mapping) or state.get("format") != _STATE_FORMAT:
            got = state.get("format") if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"VectorEnv.set_state: state format {got!r}; expected {_STATE_FORMAT!r} (a dict "
                             f"saved by VectorEnv.get_state())")
        if state.get("kind") != self._impl.kind or state.get("num_envs") != self.num_envs:
            raise ValueError(f"VectorEnv.set_state: state of kind={state.get('kind')!r} with num_envs="
                             f"{state.get('num_envs')!r}, but {self!r} is kind={self._impl.kind!r} with "
                             f"num_envs={self.num_envs}; restore into the same env, num_envs and backend")
        try:
            returns = np.asarray(state["episode_returns"], dtype=np.float64)
            lengths = np.asarray(state["episode_lengths"], dtype=np.int64)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"VectorEnv.set_state: malformed episode_returns / episode_lengths ({err!r})") from err
        if returns.shape != (self.num_envs,) or lengths.shape != (self.num_envs,):
            raise ValueError(f"VectorEnv.set_state: episode_returns / episode_lengths need {self.num_envs} entries, "
                             f"got shapes {returns.shape} / {lengths.shape}")
        if not state.get("started"):
            self._obs, self._first_reset_pending = None, True
        else:
            self._obs, exact = self._impl.set_state(state.get("envs"))
            self._first_reset_pending = False
            restarted = [i for i, ok in enumerate(exact) if not ok]
            if restarted:
                returns[restarted], lengths[restarted] = 0.0, 0
                reason = getattr(self._impl, "cannot_replay", None)
                warnings.warn(f"VectorEnv.set_state: envs {restarted} could not replay their saved episode "
                              + (f"({reason}); they start new episodes" if reason else
                                 f"(not deterministic given np_random, or longer than MAX_REPLAY_STEPS="
                                 f"{MAX_REPLAY_STEPS}); they start new episodes from their saved RNG state"),
                              RuntimeWarning, stacklevel=2)
        self._returns[:], self._lengths[:] = returns, lengths

    def close(self) -> None:
        """Closes every env; idempotent."""
        if not self._closed:
            self._closed = True
            self._impl.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed; build a new VectorEnv")

    def __enter__(self) -> VectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
