"""Hyperparameter sweeps with Ray Tune: a flowrl :class:`~flowrl.trainer.Trainer` as a Tune ``Trainable``.

:func:`trainable` makes the Trainable of an algorithm and a base config. Each trial's config (Tune's
``param_space``) holds dotted config keys, as ``flowrl train --config`` spells them, with plain values or Tune's
search spaces; the trial trains ``Trainer(algorithm, base + its keys)``. ``step()`` is one ``Trainer.train()``,
Tune's checkpoints hold a flowrl checkpoint (the plain-data format of ``Trainer.save``) and restoring one loads it
back into the trial's trainer: weights, optimizer, counters and the episode window, so a trial resumed by
``Tuner.restore`` goes on where it stopped instead of training again from scratch.

A trial asks Ray for what its trainer will use: one CPU (and ``num_gpus``) for the learner, and one bundle per
remote rollout and evaluation worker (``num_cpus_per_worker``, ``num_gpus_per_worker``), so Tune runs as many trials
at once as the cluster holds.

:func:`parse_search` reads the command line's ``--search "lr=loguniform(1e-4,1e-2)"``, checking every bound and
choice against the config before any trial starts.

Example::

    from ray import tune
    from flowrl.algorithms.ppo import PPOConfig
    import flowrl.tune

    tuner = tune.Tuner(
        flowrl.tune.trainable("ppo", PPOConfig(env="CartPole-v1", num_workers=0)),
        param_space={"lr": tune.loguniform(1e-4, 1e-2), "model.hidden_sizes": tune.choice([(32,), (64, 64)])},
        tune_config=tune.TuneConfig(metric="episode_reward_mean", mode="max", num_samples=4),
        run_config=tune.RunConfig(stop={"training_iteration": 10}, storage_path="/abs/path/sweeps"),
    )
    results = tuner.fit()
"""

from __future__ import annotations

import ast
import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ray import tune

from flowrl._checkpoint import find_checkpoint
from flowrl._cli_config import build_config, config_items
from flowrl.algorithms import Algorithm, get_algorithm
from flowrl.config import TrainerConfig, config_to_data
from flowrl.trainer import Trainer

__all__ = ["FlowrlTrainable", "trainable", "trial_config", "parse_search", "SEARCH_FUNCTIONS"]

#: the search expressions ``--search KEY=EXPR`` knows, with the arguments each takes
SEARCH_FUNCTIONS: dict[str, str] = {
    "uniform": "(low, high)",
    "loguniform": "(low, high), low > 0",
    "quniform": "(low, high, q)",
    "randint": "(low, high), high excluded",
    "lograndint": "(low, high), low > 0, high excluded",
    "choice": "(value, value, ...)",
    "grid": "(value, value, ...): every value, in every sample",
}


class FlowrlTrainable(tune.Trainable):
    """A Tune Trainable that trains one flowrl :class:`~flowrl.trainer.Trainer`; made by :func:`trainable`.

    Its Tune config maps dotted config keys (``"lr"``, ``"model.hidden_sizes"``) to values that replace the base
    config's. Subclasses made by :func:`trainable` set :attr:`algorithm` and :attr:`base_config`.
    """

    algorithm: Algorithm
    base_config: TrainerConfig
    trainer: Trainer

    def setup(self, config: dict[str, Any]) -> None:
        # Ray's storage says "Checkpoint successfully created at ..." at INFO for every checkpoint of every trial
        logging.getLogger("ray.train._internal.storage").setLevel(logging.WARNING)
        self.trainer = Trainer(self.algorithm, trial_config(self.algorithm, self.base_config, config))

    def step(self) -> dict[str, Any]:
        return self.trainer.train()

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        self.trainer.save(checkpoint_dir)

    def load_checkpoint(self, checkpoint: str | dict[str, Any] | None) -> None:
        if not isinstance(checkpoint, str):
            raise TypeError(f"a flowrl trial restores from a checkpoint directory, got {type(checkpoint).__name__}")
        self.trainer.restore(find_checkpoint(checkpoint))

    def cleanup(self) -> None:
        if getattr(self, "trainer", None) is not None:
            self.trainer.stop()

    @classmethod
    def default_resource_request(cls, config: dict[str, Any]) -> tune.PlacementGroupFactory:
        """One bundle for the learner (1 CPU, ``num_gpus``) and one per remote rollout and evaluation worker."""
        trial = trial_config(cls.algorithm, cls.base_config, config)
        learner = {"CPU": 1.0, **({"GPU": float(trial.num_gpus)} if trial.num_gpus and not trial.fake_gpus else {})}
        worker = {k: float(v) for k, v in (("CPU", trial.num_cpus_per_worker), ("GPU", trial.num_gpus_per_worker))
                  if v}
        remote = 0 if trial.executor == "local" else trial.num_workers + trial.evaluation_num_workers
        return tune.PlacementGroupFactory([learner] + ([worker] * remote if worker else []))


