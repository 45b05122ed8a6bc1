"""Experiment trackers beside the run directory's own logs: Weights & Biases and MLflow (``flowrl train --logger
wandb,mlflow``). Each receives the scalars :class:`~flowrl.logger.RunLogger` writes to ``progress.csv`` and
TensorBoard (the finite ones, at step ``timesteps_total``) and the run's config as parameters. Both are optional
extras: ``pip install "flowrl[wandb]"``, ``pip install "flowrl[mlflow]"``.

- **W&B** logs to ``RUN_DIR/wandb``: online when ``WANDB_MODE`` says so or you are logged in (``WANDB_API_KEY``, or
  ``wandb login``'s entry in ``~/.netrc``), otherwise offline (upload later with ``wandb sync RUN_DIR/wandb/...``).
  The project is ``WANDB_PROJECT`` or ``flowrl``.
- **MLflow** logs to ``MLFLOW_TRACKING_URI`` when set (a tracking server, or any store MLflow knows), otherwise to
  a SQLite store in the run directory, ``sqlite:///RUN_DIR/mlflow.db`` (view it with
  ``mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow.db``); experiment ``MLFLOW_EXPERIMENT_NAME`` or ``flowrl``.

A run resumed with ``flowrl train --resume`` continues its trackers' runs (their ids are kept in
``RUN_DIR/trackers.json``) when it resumes from the last report they hold. Resumed from an earlier report (a
checkpoint older than the last logged row, as after a crash), it starts new tracker runs and says so: the old
runs hold steps past the resume point, which W&B would refuse to log again and MLflow would show twice.

Examples:
    >>> parse_trackers("wandb, mlflow")
    ('wandb', 'mlflow')
    >>> parse_trackers("tensorboard")
    Traceback (most recent call last):
    ...
    ValueError: unknown logger 'tensorboard': flowrl writes progress.csv, result.json and TensorBoard events always; --logger adds 'wandb' and/or 'mlflow' (comma-separated)
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Mapping, Protocol

__all__ = ["TRACKERS", "TRACKERS_JSON", "Tracker", "WandbTracker", "MLflowTracker", "make_tracker", "parse_trackers"]

TRACKERS_JSON = "trackers.json"
"""The run directory's record of its tracker runs: per tracker, its run id and the last iteration it logged."""

TRACKERS = ("wandb", "mlflow")
_EXTRA = {"wandb": ("wandb", "flowrl[wandb]"), "mlflow": ("mlflow", "flowrl[mlflow]")}


class Tracker(Protocol):
    """Where a run's scalars go besides its own files."""

    @property
    def where(self) -> str: ...

    @property
    def note(self) -> str | None: ...

    def log(self, scalars: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class _Record:
    """``RUN_DIR/trackers.json``: each tracker's run and the last iteration it logged, rewritten whole (through a
    temporary file and a rename) whenever that changes."""

    def __init__(self, run_dir: Path, name: str) -> None:
        self.path, self.name = Path(run_dir) / TRACKERS_JSON, name

    def _all(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self) -> dict[str, Any]:
        entry = self._all().get(self.name)
        return entry if isinstance(entry, dict) else {}

    def set(self, **fields: Any) -> None:
        data = self._all()
        old = data.get(self.name)
        data[self.name] = {**(old if isinstance(old, dict) else {}), **fields}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path)


def _continued(record: _Record, resume_iteration: int | None, what: str) -> tuple[dict[str, Any], str | None]:
    """The recorded run to continue (``{}``: start one) and, when a recorded run is not continued, why."""
    entry = record.get()
    if resume_iteration is None or not entry:
        return {}, None
    logged = int(entry.get("last_iteration", 0))
    if logged > resume_iteration:
        return {}, (f"a new {what} run: the run's earlier one ({entry.get('id')}) logged iterations up to {logged}, "
                    f"past this resume's {resume_iteration}")
    return entry, None


def parse_trackers(spec: str) -> tuple[str, ...]:
    """The tracker names of a comma-separated ``--logger`` value, each once, in order.

    Raises:
        ValueError: a name that is not a tracker, naming it and the choices.
    """
    names: list[str] = []
    for name in (part.strip().lower() for part in spec.split(",")):
        if not name:
            continue
        if name not in TRACKERS:
            raise ValueError(f"unknown logger {name!r}: flowrl writes progress.csv, result.json and TensorBoard events "
                             f"always; --logger adds 'wandb' and/or 'mlflow' (comma-separated)")
        if name not in names:
            names.append(name)
    return tuple(names)


