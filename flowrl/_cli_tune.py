"""``flowrl tune``'s sweep (:mod:`flowrl.cli`): Ray started or joined, a Tune ``Tuner`` over :mod:`flowrl.tune`'s
Trainable with the ``--search`` space, the stop criteria and the scheduler, a sweep resumed with ``Tuner.restore``,
and the results table printed at the end.

Ray Tune is an optional extra (``pip install 'flowrl[tune]'``): ``flowrl tune`` checks that it imports before it
imports this module.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from ray import tune

from flowrl._cli_train import StopCriteria
from flowrl.algorithms import Algorithm
from flowrl.config import TrainerConfig

if TYPE_CHECKING:
    from ray.tune import ResultGrid

__all__ = ["SweepOptions", "SweepProgress", "TuneStop", "run_sweep", "resume_sweep"]

PROGRESS_EVERY_S = 30.0


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """How a sweep runs (everything but the trainable): kept in the sweep's record, so a resumed sweep runs the same."""

    search: tuple[str, ...]
    samples: int
    scheduler: str
    metric: str
    mode: str
    stop: StopCriteria
    checkpoint_freq: int
    max_concurrent: int | None


class SweepProgress(tune.Callback):
    """One line per trial that ends (its iterations, the metric and its searched values) and, every
    ``PROGRESS_EVERY_S`` seconds, one line of counts and the best trial so far (Tune's own tables are off)."""

    def __init__(self, metric: str, search: Sequence[str]) -> None:
        self.metric = metric
        self.keys = [item.partition("=")[0].strip() for item in search]
        self.last_line = 0.0

    def _params(self, trial: Any) -> str:
        return " ".join(f"{k}={_shown(trial.config.get(k))}" for k in self.keys)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        result = trial.last_result or {}
        click.echo(f"{_trial_name(trial.local_path or str(trial))} done: {result.get('training_iteration', 0)} "
                   f"iterations, {self.metric}={_shown(_value(result, self.metric))} ({self._params(trial)})")

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        click.echo(f"{_trial_name(trial.local_path or str(trial))} failed ({self._params(trial)}); see its "
                   f"error.txt", err=True)

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        now = time.monotonic()
        if now - self.last_line < PROGRESS_EVERY_S:
            return
        self.last_line = now
        counts = collections.Counter(t.status.lower() for t in trials)
        line = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        scored = [(v, t) for t in trials if not math.isnan(v := _value(t.last_result or {}, self.metric))]
        if scored:
            value, best = max(scored, key=lambda pair: pair[0])
            line += f"; best {self.metric} so far {_shown(value)} ({self._params(best)})"
        click.echo(f"sweep: {line}")


def _value(result: Mapping[str, Any], metric: str) -> float:
    value = result.get(metric)
    if value is None and "/" in metric:  # a nested key, as the trial reported it
        head, _, rest = metric.partition("/")
        value = (result.get(head) or {}).get(rest) if isinstance(result.get(head), Mapping) else None
    return float(value) if isinstance(value, (int, float)) else float("nan")


class TuneStop:
    """Tune's stopper for :class:`~flowrl._cli_train.StopCriteria`: a trial stops at the first criterion met."""

    def __init__(self, criteria: StopCriteria) -> None:
        self.criteria = criteria

    def __call__(self, trial_id: str, result: Mapping[Any, Any]) -> bool:
        return self.criteria.reason(_nested(result)) is not None


def _nested(result: Mapping[str, Any]) -> dict[str, Any]:
    """``evaluation/episode_reward_mean`` (Tune's flattened key) back under ``result["evaluation"]``."""
    nested: dict[str, Any] = {}
    for key, value in result.items():
        head, sep, rest = key.partition("/")
        if sep and head == "evaluation":
            nested.setdefault("evaluation", {})[rest] = value
        else:
            nested.setdefault(key, value)
    return nested


