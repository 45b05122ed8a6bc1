"""Making environments: :class:`EnvContext`, :data:`EnvSpec`, :func:`make_env`, :func:`derive_seed`,
and the :class:`EpisodeRecord` that a vector env emits for every finished episode.

Examples:
    >>> ctx = EnvContext(worker_index=1, env_index=0, seed=derive_seed(0, 1, 0))
    >>> env = make_env("CartPole-v1", ctx)
    >>> obs, info = env.reset(seed=ctx.seed)
    >>> obs.shape, env.action_space
    ((4,), Discrete(2))
    >>> make_env(lambda ctx: gymnasium.make("CartPole-v1", **ctx.config), ctx).spec.id
    'CartPole-v1'
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Union

import gymnasium
import numpy as np

from flowrl.validation import bounded, check_bounds, check_int

if TYPE_CHECKING:
    from flowrl.envs.multi_agent import MultiAgentEnv

__all__ = ["EnvContext", "EnvSpec", "EpisodeRecord", "GAME_CONTINUES", "make_env", "derive_seed", "check_seed"]


def check_seed(seed: object, name: str = "seed") -> int | None:
    """``seed`` as a plain ``int`` (or ``None``); a bool, a float or a negative number raises.

    Examples:
        >>> check_seed(np.int64(3)), check_seed(None)
        (3, None)

    Raises:
        ValueError: ``seed`` is not ``None`` or an int >= 0.
    """
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"{name}={seed!r} must be None or an int >= 0 (numpy's SeedSequence takes only "
                         f"non-negative integers); pass e.g. {name}=0")
    return int(seed)


@dataclass(frozen=True)
class EnvContext:
    """What an env callable is told about the env it builds.

    Attributes:
        worker_index: the rollout worker (0 for the local worker, 1..N for remote ones).
        env_index: the env's position inside that worker's vector.
        seed: the env's own seed, ``derive_seed(config_seed, worker_index, env_index)``; a vector env
            also passes it to the env's first ``reset()``. ``None`` means unseeded.
        config: the user's env config (for a gymnasium id: the keyword arguments of ``gymnasium.make``).

    Examples:
        >>> EnvContext(worker_index=2, env_index=1, seed=7, config={"max_episode_steps": 50}).config
        {'max_episode_steps': 50}
        >>> EnvContext(worker_index=-1)
        Traceback (most recent call last):
        ...
        ValueError: worker_index=-1 must be an int >= 0 (0 is the first worker)
    """

    worker_index: int = bounded(0, ge=0, meaning="0 is the first worker")
    env_index: int = bounded(0, ge=0, meaning="0 is the worker's first env")
    seed: int | None = None
    config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_bounds(self)
        check_seed(self.seed, "EnvContext.seed")
        if not isinstance(self.config, Mapping):
            raise TypeError(f"EnvContext.config={self.config!r} must be a mapping of env keyword arguments; "
                            f"pass a dict such as {{'max_episode_steps': 100}}")
        # A private copy, so a caller mutating its dict later cannot change a built env's context.
        object.__setattr__(self, "config", dict(self.config))


#: The info key by which an env says that the episode it just ended (terminated or truncated, for learning) goes
#: on, for its statistics, after the next reset: a :class:`flowrl.envs.VectorEnv` then keeps its return, length and
#: callbacks' episode running until an end without it. :class:`flowrl.envs.atari.LifeLoss` sets it on a lost life
#: that does not end the game, so the statistics report game scores.
GAME_CONTINUES = "game_continues"


EnvSpec = Union[str, Callable[[EnvContext], "gymnasium.Env[Any, Any]"], Callable[[EnvContext], "MultiAgentEnv"]]
"""A gymnasium id (``"CartPole-v1"``, or ``"module:Id-v0"`` to import ``module`` first) or a callable
``EnvContext -> gymnasium.Env``; a multi-agent config's env is a callable ``EnvContext -> MultiAgentEnv``."""


#: gymnasium namespaces that a package registers when it is imported: namespace -> (pip requirement, module).
#: An id in one of them (``"ALE/Pong-v5"``) imports the module first, as ``"ale_py:ALE/Pong-v5"`` would. (MinAtar
#: registers its ids only when asked: flowrl.envs.minatar asks.)
_NAMESPACE_PACKAGES: dict[str, tuple[str, str]] = {"ALE": ("ale-py", "ale_py"),
                                                   "MinAtar": ("minatar", "flowrl.envs.minatar")}


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _import_namespace(env_id: str) -> None:
    """Imports the package that registers ``env_id``'s namespace, if flowrl knows it and the id is not registered."""
    namespace = env_id.partition("/")[0] if "/" in env_id else None
    if env_id in gymnasium.registry or namespace not in _NAMESPACE_PACKAGES:
        return
    requirement, module = _NAMESPACE_PACKAGES[namespace]
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise ValueError(f"env id {env_id!r} needs the {requirement} package, which registers the {namespace} "
                         f"namespace, and {module} cannot be imported ({err}): pip install {requirement}") from err


