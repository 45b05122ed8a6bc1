"""Multi-agent envs: the dict-keyed :class:`MultiAgentEnv` protocol, :class:`MultiAgentCartPole`, the
validated agent -> policy map of :func:`make_policy_mapping` (from :mod:`flowrl.envs.policy_mapping`, re-exported
here), and :class:`MultiAgentVectorEnv`.

Every per-agent quantity is a dict keyed by agent id. ``step`` returns, for the agents that acted,
their next observations, rewards, ``terminateds`` and ``truncateds``; the last two also hold ``"__all__"``,
which ends the episode for everyone. An agent that finishes appears once more, with its terminal
observation in the step where it finishes, then never again; it takes no further actions
(:class:`MultiAgentVectorEnv` leaves it out of the ``obs`` to act on).

Examples:
    >>> env = MultiAgentCartPole(num_agents=2)
    >>> obs, infos = env.reset(seed=0)
    >>> sorted(obs), env.action_space("agent_0")
    (['agent_0', 'agent_1'], Discrete(2))
    >>> obs, rewards, terminateds, truncateds, infos = env.step({"agent_0": 1, "agent_1": 0})
    >>> rewards, terminateds["__all__"]
    ({'agent_0': 1.0, 'agent_1': 1.0}, False)
    >>> mapping = make_policy_mapping({"agent_0": "hunter", "agent_1": "prey"}, {"hunter", "prey"})
    >>> mapping("agent_1")
    'prey'
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Mapping, Sequence

import gymnasium
import numpy as np

from flowrl.envs._state import env_rng, load_env_rng, rng_state, to_plain
from flowrl.envs.base import EnvContext, EpisodeRecord, check_seed, derive_seed
from flowrl.envs.policy_mapping import PolicyMapping, make_policy_mapping
from flowrl.validation import check_int

__all__ = ["MultiAgentEnv", "MultiAgentCartPole", "MultiAgentVectorEnv", "MultiAgentStep", "MultiAgentVectorStep",
           "PolicyMapping", "make_policy_mapping", "ALL"]

ALL = "__all__"
"""The key in ``terminateds`` / ``truncateds`` that ends the episode for every agent."""

MultiAgentStepResult = tuple[dict[str, Any], dict[str, float], dict[str, bool], dict[str, bool],
                             dict[str, dict[str, Any]]]


class MultiAgentEnv(abc.ABC):
    """A multi-agent environment with every quantity keyed by agent id (RLlib's protocol, gymnasium 1.x style).

    Subclasses set :attr:`agent_ids` (every agent that may ever act) and implement :meth:`reset`,
    :meth:`step`, :meth:`observation_space` and :meth:`action_space`. ``step`` takes one action for each
    agent in the last observation dict; it returns ``(obs, rewards, terminateds, truncateds, infos)`` for
    the agents that acted, with ``"__all__"`` in ``terminateds`` and ``truncateds``: the episode is over
    when either is true. Implement :meth:`get_rng_state` / :meth:`set_rng_state` (plain data) to make the
    env checkpointable by :class:`MultiAgentVectorEnv`; the env must then be a deterministic function of
    its reset seed, its generator state and the actions.

    Attributes:
        agent_ids: every agent id the env can produce, in a stable order.
    """

    agent_ids: tuple[str, ...] = ()

    @abc.abstractmethod
    def reset(self, *, seed: int | None = None,
              options: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """Starts an episode; returns ``(obs, infos)`` for the agents that act first."""

    @abc.abstractmethod
    def step(self, action_dict: Mapping[str, Any]) -> MultiAgentStepResult:
        """Acts for the agents in ``action_dict``; returns ``(obs, rewards, terminateds, truncateds, infos)``."""

    @abc.abstractmethod
    def observation_space(self, agent_id: str) -> gymnasium.Space[Any]:
        """The observation space of one agent."""

    @abc.abstractmethod
    def action_space(self, agent_id: str) -> gymnasium.Space[Any]:
        """The action space of one agent."""

    def get_rng_state(self) -> Any:
        """The env's random state as plain data (override to make the env checkpointable)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement get_rng_state()/set_rng_state(); "
                                  f"implement both (plain data, e.g. generator.bit_generator.state) to save it")

    def set_rng_state(self, state: Any) -> None:
        """Loads a :meth:`get_rng_state` result."""
        raise NotImplementedError(f"{type(self).__name__} does not implement get_rng_state()/set_rng_state()")

    def close(self) -> None:
        """Releases the env's resources (nothing by default)."""


