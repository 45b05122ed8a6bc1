"""Run logs: per ``train()`` result, a row of ``progress.csv``, a line of ``result.json`` and TensorBoard
scalars; and the learning-curve plot drawn from ``progress.csv``.

A run directory holds:

- ``progress.csv``: one row per result, the result's numeric entries flattened with ``/``
  (``timers/learn_time_ms``, ``info/num_steps_trained``, ``info/learner/default_policy/...``; lists such
  as ``hist_stats`` and strings are left out). The header is fixed by the first row. A key that first
  appears later (learner stats that start only once learning starts) widens the header: the file is
  rewritten once with the new column, empty in the earlier rows, so no column is ever dropped. A key
  missing from a row leaves its cell empty.
- ``result.json``: every result whole, one JSON document per line (numpy values as numbers and lists;
  NaN as ``NaN``, as Python's ``json`` writes it).
- ``tb/``: TensorBoard event files (``tensorboardX``) with one scalar per flattened key, at
  ``global_step = timesteps_total`` (``tensorboard --logdir runs``); a NaN or infinite value is not sent.
- ``learning_curve.png``: :func:`plot_progress`'s plot of ``episode_reward_mean`` against
  ``timesteps_total``, with the min/max band, each policy's return in a multi-agent run, and the target
  return when one is known.
- ``run_info.json``: the run's own record: the target return (``flowrl train --stop-reward``), for the plot
  (:func:`record_target`), and which checkpoint is the run's latest and where its checkpoints go
  (:func:`record_checkpoint`), so that ``flowrl evaluate RUN`` and ``--resume RUN`` take the newest branch
  of a run that was resumed from an earlier checkpoint, not the highest number on disk.

Each row reaches ``progress.csv`` and ``result.json`` whole or not at all: it is appended in one write, and a
failed write (a full disk: ``ENOSPC``, a file size limit: ``EFBIG``) is cut back off both files before the
error (an ``OSError`` naming the file) is raised. Rewrites (a widened header, rows dropped on resume,
``run_info.json``) go to a file beside, which is renamed over the old one, so a crash leaves the old or the
new file, never a mix.

Examples:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with RunLogger(d, tensorboard=False) as logs:
    ...         logs.log({"training_iteration": 1, "timesteps_total": 100, "episode_reward_mean": 20.0})
    ...         logs.log({"training_iteration": 2, "timesteps_total": 200, "episode_reward_mean": 31.5,
    ...                   "info": {"learner": {"loss": 0.25}}})
    ...     print(open(logs.progress_csv).read().strip())
    ...     png = plot_progress(d)
    ...     png.name, png.read_bytes()[:4] == b"\\x89PNG"
    training_iteration,timesteps_total,episode_reward_mean,info/learner/loss
    1,100,20.0,
    2,200,31.5,0.25
    ('learning_curve.png', True)
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from flowrl._checkpoint import fsync_dir

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from flowrl.trackers import Tracker

__all__ = ["RunLogger", "flatten_result", "plot_progress", "learning_curve", "record_target", "PROGRESS_CSV",
           "record_checkpoint", "recorded_checkpoint", "recorded_checkpoint_dir", "RESULT_JSON", "TB_DIR",
           "LEARNING_CURVE", "RUN_INFO"]

PROGRESS_CSV, RESULT_JSON, TB_DIR, LEARNING_CURVE = "progress.csv", "result.json", "tb", "learning_curve.png"
RUN_INFO = "run_info.json"  # the run's record: {"target_return": R, "latest_checkpoint": P, "checkpoint_dir": D}


def flatten_result(result: Mapping[str, Any], prefix: str = "") -> dict[str, int | float]:
    """The numeric entries of a (nested) result dict, keyed by their ``/``-joined path; bools as 0/1.

    Examples:
        >>> flatten_result({"timesteps_total": 4000, "timers": {"learn_time_ms": 2.5}, "ok": True,
        ...                 "hist_stats": {"episode_reward": [9.0, 11.0]}, "env": "CartPole-v1"})
        {'timesteps_total': 4000, 'timers/learn_time_ms': 2.5, 'ok': 1}
    """
    flat: dict[str, int | float] = {}
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_result(value, f"{name}/"))
        elif isinstance(value, (bool, np.bool_)):
            flat[name] = int(value)
        elif isinstance(value, (int, float, np.integer, np.floating)):
            flat[name] = value.item() if isinstance(value, np.generic) else value
    return flat


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


def _iteration(row: Mapping[str, Any]) -> float:
    try:
        return float(row.get("training_iteration") or "nan")
    except (TypeError, ValueError):
        return math.nan


class RunLogger:
    """Writes each ``train()`` result into a run directory: ``progress.csv``, ``result.json`` and ``tb/``.

    It appends to the files a directory already holds (the header of an existing ``progress.csv`` is
    kept), so a resumed run continues its logs.

    Args:
        run_dir: the run directory (created if missing).
        keep_through_iteration: on resume, the checkpoint's ``training_iteration``: rows and lines of
            later iterations (trained after that checkpoint and now trained again) are dropped first,
            so every iteration is logged once; :attr:`dropped` counts them. ``None`` keeps everything.
        tensorboard: also write TensorBoard events under ``run_dir/tb``.
        trackers: experiment trackers (:mod:`flowrl.trackers`: W&B, MLflow) that get the same finite scalars as
            TensorBoard, at the same step; closed with the logger.

    Attributes:
        dropped: how many rows (of ``progress.csv``, else lines of ``result.json``) ``keep_through_iteration``
            dropped.
    """

    def __init__(self, run_dir: str | Path, *, keep_through_iteration: int | None = None,
                 tensorboard: bool = True, trackers: Sequence[Tracker] = ()) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.progress_csv = self.run_dir / PROGRESS_CSV
        self.result_json = self.run_dir / RESULT_JSON
        self.tb_dir = self.run_dir / TB_DIR
        self._header: list[str] = []
        if self.progress_csv.exists():
            with open(self.progress_csv, newline="") as f:
                self._header = list(csv.DictReader(f).fieldnames or [])
        self.dropped = 0
        if keep_through_iteration is not None:
            self.dropped = self._truncate_after(keep_through_iteration)
        self.trackers = list(trackers)
        self._writer: Any = None
        if tensorboard:
            from tensorboardX import SummaryWriter  # imported here: it pulls in protobuf

            self._writer = SummaryWriter(str(self.tb_dir))

    def _truncate_after(self, iteration: int) -> int:
        dropped_rows = dropped_lines = 0
        if self.progress_csv.exists():
            with open(self.progress_csv, newline="") as f:
                rows = list(csv.DictReader(f))
            kept_rows = [row for row in rows if not _iteration(row) > iteration]
            dropped_rows = len(rows) - len(kept_rows)
            if dropped_rows:
                self._write_csv(kept_rows, self._header)
        if self.result_json.exists():
            lines, kept = self.result_json.read_text().splitlines(), []
            for line in lines:
                try:
                    later = _iteration(json.loads(line)) > iteration
                except ValueError:  # a line cut short by a crash
                    later = True
                if not later:
                    kept.append(line + "\n")
            dropped_lines = len(lines) - len(kept)
            if dropped_lines:
                _replace_text(self.result_json, "".join(kept))
        return dropped_rows or dropped_lines

    def _write_csv(self, rows: list[dict[str, Any]], header: list[str]) -> None:
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, header, restval="", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        _replace_text(self.progress_csv, text.getvalue())

    def log(self, result: Mapping[str, Any]) -> None:
        """Appends one result to ``progress.csv``, ``result.json`` and the TensorBoard events."""
        flat = flatten_result(result)
        known = set(self._header)
        new_keys = [key for key in flat if key not in known]
        if new_keys or not self.progress_csv.exists():
            rows: list[dict[str, Any]] = []
            if self.progress_csv.exists():
                with open(self.progress_csv, newline="") as f:
                    rows = list(csv.DictReader(f))
            self._write_csv(rows, self._header + new_keys)  # widened once per new key, never narrowed
            self._header += new_keys
        if self._writer is not None:  # first: a TensorBoard write that fails leaves no row of this result
            step = int(result.get("timesteps_total", result.get("training_iteration", 0)))
            try:
                for key, value in flat.items():
                    if math.isfinite(value):  # a nan/inf (a diverged loss) stays in the CSV and JSON; TensorBoard
                        self._writer.add_scalar(key, value, global_step=step)  # would only warn about it
                self._writer.flush()
            except OSError as e:
                _abandon(self._writer)
                self._writer = None
                raise OSError(e.errno, e.strerror, str(self.tb_dir)) from e
        if self.trackers:
            step = int(result.get("timesteps_total", result.get("training_iteration", 0)))
            finite = {key: value for key, value in flat.items() if math.isfinite(value)}
            for tracker in self.trackers:
                tracker.log(finite, step)
        row = io.StringIO(newline="")
        csv.DictWriter(row, self._header, restval="", extrasaction="ignore").writerow(flat)
        _append_whole([(self.progress_csv, row.getvalue()),
                       (self.result_json, json.dumps(result, default=_json_default) + "\n")])

    def close(self) -> None:
        """Closes the TensorBoard writer (the CSV and JSON files are closed after every write).

        Raises:
            OSError: its last events could not be written (naming ``tb/``).
        """
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.close()
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except OSError as e:
                _abandon(writer)
                raise OSError(e.errno, e.strerror, str(self.tb_dir)) from e

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.close()
        except OSError:
            if exc is None:
                raise
            # else the error that ends the block is the one to report (often the same full disk)


def _replace_text(path: Path, text: str) -> None:
    """Replaces ``path``'s content atomically: written (and fsynced) beside it, then renamed over it; a failed
    write removes the file beside and leaves ``path`` as it was.

    Raises:
        OSError: the write failed (e.g. a full disk), naming ``path``.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(text.encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)  # the rename itself survives a power loss
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class _DroppedEvents:
    """Stands in for the event file of a TensorBoard writer given up by :func:`_abandon`: writes nothing."""

    def write_event(self, event: Any) -> None:
        return None

    def flush(self) -> None:
        return None


