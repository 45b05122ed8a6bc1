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
- ``run_info.json``: the target return (``flowrl train --stop-reward``), for the plot (:func:`record_target`).

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

import csv
import json
import math
import os
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["RunLogger", "flatten_result", "plot_progress", "learning_curve", "record_target", "PROGRESS_CSV",
           "RESULT_JSON", "TB_DIR", "LEARNING_CURVE", "RUN_INFO"]

PROGRESS_CSV, RESULT_JSON, TB_DIR, LEARNING_CURVE = "progress.csv", "result.json", "tb", "learning_curve.png"
RUN_INFO = "run_info.json"  # what the run aims at: {"target_return": R}, from flowrl train --stop-reward


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
            so every iteration is logged once. ``None`` keeps everything.
        tensorboard: also write TensorBoard events under ``run_dir/tb``.
    """

    def __init__(self, run_dir: str | Path, *, keep_through_iteration: int | None = None,
                 tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.progress_csv = self.run_dir / PROGRESS_CSV
        self.result_json = self.run_dir / RESULT_JSON
        self.tb_dir = self.run_dir / TB_DIR
        self._header: list[str] = []
        if self.progress_csv.exists():
            with open(self.progress_csv, newline="") as f:
                self._header = list(csv.DictReader(f).fieldnames or [])
        if keep_through_iteration is not None:
            self._truncate_after(keep_through_iteration)
        self._writer: Any = None
        if tensorboard:
            from tensorboardX import SummaryWriter  # imported here: it pulls in protobuf

            self._writer = SummaryWriter(str(self.tb_dir))

    def _truncate_after(self, iteration: int) -> None:
        if self.progress_csv.exists():
            with open(self.progress_csv, newline="") as f:
                rows = [row for row in csv.DictReader(f) if not _iteration(row) > iteration]
            self._write_csv(rows)
        if self.result_json.exists():
            kept = []
            for line in self.result_json.read_text().splitlines():
                try:
                    later = _iteration(json.loads(line)) > iteration
                except ValueError:  # a line cut short by a crash
                    later = True
                if not later:
                    kept.append(line + "\n")
            _replace_text(self.result_json, "".join(kept))

    def _write_csv(self, rows: list[dict[str, Any]]) -> None:
        tmp = self.progress_csv.with_name(f".{PROGRESS_CSV}.tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, self._header, restval="", extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, self.progress_csv)

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
            self._header += new_keys
            self._write_csv(rows)  # widened once per new key, never narrowed
        with open(self.progress_csv, "a", newline="") as f:
            csv.DictWriter(f, self._header, restval="", extrasaction="ignore").writerow(flat)
        with open(self.result_json, "a") as f:
            f.write(json.dumps(result, default=_json_default) + "\n")
        if self._writer is not None:
            step = int(result.get("timesteps_total", result.get("training_iteration", 0)))
            for key, value in flat.items():
                if math.isfinite(value):  # a nan/inf (a diverged loss) stays in the CSV and JSON; TensorBoard
                    self._writer.add_scalar(key, value, global_step=step)  # would only warn about it
            self._writer.flush()

    def close(self) -> None:
        """Closes the TensorBoard writer (the CSV and JSON files are closed after every write)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _replace_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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


def record_target(run_dir: str | Path, target: float | None) -> None:
    """Records the return a run aims at (``flowrl train --stop-reward``) in ``run_dir/run_info.json``, so that
    :func:`plot_progress` draws it later too; ``None`` keeps what an earlier run recorded."""
    if target is None:
        return
    path = Path(run_dir) / RUN_INFO
    info = json.loads(path.read_text()) if path.is_file() else {}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**info, "target_return": float(target)}) + "\n")


def _recorded_target(run_dir: Path) -> float | None:
    path = run_dir / RUN_INFO
    if not path.is_file():
        return None
    value = json.loads(path.read_text()).get("target_return")
    return None if value is None else float(value)


def learning_curve(run_dir: str | Path, *, target: float | None = None) -> Figure:
    """The learning-curve figure of ``run_dir/progress.csv``: ``episode_reward_mean`` against
    ``timesteps_total``, the ``episode_reward_min``/``max`` band when present, one line per policy
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
    if not finite.any():
        raise ValueError(f"{csv_path} has no row with both timesteps_total and episode_reward_mean yet; train "
                         f"until an episode has finished")
    target = target if target is not None else _recorded_target(csv_path.parent)
    fig = Figure(figsize=(9, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    low, high = _column(rows, "episode_reward_min"), _column(rows, "episode_reward_max")
    band = finite & np.isfinite(low) & np.isfinite(high)
    if band.any():
        ax.fill_between(steps[band], low[band], high[band], alpha=0.2, label="episode_reward_min/max")
    marker = "." if finite.sum() < 30 else None
    ax.plot(steps[finite], mean[finite], marker=marker, label="episode_reward_mean")
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