def _agent_seed(seed: int, agent_index: int) -> int:
    return int(np.random.SeedSequence(seed, spawn_key=(agent_index,)).generate_state(1, np.uint64)[0]) >> 1


class MultiAgentCartPole(MultiAgentEnv):
    """``num_agents`` independent CartPole-v1 envs, one per agent (``agent_0``, ``agent_1``, ...).

    ``reset(seed=s)`` seeds agent k's CartPole with a seed derived from ``(s, k)`` (a SeedSequence
    child); ``reset()`` lets each generator run on. An agent whose pole falls (terminated) or whose time
    runs out (truncated) stops appearing in the observations; the episode is over when every agent is
    done. Then ``truncateds["__all__"]`` is true if any agent was truncated (the episode was cut short),
    else ``terminateds["__all__"]`` is.

    Args:
        num_agents: agents (>= 1); or an :class:`EnvContext` / config mapping with the keys
            ``num_agents`` and ``max_episode_steps``, so that the class itself is an env callable:
            ``MultiAgentVectorEnv(MultiAgentCartPole, 4, config={"num_agents": 3})``.
        max_episode_steps: each agent's CartPole time limit.

    Examples:
        >>> env = MultiAgentCartPole(num_agents=2, max_episode_steps=3)
        >>> obs, _ = env.reset(seed=1)
        >>> for t in range(3):
        ...     obs, rew, term, trunc, _ = env.step({aid: t % 2 for aid in obs})
        >>> trunc, term["__all__"]
        ({'agent_0': True, 'agent_1': True, '__all__': True}, False)
    """

    def __init__(self, num_agents: int | EnvContext | Mapping[str, Any] = 2, *, max_episode_steps: int = 500) -> None:
        agents: Any = num_agents  # an int once checked
        if isinstance(num_agents, (EnvContext, Mapping)):
            config = num_agents.config if isinstance(num_agents, EnvContext) else num_agents
            unknown = set(config) - {"num_agents", "max_episode_steps"}
            if unknown:
                raise ValueError(f"MultiAgentCartPole config keys {sorted(unknown)} are unknown; it takes "
                                 f"'num_agents' and 'max_episode_steps'")
            agents = config.get("num_agents", 2)
            max_episode_steps = config.get("max_episode_steps", max_episode_steps)
        check_int("MultiAgentCartPole num_agents", agents, 1, "CartPoles stepped together, one per agent")
        check_int("MultiAgentCartPole max_episode_steps", max_episode_steps, 1, "steps before an agent's episode "
                  "is truncated")
        self.agent_ids = tuple(f"agent_{i}" for i in range(agents))
        self._envs = {aid: gymnasium.make("CartPole-v1", max_episode_steps=max_episode_steps)
                      for aid in self.agent_ids}
        self._live: list[str] = []
        self._any_truncated = False

    @classmethod
    def from_context(cls, ctx: EnvContext) -> MultiAgentCartPole:
        """Builds one from ``ctx.config`` (keys ``num_agents``, ``max_episode_steps``): an env callable.

        Examples:
            >>> MultiAgentCartPole.from_context(EnvContext(config={"num_agents": 3})).agent_ids
            ('agent_0', 'agent_1', 'agent_2')
        """
        return cls(ctx)

    def _check_agent(self, agent_id: str) -> None:
        if agent_id not in self._envs:
            raise ValueError(f"unknown agent id {agent_id!r}; this MultiAgentCartPole has {list(self.agent_ids)}")

    def observation_space(self, agent_id: str) -> gymnasium.Space[Any]:
        self._check_agent(agent_id)
        return self._envs[agent_id].observation_space

    def action_space(self, agent_id: str) -> gymnasium.Space[Any]:
        self._check_agent(agent_id)
        return self._envs[agent_id].action_space

    def reset(self, *, seed: int | None = None,
              options: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        checked = check_seed(seed)
        obs: dict[str, Any] = {}
        for k, (aid, env) in enumerate(self._envs.items()):
            obs[aid], _ = env.reset(seed=None if checked is None else _agent_seed(checked, k),
                                    options=None if options is None else dict(options))
        self._live, self._any_truncated = list(self.agent_ids), False
        return obs, {aid: {} for aid in obs}

    def step(self, action_dict: Mapping[str, Any]) -> MultiAgentStepResult:
        if not self._live:
            raise RuntimeError("MultiAgentCartPole.step() after the episode ended (or before reset()); call reset()")
        extra = [aid for aid in action_dict if aid not in self._live]
        missing = [aid for aid in self._live if aid not in action_dict]
        if extra or missing:
            raise ValueError(f"MultiAgentCartPole.step: actions for {sorted(action_dict)}, but the agents acting now "
                             f"are {self._live} (missing: {missing}; not acting — done or unknown: {extra}); pass one "
                             f"action for each agent still acting (the last observations, less agents that "
                             f"just finished)")
        obs: dict[str, Any] = {}
        rewards: dict[str, float] = {}
        terminateds: dict[str, bool] = {}
        truncateds: dict[str, bool] = {}
        infos: dict[str, dict[str, Any]] = {}
        for aid in self._live:
            obs[aid], reward, terminateds[aid], truncateds[aid], infos[aid] = self._envs[aid].step(action_dict[aid])
            rewards[aid] = float(reward)
            self._any_truncated |= truncateds[aid] and not terminateds[aid]
        self._live = [aid for aid in self._live if not (terminateds[aid] or truncateds[aid])]
        over = not self._live
        truncateds[ALL] = over and self._any_truncated
        terminateds[ALL] = over and not self._any_truncated
        return obs, rewards, terminateds, truncateds, infos

    def get_rng_state(self) -> Any:
        return {aid: rng_state(env_rng(env)) for aid, env in self._envs.items()}

    def set_rng_state(self, state: Any) -> None:
        if not isinstance(state, Mapping) or set(state) != set(self._envs):
            raise ValueError(f"MultiAgentCartPole.set_rng_state: expected a dict of {list(self.agent_ids)} RNG "
                             f"states, got {state!r:.120}")
        for aid, env in self._envs.items():
            load_env_rng(env, state[aid], f"MultiAgentCartPole.set_rng_state: {aid}")

    def close(self) -> None:
        for env in self._envs.values():
            env.close()


@dataclass(frozen=True)
class MultiAgentStep:
    """One env's part of a :meth:`MultiAgentVectorEnv.step`, which returns one per env; dicts keyed by agent id.

    The agents that acted are the keys of ``rewards`` (for envs that reward only the agents that act).
    Agent ``a``'s transition is ``(its previous obs, its action, rewards[a], terminateds[a], truncateds[a],
    final_obs[a])``; an agent absent from ``final_obs`` (a turn-based env that observes it later) has no
    next observation yet.

    Attributes:
        obs: the observations of the agents that act next: the agents that finished at this step are left
            out, and where the episode ended these are the reset observations of the next episode.
        final_obs: the observations the env returned at this step (the true next observations, terminal
            ones included); equal to ``obs`` unless an agent or the whole episode finished.
        rewards: agent id -> reward.
        terminateds: agent id -> terminated, for the agents the env reported, plus ``"__all__"``.
        truncateds: agent id -> truncated, for the agents the env reported, plus ``"__all__"``.
        infos: agent id -> info dict, as the env returned them.
        episodes: the episode that ended at this step (at most one), with per-agent returns in
            ``agent_returns``; empty while it runs.
    """

    obs: dict[str, Any]
    final_obs: dict[str, Any]
    rewards: dict[str, float]
    terminateds: dict[str, bool]
    truncateds: dict[str, bool]
    infos: dict[str, Any]
    episodes: list[EpisodeRecord]

    @property
    def episode_ended(self) -> bool:
        """Whether the episode ended at this step (``obs`` then holds the next episode's reset observations)."""
        return bool(self.episodes)


class MultiAgentVectorStep(list[MultiAgentStep]):
    """What :meth:`MultiAgentVectorEnv.step` returns: a list with one :class:`MultiAgentStep` per env, which
    also offers each field across envs (``step.rewards[i]`` is ``step[i].rewards``).

    Examples:
        >>> env = MultiAgentVectorEnv(MultiAgentCartPole, 2, seed=0)
        >>> step = env.step([{aid: 0 for aid in o} for o in env.reset()])
        >>> step[1].rewards == step.rewards[1], len(step), step.episodes
        (True, 2, [])
    """

    @cached_property
    def obs(self) -> list[dict[str, Any]]:
        """Per env, :attr:`MultiAgentStep.obs`."""
        return [s.obs for s in self]

    @cached_property
    def final_obs(self) -> list[dict[str, Any]]:
        """Per env, :attr:`MultiAgentStep.final_obs`."""
        return [s.final_obs for s in self]

    @cached_property
    def rewards(self) -> list[dict[str, float]]:
        """Per env, :attr:`MultiAgentStep.rewards`."""
        return [s.rewards for s in self]

    @cached_property
    def terminateds(self) -> list[dict[str, bool]]:
        """Per env, :attr:`MultiAgentStep.terminateds` (with ``"__all__"``)."""
        return [s.terminateds for s in self]

    @cached_property
    def truncateds(self) -> list[dict[str, bool]]:
        """Per env, :attr:`MultiAgentStep.truncateds` (with ``"__all__"``)."""
        return [s.truncateds for s in self]

    @cached_property
    def episodes(self) -> list[EpisodeRecord]:
        """The episodes that ended at this step, in env order."""
        return [e for s in self for e in s.episodes]


def _acting(obs: Mapping[str, Any], terminateds: Mapping[str, Any], truncateds: Mapping[str, Any]) -> dict[str, Any]:
    """The observations of the agents that did not just finish (those act next)."""
    return {aid: o for aid, o in obs.items() if not (terminateds.get(aid) or truncateds.get(aid))}


_MA_STATE_FORMAT = "flowrl.envs.MultiAgentVectorEnv/1"


class MultiAgentVectorEnv:
    """N multi-agent envs in a Python loop, with same-step autoreset and plain-data state.

    Env ``i`` is ``env(EnvContext(worker_index, i, derive_seed(seed, worker_index, i), config))``; the
    first :meth:`reset` seeds it with that seed, later resets are unseeded. :meth:`get_state` records,
    per env, how the episode in progress started and the actions since (plus the env's
    ``get_rng_state()``); :meth:`set_state` replays that episode.

    Args:
        env: a callable ``EnvContext -> MultiAgentEnv``.
        num_envs: N >= 1.
        seed: the config seed (an int >= 0) or ``None``.
        worker_index: the owning worker's index.
        config: handed to the callable as ``ctx.config``.

    Raises:
        ValueError: ``num_envs < 1`` or a bad seed.
        TypeError: the callable did not return a :class:`MultiAgentEnv`.

    Examples:
        >>> env = MultiAgentVectorEnv(MultiAgentCartPole, 2, seed=0, config={"num_agents": 2})
        >>> obs = env.reset()
        >>> len(obs), sorted(obs[0])
        (2, ['agent_0', 'agent_1'])
        >>> steps = env.step([{aid: 1 for aid in o} for o in obs])
        >>> steps[0].rewards, steps[0].terminateds, steps[0].episodes
        ({'agent_0': 1.0, 'agent_1': 1.0}, {'agent_0': False, 'agent_1': False, '__all__': False}, [])
        >>> returns = []
        >>> for _ in range(40):  # always pushing right, every pole falls within ~10 steps
        ...     steps = env.step([{aid: 1 for aid in s.obs} for s in steps])
        ...     returns += [ep.agent_returns for s in steps for ep in s.episodes]
        >>> len(returns) >= 4, sorted(returns[0])
        (True, ['agent_0', 'agent_1'])
    """

    def __init__(self, env: Callable[[EnvContext], MultiAgentEnv], num_envs: int, *, seed: int | None = None,
                 worker_index: int = 0, config: Mapping[str, Any] | None = None) -> None:
        check_int("num_envs", num_envs, 1, "envs stepped together by one worker")
        if not callable(env):
            raise TypeError(f"env={env!r} must be a callable EnvContext -> MultiAgentEnv")
        self.seed = check_seed(seed)
        self.num_envs, self.worker_index = num_envs, worker_index
        self.config: dict[str, Any] = dict(config or {})
        contexts = [EnvContext(worker_index=worker_index, env_index=i, seed=derive_seed(self.seed, worker_index, i),
                               config=self.config) for i in range(num_envs)]
        self.envs: list[MultiAgentEnv] = []
        for ctx in contexts:
            made = env(ctx)
            if not isinstance(made, MultiAgentEnv):
                raise TypeError(f"env callable {getattr(env, '__qualname__', env)!r} returned {type(made).__name__}, "
                                f"not a flowrl.envs.MultiAgentEnv; subclass MultiAgentEnv (a single-agent "
                                f"gymnasium env goes in VectorEnv)")
            self.envs.append(made)
        self._seeds = [ctx.seed for ctx in contexts]
        self._first_reset_pending = True
        self._obs: list[dict[str, Any]] | None = None
        self._returns = [0.0] * num_envs
        self._lengths = [0] * num_envs
        self._agent_returns: list[dict[str, float]] = [{} for _ in range(num_envs)]
        self._starts: list[dict[str, Any] | None] = [None] * num_envs
        self._actions: list[list[dict[str, Any]]] = [[] for _ in range(num_envs)]

    def __repr__(self) -> str:
        return f"MultiAgentVectorEnv({type(self.envs[0]).__name__}, num_envs={self.num_envs})"

    @property
    def current_obs(self) -> list[dict[str, Any]]:
        """Per env, the observations of the agents that act next."""
        if self._obs is None:
            raise RuntimeError("MultiAgentVectorEnv has no observation yet; call reset() first")
        return [dict(o) for o in self._obs]

    def _reset_env(self, i: int, seed: int | None) -> dict[str, Any]:
        env = self.envs[i]
        if seed is not None:
            self._starts[i] = {"seed": seed}
        else:
            try:
                self._starts[i] = {"rng": to_plain(env.get_rng_state())}
            except NotImplementedError:
                self._starts[i] = None  # not checkpointable; get_state() says so
        self._actions[i] = []
        obs, _ = env.reset(seed=seed)
        return obs

    def reset(self) -> list[dict[str, Any]]:
        """Resets every env; returns per env the first observations. The first call seeds the envs."""
        seeds = self._seeds if self._first_reset_pending else [None] * self.num_envs
        self._obs = [self._reset_env(i, s) for i, s in enumerate(seeds)]
        self._first_reset_pending = False
        self._returns, self._lengths = [0.0] * self.num_envs, [0] * self.num_envs
        self._agent_returns = [{} for _ in range(self.num_envs)]
        return self.current_obs

    def step(self, actions: Sequence[Mapping[str, Any]]) -> MultiAgentVectorStep:
        """Steps every env with its action dict; an env whose episode ended is reset within this step.

        Args:
            actions: one dict per env, agent id -> action, for the agents in that env's last ``obs``.

        Returns:
            A :class:`MultiAgentVectorStep`: the list of each env's :class:`MultiAgentStep`.

        Raises:
            ValueError: not one action dict per env, or an env that omits ``"__all__"``.
            RuntimeError: before :meth:`reset`.
        """
        if self._obs is None:
            raise RuntimeError("MultiAgentVectorEnv.step() before reset(); call reset() first")
        if len(actions) != self.num_envs:
            raise ValueError(f"got {len(actions)} action dicts; expected one per env ({self.num_envs})")
        out = MultiAgentVectorStep()
        next_obs: list[dict[str, Any]] = []
        for i, (env, action_dict) in enumerate(zip(self.envs, actions)):
            self._actions[i].append({k: np.array(v) if isinstance(v, np.ndarray) else v
                                     for k, v in action_dict.items()})
            obs, rewards, terminateds, truncateds, infos = env.step(action_dict)
            if ALL not in terminateds or ALL not in truncateds:
                raise ValueError(f"{type(env).__name__}.step() must put {ALL!r} in terminateds and truncateds; got "
                                 f"{sorted(terminateds)} / {sorted(truncateds)}")
            rewards = {aid: float(r) for aid, r in rewards.items()}
            self._lengths[i] += 1
            for aid, r in rewards.items():
                self._returns[i] += r
                self._agent_returns[i][aid] = self._agent_returns[i].get(aid, 0.0) + r
            episodes: list[EpisodeRecord] = []
            if terminateds[ALL] or truncateds[ALL]:
                episodes.append(EpisodeRecord(env_index=i, episode_return=self._returns[i],
                                              episode_length=self._lengths[i], agent_returns=self._agent_returns[i]))
                self._returns[i], self._lengths[i], self._agent_returns[i] = 0.0, 0, {}
                acting = self._reset_env(i, None)
            else:
                acting = _acting(obs, terminateds, truncateds)
            next_obs.append(acting)
            out.append(MultiAgentStep(
                obs=dict(acting), final_obs=dict(obs), rewards=rewards,
                terminateds={aid: bool(v) for aid, v in terminateds.items()},
                truncateds={aid: bool(v) for aid, v in truncateds.items()},
                infos=dict(infos), episodes=episodes))
        self._obs = next_obs
        return out

    def get_state(self) -> dict[str, Any]:
        """Plain-data state: per env the episode's start, its actions and the RNG; returns and lengths.

        Raises:
            TypeError: an env that does not implement ``get_rng_state()`` / ``set_rng_state()``.
        """
        started = self._obs is not None
        envs: list[dict[str, Any]] | None = None
        if started:
            envs = []
            for i, env in enumerate(self.envs):
                try:
                    rng = to_plain(env.get_rng_state())
                except NotImplementedError as err:
                    raise TypeError(f"MultiAgentVectorEnv.get_state: {err}") from None
                envs.append({"episode_start": self._starts[i], "episode_actions": to_plain(self._actions[i]),
                             "rng": rng})
        return {"format": _MA_STATE_FORMAT, "num_envs": self.num_envs, "started": started,
                "episode_returns": list(self._returns), "episode_lengths": list(self._lengths),
                "agent_returns": [dict(a) for a in self._agent_returns], "envs": envs}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores a :meth:`get_state` result by replaying each env's episode in progress.

        Raises:
            ValueError: a state of another format or size, or an episode that does not replay.
        """
        if not isinstance(state, Mapping) or state.get("format") != _MA_STATE_FORMAT \
                or state.get("num_envs") != self.num_envs:
            raise ValueError(f"MultiAgentVectorEnv.set_state: expected a {_MA_STATE_FORMAT!r} state of num_envs="
                             f"{self.num_envs} saved by get_state(), got {state!r:.160}")
        try:
            returns = [float(x) for x in state["episode_returns"]]
            lengths = [int(x) for x in state["episode_lengths"]]
            agent_returns = [{str(k): float(v) for k, v in a.items()} for a in state["agent_returns"]]
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"MultiAgentVectorEnv.set_state: malformed state ({err!r})") from err
        if not state.get("started"):
            self._obs, self._first_reset_pending = None, True
        else:
            env_states = state.get("envs")
            if not isinstance(env_states, list) or len(env_states) != self.num_envs:
                raise ValueError(f"MultiAgentVectorEnv.set_state: state['envs'] must list {self.num_envs} env states")
            self._obs = [self._replay(i, s) for i, s in enumerate(env_states)]
            self._first_reset_pending = False
        self._returns, self._lengths, self._agent_returns = returns, lengths, agent_returns

    def _replay(self, i: int, env_state: Mapping[str, Any]) -> dict[str, Any]:
        env, what = self.envs[i], f"MultiAgentVectorEnv.set_state: env {i}"
        start = env_state.get("episode_start")
        if not isinstance(start, Mapping) or not ({"seed", "rng"} & set(start)):
            raise ValueError(f"{what}: episode_start={start!r:.120} must hold 'seed' or 'rng'")
        if "seed" in start:
            obs = self._reset_env(i, int(start["seed"]))
        else:
            env.set_rng_state(start["rng"])
            obs = self._reset_env(i, None)
        for t, action_dict in enumerate(env_state.get("episode_actions", [])):
            typed = {aid: self._typed_action(env, aid, a) for aid, a in action_dict.items()}
            self._actions[i].append(typed)
            obs, _, terminateds, truncateds, _ = env.step(typed)
            obs = _acting(obs, terminateds, truncateds)
            if terminateds.get(ALL) or truncateds.get(ALL):
                raise ValueError(f"{what}: replaying the saved episode ended it at action {t + 1}; the env is not a "
                                 f"deterministic function of its seed, RNG state and actions")
        env.set_rng_state(env_state["rng"])
        return obs

    @staticmethod
    def _typed_action(env: MultiAgentEnv, agent_id: str, action: Any) -> Any:
        space = env.action_space(agent_id)
        if isinstance(space, gymnasium.spaces.Box):
            return np.asarray(action, dtype=space.dtype)
        return action

    def close(self) -> None:
        """Closes every env."""
        for env in self.envs:
            env.close()
