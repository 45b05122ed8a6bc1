"""`flowrl train --logger wandb,mlflow`: offline W&B and MLflow's SQLite store hold the scalars of progress.csv at the
same steps; unknown names and missing packages are named."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from flowrl.cli import main
from flowrl.testing import wandb_offline_history
from flowrl.trackers import parse_trackers

pytestmark = pytest.mark.usefixtures("local_executor")

TRAIN = ["train", "pg", "--seed", "0", "--stop-iters", "2", "--local", "--config", "train_batch_size=200",
         "--config", "timesteps_per_iteration=0"]


def progress(run_dir: Path) -> list[dict[str, float]]:
    with open(run_dir / "progress.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return [{k: float(v) for k, v in row.items() if v not in ("", "nan", "inf", "-inf")} for row in rows]


def test_wandb_and_mlflow_runs_hold_the_scalars_of_progress_csv(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    done = CliRunner().invoke(main, [*TRAIN, "--log-dir", str(run_dir), "--logger", "wandb,mlflow"])
    assert done.exit_code == 0, done.output
    assert "(offline)" in done.output and "mlflow.db" in done.output
    rows = progress(run_dir)
    assert len(rows) == 2 and all(math.isfinite(v) for row in rows for v in row.values())
    logged = wandb_offline_history(run_dir)
    assert [int(r["_step"]) for r in logged] == [int(row["timesteps_total"]) for row in rows]
    for row, w in zip(rows, logged):
        assert {k: w[k] for k in row} == pytest.approx(row)  # every column, at the report's step
    client = MlflowClient(f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.0004"
    for key in rows[0]:
        history = client.get_metric_history(run.info.run_id, key)
        assert [m.step for m in history] == [int(row["timesteps_total"]) for row in rows], key
        assert [m.value for m in history] == pytest.approx([row[key] for row in rows]), key


def test_unknown_loggers_and_missing_packages_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    done = CliRunner().invoke(main, [*TRAIN, "--logger", "wandb,comet"])
    assert done.exit_code == 2 and "unknown logger 'comet'" in done.output, done.output
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if flowrl[mlflow] were not installed
    done = CliRunner().invoke(main, [*TRAIN, "--log-dir", str(tmp_path / "run"), "--logger", "mlflow"])
    assert done.exit_code == 2 and 'pip install "flowrl[mlflow]"' in done.output, done.output
    assert parse_trackers(" MLflow,wandb,mlflow ") == ("mlflow", "wandb")


def _wandb_ids(run_dir: Path) -> list[str]:
    """The run id of each offline W&B run directory, oldest first, read from its ``run-<id>.wandb`` log: the
    directory's own name gains a ``-1`` suffix when two processes start the same run within one second."""
    return [log.stem.removeprefix("run-") for log in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))]


def test_a_resumed_run_continues_its_tracker_runs_and_a_branch_back_starts_new_ones(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    base = [a for a in TRAIN if a not in ("--stop-iters", "2")]
    first = CliRunner().invoke(main, [*base, "--stop-iters", "2", "--checkpoint-freq", "1", "--log-dir", str(run_dir),
                                      "--logger", "wandb,mlflow"])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(main, ["train", "pg", "--resume", str(run_dir), "--stop-iters", "4", "--local",
                                      "--checkpoint-freq", "1", "--logger", "wandb,mlflow"])
    assert again.exit_code == 0, again.output
    assert again.output.count(", continued") == 2, again.output
    steps = [int(row["timesteps_total"]) for row in progress(run_dir)]
    assert len(steps) == 4
    ids = _wandb_ids(run_dir)
    assert len(ids) == 2 and ids[0] == ids[1]  # one W&B run, written by two processes
    assert [int(r["_step"]) for r in wandb_offline_history(run_dir)] == steps
    client = MlflowClient(f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "episode_reward_mean")] == steps

    # from iteration 2's checkpoint, with iterations 3 and 4 logged: new runs, said so
    branch = CliRunner().invoke(main, ["train", "pg", "--resume", str(run_dir / "checkpoints" / "checkpoint_000002"),
                                       "--stop-iters", "3", "--local", "--logger", "wandb,mlflow"])
    assert branch.exit_code == 0, branch.output
    assert "a new W&B run: the run's earlier one" in branch.output and "logged iterations up to 4, past this " \
        "resume's 2" in branch.output, branch.output
    assert "a new MLflow run" in branch.output and ", continued" not in branch.output
    assert len(set(_wandb_ids(run_dir))) == 2
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 2
    newest = max(runs, key=lambda r: r.info.start_time)
    assert [m.step for m in client.get_metric_history(newest.info.run_id, "episode_reward_mean")] == steps[2:3]
