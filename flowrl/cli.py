"""The ``flowrl`` command line (also ``python -m flowrl ...``): train, evaluate, plot, list algorithms, and
look inside a plan (its operator graph; a per-operator profile of a short run).

::

    flowrl train ppo --env CartPole-v1 --config lr=3e-4 --stop-reward 150
    flowrl evaluate runs/ppo_CartPole-v1_20250101-120000 --episodes 20
    flowrl plot runs/ppo_CartPole-v1_20250101-120000
    flowrl algorithms [ppo]
    flowrl plan show apex --config num_workers=2 --format mermaid
    flowrl profile impala --env CartPole-v1 --config num_workers=2 --iters 5

``--config key=value`` sets a field of the algorithm's frozen config, parsed by the field's type: ints,
numbers, ``true``/``false``, strings, ``none``/``null`` for an optional field, a Literal's choices,
comma-separated tuples (``hidden_sizes=64,64``; JSON for nested ones, ``conv_filters=[[16,8,4]]``),
JSON objects for mappings (``env_config={"max_episode_steps": 200}``) and dotted keys into nested
configs (``model.hidden_sizes=32,32``). The config is then built by its own constructor, so its own
validation runs. Every mistake is a usage error (exit code 2) that names the key and the value, before
Ray or any worker starts.

A run directory (``runs/<algo>_<env>_<YYYYmmdd-HHMMSS>`` unless ``--log-dir``) holds ``progress.csv``,
``result.json``, TensorBoard events under ``tb/`` (:mod:`flowrl.logger`), ``checkpoints/``,
``learning_curve.png`` and ``run_info.json``, the run's record of its latest checkpoint.

Resuming a run from an earlier checkpoint starts a new branch of it: the checkpoint becomes the run's
recorded latest, the log rows past it are dropped (once, with a line saying so), and ``--resume RUN`` and
``flowrl evaluate RUN`` later take the newest branch's latest checkpoint, not the abandoned branch's
higher-numbered ones. A run's rows are dropped only when that run itself is resumed: ``--log-dir`` naming
another run's directory is refused. A write that fails (a full disk) ends training with one line naming the
path; the logs stay whole through their last row and the last checkpoint stays restorable.

Examples:
    >>> from click.testing import CliRunner
    >>> print(CliRunner().invoke(main, ["train", "ppo", "--config", "lr=-1", "--stop-iters", "1"]).output)
    Usage: flowrl train [OPTIONS] ALGO
    Try 'flowrl train --help' for help.
    <BLANKLINE>
    Error: Invalid value for '--config': PPOConfig rejects lr=-1: lr=-1.0 must be > 0
    <BLANKLINE>
    >>> print(CliRunner().invoke(main, ["train", "ppo", "--config", "lrr=0.1", "--stop-iters", "1"]).output)
    Usage: ...
    Error: Invalid value for '--config': lrr=0.1: PPOConfig has no field 'lrr'; did you mean 'lr'? ...
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import difflib
import errno
import importlib
import inspect
import json
import logging
import math
import os
import re
import signal
import sys
import textwrap
import threading
import time
import types
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal, Mapping, Sequence, Union, get_args, get_origin

import click

from flowrl.algorithms import ALGORITHMS, Algorithm, get_algorithm
from flowrl.config import TrainerConfig, config_field_types
from flowrl.logger import (LEARNING_CURVE, PROGRESS_CSV, TB_DIR, RunLogger, plot_progress, record_checkpoint,
                           record_target, recorded_checkpoint, recorded_checkpoint_dir)

if TYPE_CHECKING:
    from flowrl.trainer import Trainer

__all__ = ["main", "MAIN_JOB", "StopCriteria", "build_config", "parse_overrides"]

#: ``python -m flowrl`` with no arguments: PPO on CartPole-v1 with its tuned preset (:mod:`flowrl.presets`: two
#: rollout workers and RLlib's tuned settings, train batch 4000, minibatch 128, 6 epochs, lr 3e-4), until the
#: smoothed return reaches 450 or 300k env steps have been sampled.
MAIN_JOB = ("train", "ppo", "--env", "CartPole-v1", "--tuned", "--seed", "0", "--stop-reward", "450",
            "--stop-timesteps", "300000")

_NONE_WORDS = frozenset({"none", "null"})
_TRUE_WORDS, _FALSE_WORDS = frozenset({"true", "yes", "on", "1"}), frozenset({"false", "no", "off", "0"})


# -- --config key=value ---------------------------------------------------------------------------

class _NotSettable(Exception):
    """A field whose type holds a callable, a class or a nested config: no command-line spelling."""


def _is_callable_type(tp: Any) -> bool:
    origin = get_origin(tp)
    return (tp is None or tp is type or origin is type or tp is collections.abc.Callable
            or origin is collections.abc.Callable)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _settable(tp: Any) -> bool:
    """Whether a field of type ``tp`` has a command-line spelling (no callable, class or nested config)."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Union or origin is types.UnionType:
        members = [a for a in args if a is not type(None) and not _is_callable_type(a)]
        return len(members) == 1 and _settable(members[0])
    if _is_callable_type(tp) or _is_dataclass_type(tp):
        return False
    if origin is Literal or tp in (bool, int, float, str):
        return True
    if origin is tuple:
        return all(_settable(a) for a in args if a is not Ellipsis)
    if origin in (dict, collections.abc.Mapping):
        return not args or args[1] is Any or _settable(args[1])
    return False


