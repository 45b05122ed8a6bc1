"""``flowrl train``'s run loop (:mod:`flowrl.cli`): the trainer started as the options say, stop criteria, the
live progress display, stop signals (Ctrl-C, SIGTERM, the ``--stop-time`` deadline) and writes that fail (a full
disk), each ending training with its last report checkpointed and the logs whole.

Examples:
    >>> StopCriteria(timesteps=1000).reason({"timesteps_total": 1200})
    'timesteps_total 1200 >= 1000'
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal, Mapping, Sequence

import click

from flowrl._cli_config import _field_default
from flowrl.algorithms import Algorithm
from flowrl.config import TrainerConfig, config_to_data
from flowrl.logger import PROGRESS_CSV, TB_DIR, RunLogger, plot_progress, record_checkpoint, record_target
from flowrl.trackers import Tracker, make_tracker

if TYPE_CHECKING:
    from flowrl.trainer import Trainer

__all__ = ["StopCriteria"]


@dataclass(frozen=True)
class StopCriteria:
    """When ``flowrl train`` stops: the first criterion a result meets (all are totals over the run, so a
    resumed run counts the iterations, steps and time before its checkpoint).

    Attributes:
        reward: ``episode_reward_mean >= reward``; with ``reward_from="evaluation"``, the evaluation's
            (``result["evaluation"]["episode_reward_mean"]``, reported every ``evaluation_interval`` iterations).
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
        >>> StopCriteria(reward=450, reward_from="evaluation").reason(
        ...     {"episode_reward_mean": 460.0, "evaluation": {"episode_reward_mean": 300.0}}) is None
        True
    """

    reward: float | None = None
    timesteps: int | None = None
    time_s: float | None = None
    iters: int | None = None
    reward_from: Literal["training", "evaluation"] = "training"

    def reason(self, result: Mapping[str, Any]) -> str | None:
        """Why ``result`` ends training, or ``None`` to go on."""
        reward_key = "episode_reward_mean" if self.reward_from == "training" else "evaluation/episode_reward_mean"
        checks = ((reward_key, self.reward), ("timesteps_total", self.timesteps),
                  ("time_total_s", self.time_s), ("training_iteration", self.iters))
        for key, bound in checks:
            value = result.get(key) if "/" not in key else result.get("evaluation", {}).get("episode_reward_mean")
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
        >>> _progress_line({"training_iteration": 2, "timesteps_total": 20, "episode_reward_mean": 9.5,
        ...                 "evaluation": {"episode_reward_mean": 21.0}}, 1.0)[-16:]
        '  evaluation 21.0'
    """
    reward = result.get("episode_reward_mean")
    per_s = result.get("timesteps_this_iter", 0) / max(result.get("time_this_iter_s", 0.0), 1e-9)
    if reward is None or math.isnan(reward):
        shown = f"{'-':>7} (no episode finished yet)"
    else:
        spread = (f" (min {result['episode_reward_min']:.0f}, max {result['episode_reward_max']:.0f})"
                  if "episode_reward_min" in result and "episode_reward_max" in result else "")
        shown = f"{float(reward):7.1f}{spread}"
    evaluated = result.get("evaluation", {}).get("episode_reward_mean")
    return (f"iter {result['training_iteration']:4d}  env steps {result.get('timesteps_total', 0):8d}  "
            f"reward {shown}  {per_s:6.0f} steps/s  elapsed {elapsed_s:6.1f} s"  # ~97 columns
            + ("" if evaluated is None else f"  evaluation {float(evaluated):.1f}"))


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


def _local_cpus(config: TrainerConfig) -> int:
    """Logical CPUs for a local Ray instance: the machine's, or enough to hold the workers (as the main job
    always did: two 1-CPU workers on a 2-core machine get 3)."""
    return max(os.cpu_count() or 1, math.ceil(config.num_workers * config.num_cpus_per_worker) + 1)


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

    local = config.executor == "local"
    if not local and address is None and config.num_workers * config.num_cpus_per_worker > (os.cpu_count() or 1):
        click.echo(f"num_workers={config.num_workers} (x {config.num_cpus_per_worker:g} CPU each) is more than this "
                   f"machine's {os.cpu_count() or 1} CPUs: kept as set, the workers share the cores; lower "
                   f"num_workers for less contention", err=True)
    if not local and (address is not None or config.num_workers):
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
            return Trainer.from_checkpoint(checkpoint, env=config.env if isinstance(config.env, str) else None,
                                           executor=config.executor)
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


def _make_trackers(names: Sequence[str], run_dir: Path, config: TrainerConfig,
                   resume_iteration: int | None) -> list[Tracker]:
    """The ``--logger`` trackers for the run (continuing their runs when it resumes from their last iteration); a
    tracker whose package is missing is a usage error naming the extra."""
    made: list[Tracker] = []
    try:
        for name in names:
            made.append(make_tracker(name, run_dir, config_to_data(config)["fields"], resume_iteration=resume_iteration))
            click.echo(f"{name}: {made[-1].where}" + (f" ({made[-1].note})" if made[-1].note else ""))
    except ImportError as e:
        for tracker in made:
            tracker.close()
        raise click.UsageError(str(e)) from e
    return made


def _train(algorithm: Algorithm, config: TrainerConfig, stop: StopCriteria, *, run_dir: Path,
           checkpoint: Path | None, address: str | None, checkpoint_dir: Path, checkpoint_freq: int,
           workers_chosen: bool = True, trackers: Sequence[str] = ()) -> None:
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
                    logs = RunLogger(run_dir, keep_through_iteration=completed if checkpoint else None,
                                     trackers=_make_trackers(trackers, run_dir, config,
                                                             completed if checkpoint else None))
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
    evaluated = result.get("evaluation", {}).get("episode_reward_mean")
    shown = (f"return {result['episode_reward_mean']:.1f}" if "episode_reward_mean" in result
             else f"evaluation return {evaluated:.1f}" if evaluated is not None else "no episode finished")
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
