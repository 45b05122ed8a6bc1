"""Algorithms as plans: one file each, with a frozen config, a policy and ``plan(workers, config)``.

Each module ``flowrl/algorithms/<name>.py`` reads "what" before "how": its docstring (paper and dataflow),
the config, ``plan``, the state the trainer owns (``make_owned_state``), the policy, and last
``ALGORITHM = Algorithm(...)``; the registry maps a name to its module and imports it on first use, so
``flowrl.algorithms`` stays light. What several algorithms share lives in modules that register nothing
(:mod:`~flowrl.algorithms.actor_critic`, :mod:`~flowrl.algorithms.vtrace`).
:class:`flowrl.trainer.Trainer` (and the CLI) find algorithms here by name:
``Trainer("ppo", PPOConfig(...))``.

Examples:
    >>> sorted(ALGORITHMS)
    ['a2c', 'a3c', 'apex', 'apex_ddpg', 'appo', 'ars', 'bc', 'cql', 'cql_dqn', 'ddpg', 'ddppo', 'dqn', 'es', 'impala', 'maml', 'marwil', 'multiagent', 'pg', 'ppo', 'r2d2', 'sac', 'td3']
    >>> get_algorithm("dreamer")
    Traceback (most recent call last):
    ...
    ValueError: unknown algorithm 'dreamer'; flowrl has ['a2c', 'a3c', 'apex', 'apex_ddpg', 'appo', 'ars', 'bc', 'cql', 'cql_dqn', 'ddpg', 'ddppo', 'dqn', 'es', 'impala', 'maml', 'marwil', 'multiagent', 'pg', 'ppo', 'r2d2', 'sac', 'td3']
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from flowrl.config import TrainerConfig
    from flowrl.iter import LocalIterator
    from flowrl.policy import Policy
    from flowrl.workers import WorkerSet

__all__ = ["Algorithm", "ALGORITHMS", "get_algorithm"]

def _discover() -> dict[str, str]:
    """name -> module for every module in this package that assigns ``ALGORITHM`` at its top level, found by
    reading the source (nothing is imported): adding ``flowrl/algorithms/<name>.py`` registers ``<name>``."""
    found = {}
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if not path.stem.startswith("_") and re.search(r"^ALGORITHM\s*[:=]", path.read_text(), re.M):
            found[path.stem] = f"{__name__}.{path.stem}"
    return found


#: name -> module; each module defines ``ALGORITHM = Algorithm("<name>", ...)`` under its own file name.
ALGORITHMS: dict[str, str] = _discover()


@dataclass(frozen=True)
class Algorithm:
    """What the trainer needs to run an algorithm.

    Attributes:
        name: the registry name (``"ppo"``).
        config_class: its frozen config (a :class:`~flowrl.config.TrainerConfig` subclass).
        policy_class: the policy its workers run.
        plan: ``plan(workers, config, **trainer_owned_state) -> LocalIterator[dict]``.
        make_owned_state: ``config -> {name: state}``, what the trainer creates once and passes to every
            (re)built plan as keyword arguments, e.g.
            ``{"replay_buffer": LocalReplayBuffer(...)}``, so it outlives a plan rebuilt after a worker failure.
            Objects with ``get_state``/``set_state`` are checkpointed when the config
            sets ``store_buffer_in_checkpoints``. ``None``: nothing.
        worker_class: the training workers' class (``None``: :class:`~flowrl.workers.RolloutWorker`); ES and ARS
            run :class:`~flowrl.evolution.PerturbationWorker`. Evaluation workers are always rollout workers.
    """

    name: str
    config_class: type[TrainerConfig]
    policy_class: type[Policy]
    plan: Callable[..., LocalIterator[dict[str, Any]]]
    make_owned_state: Callable[[Any], dict[str, Any]] | None = None
    worker_class: type[Any] | None = None


def get_algorithm(name: str) -> Algorithm:
    """The registered algorithm ``name`` (case-insensitive)."""
    module = ALGORITHMS.get(name.lower()) if isinstance(name, str) else None
    if module is None:
        raise ValueError(f"unknown algorithm {name!r}; flowrl has {sorted(ALGORITHMS)}")
    algorithm = importlib.import_module(module).ALGORITHM
    if not isinstance(algorithm, Algorithm):
        raise TypeError(f"{module}.ALGORITHM must be an Algorithm(...), got {type(algorithm).__name__}")
    if algorithm.name != name.lower():
        raise ValueError(f"{module}.ALGORITHM is named {algorithm.name!r}; name it after its file: "
                         f"Algorithm({name.lower()!r}, ...)")
    return algorithm