def _describe(tp: Any) -> str:
    """What a value of type ``tp`` looks like on the command line."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Union or origin is types.UnionType:
        members = [a for a in args if a is not type(None) and not _is_callable_type(a)]
        text = " or ".join(_describe(m) for m in members)
        return f"{text} or none" if type(None) in args else text
    if origin is Literal:
        return f"one of {list(args)}"
    if origin is tuple:
        plural = {int: "ints", float: "numbers", str: "strings"}
        if len(args) == 2 and args[1] is Ellipsis and args[0] in plural:
            return f"comma-separated {plural[args[0]]} (e.g. {'64,64' if args[0] is not str else 'a,b'})"
        return "a JSON list (e.g. [[16,8,4],[32,4,2]])"
    if origin in (dict, collections.abc.Mapping):
        return 'a JSON object (e.g. {"max_episode_steps": 200})'
    return {bool: "true or false", int: "an int", float: "a number", str: "a string"}.get(tp, str(tp))


def _parse_value(text: str, tp: Any) -> Any:
    """``text`` as a value of field type ``tp``.

    Raises:
        ValueError: ``text`` does not spell such a value (the message says what would).
        _NotSettable: the type has no command-line spelling.
    """
    if not _settable(tp):
        raise _NotSettable
    origin, args = get_origin(tp), get_args(tp)
    if origin is Union or origin is types.UnionType:
        if type(None) in args and text.strip().lower() in _NONE_WORDS:
            return None
        return _parse_value(text, next(a for a in args if a is not type(None) and not _is_callable_type(a)))
    if origin is Literal:
        if text not in args:
            raise ValueError
        return text
    if tp is bool:
        word = text.strip().lower()
        if word not in _TRUE_WORDS | _FALSE_WORDS:
            raise ValueError
        return word in _TRUE_WORDS
    if tp is int:
        try:
            return int(text)
        except ValueError:
            number = float(text)  # 4e3 is an int; 1.5 and "abc" are not
            if not number.is_integer():
                raise ValueError from None
            return int(number)
    if tp is float:
        return float(text)
    if tp is str:
        return text
    if origin is tuple:
        items: Any = json.loads(text) if text.lstrip().startswith("[") else (
            [] if not text.strip() else [item.strip() for item in text.split(",")])
        return _coerce(items, tp)
    if origin in (dict, collections.abc.Mapping):
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError(f"expected {_describe(tp)}")
        return {k: _coerce(v, args[1]) for k, v in value.items()} if args and args[1] is not Any else value
    raise _NotSettable  # unreachable: _settable admits only the types above


def _coerce(value: Any, tp: Any) -> Any:
    """An item of a tuple or mapping (a string from a comma list, or a JSON value) as type ``tp``."""
    if isinstance(value, str) and tp is not Any:
        return _parse_value(value, tp)
    origin, args = get_origin(tp), get_args(tp)
    if origin is tuple:
        if not isinstance(value, list):
            raise ValueError(f"expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0]) for v in value)
        if len(value) != len(args):
            raise ValueError(f"expected {len(args)} items, got {value!r}")
        return tuple(_coerce(v, a) for v, a in zip(value, args))
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if (tp is int and isinstance(value, int) and not isinstance(value, bool)) or tp is Any:
        return value
    if tp is bool and isinstance(value, bool):
        return value
    raise ValueError(f"expected {_describe(tp)}, got {value!r}")


def _field_names(config_class: type, prefix: str = "") -> list[str]:
    """Every settable dotted key of a config class (for suggestions)."""
    names = []
    for name, tp in config_field_types(config_class).items():
        names.append(prefix + name)
        if _is_dataclass_type(tp):
            names += _field_names(tp, f"{prefix}{name}.")
    return names


def _field_default(config_class: type, name: str) -> Any:
    field = next(f for f in dataclasses.fields(config_class) if f.name == name)
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _parse_override(config_class: type, item: str) -> tuple[tuple[str, ...], Any]:
    """``"model.hidden_sizes=32,32"`` -> ``(("model", "hidden_sizes"), (32, 32))``."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"{item!r} is not key=value; write e.g. --config lr=3e-4")
    path = tuple(key.split("."))
    cls: type = config_class
    for depth, name in enumerate(path):
        types_ = config_field_types(cls)
        if name not in types_:
            close = difflib.get_close_matches(key, _field_names(config_class), n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else "no field is close"
            algo = next((n for n in ALGORITHMS if get_algorithm(n).config_class is config_class), None)
            listing = f"`flowrl algorithms {algo}`" if algo else f"{config_class.__name__}'s docstring"
            raise ValueError(f"{item}: {config_class.__name__} has no field {key!r}; {hint} ({listing} lists "
                             f"the fields)")
        tp = types_[name]
        if depth < len(path) - 1:
            if not _is_dataclass_type(tp):
                raise ValueError(f"{item}: {'.'.join(path[:depth + 1])} is not a nested config, so it has no "
                                 f"field {path[depth + 1]!r}")
            cls = tp
    if _is_dataclass_type(tp):
        first = dataclasses.fields(tp)[0].name
        raise ValueError(f"{item}: {key} is a nested {tp.__name__}; set its fields with dotted keys, e.g. "
                         f"--config {key}.{first}=...")
    default = _field_default(cls, path[-1])
    try:
        return path, _parse_value(text, tp)
    except _NotSettable:
        shown = getattr(default, "__qualname__", None) or repr(default)
        raise ValueError(f"{item}: {key} holds a callable or a class (default {shown}), which cannot be set "
                         f"from the command line; build the config in Python and run Trainer(...) there") from None
    except ValueError as e:
        # scalar parse errors say nothing the message does not; JSON and tuple ones do
        detail = f" ({e})" if str(e) and not str(e).startswith(("could not convert", "invalid literal")) else ""
        raise ValueError(f"{item}: {key} takes {_describe(tp)}, not {text!r}{detail}; its default is "
                         f"{key}={default!r}") from None


def _construct(config_class: type, overrides: Sequence[tuple[tuple[str, ...], Any]], base: Any) -> Any:
    direct = {path[0]: value for path, value in overrides if len(path) == 1}
    nested: dict[str, list[tuple[tuple[str, ...], Any]]] = {}
    for path, value in overrides:
        if len(path) > 1:
            nested.setdefault(path[0], []).append((path[1:], value))
    types_ = config_field_types(config_class)
    for name, sub in nested.items():
        sub_base = getattr(base, name) if base is not None else _field_default(config_class, name)
        direct[name] = _construct(types_[name], sub, sub_base)
    return dataclasses.replace(base, **direct) if base is not None else config_class(**direct)


def parse_overrides(config_class: type, items: Sequence[str]) -> list[tuple[tuple[str, ...], Any]]:
    """Parses ``key=value`` items against a config class's field types (no config is built).

    Raises:
        ValueError: an item that is not ``key=value``, an unknown key (with the closest names), a key given
            twice, a value that does not parse as the field's type, or a field that holds a callable.
    """
    parsed, seen = [], set()
    for item in items:
        path, value = _parse_override(config_class, item)
        if path in seen:
            raise ValueError(f"{item}: {'.'.join(path)} is given twice; keep one")
        seen.add(path)
        parsed.append((path, value))
    return parsed


def build_config(config_class: type, items: Sequence[str]) -> Any:
    """A config of ``config_class`` with the ``key=value`` overrides ``items``, built by its constructor.

    Raises:
        ValueError: as :func:`parse_overrides`, or the config's own validation (the message names the
            overrides given and the config's reason).

    Examples:
        >>> from flowrl.algorithms.ppo import PPOConfig
        >>> config = build_config(PPOConfig, ["lr=3e-4", "model.hidden_sizes=32,32", "grad_clip=none",
        ...                                   "batch_mode=complete_episodes", "use_gae=false"])
        >>> config.lr, config.model.hidden_sizes, config.grad_clip, config.batch_mode, config.use_gae
        (0.0003, (32, 32), None, 'complete_episodes', False)
        >>> build_config(PPOConfig, ["num_sgd_iter=1.5"])
        Traceback (most recent call last):
        ...
        ValueError: num_sgd_iter=1.5: num_sgd_iter takes an int, not '1.5'; its default is num_sgd_iter=30
    """
    overrides = parse_overrides(config_class, items)
    try:
        return _construct(config_class, overrides, None)
    except (ValueError, TypeError) as e:
        given = " ".join(items) if items else "the defaults"
        raise ValueError(f"{config_class.__name__} rejects {given}: {e}") from None


# -- stop criteria and progress -----------------------------------------------------------------

@dataclass(frozen=True)
class StopCriteria:
    """When ``flowrl train`` stops: the first criterion a result meets (all are totals over the run, so a
    resumed run counts the iterations, steps and time before its checkpoint).

    Attributes:
        reward: ``episode_reward_mean >= reward``.
        timesteps: ``timesteps_total >= timesteps``.
        time_s: ``time_total_s >= time_s`` (training time).
        iters: ``training_iteration >= iters``.

    Examples:
        >>> StopCriteria(reward=450, iters=100).reason({"episode_reward_mean": 460.0, "training_iteration": 20})
        'episode_reward_mean 460.0 >= 450'
        >>> StopCriteria(reward=450).reason({"episode_reward_mean": float("nan")}) is None
        True
        >>> StopCriteria(reward=450).reason({"training_iteration": 1}) is None  # no episode finished yet
        True
    """

    reward: float | None = None
    timesteps: int | None = None
    time_s: float | None = None
    iters: int | None = None

    def reason(self, result: Mapping[str, Any]) -> str | None:
        """Why ``result`` ends training, or ``None`` to go on."""
        checks = (("episode_reward_mean", self.reward), ("timesteps_total", self.timesteps),
                  ("time_total_s", self.time_s), ("training_iteration", self.iters))
        for key, bound in checks:
            value = result.get(key)
            if bound is not None and value is not None and float(value) >= bound:  # NaN never stops
                shown = f"{value:.1f}" if isinstance(value, float) else str(value)
                return f"{key} {shown} >= {bound:g}"
        return None

    @property
    def empty(self) -> bool:
        """No criterion given."""
        return all(c is None for c in (self.reward, self.timesteps, self.time_s, self.iters))


def _progress_line(result: Mapping[str, Any], elapsed_s: float) -> str:
    """One iteration's line; a result without episode statistics (no episode has finished yet) says so.

    Examples:
        >>> _progress_line({"training_iteration": 1, "timesteps_total": 10, "timesteps_this_iter": 10,
        ...                 "time_this_iter_s": 0.5}, 0.5)
        'iter    1  env steps       10  reward       - (no episode finished yet)      20 steps/s  elapsed ...'
    """
    reward = result.get("episode_reward_mean")
    per_s = result.get("timesteps_this_iter", 0) / max(result.get("time_this_iter_s", 0.0), 1e-9)
    if reward is None or math.isnan(reward):
        shown = f"{'-':>7} (no episode finished yet)"
    else:
        spread = (f" (min {result['episode_reward_min']:.0f}, max {result['episode_reward_max']:.0f})"
                  if "episode_reward_min" in result and "episode_reward_max" in result else "")
        shown = f"{float(reward):7.1f}{spread}"
    return (f"iter {result['training_iteration']:4d}  env steps {result.get('timesteps_total', 0):8d}  "
            f"reward {shown}  {per_s:6.0f} steps/s  elapsed {elapsed_s:6.1f} s")  # ~97 columns


class _Progress:
    """The live display while training: a rich spinner with the last iteration's numbers, above which each
    iteration leaves one line, when stdout is a terminal; otherwise one plain line per iteration."""

    def __init__(self, *, live: bool) -> None:
        self.live, self._start = live, time.monotonic()
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> _Progress:
        if self.live:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                      console=Console(), transient=True)
            self._progress.start()
            self._task = self._progress.add_task("iteration 1: sampling and learning", total=None)
        return self

    def update(self, result: Mapping[str, Any]) -> None:
        """Shows one result."""
        line = _progress_line(result, time.monotonic() - self._start)
        if self._progress is None:
            click.echo(line)
            return
        self._progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
        reward = result.get("episode_reward_mean")
        last = f"last reward {reward:.1f}" if reward is not None else "no episode finished yet"
        self._progress.update(self._task, description=f"iteration {result['training_iteration'] + 1} "
                                                      f"({last}, {result.get('timesteps_total', 0)} env steps)")

    def note(self, text: str) -> None:
        """A line that is not a result (a checkpoint path), in the live display or plainly."""
        if self._progress is None:
            click.echo(text)
        else:
            self._progress.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


