"""A short `flowrl train` prints only flowrl's own lines: no Ray INFO start line, no token-authentication
note, and no line wider than 120 columns (the plan is summarised in 100, not its 300-600-character repr)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RAY_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(INFO|WARNING) ")


def test_a_short_train_run_with_a_local_ray_instance_prints_short_lines_and_no_ray_notes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}  # as a user has it
    done = subprocess.run(
        [sys.executable, "-m", "flowrl", "train", "pg", "--config", "num_workers=1", "--config",
         "num_cpus_per_worker=0", "--stop-iters", "1", "--log-dir", "run"],  # relative: short paths
        capture_output=True, text=True, cwd=tmp_path, timeout=300, env={**env, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    assert [line for line in lines if RAY_LOG_LINE.match(line)] == []
    assert [line for line in lines if len(line) > 120] == []  # (the progress line, not flowrl's plan, is ~100)
    plan = [line for line in lines if line.startswith("plan: ")]
    assert plan == ["plan: ParallelRollouts, ConcatBatches, TrainOneStep, ReportGate, CollectMetrics"]
    assert "      (`flowrl plan show pg` draws the graph)" in lines  # the plan's lines fit 100 columns