def _abandon(writer: Any) -> None:
    """Gives up a ``tensorboardX.SummaryWriter`` whose write failed (a full disk). Left alone, tensorboardX would
    retry the write when closed and again at exit, and its writer thread would fail at exit, each time printing a
    traceback after flowrl's one-line error; so (through tensorboardX internals, each looked up with a default)
    its writer thread drops what is still queued and stops, and its event writers are marked closed."""
    for file_writer in (getattr(writer, "all_writers", None) or {}).values():
        events = getattr(file_writer, "event_writer", None)
        worker = getattr(events, "_worker", None)
        if worker is not None and hasattr(worker, "_record_writer") and callable(getattr(worker, "stop", None)):
            worker._record_writer = _DroppedEvents()
            with contextlib.suppress(Exception):
                worker.stop()
        if events is not None and hasattr(events, "_closed"):
            events._closed = True


def _append_whole(parts: list[tuple[Path, str]]) -> None:
    """Appends each text to its file, all or none: a failed or interrupted write cuts every file back to its
    size before, so no file ends in half a row and no file holds a row the others lack.

    Raises:
        OSError: a write failed (e.g. a full disk), naming the file.
    """
    done: list[tuple[Any, int]] = []
    try:
        for path, text in parts:
            f = open(path, "ab", buffering=0)
            done.append((f, f.seek(0, os.SEEK_END)))
            data = memoryview(text.encode())
            try:
                while data:
                    data = data[f.write(data) or 0:]
            except OSError as e:
                raise OSError(e.errno, e.strerror, str(path)) from e
    except BaseException:
        for f, size in done:
            with contextlib.suppress(OSError):  # shrinking a file does not need free space
                f.truncate(size)
        raise
    finally:
        for f, _ in done:
            f.close()