# -- paths --------------------------------------------------------------------------------------

def _find_checkpoint(path: Path, param_hint: str) -> Path:
    """``path`` if it is a checkpoint, else the run's latest in it (:func:`flowrl._checkpoint.find_checkpoint`)."""
    from flowrl._checkpoint import find_checkpoint

    try:
        return find_checkpoint(path)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=param_hint) from None


def _env_name(env: Any) -> str:
    name = env if isinstance(env, str) else getattr(env, "__name__", type(env).__name__)
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name))


def _local_cpus(config: TrainerConfig) -> int:
    """Logical CPUs for a local Ray instance: the machine's, or enough to hold the workers (as the main job
    always did: two 1-CPU workers on a 2-core machine get 3)."""
    return max(os.cpu_count() or 1, math.ceil(config.num_workers * config.num_cpus_per_worker) + 1)


# -- commands -----------------------------------------------------------------------------------

@click.group(name="flowrl", context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """flowrl: distributed RL as a dataflow. `python -m flowrl` alone runs the main job (PPO on CartPole-v1)."""


def _algorithm_arg(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value.lower() in ALGORITHMS:
        return value.lower()
    close = difflib.get_close_matches(value.lower(), list(ALGORITHMS), n=2, cutoff=0.5)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    raise click.BadParameter(f"unknown algorithm {value!r}; {hint}flowrl has {sorted(ALGORITHMS)} "
                             f"(`flowrl algorithms` lists them)")


def _finite_arg(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number, so no result can ever meet it; give a finite "
                                 f"bound, e.g. --{(param.name or '').replace('_', '-')} 100")
    return value


def _address_arg(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from flowrl.runtime import parse_address

    if value is not None:
        try:
            parse_address(value)
        except ValueError as e:
            raise click.BadParameter(f"{e}; e.g. --address 10.0.0.5:6379, or --address auto to join the "
                                     f"cluster `ray start` started on this machine") from None
    return value


def _check_resume_agrees(config: Any, overrides: Sequence[tuple[tuple[str, ...], Any]], items: Sequence[str]) -> None:
    for (path, value), item in zip(overrides, items):
        saved: Any = config
        for name in path:
            saved = getattr(saved, name)
        if saved != value:
            key = ".".join(path)
            raise click.BadParameter(f"{item} differs from the checkpoint's {key}={saved!r}; a resumed run keeps its "
                                     f"saved config: drop the option, or start a new run to change it",
                                     param_hint="'--resume'")


@main.command()
@click.argument("algo", callback=_algorithm_arg)
@click.option("--env", help="gymnasium env id (default: the config's env). With --resume, the checkpoint's env named "
                            "again: needed when it is 'module:Id', since nothing in a checkpoint may make flowrl "
                            "import a module.")
@click.option("--config", "config_items", multiple=True, metavar="KEY=VALUE",
              help="Set a config field (repeatable): lr=3e-4, model.hidden_sizes=32,32, grad_clip=none.")
@click.option("--stop-reward", type=float, callback=_finite_arg, help="Stop when episode_reward_mean reaches this.")
@click.option("--stop-timesteps", type=click.IntRange(min=1), help="Stop at this many env steps in all.")
@click.option("--stop-time", type=click.FloatRange(min=0, min_open=True), callback=_finite_arg,
              help="Stop after this many seconds of training in all; a report still running then is abandoned "
                   "(its samples are dropped) and the last finished one is checkpointed.")
@click.option("--stop-iters", type=click.IntRange(min=1), help="Stop at this training_iteration.")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where checkpoints go (default: RUN_DIR/checkpoints).")
@click.option("--checkpoint-freq", type=click.IntRange(min=0), default=10, show_default=True,
              help="Checkpoint every K iterations (0: only at the end); one is always written at the end.")
@click.option("--resume", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Continue from a checkpoint, or from a run dir's latest (as its run_info.json records it; "
                   "else its highest-numbered checkpoint_*).")
@click.option("--log-dir", type=click.Path(file_okay=False, path_type=Path),
              help="The run directory (default: runs/<algo>_<env>_<time>; on resume, the resumed run's).")
@click.option("--seed", type=click.IntRange(min=0), help="The config's seed (same as --config seed=S).")
@click.option("--address", callback=_address_arg,
              help="Join a Ray cluster ('auto' or 'host:port') instead of starting a local instance.")
@click.option("--tuned/--no-tuned", default=False, show_default=True,
              help="Apply the tuned preset for ALGO on the env, where one exists (see flowrl/presets.py and the "
                   "README's table); --config values win over it.")
def train(algo: str, env: str | None, config_items: tuple[str, ...], stop_reward: float | None,
          stop_timesteps: int | None, stop_time: float | None, stop_iters: int | None, checkpoint_dir: Path | None,
          checkpoint_freq: int, resume: Path | None, log_dir: Path | None, seed: int | None,
          address: str | None, tuned: bool) -> None:
    """Train ALGO (a registered algorithm, see `flowrl algorithms`) until a stop criterion is met.

    Logs go to the run directory (progress.csv, result.json, tb/), checkpoints to RUN_DIR/checkpoints,
    and the learning curve to RUN_DIR/learning_curve.png. With --resume, the checkpoint's saved config is
    used; --env, --config and --seed may only repeat its values. Resuming an earlier checkpoint of a run makes it
    the run's latest and drops the log rows past it (saying so); --log-dir may not name another run's directory.

    Ctrl-C or SIGTERM abandons the report in progress, checkpoints the last finished one and exits with 130 or
    143; a full disk ends training with one line naming the path, the logs whole and the last checkpoint intact.
    """
    stop = StopCriteria(reward=stop_reward, timesteps=stop_timesteps, time_s=stop_time, iters=stop_iters)
    if stop.empty:
        raise click.UsageError("give at least one stop criterion: --stop-reward R, --stop-timesteps N, "
                               "--stop-time S or --stop-iters N")
    algorithm = get_algorithm(algo)
    items = [*config_items, *([f"env={env}"] if env is not None else []),
             *([f"seed={seed}"] if seed is not None else [])]
    note = None
    if resume is None:
        items, note = _with_preset(algorithm, env, items, tuned=tuned)
    elif tuned:
        raise click.BadParameter("a resumed run keeps its saved config; drop --tuned", param_hint="'--tuned'")
    config, checkpoint = _config_and_checkpoint(algorithm, items, resume)
    if note is not None:
        click.echo(note, err=True)
    run_dir = _run_dir(log_dir, checkpoint, algorithm, config)
    _check_writable_dir(run_dir, "'--log-dir'")
    _check_writable_dir(checkpoint_dir or run_dir / "checkpoints", "'--checkpoint-dir'")
    workers_chosen = any(item.partition("=")[0].strip() == "num_workers" for item in items)
    _train(algorithm, config, stop, run_dir=run_dir, checkpoint=checkpoint, address=address,
           checkpoint_dir=checkpoint_dir or run_dir / "checkpoints", checkpoint_freq=checkpoint_freq,
           workers_chosen=workers_chosen)


def _with_preset(algorithm: Algorithm, env: str | None, items: Sequence[str], *,
                 tuned: bool) -> tuple[list[str], str | None]:
    """``items`` under the tuned preset for the algorithm and env (``--tuned``) and the line that says so; without
    ``--tuned``, ``items`` unchanged and, where a preset exists, a line saying how to use it."""
    from flowrl.presets import PRESETS, find_preset

    env_id = env if env is not None else _field_default(algorithm.config_class, "env")
    preset = find_preset(algorithm.name, env_id) if isinstance(env_id, str) else None
    if preset is None:
        known = ", ".join(f"{p.algorithm} on {p.env}" for p in PRESETS)
        return list(items), (f"no tuned preset for {algorithm.name} on {env_id} (presets: {known}); training with "
                             f"the defaults" if tuned else None)
    if not tuned:
        return list(items), (f"a tuned preset exists for {algorithm.name} on {preset.env}: add --tuned to use it "
                             f"({' '.join(preset.settings)})")
    given = set(preset.keys()) & {item.partition("=")[0].strip() for item in items}
    kept = " ".join(item for item in preset.settings if item.partition("=")[0].strip() not in given)
    return list(preset.items(items)), (f"tuned preset for {algorithm.name} on {preset.env}: {kept}"
                                       + (f" (your --config {', '.join(sorted(given))} kept)" if given else ""))


def _config_and_checkpoint(algorithm: Algorithm, items: Sequence[str],
                           resume: Path | None) -> tuple[TrainerConfig, Path | None]:
    """The config built from the options, or, resuming, the checkpoint's (which the options may only repeat)."""
    try:
        overrides = parse_overrides(algorithm.config_class, items)
        if resume is None:
            return build_config(algorithm.config_class, items), None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--config'") from None
    from flowrl._checkpoint import sweep_checkpoint_dir

    for folder in (resume, resume / "checkpoints"):  # a checkpoint a killed save left aside is put back first
        for line in sweep_checkpoint_dir(folder):
            click.echo(line, err=True)
    checkpoint = _find_checkpoint(resume, "'--resume'")
    return _resume_config(checkpoint, algorithm, overrides, items), checkpoint


def _resume_config(checkpoint: Path, algorithm: Algorithm, overrides: Sequence[tuple[tuple[str, ...], Any]],
                   items: Sequence[str]) -> TrainerConfig:
    from flowrl._checkpoint import checkpoint_algorithm
    from flowrl.trainer import load_checkpoint_config

    try:
        owner = checkpoint_algorithm(checkpoint)
        if owner.lower() != algorithm.name:
            raise ValueError(f"{checkpoint} is a checkpoint of {owner!r}, not {algorithm.name!r}; run "
                             f"`flowrl train {owner} --resume {checkpoint} ...`")
        named_env = next((value for path, value in overrides if path == ("env",)), None)  # --env or --config env=
        _, config = load_checkpoint_config(checkpoint, env=named_env)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--resume'") from None
    _check_resume_agrees(config, overrides, items)
    return config


def _owns(run_dir: Path, checkpoint: Path) -> bool:
    """Whether ``checkpoint`` belongs to the run in ``run_dir``: it lies in the run's checkpoint directory (as the
    run recorded it; ``RUN_DIR/checkpoints`` without a record), or it is the run's recorded latest (a run resumed
    from another run's checkpoint and killed before its own first one)."""
    try:
        folder, latest = recorded_checkpoint_dir(run_dir), recorded_checkpoint(run_dir)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--log-dir'") from None
    same = os.path.realpath(checkpoint.parent) == os.path.realpath(folder or run_dir / "checkpoints")
    return same or (latest is not None and os.path.realpath(latest) == os.path.realpath(checkpoint))


def _run_dir(log_dir: Path | None, checkpoint: Path | None, algorithm: Algorithm, config: TrainerConfig) -> Path:
    """The run directory: ``--log-dir``; else, resuming, the run the checkpoint belongs to; else a new one. Rows of
    a run are dropped only when that run itself is resumed, so another run's directory is refused."""
    if log_dir is not None:
        if checkpoint is None and (log_dir / PROGRESS_CSV).exists():
            raise click.BadParameter(f"{str(log_dir)!r} already holds a run's {PROGRESS_CSV}; continue it with "
                                     f"--resume {log_dir} or choose another --log-dir", param_hint="'--log-dir'")
        if checkpoint is not None and (log_dir / PROGRESS_CSV).exists() and not _owns(log_dir, checkpoint):
            raise click.BadParameter(f"{str(log_dir)!r} holds another run's {PROGRESS_CSV} ({checkpoint} is not one "
                                     f"of its checkpoints), whose rows resuming would mix or drop; choose a new "
                                     f"--log-dir, or drop --log-dir to continue the checkpoint's own run",
                                     param_hint="'--log-dir'")
        return log_dir
    if checkpoint is not None and (checkpoint.parent.parent / PROGRESS_CSV).exists() and \
            _owns(checkpoint.parent.parent, checkpoint):
        return checkpoint.parent.parent  # RUN_DIR/checkpoints/checkpoint_N: append to that run
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{algorithm.name}_{_env_name(config.env)}_{stamp}"


def _check_writable_dir(path: Path, param_hint: str) -> None:
    """Refuses a directory that cannot be created or written to, before any training time is spent (not
    creating it: a run refused later, e.g. for an unknown env, leaves nothing behind)."""
    existing = path
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise click.BadParameter(f"{str(path)!r} cannot be a directory: {str(existing)!r} is a file; choose another "
                                 f"path", param_hint=param_hint)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{str(path)!r} is not writable: this user may not write in {str(existing)!r}; "
                                 f"choose another path or change its permissions", param_hint=param_hint)


def _make_trainer(algorithm: Algorithm, config: TrainerConfig, *, checkpoint: Path | None = None,
                  address: str | None = None, workers_chosen: bool = True) -> Trainer:
    """Ray started (or joined) as the options say, then the trainer; its construction errors are usage errors.

    A default ``num_workers`` (``workers_chosen=False``) was fitted to this machine's CPUs when the config was
    built; joining a cluster fits it again to the cluster's. A chosen one is kept, with one line when it asks
    for more CPUs than this machine has (the local Ray instance is then given enough logical CPUs to hold it).
    """
    from flowrl import runtime
    from flowrl.config import available_cpus
    from flowrl.trainer import Trainer

    if address is None and config.num_workers * config.num_cpus_per_worker > (os.cpu_count() or 1):
        click.echo(f"num_workers={config.num_workers} (x {config.num_cpus_per_worker:g} CPU each) is more than this "
                   f"machine's {os.cpu_count() or 1} CPUs: kept as set, the workers share the cores; lower "
                   f"num_workers for less contention", err=True)
    if address is not None or config.num_workers:
        try:
            runtime.init(address, num_cpus=None if address is not None else _local_cpus(config))
        except ConnectionError as e:
            raise click.ClickException(f"could not join the Ray cluster at --address {address} ({e}); start it "
                                       f"with `ray start --head` (and `ray start --address=HEAD:6379` on the "
                                       f"other nodes), or drop --address for a local instance") from None
        if address is not None and not workers_chosen and checkpoint is None:
            fitted = _field_default(type(config), "num_workers")  # the default, fitted to the cluster's CPUs now
            if fitted != config.num_workers:
                click.echo(f"num_workers={fitted}: the default fitted to the {available_cpus()} CPUs of the "
                           f"cluster; set --config num_workers=N to choose", err=True)
                config = dataclasses.replace(config, num_workers=fitted)
    try:
        if checkpoint is not None:  # `config` is the checkpoint's, its env already named as _resume_config asks
            return Trainer.from_checkpoint(checkpoint, env=config.env if isinstance(config.env, str) else None)
        return Trainer(algorithm, config)
    except ValueError as e:  # an unknown env id, GPUs or workers the machine cannot hold
        raise click.UsageError(str(e)) from None


class _Stopped(KeyboardInterrupt):
    """SIGINT or SIGTERM asked ``flowrl train`` to stop (a KeyboardInterrupt, so that code which lets a
    Ctrl-C through lets this through too)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _StopSignals:
    """While entered (from the main thread), SIGINT and SIGTERM stop ``flowrl train``.

    A signal raises :class:`_Stopped` in the main thread at once (abandoning the report being trained),
    except inside a :meth:`held` section, where it is only recorded and raised when the section ends
    (or never, with ``raise_after=False``), so that what the section writes is written whole.
    :attr:`received` is the first signal. The handler prints nothing (the main thread may be writing),
    and the previous handlers (Python's for SIGINT, Ray's for SIGTERM) come back on exit.

    :meth:`deadline` arms a timer (``SIGALRM``) that stops the same way, for ``--stop-time`` inside a long
    report; it sets :attr:`deadline_passed`, not :attr:`received`.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.deadline_passed = False
        self._held = 0
        self._pending: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if signal.SIGALRM in self._previous:
            signal.setitimer(signal.ITIMER_REAL, 0)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def deadline(self, seconds: float) -> None:
        """Stops (as a signal does) once ``seconds`` have passed; only while entered from the main thread."""
        if self._previous:
            self._previous.setdefault(signal.SIGALRM, signal.signal(signal.SIGALRM, self._handle))
            signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGALRM:
            self.deadline_passed = True
        elif self.received is None:
            self.received = signum
        if self._held:
            self._pending = signum
            return
        raise _Stopped(signum)

    @contextlib.contextmanager
    def held(self, *, raise_after: bool = True) -> Iterator[None]:
        """A section that a signal does not cut short; one that arrived in it is raised at its end."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
        pending, self._pending = self._pending, None
        if pending is not None and raise_after and not self._held:
            raise _Stopped(pending)


class _WriteFailed(Exception):
    """A log row, a checkpoint or the run record could not be written (a full disk, a file size limit)."""

    def __init__(self, error: OSError, path: Path) -> None:
        self.error, self.path = error, Path(error.filename) if error.filename else path
        name = errno.errorcode.get(error.errno or 0, "error")
        super().__init__(f"cannot write {self.path}: {error.strerror or error} ({name})")


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Turns an ``OSError`` of the writes inside into :class:`_WriteFailed` (naming ``path`` unless it names a
    file itself), so that ``flowrl train`` tells it from an error of training."""
    try:
        yield
    except OSError as e:
        raise _WriteFailed(e, path) from e


def _save(trainer: Trainer, checkpoint_dir: Path, snapshot: dict[str, Any], run_dir: Path) -> Path:
    """A checkpoint of ``snapshot``, then recorded as the run's latest."""
    with _writing(checkpoint_dir):
        saved = trainer.save(checkpoint_dir, snapshot=snapshot)
    with _writing(run_dir):
        record_checkpoint(run_dir, saved, checkpoint_dir=checkpoint_dir)
    return saved


def _later_checkpoints(checkpoint_dir: Path, iteration: int) -> list[str]:
    """The names of ``checkpoint_dir``'s checkpoints past ``iteration`` (an abandoned branch's, after a resume)."""
    names = [p.name for p in checkpoint_dir.glob("checkpoint_*") if re.fullmatch(r"checkpoint_\d+", p.name)]
    return sorted(n for n in names if int(n.rpartition("_")[2]) > iteration)


def _train(algorithm: Algorithm, config: TrainerConfig, stop: StopCriteria, *, run_dir: Path,
           checkpoint: Path | None, address: str | None, checkpoint_dir: Path, checkpoint_freq: int,
           workers_chosen: bool = True) -> None:
    """Trains until ``stop``; on SIGINT (Ctrl-C) or SIGTERM it abandons the report in progress, writes a final
    checkpoint of the last completed report (the state the logs end with), and exits with 128 + the signal.

    A write that fails (a full disk) ends training with one line naming the file; the logs stay whole through
    the last logged iteration and the last checkpoint stays restorable. ``--stop-time`` also abandons a report
    still running at the deadline. Resuming, the checkpoint becomes the run's recorded latest before the logs'
    later rows (of the branch that is abandoned) are dropped, and a line says so."""
    trainer = _make_trainer(algorithm, config, checkpoint=checkpoint, address=address, workers_chosen=workers_chosen)
    if stop.iters is not None and trainer.training_iteration >= stop.iters:
        trainer.stop()
        raise click.BadParameter(f"{checkpoint} is at iteration {trainer.training_iteration}, which already meets "
                                 f"--stop-iters {stop.iters}; raise it to train on", param_hint="'--stop-iters'")
    if stop.time_s is not None and trainer.time_total_s >= stop.time_s:
        trainer.stop()
        raise click.BadParameter(f"{checkpoint} has trained {trainer.time_total_s:.1f} s, which already meets "
                                 f"--stop-time {stop.time_s:g}; raise it to train on", param_hint="'--stop-time'")
    click.echo(f"run dir: {run_dir}" + (f" (resuming {checkpoint} at iteration {trainer.training_iteration})"
                                        if checkpoint is not None else ""))
    click.echo(f"progress: {run_dir / PROGRESS_CSV} and {run_dir / 'result.json'}")
    click.echo(f"tensorboard events: {run_dir / TB_DIR} (view with: tensorboard --logdir {run_dir.parent})")
    from flowrl import plan_graph  # the plan's operators by name; `flowrl plan show ALGO` draws its graph
    click.echo(plan_graph.summary(trainer.plan, algorithm.name))
    saved, reason, result = checkpoint, None, None
    completed = saved_at = trainer.training_iteration  # the last report's iteration; the one `saved` holds
    snapshot: dict[str, Any] | None = None  # the trainer's state after the last completed report
    signals = _StopSignals()
    write_failed: _WriteFailed | None = None
    try:
        with signals:
            try:
                with _writing(run_dir):
                    record_target(run_dir, stop.reward)  # the learning curve draws it, now and in `flowrl plot`
                    if checkpoint is not None:  # the run's newest branch starts here, before later rows go
                        record_checkpoint(run_dir, checkpoint, checkpoint_dir=checkpoint_dir)
                    logs = RunLogger(run_dir, keep_through_iteration=completed if checkpoint else None)
                with logs, _Progress(live=sys.stdout.isatty()) as progress:
                    if logs.dropped and checkpoint is not None:
                        later = _later_checkpoints(checkpoint_dir, completed)
                        progress.note(f"dropping {logs.dropped} log rows after iteration {completed} of {run_dir}: "
                                      f"resumed from {checkpoint.name}" + (
                                          f" (the abandoned branch's {', '.join(later)} stay until this run "
                                          f"replaces them)" if later else ""))
                    if stop.time_s is not None:
                        signals.deadline(stop.time_s - trainer.time_total_s)
                    while result is None or reason is None:
                        result = trainer.train()  # a stop signal abandons this report; `snapshot` is the last one
                        with signals.held():  # each report is logged, snapshotted and checkpointed whole
                            with _writing(run_dir):
                                logs.log(result)
                            snapshot, completed = trainer.snapshot(), result["training_iteration"]
                            progress.update(result)
                            reason = stop.reason(result)
                            if reason is None and checkpoint_freq and completed % checkpoint_freq == 0:
                                saved, saved_at = _save(trainer, checkpoint_dir, snapshot, run_dir), completed
                                progress.note(f"checkpoint: {saved}")
            except KeyboardInterrupt as e:  # SIGINT or SIGTERM, through _StopSignals; or the --stop-time deadline
                if not (isinstance(e, _Stopped) and e.signum == signal.SIGALRM):
                    signals.received = signals.received or signal.SIGINT
                elif reason is None:
                    reason = (f"--stop-time {stop.time_s:g} s passed during iteration {completed + 1}, which was "
                              f"abandoned")
            except _WriteFailed as e:
                write_failed = e
            with signals.held(raise_after=False):  # a second signal cannot cut the final checkpoint short
                failed = None
                if snapshot is not None and completed != saved_at:
                    try:
                        saved = _save(trainer, checkpoint_dir, snapshot, run_dir)
                    except Exception as e:  # e.g. remote workers that the same signal stopped; a full disk
                        if signals.received is None and write_failed is None and not isinstance(e, _WriteFailed):
                            raise
                        failed = f"{type(e).__name__}: {e}".splitlines()[0]
                        write_failed = write_failed or (e if isinstance(e, _WriteFailed) else None)
                if signals.received is not None:
                    if failed is not None:
                        where = f"the final checkpoint could not be written ({failed}); the last: {saved or 'none'}"
                    elif saved:
                        where = f"the final checkpoint is {saved}"
                    else:
                        where = "no report had finished, so there is no checkpoint"
                    click.echo(f"stopped by {signal.Signals(signals.received).name} after iteration {completed}; "
                               f"{where}")
    finally:
        trainer.stop()
    if signals.received is not None:
        _write_plot(run_dir)
        sys.exit(128 + signals.received)  # 130 for SIGINT, 143 for SIGTERM
    if write_failed is not None:
        last = f"the last checkpoint is {saved}" if saved else "no checkpoint was written"
        raise click.ClickException(f"{write_failed}; training stopped: the logs are whole through iteration "
                                   f"{completed} and {last}; free space (or lift the file size limit) and "
                                   f"continue with --resume {run_dir}")
    if result is None:  # the --stop-time deadline passed inside the first report
        click.echo(f"done ({reason}): no report finished; " + (f"the checkpoint is still {saved}" if saved else
                                                               "so there is no checkpoint"))
        return
    shown = (f"return {result['episode_reward_mean']:.1f}" if "episode_reward_mean" in result
             else "no episode finished")
    click.echo(f"done ({reason}): {shown} after {result['timesteps_total']} env steps and "
               f"{result['time_total_s']:.1f} s of training")
    click.echo(f"checkpoint: {saved}")
    _write_plot(run_dir)
    click.echo(f"evaluate it with: flowrl evaluate {saved} --episodes 10")


def _write_plot(run_dir: Path) -> None:
    try:
        click.echo(f"learning curve: {plot_progress(run_dir)}")
    except (ValueError, OSError) as e:  # no reward yet; a full disk
        click.echo(f"no learning curve: {e}")


@main.command()
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--episodes", type=click.IntRange(min=1), default=10, show_default=True,
              help="Complete episodes to run.")
@click.option("--explore/--no-explore", default=False, show_default=True,
              help="Sample actions (--explore) or act greedily (--no-explore).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seeds the envs.")
@click.option("--render", is_flag=True, help="Show the env on screen (render_mode=human), one episode at a time.")
@click.option("--video", "video_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Record each episode as an mp4 into this folder (render_mode=rgb_array; needs moviepy: "
                   'pip install "flowrl[video]").')
@click.option("--env", help="The checkpoint's env id, named again; needed when it is 'module:Id', since nothing in "
                            "a checkpoint may make flowrl import a module.")
def evaluate(checkpoint: Path, episodes: int, explore: bool, seed: int, render: bool, video_dir: Path | None,
             env: str | None) -> None:
    """Report the mean (min, max) return of a checkpoint's policy over complete episodes; for a multi-agent
    checkpoint, also each policy's (the mean return of the agents it plays).

    CHECKPOINT is a checkpoint directory, or a run dir (or its checkpoints/) whose latest checkpoint is taken: the
    one its run_info.json records, else the highest-numbered checkpoint_*. The policies are loaded without Ray or
    rollout workers.
    """
    from flowrl.evaluation import RenderError, evaluate_checkpoint

    if render and video_dir is not None:
        raise click.UsageError("give --render or --video, not both (a video records the rgb_array render mode)")
    path = _find_checkpoint(checkpoint, "'CHECKPOINT'")
    try:
        result = evaluate_checkpoint(path, episodes=episodes, explore=explore, seed=seed, render=render,
                                     video_dir=video_dir, env=env)
    except RenderError as e:
        raise click.BadParameter(str(e), param_hint="'--video'" if video_dir is not None else "'--render'") from None
    except ImportError as e:
        raise click.ClickException(str(e)) from None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'CHECKPOINT'") from None
    mode = "exploring" if explore else "greedy"
    mean_length = sum(result.lengths) / len(result.lengths)
    click.echo(f"{path}: {len(result.returns)} episodes ({mode}): mean return {result.mean:.2f} "
               f"(min {result.min:.2f}, max {result.max:.2f}), mean length {mean_length:.1f}"
               + (" (all agents' rewards)" if result.policy_returns else ""))
    width = max((len(pid) for pid in result.policy_returns), default=0)
    for pid, returns in result.policy_returns.items():
        click.echo(f"  {pid:<{width}}  mean return {sum(returns) / len(returns):.2f} (min {min(returns):.2f}, "
                   f"max {max(returns):.2f}) over {len(returns)} episodes")
    if video_dir is not None:
        click.echo(f"videos: {video_dir}")


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help=f"The PNG to write (default: RUN_DIR/{LEARNING_CURVE}).")
@click.option("--target", type=float, help="Draw this target return (default: the run's --stop-reward, if any).")
def plot(run_dir: Path, out: Path | None, target: float | None) -> None:
    """Draw RUN_DIR/progress.csv's learning curve (episode_reward_mean vs timesteps_total, each policy's return in
    a multi-agent run, the target return) into a PNG."""
    try:
        click.echo(plot_progress(run_dir, out, target=target))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'RUN_DIR'") from None


