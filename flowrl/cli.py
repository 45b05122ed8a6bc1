"""The ``flowrl`` command line (also ``python -m flowrl ...``): train, evaluate, plot, sweep, list algorithms, and
look inside a plan (its operator graph; a per-operator profile of a short run).

::

    flowrl train ppo --env CartPole-v1 --config lr=3e-4 --stop-reward 150
    flowrl evaluate runs/ppo_CartPole-v1_20250101-120000 --episodes 20
    flowrl plot runs/ppo_CartPole-v1_20250101-120000
    flowrl tune ppo --search "lr=loguniform(1e-4,1e-2)" --samples 8 --scheduler asha --stop-iters 20
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

This module holds the commands and their argument checks; ``--config`` parsing lives in
:mod:`flowrl._cli_config` and ``train``'s run loop (progress, stop signals, failed writes) in
:mod:`flowrl._cli_train`. Everything importable from ``flowrl.cli`` before that split still is.

Examples:
    >>> from click.testing import CliRunner
    >>> print(CliRunner().invoke(main, ["train", "ppo", "--config", "lr=-1", "--stop-iters", "1"]).output)
    Usage: flowrl train [OPTIONS] ALGO
    Try 'flowrl train --help' for help.
    <BLANKLINE>
    Error: Invalid value for '--config': PPOConfig rejects lr=-1: lr=-1.0 must be a number > 0
    <BLANKLINE>
    >>> print(CliRunner().invoke(main, ["train", "ppo", "--config", "lrr=0.1", "--stop-iters", "1"]).output)
    Usage: ...
    Error: Invalid value for '--config': lrr=0.1: PPOConfig has no field 'lrr'; did you mean 'lr'? ...
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import math
import os
import re
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Sequence

import click

from flowrl._cli_config import _describe, _field_default, _field_names, _settable, build_config, parse_overrides
from flowrl._cli_train import StopCriteria, _make_trainer, _progress_line, _train
from flowrl._cli_train import _Stopped, _StopSignals  # re-exported: tests import them from flowrl.cli
from flowrl._config_hints import field_hints
from flowrl.algorithms import ALGORITHMS, Algorithm, get_algorithm
from flowrl.config import TrainerConfig
from flowrl.logger import LEARNING_CURVE, PROGRESS_CSV, plot_progress, recorded_checkpoint, recorded_checkpoint_dir

__all__ = ["main", "MAIN_JOB", "StopCriteria", "build_config", "parse_overrides"]

#: ``python -m flowrl`` with no arguments: PPO on CartPole-v1 with its tuned preset (:mod:`flowrl.presets`: two
#: rollout workers and RLlib's tuned settings, train batch 4000, minibatch 128, 6 epochs, lr 3e-4), until the
#: smoothed return reaches 450 or 300k env steps have been sampled.
MAIN_JOB = ("train", "ppo", "--env", "CartPole-v1", "--tuned", "--seed", "0", "--stop-reward", "450",
            "--stop-timesteps", "300000")


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


# -- commands -----------------------------------------------------------------------------------

@click.group(name="flowrl", context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """flowrl: distributed RL as a dataflow. `python -m flowrl` alone runs the main job (PPO on CartPole-v1)."""
    # As under `python -m flowrl`, a module in the current directory is importable by path (`--config
    # callbacks=my_metrics:MyCallbacks`); Ray's workers get the driver's directory on their path too.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


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
@click.option("--stop-reward-from", type=click.Choice(["training", "evaluation"]),
              help="Whose episode_reward_mean --stop-reward reads: the training episodes', or the evaluation's (needs "
                   "--config evaluation_interval=K). Default: the evaluation's for a run that only reads a dataset "
                   "(--input without input_mix: it has no training episodes), else the training episodes'.")
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
@click.option("--input", "input_dir", metavar="DIR",
              help="Learn from the experience recorded in DIR (by a run with --output DIR) instead of sampling the "
                   "env (same as --config input=DIR); MARWIL and BC are made for it.")
@click.option("--output", "output_dir", metavar="DIR",
              help="Record every experience the workers sample into DIR as Parquet files of whole episodes (same as "
                   "--config output=DIR).")
@click.option("--address", callback=_address_arg,
              help="Join a Ray cluster ('auto' or 'host:port') instead of starting a local instance.")
@click.option("--tuned/--no-tuned", default=False, show_default=True,
              help="Apply the tuned preset for ALGO on the env, where one exists (see flowrl/presets.py and the "
                   "README's table); --config values win over it.")
@click.option("--logger", "trackers", default="", callback=lambda ctx, param, v: _trackers_arg(v), metavar="NAMES",
              help="Also log to these experiment trackers (comma-separated): wandb (offline unless you are logged in "
                   "or WANDB_MODE says so), mlflow (MLFLOW_TRACKING_URI, else RUN_DIR/mlflow.db). Needs "
                   "flowrl[wandb] / flowrl[mlflow].")
@click.option("--local", "local", is_flag=True,
              help="Run every worker and actor in this process, with no Ray (executor=local): deterministic, and a "
                   "breakpoint() in an env, a loss or an operator stops here. A resumed run runs on Ray "
                   "unless --local is given again.")
def train(algo: str, env: str | None, config_items: tuple[str, ...], stop_reward: float | None,
          stop_reward_from: Literal["training", "evaluation"] | None, stop_timesteps: int | None,
          stop_time: float | None, stop_iters: int | None, checkpoint_dir: Path | None, checkpoint_freq: int,
          resume: Path | None, log_dir: Path | None, seed: int | None, input_dir: str | None, output_dir: str | None,
          address: str | None, tuned: bool, trackers: tuple[str, ...], local: bool) -> None:
    """Train ALGO (a registered algorithm, see `flowrl algorithms`) until a stop criterion is met.

    Logs go to the run directory (progress.csv, result.json, tb/), checkpoints to RUN_DIR/checkpoints,
    and the learning curve to RUN_DIR/learning_curve.png. With --resume, the checkpoint's saved config is
    used; --env, --config and --seed may only repeat its values. Resuming an earlier checkpoint of a run makes it
    the run's latest and drops the log rows past it (saying so); --log-dir may not name another run's directory.

    Ctrl-C or SIGTERM abandons the report in progress, checkpoints the last finished one and exits with 130 or
    143; a full disk ends training with one line naming the path, the logs whole and the last checkpoint intact.
    """
    stop = StopCriteria(reward=stop_reward, timesteps=stop_timesteps, time_s=stop_time, iters=stop_iters,
                        reward_from=stop_reward_from or "training")
    if stop.empty:
        raise click.UsageError("give at least one stop criterion: --stop-reward R, --stop-timesteps N, "
                               "--stop-time S or --stop-iters N")
    algorithm = get_algorithm(algo)
    items = [*config_items, *([f"env={env}"] if env is not None else []),
             *([f"seed={seed}"] if seed is not None else []),
             *([f"input={input_dir}"] if input_dir is not None else []),
             *([f"output={output_dir}"] if output_dir is not None else [])]
    note = None
    if resume is None:
        items, note = _with_preset(algorithm, env, items, tuned=tuned)
    elif tuned:
        raise click.BadParameter("a resumed run keeps its saved config; drop --tuned", param_hint="'--tuned'")
    if local and address is not None:
        raise click.UsageError("--local runs everything in this process; it cannot join a cluster: drop --local or "
                               "--address")
    config, checkpoint = _config_and_checkpoint(algorithm, items, resume)
    if stop_reward_from is None and config.input is not None and config.input_mix is None:
        stop_reward_from = "evaluation"  # a run that only reads a dataset has no training episodes
        stop = dataclasses.replace(stop, reward_from=stop_reward_from)
        if stop_reward is not None and not config.evaluation_interval:
            raise click.BadParameter("a run that reads a dataset (--input) has no training episodes, so "
                                     "--stop-reward reads the evaluation's reward, and this run does not evaluate: "
                                     "add --config evaluation_interval=K", param_hint="'--stop-reward'")
    if stop_reward_from == "evaluation" and not config.evaluation_interval:
        raise click.BadParameter("the run does not evaluate: add --config evaluation_interval=K (evaluate every K "
                                 "iterations), or drop --stop-reward-from evaluation", param_hint="'--stop-reward-from'")
    if local or checkpoint is not None:  # how it runs, not what it learned: resumed, it runs on Ray unless --local
        try:
            config = dataclasses.replace(config, executor="local" if local else "ray")
        except ValueError as e:  # an algorithm that cannot run in one process (DD-PPO) says so
            raise click.BadParameter(str(e), param_hint="'--local'") from None
    if note is not None:
        click.echo(note, err=True)
    run_dir = _run_dir(log_dir, checkpoint, algorithm, config)
    _check_writable_dir(run_dir, "'--log-dir'")
    _check_writable_dir(checkpoint_dir or run_dir / "checkpoints", "'--checkpoint-dir'")
    workers_chosen = any(item.partition("=")[0].strip() == "num_workers" for item in items)
    _train(algorithm, config, stop, run_dir=run_dir, checkpoint=checkpoint, address=address,
           checkpoint_dir=checkpoint_dir or run_dir / "checkpoints", checkpoint_freq=checkpoint_freq,
           workers_chosen=workers_chosen, trackers=trackers)


def _trackers_arg(value: str) -> tuple[str, ...]:
    from flowrl.trackers import parse_trackers

    try:
        return parse_trackers(value)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--logger'") from e


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
@click.argument("algo", callback=_algorithm_arg)
@click.option("--env", help="gymnasium env id (default: the config's env).")
@click.option("--config", "config_items", multiple=True, metavar="KEY=VALUE",
              help="The base config every trial starts from, as `flowrl train --config` (repeatable).")
@click.option("--search", "search_items", multiple=True, metavar="KEY=EXPR",
              help="A searched config key (repeatable): uniform(a,b), loguniform(a,b), quniform(a,b,q), randint(a,b), "
                   "lograndint(a,b), choice(x,y,...) or grid(x,y,...), e.g. --search 'lr=loguniform(1e-4,1e-2)'.")
@click.option("--samples", type=click.IntRange(min=1), default=1, show_default=True,
              help="Trials drawn from the search space (each grid value gets this many).")
@click.option("--scheduler", type=click.Choice(["fifo", "asha"]), default="fifo", show_default=True,
              help="asha stops weak trials early (ASHA over training_iteration up to --stop-iters, its first cut after a "
                   "quarter of them).")
@click.option("--metric", default="episode_reward_mean", show_default=True,
              help="The result key trials are ranked by (evaluation/episode_reward_mean with evaluation on).")
@click.option("--mode", type=click.Choice(["max", "min"]), default="max", show_default=True)
@click.option("--stop-reward", type=float, callback=_finite_arg, help="A trial stops when its episode_reward_mean reaches "
              "this.")
@click.option("--stop-timesteps", type=click.IntRange(min=1), help="A trial stops at this many env steps.")
@click.option("--stop-time", type=click.FloatRange(min=0, min_open=True), callback=_finite_arg,
              help="A trial stops after this many seconds of training.")
@click.option("--stop-iters", type=click.IntRange(min=1), help="A trial stops at this training_iteration.")
@click.option("--checkpoint-freq", type=click.IntRange(min=0), default=1, show_default=True,
              help="Checkpoint every N iterations (0: only at the end); a resumed trial goes on from its last one.")
@click.option("--storage-path", type=click.Path(file_okay=False, path_type=Path), default=Path("runs") / "tune",
              show_default=True, help="Where sweeps are kept: one directory per sweep, STORAGE/NAME.")
@click.option("--name", help="The sweep's directory name (default: ALGO_ENV_YYYYmmdd-HHMMSS).")
@click.option("--resume", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Continue the sweep in this directory (Tune's Tuner.restore): unfinished and failed trials go on "
                   "from their last checkpoints, finished ones are kept. No other option but --address may be given.")
@click.option("--max-concurrent", type=click.IntRange(min=1), help="At most this many trials at once (default: as "
              "many as the cluster's CPUs hold).")
@click.option("--seed", type=click.IntRange(min=0), help="The base config's seed (same as --config seed=S).")
@click.option("--tuned/--no-tuned", default=False, show_default=True,
              help="Start from the tuned preset for ALGO on --env, as `flowrl train --tuned`.")
@click.option("--address", callback=_address_arg,
              help="Join this Ray cluster (host:port, ray://host:port or auto) instead of starting a local one.")
def tune(algo: str, env: str | None, config_items: tuple[str, ...], search_items: tuple[str, ...], samples: int,
         scheduler: str, metric: str, mode: str, stop_reward: float | None, stop_timesteps: int | None,
         stop_time: float | None, stop_iters: int | None, checkpoint_freq: int, storage_path: Path, name: str | None,
         resume: Path | None, max_concurrent: int | None, seed: int | None, tuned: bool, address: str | None) -> None:
    """Sweep ALGO's hyperparameters with Ray Tune: --samples trials drawn from the --search space, each a Trainer
    from the base config (--config, --env) with its searched keys replaced, stopped by the stop criteria (and by
    ASHA with --scheduler asha); then a table of the trials, best first. Needs `pip install 'flowrl[tune]'`.

    Unless --config sets num_workers, each trial samples in its learner's process (num_workers=0), so as many
    trials run at once as the cluster has CPUs. Each trial's logs (progress.csv, result.json, TensorBoard) and
    checkpoints are in STORAGE/NAME/<trial>; `flowrl evaluate` takes a trial's checkpoint directory.
    """
    try:
        import ray.tune  # noqa: F401
    except ImportError as e:  # Ray without its tune extra (pandas, pyarrow, ...)
        raise click.ClickException(f"flowrl tune needs Ray Tune, which does not import here ({e}); install it with "
                                   f"pip install 'flowrl[tune]'") from None
    from flowrl._cli_tune import SweepOptions, resume_sweep, run_sweep

    algorithm = get_algorithm(algo)
    if resume is not None:
        ctx = click.get_current_context()
        given = [p.opts[0] for p in ctx.command.params if isinstance(p, click.Option) and p.name not in
                 ("resume", "address") and ctx.get_parameter_source(p.name or "") == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise click.UsageError(f"--resume continues the sweep as it was started; drop {', '.join(given)}")
        resume_sweep(algorithm, resume, address=address)
        return
    stop = StopCriteria(reward=stop_reward, timesteps=stop_timesteps, time_s=stop_time, iters=stop_iters)
    if stop.empty:
        raise click.UsageError("give at least one stop criterion: --stop-iters N, --stop-timesteps N, --stop-time S "
                               "or --stop-reward R")
    if scheduler == "asha" and stop_iters is None:
        raise click.BadParameter("ASHA needs the most iterations a trial may run: add --stop-iters N",
                                 param_hint="'--scheduler'")
    items = [*config_items, *([f"env={env}"] if env is not None else []), *([f"seed={seed}"] if seed is not None else [])]
    items, note = _with_preset(algorithm, env, items, tuned=tuned)
    if not any(item.partition("=")[0].strip() == "num_workers" for item in config_items):  # the sweep is the parallelism
        items = [item for item in items if item.partition("=")[0].strip() != "num_workers"] + ["num_workers=0"]
    base, _ = _config_and_checkpoint(algorithm, items, None)
    if note is not None:
        click.echo(note, err=True)
    sweep_name = name or f"{algorithm.name}_{_env_name(base.env)}_{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    if "/" in sweep_name or sweep_name in (".", ".."):
        raise click.BadParameter(f"{sweep_name!r} is not a directory name; give a plain name", param_hint="'--name'")
    storage = storage_path.resolve()
    _check_writable_dir(storage, "'--storage-path'")
    options = SweepOptions(search=tuple(search_items), samples=samples, scheduler=scheduler, metric=metric, mode=mode,
                           stop=stop, checkpoint_freq=checkpoint_freq, max_concurrent=max_concurrent)
    run_sweep(algorithm, base, options, storage=storage, name=sweep_name, address=address)


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
        cls: type = config_class
        for part in key.split("."):
            value = getattr(value, part)
            owner, hint = cls, field_hints(cls)[part]
            cls = hint.config_class or cls
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            continue  # its fields are listed with dotted keys
        kind = _describe(hint) if _settable(hint) else "a callable or class: not settable from the command line"
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
