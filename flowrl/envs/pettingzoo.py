"""A PettingZoo ``ParallelEnv`` as a flowrl :class:`~flowrl.envs.MultiAgentEnv`: :class:`PettingZooEnv`.

PettingZoo is an optional dependency (``pip install "flowrl[pettingzoo]"``): this module imports it only
when an env is wrapped, so ``import flowrl.envs`` works without it. Wrap a ``ParallelEnv`` instance with
``PettingZooEnv(env)``; give a :class:`~flowrl.config.RolloutConfig` the env callable
``PettingZooEnv.factory(make_env, **kwargs)``, so that every rollout worker builds its own copies.

Examples:
    >>> from pettingzoo.sisl import pursuit_v5
    >>> env = PettingZooEnv(pursuit_v5.parallel_env(n_pursuers=2, n_evaders=2, x_size=8, y_size=8,
    ...                                             obs_range=3, max_cycles=3))
    >>> env.agent_ids, env.observation_space("pursuer_0"), env.action_space("pursuer_0")
    (('pursuer_0', 'pursuer_1'), Box(0.0, 2.0, (3, 3, 3), float32), Discrete(5))
    >>> obs, infos = env.reset(seed=0)
    >>> for t in range(3):
    ...     obs, rewards, terminateds, truncateds, infos = env.step({aid: 4 for aid in obs})
    >>> truncateds, terminateds["__all__"]
    ({'pursuer_0': True, 'pursuer_1': True, '__all__': True}, False)
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any, Callable, Mapping

import gymnasium

from flowrl.envs.base import EnvContext, check_seed
from flowrl.envs.multi_agent import ALL, MultiAgentEnv, MultiAgentStepResult

if TYPE_CHECKING:
    from pettingzoo.utils.env import ParallelEnv

__all__ = ["PettingZooEnv"]

_INSTALL_HINT = 'pip install "flowrl[pettingzoo]"'


def _parallel_env_classes() -> tuple[type[Any], type[Any]]:
    """PettingZoo's ``(ParallelEnv, AECEnv)``, imported now; a missing PettingZoo names the fix."""
    try:
        from pettingzoo.utils.env import AECEnv, ParallelEnv
    except ImportError as err:
        raise ImportError(f"PettingZooEnv needs PettingZoo, an optional dependency of flowrl that is not "
                          f"installed ({err}); install it with: {_INSTALL_HINT}") from err
    return ParallelEnv, AECEnv


def _check_parallel_env(made: object, what: str) -> None:
    parallel_cls, aec_cls = _parallel_env_classes()
    if isinstance(made, parallel_cls):
        return
    if isinstance(made, aec_cls):
        raise ValueError(f"{what} is a PettingZoo AEC env ({type(made).__name__}), not a ParallelEnv; use the "
                         f"module's parallel_env (e.g. pursuit_v5.parallel_env) or convert it with "
                         f"pettingzoo.utils.conversions.aec_to_parallel(env)")
    if isinstance(made, gymnasium.Env):
        raise ValueError(f"{what} is a single-agent gymnasium env ({type(made).__name__}), not a PettingZoo "
                         f"ParallelEnv; pass it as RolloutConfig(env=...) without policies")
    raise ValueError(f"{what} is {type(made).__name__} ({made!r:.80}), not a PettingZoo ParallelEnv "
                     f"(pettingzoo.utils.env.ParallelEnv); return the env itself, e.g. pursuit_v5.parallel_env()")