def _summary(algorithm: Algorithm) -> str:
    doc = importlib.import_module(ALGORITHMS[algorithm.name]).__doc__ or ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    return first.split(" (", 1)[0]


#: `flowrl algorithms NAME` fits its lines in this many columns.
_WIDTH = 100


def _field_docs(config_class: type) -> dict[str, str]:
    """Field name -> its description, from the ``Attributes:`` sections of the docstrings of ``config_class`` and
    its bases (a subclass's entry wins). An entry ``a / b: text`` describes both fields.

    Examples:
        >>> from flowrl.config import RolloutConfig
        >>> docs = _field_docs(RolloutConfig)
        >>> docs["lr"], docs["num_gpus_per_worker"]
        ('Adam learning rate.', 'what each remote worker asks Ray for.')
        >>> from flowrl.algorithms.dqn import DQNConfig
        >>> docs = _field_docs(DQNConfig)
        >>> docs["adam_epsilon"], docs["prioritized_replay_eps"][:40]
        ("Adam's epsilon (1e-8).", 'priority exponent (0.6), importance-weig')
    """
    docs: dict[str, str] = {}
    for cls in reversed(config_class.__mro__):
        lines = inspect.cleandoc(cls.__dict__.get("__doc__") or "").splitlines()
        if "Attributes:" not in lines:
            continue
        entries: list[list[str]] = []
        for line in lines[lines.index("Attributes:") + 1:]:
            if line and not line[0].isspace():
                break  # the next section
            if re.match(r"^ {4}[\w./ ]+?:(\s|$)", line):
                entries.append([line.strip()])
            elif entries and line.strip():
                entries[-1].append(line.strip())
        fields = {f.name for f in dataclasses.fields(config_class)}
        for entry in entries:
            names, _, text = " ".join(entry).partition(":")
            # "lr: Adam learning rate. adam_epsilon: Adam's epsilon." describes two fields
            parts = re.split(r"(?<=\.)\s+([a-z_]\w*):\s+", text.strip())
            described = [(names, parts[0])] + [(n, t) for n, t in zip(parts[1::2], parts[2::2])]
            for names_, text_ in described:
                first, *others = [n.strip() for n in names_.split("/")]
                stem = first.rsplit("_", 1)[0]  # "alpha / _beta / _eps" shares alpha's stem
                for name in [first, *(stem + n if n.startswith("_") and stem + n in fields else n for n in others)]:
                    docs[name] = text_
    return docs