def _check_registered(env_id: str) -> str:
    """``env_id`` without its ``module:`` prefix, once that module (or its namespace's package) is imported.

    Raises:
        ValueError: the module cannot be imported, or the id is not registered (gymnasium's reason, the
            closest registered ids and the fix).
    """
    module, sep, name = env_id.partition(":")
    if sep:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ValueError(f"env id {env_id!r}: cannot import module {module!r} ({err}); install it or drop "
                             f"the 'module:' prefix") from err
    else:
        name = env_id
    _import_namespace(name)
    if name not in gymnasium.registry:
        try:
            gymnasium.spec(name)  # raises with gymnasium's own hint (a close name, a missing namespace's package)
        except gymnasium.error.Error as err:
            raise _unknown_id(name, err) from err
    return name


def _unknown_id(name: str, err: Exception) -> ValueError:
    """An unknown id as one line: gymnasium's own reason (with its hint), the closest ids and the fix."""
    close = difflib.get_close_matches(name, list(gymnasium.registry), n=3, cutoff=0.6)
    hint = f"closest registered ids: {', '.join(repr(c) for c in close)}" if close else "no registered id is close"
    return ValueError(f"unknown gymnasium env id {name!r}: {_one_line(str(err))} ({hint}); pass a registered id "
                      f"(see gymnasium.registry.keys()), 'module:Id' to register one on import, or a callable "
                      f"EnvContext -> gymnasium.Env")


def _missing_dependency(env: object, err: gymnasium.error.DependencyNotInstalled) -> ValueError:
    """A missing optional dependency as one line: what is missing and, from gymnasium's message, the pip command."""
    reason = _one_line(str(err))
    if "pip install" not in reason:
        missing = err.__cause__.name if isinstance(err.__cause__, ModuleNotFoundError) else None
        reason += f"; install the package that provides the module {missing!r}" if missing else ""
    label = repr(env) if isinstance(env, str) else getattr(env, "__qualname__", repr(env))
    return ValueError(f"env {label} needs a package that is not installed: {reason}")


_UNEXPECTED_KEYWORD = re.compile(r"unexpected keyword argument '(\w+)'")


def _accepted_keywords(env_id: str) -> list[str] | None:
    """The keyword arguments the constructor of a registered id takes (``None``: any, or unknown)."""
    try:
        entry = gymnasium.registry[env_id].entry_point
        creator = gymnasium.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
        params = list(inspect.signature(creator).parameters.values()) if creator is not None else []
    except (AttributeError, ImportError, TypeError, ValueError, KeyError):  # a probe for the message only
        return None
    if not params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.name != "self" and p.kind is not inspect.Parameter.VAR_POSITIONAL]


def _rejected_keyword(env: object, ctx: EnvContext, err: TypeError) -> ValueError | None:
    """A ``TypeError`` about a keyword of the env config as one line naming the env, the keyword and what the env
    accepts; ``None`` when the error is about something else."""
    match = _UNEXPECTED_KEYWORD.search(str(err))
    if match is None or match.group(1) not in ctx.config:
        return None
    label = repr(env) if isinstance(env, str) else getattr(env, "__qualname__", repr(env))
    accepted = _accepted_keywords(env.partition(":")[2] or env) if isinstance(env, str) else None
    takes = (f"it takes {', '.join([*accepted, 'max_episode_steps', 'disable_env_checker'])}; "
             if accepted is not None else "")
    return ValueError(f"env {label} does not accept {match.group(1)} (env_config={dict(ctx.config)!r}); {takes}"
                      f"drop or rename it in env_config")


