"""A full disk: a write that fails (``EFBIG`` under a per-file size limit, set with ``RLIMIT_FSIZE`` in a child
process; ``ENOSPC`` from a patched write) leaves ``progress.csv`` and ``result.json`` whole through their last
complete row, the previous checkpoint restorable, and ``flowrl train`` ends with one line naming the path."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import flowrl
from flowrl._checkpoint import find_checkpoint, read_checkpoint
from flowrl.cli import main

FLOWRL_ROOT = Path(flowrl.__file__).resolve().parents[1]  # the child imports the flowrl this test imports


def in_a_child(code: str) -> str:
    """Runs ``code`` in a new Python process (so that its file size limit binds no one else); returns stdout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FLOWRL_ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


LOG_UNDER_A_SIZE_LIMIT = """
    import errno, resource
    from pathlib import Path
    from flowrl.logger import RunLogger

    run_dir = Path({run_dir!r})
    logs = RunLogger(run_dir, tensorboard=False)
    for i in (1, 2, 3):
        logs.log({{"training_iteration": i, "episode_reward_mean": 10.0 * i, "hist_stats": list(range(40))}})
    limit = max((run_dir / name).stat().st_size for name in ("progress.csv", "result.json")) + 40
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        logs.log({row})
    except OSError as e:
        print(errno.errorcode[e.errno], e.filename)
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    logs.log({{"training_iteration": 4, "episode_reward_mean": 40.0}})  # the disk has room again
"""


def read_logs(run_dir: Path) -> tuple[list[str], list[list[str]], list[dict[str, Any]]]:
    with open(run_dir / "progress.csv", newline="") as f:
        header, *rows = list(csv.reader(f))
    return header, rows, [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]


def test_a_row_that_does_not_fit_is_cut_back_off_both_files(tmp_path: Path) -> None:
    # a row far longer than what still fits: the write stops part-way with EFBIG
    row = '{"training_iteration": 9, "episode_reward_mean": 90.0, "hist_stats": list(range(5000))}'
    printed = in_a_child(LOG_UNDER_A_SIZE_LIMIT.format(run_dir=str(tmp_path), row=row))
    header, rows, results = read_logs(tmp_path)
    assert all(len(r) == len(header) for r in rows)
    assert [r[0] for r in rows] == ["1", "2", "3", "4"]  # iteration 9 is in neither file
    assert [r["training_iteration"] for r in results] == [1, 2, 3, 4]
    assert printed.split() == ["EFBIG", str(tmp_path / "result.json")]  # the error names the file


def test_a_widened_header_that_does_not_fit_leaves_the_old_file_and_header(tmp_path: Path) -> None:
    # a row with new keys rewrites progress.csv with a wider header: that rewrite fails here
    wide = "{" + ", ".join(f'"learner_stat_{k:03d}": 1.0' for k in range(60)) + ', "training_iteration": 9}'
    printed = in_a_child(LOG_UNDER_A_SIZE_LIMIT.format(run_dir=str(tmp_path), row=wide))
    header, rows, results = read_logs(tmp_path)
    assert header == ["training_iteration", "episode_reward_mean"]  # the next row was written under the old header
    assert rows == [["1", "10.0"], ["2", "20.0"], ["3", "30.0"], ["4", "40.0"]]
    assert [r["training_iteration"] for r in results] == [1, 2, 3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.csv", "result.json"]  # no file left beside
    assert printed.split() == ["EFBIG", str(tmp_path / "progress.csv")]  # the error names the file


PG = ["train", "pg", "--env", "CartPole-v1", "--seed", "0", "--config", "train_batch_size=200",
      "--config", "timesteps_per_iteration=0", "--config", "num_workers=0", "--config", "model.hidden_sizes=8"]


def test_a_full_disk_at_a_checkpoint_is_one_line_and_the_previous_checkpoint_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import flowrl._checkpoint

    real_savez, calls = np.savez, []

    def full_after_the_first(file: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(file)
        if len(calls) == 1:
            return real_savez(file, *args, **kwargs)
        if isinstance(file, (str, os.PathLike)):
            with open(file, "wb") as f:
                f.write(b"PK\x03\x04 half an archive")
        raise OSError(28, "No space left on device")  # as a write() on a full disk raises it: no file name

    monkeypatch.setattr(flowrl._checkpoint.np, "savez", full_after_the_first)
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    result = CliRunner().invoke(main, [*PG, "--stop-iters", "5", "--checkpoint-freq", "1", "--log-dir", str(run_dir)])
    assert result.exit_code == 1, result.output
    last_line = result.output.strip().splitlines()[-1]
    assert last_line == (f"Error: cannot write {checkpoints}: No space left on device (ENOSPC); training stopped: the "
                         f"logs are whole through iteration 2 and the last checkpoint is "
                         f"{checkpoints / 'checkpoint_000001'}; free space (or lift the file size limit) and "
                         f"continue with --resume {run_dir}")
    assert result.exception is None or isinstance(result.exception, SystemExit)  # no traceback
    # the previous checkpoint is whole and is still the run's latest; no half-written one is left beside it
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint_000001"]
    assert read_checkpoint(checkpoints / "checkpoint_000001", algorithm="pg")["trainer"]["training_iteration"] == 1
    assert find_checkpoint(run_dir) == checkpoints / "checkpoint_000001"
    header, rows, results = read_logs(run_dir)
    assert [r[header.index("training_iteration")] for r in rows] == ["1", "2"]
    assert [r["training_iteration"] for r in results] == [1, 2]
    # with room again, the run goes on from its checkpoint; iteration 2's row is logged once
    monkeypatch.setattr(flowrl._checkpoint.np, "savez", real_savez)
    result = CliRunner().invoke(main, ["train", "pg", "--resume", str(run_dir), "--stop-iters", "3"])
    assert result.exit_code == 0, result.output
    assert f"dropping 1 log rows after iteration 1 of {run_dir}: resumed from checkpoint_000001" in result.output
    header, rows, results = read_logs(run_dir)
    assert [r[header.index("training_iteration")] for r in rows] == ["1", "2", "3"]
    assert [r["training_iteration"] for r in results] == [1, 2, 3]


def test_flowrl_train_under_a_file_size_limit_ends_with_one_line_and_whole_logs(tmp_path: Path) -> None:
    import resource

    def limit_file_sizes() -> None:  # in the child only: every file it writes stays under 16 kB
        resource.setrlimit(resource.RLIMIT_FSIZE, (16_000, resource.RLIM_INFINITY))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FLOWRL_ROOT), os.environ.get("PYTHONPATH", "")]),
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "flowrl", *PG, "--stop-iters", "1000", "--checkpoint-freq", "1",
                           "--log-dir", str(run_dir)], env=env, capture_output=True, text=True, timeout=240,
                          preexec_fn=limit_file_sizes)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    error = [line for line in output.splitlines() if line.startswith("Error: ")]
    assert len(error) == 1 and "File too large (EFBIG); training stopped: the logs are whole through iteration" \
        in error[0], output
    assert "Traceback" not in output and "Exception" not in output
    header, rows, results = read_logs(run_dir)
    assert all(len(r) == len(header) for r in rows)
    logged = [int(r[header.index("training_iteration")]) for r in rows]
    assert logged == [r["training_iteration"] for r in results] == list(range(1, len(rows) + 1))
    assert f"whole through iteration {logged[-1]} and the last checkpoint is " in error[0]
    latest = find_checkpoint(run_dir)
    assert read_checkpoint(latest, algorithm="pg")["trainer"]["training_iteration"] == logged[-1]
