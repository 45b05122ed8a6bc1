"""Run directories under faults: which checkpoint is a run's latest after a resume from an earlier one (the
run's own record, not the highest number), whose log rows a resume may drop (only the resumed run's, once),
directories that cannot be written (refused before training), and ``--stop-time`` inside a long report."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result

from flowrl._checkpoint import find_checkpoint, write_checkpoint
from flowrl.cli import main
from flowrl.logger import record_checkpoint
from flowrl.testing import tb_scalars

# PG in the driver (no Ray), 200 env steps per report, a tiny model: a report takes a fraction of a second.
PG = ["train", "pg", "--env", "CartPole-v1", "--seed", "0", "--config", "train_batch_size=200",
      "--config", "timesteps_per_iteration=0", "--config", "num_workers=0", "--config", "model.hidden_sizes=8"]


def invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def iterations(run_dir: Path) -> tuple[list[int], list[int]]:
    """The training_iteration of each progress.csv row and of each result.json line."""
    with open(run_dir / "progress.csv", newline="") as f:
        rows = [int(row["training_iteration"]) for row in csv.DictReader(f)]
    lines = [json.loads(line)["training_iteration"] for line in (run_dir / "result.json").read_text().splitlines()]
    return rows, lines


def fake_checkpoint(folder: Path, iteration: int) -> Path:
    return write_checkpoint(folder, f"checkpoint_{iteration:06d}", {"w": np.zeros(1)}, algorithm="pg")


@pytest.fixture(scope="module")
def four_iterations(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 4 iterations with a checkpoint after each."""
    run_dir = tmp_path_factory.mktemp("runs") / "run"
    result = invoke(*PG, "--stop-iters", 4, "--checkpoint-freq", 1, "--log-dir", run_dir)
    assert result.exit_code == 0, result.output
    return run_dir


def test_a_second_resume_continues_the_newest_branch_and_drops_rows_once(four_iterations: Path,
                                                                        tmp_path: Path) -> None:
    run_dir = Path(shutil.copytree(four_iterations, tmp_path / "run"))
    checkpoints = run_dir / "checkpoints"
    # branch: back to iteration 2, train 3 again; checkpoint_000004 of the abandoned branch stays on disk
    result = invoke("train", "pg", "--resume", checkpoints / "checkpoint_000002", "--stop-iters", 3,
                    "--checkpoint-freq", 1)
    assert result.exit_code == 0, result.output
    assert (f"dropping 2 log rows after iteration 2 of {run_dir}: resumed from checkpoint_000002 (the abandoned "
            f"branch's checkpoint_000003, checkpoint_000004 stay until this run replaces them)") in result.output
    assert iterations(run_dir) == ([1, 2, 3], [1, 2, 3])
    assert (checkpoints / "checkpoint_000004").is_dir()
    # the run's latest is the newest branch's checkpoint_000003, not the higher-numbered checkpoint_000004
    assert find_checkpoint(run_dir) == find_checkpoint(checkpoints) == checkpoints / "checkpoint_000003"
    # so resuming the run again continues iteration 3 and drops nothing
    result = invoke("train", "pg", "--resume", run_dir, "--stop-iters", 5, "--checkpoint-freq", 1)
    assert result.exit_code == 0, result.output
    assert f"resuming {checkpoints / 'checkpoint_000003'} at iteration 3" in result.output
    assert "dropping" not in result.output
    assert iterations(run_dir) == ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5])
    with open(run_dir / "progress.csv", newline="") as f:
        steps = [int(row["timesteps_total"]) for row in csv.DictReader(f)]
    assert steps == [200, 400, 600, 800, 1000]  # one branch: the counters never step back
    assert find_checkpoint(run_dir) == checkpoints / "checkpoint_000005"
    result = invoke("evaluate", run_dir, "--episodes", 1)
    assert result.exit_code == 0 and f"{checkpoints / 'checkpoint_000005'}: 1 episodes" in result.output