def trainable(algorithm: str | Algorithm, config: TrainerConfig | None = None) -> type[FlowrlTrainable]:
    """The Tune Trainable training ``algorithm`` from ``config`` (``None``: the algorithm's defaults), each trial
    with its Tune config's dotted keys replaced (see :func:`trial_config`).

    Raises:
        ValueError: an unknown algorithm.
        TypeError: a config of another class than the algorithm's.

    Examples:
        >>> from flowrl.algorithms.ppo import PPOConfig
        >>> PPOTrainable = trainable("ppo", PPOConfig(num_workers=0))
        >>> PPOTrainable.__name__, PPOTrainable.base_config.num_workers
        ('PPO', 0)
        >>> PPOTrainable.default_resource_request({"num_workers": 2}).bundles
        [{'CPU': 1.0}, {'CPU': 1.0}, {'CPU': 1.0}]
    """
    algo = algorithm if isinstance(algorithm, Algorithm) else get_algorithm(algorithm)
    base = algo.config_class() if config is None else config
    if not isinstance(base, algo.config_class):
        raise TypeError(f"trainable({algo.name!r}) needs a {algo.config_class.__name__}, got {type(base).__name__}")
    name = algo.name.upper() if algo.name.isalnum() else algo.config_class.__name__.removesuffix("Config")
    return type(name, (FlowrlTrainable,), {"algorithm": algo, "base_config": base, "__module__": __name__})


def trial_config(algorithm: Algorithm, base: TrainerConfig, values: Mapping[str, Any]) -> TrainerConfig:
    """``base`` with the dotted keys of ``values`` replaced, each value checked as ``--config`` checks it.

    Raises:
        ValueError: an unknown key, a value of the wrong type or one the config rejects (naming the key).

    Examples:
        >>> from flowrl.algorithms.ppo import PPOConfig
        >>> ppo = get_algorithm("ppo")
        >>> trial_config(ppo, PPOConfig(), {"lr": 0.001, "model.hidden_sizes": [32, 32]}).model.hidden_sizes
        (32, 32)
        >>> trial_config(ppo, PPOConfig(), {"lr": -1.0})
        Traceback (most recent call last):
        ...
        ValueError: PPOConfig rejects lr=-1.0: lr=-1.0 must be a number > 0
    """
    if not values:
        return base
    config: TrainerConfig = build_config(algorithm.config_class, config_items(values), base=base)
    return config


# -- the command line's --search --------------------------------------------------------------------

def _spelled(value: Any) -> str:
    return json.dumps(list(value)) if isinstance(value, tuple) else str(value)


def parse_search(algorithm: Algorithm, base: TrainerConfig, items: Sequence[str]) -> dict[str, Any]:
    """Tune's ``param_space`` for ``--search KEY=EXPR`` items, e.g. ``lr=loguniform(1e-4,1e-2)``.

    ``EXPR`` is one of :data:`SEARCH_FUNCTIONS` with literal arguments. Every bound and choice is checked against
    the config (the key exists, the value has its type and the config accepts it) before any trial starts.

    Raises:
        ValueError: a malformed item, an unknown function, wrong arguments, a key given twice or a value the
            config rejects; the message names the item and shows a correct one.

    Examples:
        >>> from flowrl.algorithms.ppo import PPOConfig
        >>> space = parse_search(get_algorithm("ppo"), PPOConfig(), ["lr=loguniform(1e-4, 1e-2)",
        ...                                                          "num_sgd_iter=choice(5, 10)"])
        >>> sorted(space), type(space["lr"]).__name__
        (['lr', 'num_sgd_iter'], 'Float')
        >>> parse_search(get_algorithm("ppo"), PPOConfig(), ["lr=loguniform(0, 1e-2)"])
        Traceback (most recent call last):
        ...
        ValueError: --search 'lr=loguniform(0, 1e-2)': loguniform needs 0 < low < high, got low=0 and high=0.01; e.g. lr=loguniform(1e-4,1e-2)
    """
    space: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        example = f"e.g. {key or 'lr'}=loguniform(1e-4,1e-2)"
        if not sep or not key:
            raise ValueError(f"--search {item!r} is not KEY=EXPR; {example}")
        if key in space:
            raise ValueError(f"--search {item!r}: {key} is searched twice; keep one")
        function, args = _parse_call(item, text, example)
        candidates = _check_arguments(item, function, args, example)

        for value in candidates:  # every bound and choice must make a valid config
            try:
                trial_config(algorithm, base, {key: value})
            except ValueError as e:
                raise ValueError(f"--search {item!r}: {e}") from None
        space[key] = _domain(function, args)
    return space