def _scheduler(options: SweepOptions) -> Any:
    if options.scheduler == "fifo":
        return None
    from ray.tune.schedulers import ASHAScheduler

    assert options.stop.iters is not None, "the command line asks ASHA for --stop-iters"
    return ASHAScheduler(time_attr="training_iteration", max_t=options.stop.iters,
                         grace_period=max(1, options.stop.iters // 4))


def _init_ray(address: str | None) -> None:
    from flowrl import runtime

    try:
        runtime.init(address)
    except ConnectionError as e:
        raise click.ClickException(f"could not join the Ray cluster at --address {address} ({e}); start it with "
                                   f"`ray start --head`, or drop --address for a local instance") from None


def _check_fits(trainable: Any, base: TrainerConfig) -> None:
    """Refuses trials the cluster can never hold (Tune would wait for them forever)."""
    from flowrl import executor

    bundles = trainable.default_resource_request({}).bundles
    total = executor.cluster_resources()
    for name in ("CPU", "GPU"):
        need = sum(b.get(name, 0) for b in bundles)
        if need > total.get(name, 0):
            raise click.UsageError(f"each trial asks for {need:g} {name} (1 for its learner and "
                                   f"{base.num_workers + base.evaluation_num_workers} remote workers) but the Ray "
                                   f"cluster has {total.get(name, 0):g}; lower num_workers (--config num_workers=0 "
                                   f"samples in the learner's process) or num_gpus")


def run_sweep(algorithm: Algorithm, base: TrainerConfig, options: SweepOptions, *, storage: Path, name: str,
              address: str | None) -> None:
    """Runs a new sweep into ``storage/name`` and prints its results table."""
    from flowrl.tune import SWEEP_RECORD, parse_search, sweep_record, trainable

    try:
        space = parse_search(algorithm, base, options.search)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--search'") from None
    experiment = storage / name
    if experiment.exists():
        raise click.BadParameter(f"{str(experiment)!r} already holds a sweep; continue it with --resume "
                                 f"{experiment}, or choose another --name", param_hint="'--name'")
    _init_ray(address)
    flowrl_trainable = trainable(algorithm, base)
    _check_fits(flowrl_trainable, base)
    experiment.mkdir(parents=True)
    record = sweep_record(algorithm, base, options.search, options=_options_data(options))
    (experiment / SWEEP_RECORD).write_text(json.dumps(record, indent=1))
    tuner = tune.Tuner(
        flowrl_trainable, param_space=space,
        tune_config=tune.TuneConfig(metric=options.metric, mode=options.mode, num_samples=options.samples,
                                    scheduler=_scheduler(options), max_concurrent_trials=options.max_concurrent),
        run_config=tune.RunConfig(name=name, storage_path=str(storage), stop=TuneStop(options.stop), verbose=0,
                                  callbacks=[SweepProgress(options.metric, options.search)],
                                  checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=options.checkpoint_freq,
                                                                          checkpoint_at_end=True)))
    _report(tuner.fit(), options, experiment, algorithm)


def resume_sweep(algorithm: Algorithm, experiment: Path, *, address: str | None) -> None:
    """Continues the sweep in ``experiment`` with ``Tuner.restore`` (unfinished and errored trials from their last
    checkpoints, finished ones kept) and prints its results table."""
    from flowrl.config import config_from_data
    from flowrl.tune import read_sweep_record, trainable

    try:
        record = read_sweep_record(experiment)
        if record["algorithm"] != algorithm.name:
            raise ValueError(f"{experiment} is a sweep of {record['algorithm']!r}, not {algorithm.name!r}; run "
                             f"`flowrl tune {record['algorithm']} --resume {experiment}`")
        base = config_from_data(algorithm.config_class, record["config"])
        options = _options_from_data(record["options"])
        _check_tune_state(experiment)
    except KeyError as e:
        raise click.BadParameter(f"{experiment / 'flowrl_sweep.json'} is malformed: it has no {e}; it was not written "
                                 f"by flowrl tune", param_hint="'--resume'") from None
    except (ValueError, TypeError) as e:
        raise click.BadParameter(str(e), param_hint="'--resume'") from None
    _init_ray(address)
    flowrl_trainable = trainable(algorithm, base)
    _check_fits(flowrl_trainable, base)
    tuner = tune.Tuner.restore(str(experiment.resolve()), trainable=flowrl_trainable, resume_unfinished=True,
                               resume_errored=True)
    _report(tuner.fit(), options, experiment, algorithm)


def _check_tune_state(experiment: Path) -> None:
    """Refuses a sweep whose Tune state file is missing or cut short: from one, ``Tuner.restore`` logs an error and
    silently starts an empty sweep in the same directory. Tune copies the file to storage in the background and not
    atomically, so a sweep killed during a copy leaves it so.

    Raises:
        ValueError: naming the file and what stays usable.
    """
    states = sorted(experiment.glob("experiment_state-*.json"), key=lambda p: p.stat().st_mtime_ns)
    if not states:
        raise ValueError(f"{str(experiment)!r} holds no experiment_state-*.json: Ray Tune never saved this sweep's "
                         f"state, so it cannot be resumed; start it again")
    try:
        json.loads(states[-1].read_bytes())
    except ValueError:
        raise ValueError(f"{states[-1]} is empty or cut short (the sweep was killed while Ray Tune was writing it), so "
                         f"Tune cannot resume the sweep and would start an empty one; start it again (its trials' "
                         f"checkpoints in {experiment} stay usable with flowrl evaluate)") from None


def _options_data(options: SweepOptions) -> dict[str, Any]:
    data = dataclasses.asdict(options)
    data["search"] = list(options.search)
    return data


def _options_from_data(data: Mapping[str, Any]) -> SweepOptions:
    return SweepOptions(**{**data, "search": tuple(data["search"]), "stop": StopCriteria(**data["stop"])})


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def _trial_name(path: str) -> str:
    """``PPO_04d05_00001`` of Tune's trial directory ``PPO_04d05_00001_1_lr=0.0002_2026-12-07_04-31-06``."""
    return "_".join(Path(path).name.split("_")[:3])


def _report(results: ResultGrid, options: SweepOptions, experiment: Path, algorithm: Algorithm) -> None:
    """The results table (one row per trial, best metric first), the best trial's checkpoint and how to resume."""
    from rich.console import Console
    from rich.table import Table

    keys = [item.partition("=")[0].strip() for item in options.search]
    rows = []
    for result in (results[i] for i in range(len(results))):
        metrics = result.metrics or {}
        value = _value(metrics, options.metric)
        rows.append((result, metrics, value))
    sign = -1 if options.mode == "max" else 1
    rows.sort(key=lambda row: (math.isnan(row[2]), sign * row[2] if not math.isnan(row[2]) else 0))
    table = Table(title=f"{len(rows)} trials, by {options.metric} ({options.mode})")
    for column in ("trial", *keys, "status", "iterations", "timesteps", options.metric):
        table.add_column(column, justify="left" if column in ("trial", "status") else "right")
    for result, metrics, value in rows:
        config = result.config or {}
        status = "error" if result.error is not None else "done"
        table.add_row(_trial_name(result.path), *(_shown(config.get(k)) for k in keys), status,
                      _shown(metrics.get("training_iteration", 0)), _shown(metrics.get("timesteps_total", 0)),
                      _shown(value))
    Console(width=max(100, 20 * (len(keys) + 5))).print(table)
    finished = [row for row in rows if not math.isnan(row[2])]
    if finished:
        best, metrics, value = finished[0]
        params = " ".join(f"{k}={_shown((best.config or {}).get(k))}" for k in keys)
        click.echo(f"best trial: {_trial_name(best.path)} ({params}) {options.metric}={_shown(value)}")
        if best.checkpoint is not None:
            click.echo(f"its checkpoint: {best.checkpoint.path}  (flowrl evaluate {best.checkpoint.path})")
    click.echo(f"sweep directory: {experiment}  (continue it with flowrl tune {algorithm.name} --resume {experiment})")
    if results.errors:
        raise click.ClickException(f"{len(results.errors)} trial(s) failed; their error.txt in {experiment} says why")