def _import(name: str) -> Any:
    module, extra = _EXTRA[name]
    try:
        return __import__(module)
    except ImportError as e:
        raise ImportError(f"--logger {name} needs the {module!r} package: pip install \"{extra}\"") from e


def _params(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as flat ``a.b`` parameters (values as they are; lists and others as text)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(_params(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, (bool, int, float, str)) or value is None else str(value)
    return out


def _logged_in_to_wandb() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path.home() / ".netrc"
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False


class WandbTracker:
    """A W&B run in ``run_dir/wandb`` (see the module docstring for online or offline, and for resumed runs)."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any], resume_iteration: int | None = None) -> None:
        wandb = _import("wandb")
        mode = os.environ.get("WANDB_MODE") or ("online" if _logged_in_to_wandb() else "offline")
        self.record = _Record(run_dir, "wandb")
        entry, self.note = _continued(self.record, resume_iteration, "W&B")
        resume = {"id": entry["id"], "resume": "allow"} if entry.get("id") else {}
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "flowrl"), dir=str(run_dir), name=run_dir.name,
                              config=_params(config), mode=mode, reinit="create_new", **resume)
        self.mode, self.continued = mode, bool(resume)
        self.record.set(id=self.run.id, last_iteration=resume_iteration if self.continued else 0)

    @property
    def where(self) -> str:
        """The run's directory and mode, for the line ``flowrl train`` prints."""
        return f"{self.run.dir} ({self.mode}{', continued' if self.continued else ''})"

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.run.log(dict(scalars), step=step)
        self.record.set(last_iteration=int(scalars.get("training_iteration", 0)))

    def close(self) -> None:
        self.run.finish()


_MLFLOW_KEY = re.compile(r"[^\w\-. /]")  # MLflow's names: alphanumerics, underscores, dashes, periods, spaces, slashes


class MLflowTracker:
    """An MLflow run (see the module docstring for where it goes)."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any], resume_iteration: int | None = None) -> None:
        mlflow = _import("mlflow")
        from mlflow.tracking import MlflowClient

        for noisy in ("mlflow", "alembic"):  # a new store's table set-up logs a dozen INFO lines
            logging.getLogger(noisy).setLevel(max(logging.getLogger(noisy).level, logging.WARNING))

        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"
        self.client = MlflowClient(self.uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "flowrl")
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment is not None else self.client.create_experiment(name)
        self.record = _Record(run_dir, "mlflow")
        entry, self.note = _continued(self.record, resume_iteration, "MLflow")
        self.continued = bool(entry.get("id")) and entry.get("uri") == self.uri and self._exists(entry["id"])
        if self.continued:
            self.run_id: str = entry["id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
        self.record.set(id=self.run_id, uri=self.uri, last_iteration=resume_iteration if self.continued else 0)
        self._metric = mlflow.entities.Metric
        if self.continued:
            return  # its parameters are logged (MLflow refuses to log a parameter again with another value)
        params = [mlflow.entities.Param(_MLFLOW_KEY.sub("_", k), str(v)[:6000]) for k, v in _params(config).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters per batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def _exists(self, run_id: str) -> bool:
        try:
            self.client.get_run(run_id)
        except Exception:  # MlflowException: gone from the store, or a store that moved
            return False
        return True

    @property
    def where(self) -> str:
        """The tracking store and run, for the line ``flowrl train`` prints."""
        return f"{self.uri} (experiment run {self.run_id}{', continued' if self.continued else ''})"

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        metrics = [self._metric(_MLFLOW_KEY.sub("_", k), float(v), now, step) for k, v in scalars.items()]
        for start in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])
        self.record.set(last_iteration=int(scalars.get("training_iteration", 0)))

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def make_tracker(name: str, run_dir: Path, config: Mapping[str, Any], *, resume_iteration: int | None = None) -> Tracker:
    """The tracker ``name`` (one of :data:`TRACKERS`) for a run in ``run_dir`` whose config (as plain data) is
    ``config``; ``resume_iteration``: the run resumes from a checkpoint of that iteration (its tracker runs are
    continued when they logged nothing past it)."""
    if name == "wandb":
        return WandbTracker(run_dir, config, resume_iteration)
    return MLflowTracker(run_dir, config, resume_iteration)