def _parse_call(item: str, text: str, example: str) -> tuple[str, list[Any]]:
    known = ", ".join(f"{name}{args}" for name, args in SEARCH_FUNCTIONS.items())
    try:
        call = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        call = None
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.keywords:
        raise ValueError(f"--search {item!r}: {text.strip()!r} is not FUNCTION(ARGS); {example} (functions: {known})")
    function = call.func.id
    if function not in SEARCH_FUNCTIONS:
        raise ValueError(f"--search {item!r}: unknown search function {function!r}; one of: {known}")
    try:
        args = [ast.literal_eval(arg) for arg in call.args]
    except ValueError:
        raise ValueError(f"--search {item!r}: {function}'s arguments must be literal numbers, strings or lists; "
                         f"{example}") from None
    return function, args


def _check_arguments(item: str, function: str, args: list[Any], example: str) -> list[Any]:
    """The values to check against the config: the bounds of a range, every value of a choice or grid."""
    if function in ("choice", "grid"):
        if not args:
            raise ValueError(f"--search {item!r}: {function} needs at least one value, e.g. num_sgd_iter={function}(5,10)")
        return [tuple(a) if isinstance(a, list) else a for a in args]
    wanted = 3 if function == "quniform" else 2
    if len(args) != wanted or not all(isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a)
                                      for a in args):
        raise ValueError(f"--search {item!r}: {function} takes {SEARCH_FUNCTIONS[function]} as finite numbers; "
                         f"{example}")
    low, high = args[0], args[1]
    if function in ("loguniform", "lograndint") and not 0 < low < high:
        raise ValueError(f"--search {item!r}: {function} needs 0 < low < high, got low={low} and high={high}; {example}")
    if not low < high:
        raise ValueError(f"--search {item!r}: {function} needs low < high, got low={low} and high={high}")
    if function in ("randint", "lograndint"):
        if not all(isinstance(a, int) for a in args):
            raise ValueError(f"--search {item!r}: {function} takes ints, e.g. num_sgd_iter={function}(5,30)")
        return [low, high - 1]
    if function == "quniform" and not args[2] > 0:
        raise ValueError(f"--search {item!r}: quniform's q must be > 0, got {args[2]}")
    return [float(low), float(high)]


def _domain(function: str, args: list[Any]) -> Any:
    values = [tuple(a) if isinstance(a, list) else a for a in args]
    if function == "grid":
        return tune.grid_search(values)
    if function == "choice":
        return tune.choice(values)
    return getattr(tune, function)(*values)


def sweep_record(algorithm: Algorithm, base: TrainerConfig, search: Sequence[str], **options: Any) -> dict[str, Any]:
    """What ``flowrl tune --resume`` needs to rebuild a sweep's Trainable: the algorithm, the base config as data
    and the search items (kept beside Tune's own experiment state)."""
    return {"algorithm": algorithm.name, "config": config_to_data(base), "search": list(search), **options}


SWEEP_RECORD = "flowrl_sweep.json"


def read_sweep_record(experiment: Path) -> dict[str, Any]:
    """The record :func:`sweep_record` wrote in a sweep's experiment directory.

    Raises:
        ValueError: the directory holds no record (not a sweep of ``flowrl tune``) or a malformed one.
    """
    path = experiment / SWEEP_RECORD
    if not path.is_file():
        raise ValueError(f"{str(experiment)!r} holds no {SWEEP_RECORD}: it is not a sweep directory `flowrl tune` "
                         f"wrote (pass the directory it printed, STORAGE/NAME)")
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is unreadable ({e}); the sweep cannot be resumed from the command line") from None
    if not isinstance(record, dict) or not {"algorithm", "config", "search"} <= set(record):
        raise ValueError(f"{path} is malformed (it needs algorithm, config and search)")
    return record