class PettingZooEnv(MultiAgentEnv):
    """A PettingZoo ``ParallelEnv`` behind flowrl's multi-agent protocol.

    ``agent_ids`` is the env's ``possible_agents``; the spaces are the env's own. ``reset`` and ``step``
    pass through, with plain ``float`` rewards and ``bool`` flags, and these rules on top:

    - An agent leaves when it is terminated or truncated: it appears with its terminal observation (when the env
      gives one) in the step where it finishes, then never again, even if the env keeps reporting it.
    - The episode is over when no agent is left to act (PettingZoo's ``env.agents`` is empty, or holds only
      agents that finished). Then ``truncateds["__all__"]`` is true if any agent was truncated (the episode
      was cut short), else ``terminateds["__all__"]`` is, as in :class:`~flowrl.envs.MultiAgentCartPole`.
    - An agent that joins mid-episode (in ``env.agents`` after a step) acts from the next step on.

    The env is not checkpointable (``get_rng_state`` raises), because PettingZoo envs expose no common
    generator: a worker's ``get_state()`` names that.

    Args:
        env: a ``pettingzoo.utils.env.ParallelEnv`` (an AEC env goes through
            ``pettingzoo.utils.conversions.aec_to_parallel`` first) whose ``possible_agents`` are strings.

    Raises:
        ImportError: PettingZoo is not installed.
        ValueError: ``env`` is not a ``ParallelEnv``, or its ``possible_agents`` are missing, empty, not
            strings, repeated, or include ``"__all__"``.

    Examples:
        >>> from pettingzoo.sisl import pursuit_v5
        >>> PettingZooEnv(pursuit_v5.env())
        Traceback (most recent call last):
        ...
        ValueError: PettingZooEnv(env=...) is a PettingZoo AEC env (OrderEnforcingWrapper), not a ParallelEnv; ...
    """

    def __init__(self, env: ParallelEnv[Any, Any, Any]) -> None:
        _check_parallel_env(env, "PettingZooEnv(env=...)")
        self.env = env
        name = type(env).__name__
        try:
            possible = list(env.possible_agents)
        except AttributeError:
            raise ValueError(f"the ParallelEnv {name} has no possible_agents; flowrl builds one policy per agent "
                             f"group before sampling, so the env must list every agent it may produce") from None
        bad = [a for a in possible if not isinstance(a, str)]
        if bad:
            raise ValueError(f"the ParallelEnv {name} has agent ids {bad!r:.120} that are not strings; flowrl keys "
                             f"every per-agent dict and the policy mapping by str, so rename the agents (e.g. "
                             f"f'agent_{{i}}') in the env or a wrapper")
        if not possible or len(set(possible)) != len(possible) or ALL in possible:
            raise ValueError(f"the ParallelEnv {name} has possible_agents={possible!r:.120}; they must be one or "
                             f"more distinct ids other than {ALL!r}")
        self.agent_ids = tuple(possible)
        self._known = frozenset(possible)
        self._live: list[str] = []
        self._done: set[str] = set()
        self._any_truncated = False

    @classmethod
    def factory(cls, make_env: Callable[..., ParallelEnv[Any, Any, Any]],
                **kwargs: Any) -> Callable[[EnvContext], PettingZooEnv]:
        """An env callable for :class:`~flowrl.config.RolloutConfig`: ``ctx -> PettingZooEnv(make_env(...))``.

        Each env is built with ``make_env(**kwargs, **ctx.config)``: the keyword arguments given here plus
        the config's ``env_config`` (a key may be set in only one of the two). The callable pickles when
        ``make_env`` and ``kwargs`` do, so remote workers build their own envs. For PettingZoo's registry
        (1.27+), pass ``functools.partial(pettingzoo.make, "parallel", "pursuit_v5")``.

        Args:
            make_env: builds one ``ParallelEnv``, e.g. ``pursuit_v5.parallel_env``.
            **kwargs: keyword arguments for ``make_env``.

        Returns:
            A callable ``EnvContext -> PettingZooEnv``.

        Raises:
            ImportError: PettingZoo is not installed.
            ValueError: ``make_env`` is a module, an env instance, or not callable.

        Examples:
            >>> from flowrl.envs import MultiAgentVectorEnv
            >>> from pettingzoo.sisl import pursuit_v5
            >>> make = PettingZooEnv.factory(pursuit_v5.parallel_env, n_pursuers=3, n_evaders=2, x_size=8, y_size=8)
            >>> make
            PettingZooEnv.factory(...par_fn, n_pursuers=3, n_evaders=2, x_size=8, y_size=8)
            >>> vec = MultiAgentVectorEnv(make, 2, seed=0, config={"max_cycles": 5})
            >>> [sorted(obs) for obs in vec.reset()]
            [['pursuer_0', 'pursuer_1', 'pursuer_2'], ['pursuer_0', 'pursuer_1', 'pursuer_2']]
            >>> PettingZooEnv.factory(pursuit_v5)
            Traceback (most recent call last):
            ...
            ValueError: PettingZooEnv.factory: make_env is the module pettingzoo.sisl.pursuit_v5; pass the function that builds the env, e.g. pettingzoo.sisl.pursuit_v5.parallel_env
        """
        parallel_cls, _ = _parallel_env_classes()
        if isinstance(make_env, types.ModuleType):
            raise ValueError(f"PettingZooEnv.factory: make_env is the module {make_env.__name__}; pass the "
                             f"function that builds the env, e.g. {make_env.__name__}.parallel_env")
        if isinstance(make_env, parallel_cls):
            raise ValueError(f"PettingZooEnv.factory: make_env is an env instance ({type(make_env).__name__}); "
                             f"pass the function that builds it (e.g. pursuit_v5.parallel_env, not "
                             f"pursuit_v5.parallel_env()) so that every worker builds its own copy")
        if not callable(make_env):
            raise ValueError(f"PettingZooEnv.factory: make_env={make_env!r:.80} is not callable; pass the function "
                             f"that builds a ParallelEnv, e.g. pursuit_v5.parallel_env")
        return _PettingZooFactory(make_env, kwargs)

    def _check_agent(self, agent_id: str) -> None:
        if agent_id not in self._known:
            raise ValueError(f"unknown agent id {agent_id!r}; this {type(self.env).__name__} has "
                             f"{list(self.agent_ids)}")

    def observation_space(self, agent_id: str) -> gymnasium.Space[Any]:
        self._check_agent(agent_id)
        space: gymnasium.Space[Any] = self.env.observation_space(agent_id)
        return space

    def action_space(self, agent_id: str) -> gymnasium.Space[Any]:
        self._check_agent(agent_id)
        space: gymnasium.Space[Any] = self.env.action_space(agent_id)
        return space

    def _check_unknown(self, agents: set[str], where: str) -> None:
        unknown = agents - self._known
        if unknown:
            raise ValueError(f"{type(self.env).__name__}.{where} produced agents {sorted(map(repr, unknown))} that "
                             f"are not in its possible_agents {list(self.agent_ids)}; list every agent there")

    def reset(self, *, seed: int | None = None,
              options: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        checked = check_seed(seed)
        obs, infos = self.env.reset(seed=checked, options=None if options is None else dict(options))
        self._done, self._any_truncated = set(), False
        self._live = list(self.env.agents)
        self._check_unknown(set(obs) | set(self._live), "reset()")
        no_obs = [aid for aid in self._live if aid not in obs]
        if not self._live or no_obs:
            raise ValueError(f"{type(self.env).__name__}.reset() gave env.agents={self._live} and observations for "
                             f"{sorted(obs)}; an episode needs at least one agent, each with an observation")
        return ({aid: obs[aid] for aid in self._live},
                {aid: dict(infos.get(aid) or {}) for aid in self._live})

    def step(self, action_dict: Mapping[str, Any]) -> MultiAgentStepResult:
        name = type(self.env).__name__
        if not self._live:
            raise RuntimeError(f"PettingZooEnv({name}).step() after the episode ended (or before reset()); "
                               f"call reset()")
        extra = [aid for aid in action_dict if aid not in self._live]
        missing = [aid for aid in self._live if aid not in action_dict]
        if extra or missing:
            raise ValueError(f"PettingZooEnv({name}).step: actions for {sorted(action_dict)}, but the agents acting "
                             f"now are {self._live} (missing: {missing}; not acting — done or unknown: {extra}); "
                             f"pass one action for each agent in the last observations, less agents that finished")
        acted = list(self._live)
        obs, rewards, terms, truncs, infos = self.env.step(dict(action_dict))
        still_listed = [aid for aid in self.env.agents if aid not in self._done]
        self._check_unknown(set(obs) | set(still_listed), "step()")
        # Report the agents that acted and the ones that act next, never an agent that finished earlier.
        reported = acted + [aid for aid in still_listed if aid not in acted]
        terminateds = {aid: bool(terms.get(aid, False)) for aid in reported}
        truncateds = {aid: bool(truncs.get(aid, False)) for aid in reported}
        finished = [aid for aid in reported if terminateds[aid] or truncateds[aid]]
        vanished = [aid for aid in acted if aid not in still_listed and aid not in finished]
        if vanished:
            raise ValueError(f"{name}.step() removed agents {vanished} from env.agents without terminating or "
                             f"truncating them; PettingZoo envs must flag an agent as done when it leaves")
        self._done.update(finished)
        self._any_truncated |= any(truncateds[aid] and not terminateds[aid] for aid in finished)
        self._live = [aid for aid in still_listed if aid not in self._done]
        no_obs = [aid for aid in self._live if aid not in obs]
        if no_obs:
            raise ValueError(f"{name}.step() returned no observation for agents {no_obs} that are still in "
                             f"env.agents; every agent that acts next needs one")
        over = not self._live
        terminateds[ALL] = over and not self._any_truncated
        truncateds[ALL] = over and self._any_truncated
        return ({aid: obs[aid] for aid in reported if aid in obs},
                {aid: float(rewards.get(aid, 0.0)) for aid in reported},
                terminateds, truncateds,
                {aid: dict(infos.get(aid) or {}) for aid in reported})

    def close(self) -> None:
        self.env.close()

    def __repr__(self) -> str:
        return f"PettingZooEnv({type(self.env).__name__}, agents={list(self.agent_ids)})"


class _PettingZooFactory:
    """The picklable env callable that :meth:`PettingZooEnv.factory` returns."""

    def __init__(self, make_env: Callable[..., ParallelEnv[Any, Any, Any]], kwargs: dict[str, Any]) -> None:
        self.make_env, self.kwargs = make_env, dict(kwargs)
        self._label = getattr(make_env, "__qualname__", None) or repr(make_env)

    def __call__(self, ctx: EnvContext) -> PettingZooEnv:
        clash = sorted(set(self.kwargs) & set(ctx.config))
        if clash:
            raise ValueError(f"PettingZooEnv.factory({self._label}): keys {clash} are set both in the factory's "
                             f"keyword arguments and in env_config; set each in one place")
        made = self.make_env(**self.kwargs, **ctx.config)
        _check_parallel_env(made, f"PettingZooEnv.factory: what {self._label}(...) returned")
        return PettingZooEnv(made)

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.kwargs.items())
        return f"PettingZooEnv.factory({self._label}{args})"