def _plain(text: str) -> str:
    """Docstring markup as plain text: ``x`` -> x, :class:`~a.B` -> B."""
    text = re.sub(r":\w+:`~?(?:[\w.]*\.)?([^`]+)`", r"\1", text)
    return text.replace("``", "")


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=[.])\s+(?=[A-Z(])", _plain(text), maxsplit=1)[0]


def _shown(value: Any, width: int) -> str:
    """A default as the listing shows it: a callable or class by name, anything else by repr, cut to ``width``."""
    text = getattr(value, "__qualname__", None) or repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


@main.command("algorithms")
@click.argument("name", required=False, callback=lambda ctx, param, v: None if v is None else _algorithm_arg(ctx, param, v))
def algorithms(name: str | None) -> None:
    """List the registered algorithms, or NAME's config fields: default, type and what each does.

    Fields whose name starts with an underscore are internal and not listed.
    """
    if name is None:
        for key in sorted(ALGORITHMS):
            algorithm = get_algorithm(key)
            click.echo(f"{key:<11} {algorithm.config_class.__name__:<17} {_summary(algorithm)}")
        return
    config_class = get_algorithm(name).config_class
    defaults = config_class()
    click.echo(f"{name}: {config_class.__name__} (set with --config KEY=VALUE)")
    for key in _field_names(config_class):
        if any(part.startswith("_") for part in key.split(".")):
            continue  # internal
        value: Any = defaults
        cls, tp = config_class, None
        for part in key.split("."):
            value = getattr(value, part)
            owner, tp = cls, config_field_types(cls)[part]
            cls = tp if _is_dataclass_type(tp) else cls
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            continue  # its fields are listed with dotted keys
        kind = _describe(tp) if _settable(tp) else "a callable or class: not settable from the command line"
        head = f"  {key} = "
        click.echo(f"{head}{_shown(value, _WIDTH - len(head) - len(kind) - 4)}  ({kind})")
        doc = _field_docs(owner).get(key.split(".")[-1])
        if doc:
            click.echo(textwrap.fill(_first_sentence(doc), width=_WIDTH, initial_indent=" " * 6,
                                     subsequent_indent=" " * 6, break_on_hyphens=False))


@main.group("plan")
def plan_group() -> None:
    """Inspect an algorithm's plan without training it."""


@plan_group.command("show")
@click.argument("algo", callback=_algorithm_arg)
@click.option("--env", help="gymnasium env id (default: the config's env).")
@click.option("--config", "config_items", multiple=True, metavar="KEY=VALUE",
              help="Set a config field (repeatable), as for `flowrl train`.")
@click.option("--format", "fmt", type=click.Choice(["text", "dot", "mermaid"]), default="text", show_default=True,
              help="text: describe()'s tree; dot: Graphviz DOT (`dot -Tsvg`); mermaid: a Mermaid flowchart.")
def plan_show(algo: str, env: str | None, config_items: tuple[str, ...], fmt: str) -> None:
    """Build ALGO's plan and print its operator graph; nothing is sampled or trained, and nothing starts.

    The plan is built over stand-ins for its workers (and Ape-X's replay shards) that never run, so Ray, envs
    and models are not started; the graph is the one `flowrl train` runs with these options, shard for shard.
    """
    from flowrl import plan_graph

    algorithm = get_algorithm(algo)
    config, _ = _config_and_checkpoint(algorithm, [*config_items, *([f"env={env}"] if env is not None else [])], None)
    render = {"text": plan_graph.to_text, "dot": plan_graph.to_dot, "mermaid": plan_graph.to_mermaid}[fmt]
    try:
        with plan_graph.stand_in_plan(algorithm, config) as plan:
            plan.validate()
            click.echo(render(plan_graph.build(plan)))
    except ValueError as e:  # e.g. tree aggregation with too few workers: as Trainer(...) would say
        raise click.UsageError(str(e)) from None


@main.command("profile")
@click.argument("algo", callback=_algorithm_arg)
@click.option("--env", help="gymnasium env id (default: the config's env).")
@click.option("--config", "config_items", multiple=True, metavar="KEY=VALUE",
              help="Set a config field (repeatable), as for `flowrl train`.")
@click.option("--iters", type=click.IntRange(min=1), default=3, show_default=True, help="Training iterations to run.")
def profile(algo: str, env: str | None, config_items: tuple[str, ...], iters: int) -> None:
    """Train ALGO for --iters iterations with profiling on (config profile=true), then print the profile table.

    One row per operator of the plan, as `flowrl plan show` draws it: items in and out, seconds inside the
    operator and waiting for its upstream, its share of the wall time, and, where known, queue depths, requests
    in flight per shard and the staleness of the data learners trained on (learner updates behind). Nothing is
    logged or checkpointed.
    """
    algorithm = get_algorithm(algo)
    config, _ = _config_and_checkpoint(algorithm, [*config_items, *([f"env={env}"] if env is not None else [])], None)
    trainer = _make_trainer(algorithm, dataclasses.replace(config, profile=True))
    try:
        start = time.monotonic()
        for _ in range(iters):
            click.echo(_progress_line(trainer.train(), time.monotonic() - start))
        click.echo(trainer.plan.profile())
    finally:
        trainer.stop()
