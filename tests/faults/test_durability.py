"""Durability across a power loss: what flowrl fsyncs when it records a checkpoint as a run's latest."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from flowrl.logger import PROGRESS_CSV, RESULT_JSON, RUN_INFO, RunLogger, record_checkpoint

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="names fsynced fds via /proc")


def test_recording_a_checkpoint_fsyncs_the_logs_then_the_record_and_its_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with RunLogger(tmp_path, tensorboard=False) as logs:
        for i in (1, 2):
            logs.log({"training_iteration": i, "timesteps_total": 100 * i, "episode_reward_mean": 20.0 + i})
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    record_checkpoint(tmp_path, tmp_path / "checkpoints" / "checkpoint_000002", checkpoint_dir=tmp_path / "checkpoints")
    # the rows through the checkpoint first, then the record (written beside, renamed), then the rename itself
    assert synced[:2] == [PROGRESS_CSV, RESULT_JSON], synced
    assert synced[2:] == [f".{RUN_INFO}.tmp", tmp_path.name], synced