def _column(rows: list[dict[str, str]], key: str) -> np.ndarray:
    values = []
    for row in rows:
        try:
            values.append(float(row.get(key) or "nan"))
        except ValueError:
            values.append(math.nan)
    return np.array(values, dtype=np.float64)


def _progress_csv(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    csv_path = run_dir if run_dir.suffix == ".csv" else run_dir / PROGRESS_CSV
    if not csv_path.is_file():
        raise ValueError(f"{csv_path} does not exist; pass a run directory written by `flowrl train` (RunLogger)")
    return csv_path


def _run_info(run_dir: Path) -> dict[str, Any]:
    """``run_dir/run_info.json`` (``{}`` when there is none).

    Raises:
        ValueError: it is not a JSON object (the message names the file and the fix).
    """
    path = run_dir / RUN_INFO
    if not path.is_file():
        return {}
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is unreadable ({e}); delete it to let flowrl pick the highest-numbered "
                         f"checkpoint_* of the run") from None
    if not isinstance(info, dict):
        raise ValueError(f"{path} holds {type(info).__name__}, not a JSON object; delete it to let flowrl pick "
                         f"the highest-numbered checkpoint_* of the run")
    return info


def _update_run_info(run_dir: Path, **entries: Any) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    _replace_text(run_dir / RUN_INFO, json.dumps({**_run_info(run_dir), **entries}) + "\n")