def test_a_resume_killed_before_its_first_checkpoint_leaves_the_branch_point_as_the_latest(
        four_iterations: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flowrl.trainer import Trainer

    run_dir = Path(shutil.copytree(four_iterations, tmp_path / "run"))

    def killed(self: Trainer) -> dict[str, Any]:
        raise SystemExit(137)  # as if SIGKILLed in the first report after the resume

    monkeypatch.setattr(Trainer, "train", killed)
    result = invoke("train", "pg", "--resume", run_dir / "checkpoints" / "checkpoint_000002", "--stop-iters", 9)
    assert result.exit_code == 137, result.output
    assert iterations(run_dir) == ([1, 2], [1, 2])
    # the rows of iterations 3 and 4 are gone, so checkpoint_000004 must not be the run's latest any more
    assert find_checkpoint(run_dir) == run_dir / "checkpoints" / "checkpoint_000002"


def test_the_record_wins_over_higher_numbers_and_symlinks_out_of_the_folder_are_ignored(tmp_path: Path) -> None:
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    checkpoints = run_dir / "checkpoints"
    fake_checkpoint(checkpoints, 5)
    planted = fake_checkpoint(elsewhere, 99)
    (checkpoints / "checkpoint_000099").symlink_to(planted, target_is_directory=True)
    # no record (a run of an older flowrl): the highest number, but not through a link out of the folder
    assert find_checkpoint(run_dir) == checkpoints / "checkpoint_000005"
    # with a record: the recorded checkpoint, even with a higher-numbered real one beside it
    fake_checkpoint(checkpoints, 7)
    record_checkpoint(run_dir, checkpoints / "checkpoint_000005", checkpoint_dir=checkpoints)
    assert find_checkpoint(run_dir) == find_checkpoint(checkpoints) == checkpoints / "checkpoint_000005"
    assert json.loads((run_dir / "run_info.json").read_text())["latest_checkpoint"] == \
        os.path.join("checkpoints", "checkpoint_000005")  # relative: a moved run directory keeps its record
    shutil.rmtree(checkpoints / "checkpoint_000005")
    with pytest.raises(ValueError, match=r"run_info.json records .*checkpoint_000005.* as the run's latest "
                                         r"checkpoint, but it is gone"):
        find_checkpoint(run_dir)


def test_resuming_into_another_runs_log_dir_is_refused_and_its_rows_kept(four_iterations: Path,
                                                                         tmp_path: Path) -> None:
    other = tmp_path / "other"
    result = invoke(*PG, "--stop-iters", 1, "--log-dir", other)
    assert result.exit_code == 0, result.output
    before = (other / "progress.csv").read_text(), (other / "result.json").read_text()
    result = invoke("train", "pg", "--resume", four_iterations, "--stop-iters", 6, "--log-dir", other)
    assert result.exit_code == 2, result.output
    assert f"'{other}' holds another run's progress.csv" in result.output
    assert "drop --log-dir to continue the checkpoint's own run" in result.output
    assert ((other / "progress.csv").read_text(), (other / "result.json").read_text()) == before
    # a run resumed into a new directory is that directory's own: resuming it there again is fine
    fresh = tmp_path / "fresh"
    checkpoint = four_iterations / "checkpoints" / "checkpoint_000002"
    result = invoke("train", "pg", "--resume", checkpoint, "--stop-iters", 3, "--log-dir", fresh)
    assert result.exit_code == 0, result.output
    result = invoke("train", "pg", "--resume", fresh, "--stop-iters", 4, "--log-dir", fresh)
    assert result.exit_code == 0, result.output
    assert iterations(fresh) == ([3, 4], [3, 4])
    # ... but resuming the first run's checkpoint into it once more would drop its own later rows: refused
    result = invoke("train", "pg", "--resume", checkpoint, "--stop-iters", 3, "--log-dir", fresh)
    assert result.exit_code == 2 and "holds another run's progress.csv" in result.output


@pytest.mark.parametrize("option", ["--log-dir", "--checkpoint-dir"])
def test_an_unusable_directory_is_refused_before_training(tmp_path: Path, option: str) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory\n")
    log_dir = [] if option == "--log-dir" else ["--log-dir", tmp_path / "run"]
    result = invoke(*PG, "--stop-iters", 3, option, a_file / "run", *log_dir)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}': '{a_file / 'run'}' cannot be a directory: '{a_file}' is a file" \
        in result.output
    assert "iter " not in result.output and not (tmp_path / "run").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere, so permissions cannot refuse it")
def test_a_directory_without_write_permission_is_refused_before_training(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    result = invoke(*PG, "--stop-iters", 3, "--checkpoint-dir", locked / "checkpoints", "--log-dir", tmp_path / "run")
    assert result.exit_code == 2, result.output
    assert f"'{locked / 'checkpoints'}' is not writable" in result.output and "iter " not in result.output


def test_stop_time_abandons_a_report_still_running_at_the_deadline(tmp_path: Path) -> None:
    # one report of 20000 env steps takes far longer than the 0.5 s allowed
    result = invoke("train", "pg", "--config", "train_batch_size=20000", "--config", "num_workers=0",
                    "--stop-time", 0.5, "--log-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "done (--stop-time 0.5 s passed during iteration 1, which was abandoned): no report finished; so there " \
           "is no checkpoint" in result.output
    assert not (tmp_path / "run" / "progress.csv").exists() and not (tmp_path / "run" / "checkpoints").exists()


def test_sigterm_leaves_every_log_whole_and_closed_and_exits_143(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from flowrl.trainer import Trainer

    train, calls = Trainer.train, []

    def terminated_in_the_third_report(self: Trainer) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 3:
            signal.raise_signal(signal.SIGTERM)  # docker stop, Kubernetes, a batch scheduler
        return train(self)

    monkeypatch.setattr(Trainer, "train", terminated_in_the_third_report)
    run_dir = tmp_path / "run"
    result = invoke(*PG, "--stop-iters", 10, "--checkpoint-freq", 0, "--log-dir", run_dir)
    assert result.exit_code == 143, result.output  # 128 + SIGTERM: stopped, not failed
    assert "stopped by SIGTERM after iteration 2; the final checkpoint is" in result.output
    assert iterations(run_dir) == ([1, 2], [1, 2])
    assert [step for step, _ in tb_scalars(run_dir / "tb")["training_iteration"]] == [200, 400]  # TensorBoard flushed and closed
    assert find_checkpoint(run_dir) == run_dir / "checkpoints" / "checkpoint_000002"