def make_env(env: EnvSpec, ctx: EnvContext) -> gymnasium.Env[Any, Any]:
    """Builds one env: ``gymnasium.make(env, **ctx.config)`` for an id, ``env(ctx)`` for a callable; an id of the
    ``ALE`` namespace comes with the standard Atari preprocessing (:mod:`flowrl.envs.atari`).

    Args:
        env: a gymnasium id or a callable ``EnvContext -> gymnasium.Env``.
        ctx: the worker / env indices, the env's seed and the env config.

    Returns:
        The env, not yet reset.

    Raises:
        ValueError: an unknown id (the message lists the closest registered ids and keeps gymnasium's hint),
            an env that needs an optional package which is not installed (the message gives the pip
            command, e.g. ``pip install "gymnasium[box2d]"`` or ``pip install ale-py``), or an env that does not
            accept a keyword of ``ctx.config`` (the message names the env and the keyword).
        TypeError: ``env`` is neither a string nor callable, the callable returned something that is not a
            ``gymnasium.Env``, or ``gymnasium.make`` rejected the config's keyword arguments otherwise.

    Examples:
        >>> make_env("CartPole-v1", EnvContext(config={"max_episode_steps": 5})).spec.max_episode_steps
        5
        >>> make_env("CartPol-v1", EnvContext())
        Traceback (most recent call last):
        ...
        ValueError: unknown gymnasium env id 'CartPol-v1': Environment `CartPol` doesn't exist. ...
        >>> make_env("CartPole-v1", EnvContext(config={"no_such_kw": 1}))
        Traceback (most recent call last):
        ...
        ValueError: env 'CartPole-v1' does not accept no_such_kw (env_config={'no_such_kw': 1}); it takes ...
    """
    if isinstance(env, str):
        name = _check_registered(env)
        try:
            if name.startswith("ALE/"):  # Atari: the papers' preprocessing (flowrl.envs.atari)
                from flowrl.envs.atari import make_atari

                return make_atari(name, ctx)
            return gymnasium.make(name, **ctx.config)
        except gymnasium.error.DependencyNotInstalled as err:
            raise _missing_dependency(env, err) from err
        except TypeError as err:
            rejected = _rejected_keyword(env, ctx, err)
            if rejected is not None:
                raise rejected from err
            raise TypeError(f"gymnasium.make({env!r}, **config) rejected the env config {dict(ctx.config)!r}: {err}; "
                            f"fix or drop the offending keys") from err
    if not callable(env):
        raise TypeError(f"env={env!r} must be a gymnasium id (str) or a callable EnvContext -> gymnasium.Env")
    try:
        made = env(ctx)
    except gymnasium.error.DependencyNotInstalled as err:
        raise _missing_dependency(env, err) from err
    except TypeError as err:
        rejected = _rejected_keyword(env, ctx, err)
        if rejected is None:
            raise
        raise rejected from err
    if not isinstance(made, gymnasium.Env):
        name = getattr(env, "__qualname__", repr(env))
        raise TypeError(f"env callable {name} returned {type(made).__name__} ({made!r:.80}), not a gymnasium.Env; "
                        f"return the env itself (e.g. gymnasium.make(...)), not a vector env, tuple or class")
    return made


def derive_seed(seed: int | None, worker_index: int, env_index: int) -> int | None:
    """The seed of env ``env_index`` on worker ``worker_index``, derived from one config ``seed``.

    It is the first 63 bits of ``numpy.random.SeedSequence(seed, spawn_key=(worker_index, env_index))``:
    the grandchild that ``SeedSequence(seed).spawn(...)`` would give at those positions, so the seeds
    of different workers and envs are statistically independent (unlike ``seed + i``), and the same for
    every run. ``None`` stays ``None`` (unseeded).

    Args:
        seed: the config seed (an int >= 0) or ``None``.
        worker_index: 0 for the local worker, 1..N for remote ones.
        env_index: the env's position in the worker's vector.

    Returns:
        An int in ``[0, 2**63)``, or ``None``.

    Raises:
        ValueError: a negative or non-integer seed or index.

    Examples:
        >>> derive_seed(0, 1, 2) == derive_seed(0, 1, 2) != derive_seed(0, 2, 1)
        True
        >>> child = np.random.SeedSequence(0).spawn(2)[1].spawn(3)[2]
        >>> derive_seed(0, 1, 2) == int(child.generate_state(1, np.uint64)[0]) >> 1
        True
        >>> derive_seed(None, 1, 2) is None
        True
    """
    checked = check_seed(seed)
    check_int("derive_seed worker_index", worker_index, 0, "0 is the first worker")
    check_int("derive_seed env_index", env_index, 0, "0 is the worker's first env")
    if checked is None:
        return None
    seq = np.random.SeedSequence(checked, spawn_key=(int(worker_index), int(env_index)))
    return int(seq.generate_state(1, np.uint64)[0]) >> 1


@dataclass(frozen=True)
class EpisodeRecord:
    """One finished episode, as a vector env reports it.

    Attributes:
        env_index: the env (inside its vector) that ran the episode.
        episode_return: the sum of the episode's rewards (all agents' rewards, for a multi-agent env).
        episode_length: env steps in the episode.
        agent_returns: agent id -> that agent's return; empty for a single-agent env.
        custom_metrics: user metrics for the episode (name -> value); empty by default.
        policy_returns: policy id -> the mean return of its agents in this episode (as RLlib's
            ``policy_reward_mean`` averages agent returns); the rollout worker fills it.

    Examples:
        >>> EpisodeRecord(env_index=0, episode_return=12.0, episode_length=12)
        EpisodeRecord(env_index=0, episode_return=12.0, episode_length=12, agent_returns={}, custom_metrics={}, policy_returns={})
    """

    env_index: int
    episode_return: float
    episode_length: int
    agent_returns: dict[str, float] = field(default_factory=dict)
    custom_metrics: dict[str, float] = field(default_factory=dict)
    policy_returns: dict[str, float] = field(default_factory=dict)