def _relative_to(path: Path, run_dir: Path) -> str:
    """``path`` relative to ``run_dir`` when inside it (a moved run directory keeps its record), else absolute."""
    path, run_dir = Path(os.path.abspath(path)), Path(os.path.abspath(run_dir))
    return str(path.relative_to(run_dir)) if path.is_relative_to(run_dir) else str(path)


def record_target(run_dir: str | Path, target: float | None) -> None:
    """Records the return a run aims at (``flowrl train --stop-reward``) in ``run_dir/run_info.json``, so that
    :func:`plot_progress` draws it later too; ``None`` keeps what an earlier run recorded."""
    if target is None:
        return
    _update_run_info(Path(run_dir), target_return=float(target))


def _recorded_target(run_dir: Path) -> float | None:
    value = _run_info(run_dir).get("target_return")
    return None if value is None else float(value)


def record_checkpoint(run_dir: str | Path, checkpoint: str | Path, *, checkpoint_dir: str | Path) -> None:
    """Records ``checkpoint`` as the run's latest, and ``checkpoint_dir`` as where the run writes its
    checkpoints, in ``run_dir/run_info.json`` (rewritten atomically). The run's ``progress.csv`` and
    ``result.json`` are fsynced first, so after a power loss the logs hold at least the rows the recorded
    checkpoint has (rows are appended without an fsync each).

    ``flowrl train`` records every checkpoint it writes, and, on ``--resume``, the checkpoint it resumes
    from before anything else: the run's newest branch starts there, even while older checkpoints with
    higher numbers (of the abandoned branch) are still on disk.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     record_checkpoint(d, Path(d) / "checkpoints" / "checkpoint_000005",
        ...                       checkpoint_dir=Path(d) / "checkpoints")
        ...     latest, folder = recorded_checkpoint(d), recorded_checkpoint_dir(d)
        ...     (latest.parent.name, latest.name), folder == Path(d) / "checkpoints"
        (('checkpoints', 'checkpoint_000005'), True)
    """
    run_dir = Path(run_dir)
    for log in (run_dir / PROGRESS_CSV, run_dir / RESULT_JSON):  # the rows through the checkpoint: as durable
        if log.is_file():
            with open(log, "rb") as f:
                os.fsync(f.fileno())
    _update_run_info(run_dir, latest_checkpoint=_relative_to(Path(checkpoint), run_dir),
                     checkpoint_dir=_relative_to(Path(checkpoint_dir), run_dir))


def _recorded_path(run_dir: Path, key: str) -> Path | None:
    value = _run_info(run_dir).get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{run_dir / RUN_INFO}: {key} is {value!r}, not a path; delete the file to let flowrl "
                         f"pick the highest-numbered checkpoint_* of the run")
    return run_dir / value  # an absolute value stays absolute


def recorded_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint :func:`record_checkpoint` last recorded as ``run_dir``'s latest; ``None`` without a record
    (a run of an older flowrl, or one that has written no checkpoint yet).

    Raises:
        ValueError: an unreadable ``run_info.json`` (the message names it).
    """
    return _recorded_path(Path(run_dir), "latest_checkpoint")


def recorded_checkpoint_dir(run_dir: str | Path) -> Path | None:
    """Where ``run_dir``'s checkpoints go, as :func:`record_checkpoint` recorded it; ``None`` without a record.

    Raises:
        ValueError: an unreadable ``run_info.json`` (the message names it).
    """
    return _recorded_path(Path(run_dir), "checkpoint_dir")


def learning_curve(run_dir: str | Path, *, target: float | None = None) -> Figure:
    """The learning-curve figure of ``run_dir/progress.csv``: ``episode_reward_mean`` against
    ``timesteps_total``, the ``episode_reward_min``/``max`` band when present, the evaluation's return when the run
    evaluates (the only return of a run that reads a dataset), one line per policy
    (``policy_reward_mean/<policy id>``) when the run has several policies, and a dashed line at the target
    return (``target``, else the one :func:`record_target` recorded). The legend sits outside the axes.

    Raises:
        ValueError: no ``progress.csv``, or it has no row with a reward yet.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     with RunLogger(d, tensorboard=False) as logs:
        ...         for i in (1, 2):
        ...             logs.log({"timesteps_total": 100 * i, "episode_reward_mean": 10.0 * i,
        ...                       "policy_reward_mean": {"ppo_policy": 4.0 * i, "dqn_policy": 6.0 * i}})
        ...     fig = learning_curve(d, target=50)
        >>> [line.get_label() for line in fig.axes[0].get_lines()]  # doctest: +NORMALIZE_WHITESPACE
        ['episode_reward_mean', 'policy_reward_mean/ppo_policy', 'policy_reward_mean/dqn_policy',
         'target return 50']
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    csv_path = _progress_csv(run_dir)
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        rows, columns = list(reader), list(reader.fieldnames or [])
    steps, mean = _column(rows, "timesteps_total"), _column(rows, "episode_reward_mean")
    finite = np.isfinite(steps) & np.isfinite(mean)
    evaluated = _column(rows, "evaluation/episode_reward_mean")
    shown_evaluation = np.isfinite(steps) & np.isfinite(evaluated)
    if not finite.any() and not shown_evaluation.any():
        raise ValueError(f"{csv_path} has no row with both timesteps_total and episode_reward_mean (or "
                         f"evaluation/episode_reward_mean) yet; train until an episode has finished")
    target = target if target is not None else _recorded_target(csv_path.parent)
    fig = Figure(figsize=(9, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    low, high = _column(rows, "episode_reward_min"), _column(rows, "episode_reward_max")
    band = finite & np.isfinite(low) & np.isfinite(high)
    if band.any():
        ax.fill_between(steps[band], low[band], high[band], alpha=0.2, label="episode_reward_min/max")
    marker = "." if max(finite.sum(), shown_evaluation.sum()) < 30 else None
    if finite.any():
        ax.plot(steps[finite], mean[finite], marker=marker, label="episode_reward_mean")
    if shown_evaluation.any():  # a run that evaluates; for one that reads a dataset, its only return
        ax.plot(steps[shown_evaluation], evaluated[shown_evaluation], marker=marker, linewidth=1,
                label="evaluation/episode_reward_mean")
    policies = [c for c in columns if c.startswith("policy_reward_mean/")]
    for column in policies if len(policies) > 1 else []:
        values = _column(rows, column)
        shown = np.isfinite(steps) & np.isfinite(values)
        ax.plot(steps[shown], values[shown], marker=marker, linewidth=1, label=column)
    if target is not None:
        ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target return {target:g}")
    ax.set_xlabel("timesteps_total (env steps)")
    ax.set_ylabel("episode return")
    ax.set_title(csv_path.parent.name)
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper")
    return fig


def plot_progress(run_dir: str | Path, out: str | Path | None = None, *, target: float | None = None) -> Path:
    """Draws :func:`learning_curve` into a PNG, with matplotlib's Agg backend.

    Args:
        run_dir: a run directory (or the ``progress.csv`` itself).
        out: the PNG to write (``None``: ``run_dir/learning_curve.png``).
        target: the target return to draw (``None``: the one recorded by ``flowrl train --stop-reward``, if any).

    Returns:
        The PNG's path.

    Raises:
        ValueError: no ``progress.csv``, or it has no row with a reward yet.
    """
    fig = learning_curve(run_dir, target=target)
    out_path = Path(out) if out is not None else _progress_csv(run_dir).parent / LEARNING_CURVE
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path)
    return out_path
