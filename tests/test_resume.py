"""Checkpoint, kill the process, ``flowrl train --resume`` in a new one: with a sync plan, a fixed seed and
whole-episode sampling the resumed run's next iterations are bit-identical to an
uninterrupted run's — policy weights, optimizer state, RNG states, the remote worker's state and counters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

# PPO with one remote worker, small batches; complete episodes, so no env is mid-episode at a checkpoint.
TRAIN = ["train", "ppo", "--env", "CartPole-v1", "--seed", "0", "--checkpoint-freq", "1",
         "--config", "num_workers=1", "--config", "num_cpus_per_worker=0.5", "--config", "batch_mode=complete_episodes",
         "--config", "rollout_fragment_length=100", "--config", "train_batch_size=400",
         "--config", "sgd_minibatch_size=64", "--config", "num_sgd_iter=3", "--config", "lr=3e-4"]


def flowrl(*args: str, **popen: object) -> subprocess.Popen[bytes]:
    """``python -m flowrl ARGS`` in a new session (so that its Ray processes can be killed with it)."""
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([sys.executable, "-m", "flowrl", *args], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen)  # type: ignore[call-overload]


def finish(proc: subprocess.Popen[bytes], timeout_s: float = 240) -> str:
    out, _ = proc.communicate(timeout=timeout_s)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text
    return text


def arrays(checkpoint: Path) -> dict[str, np.ndarray]:
    with np.load(checkpoint / "arrays.npz") as data:
        return {k: data[k] for k in data.files}


@pytest.mark.slow  # ~30 s of training in two processes: the default tier keeps the signal tests (test_train_signals.py)
def test_kill_then_resume_in_a_new_process_continues_bit_identically(tmp_path: Path) -> None:
    # (1) the uninterrupted run: 5 iterations, a checkpoint after each; and, side by side (each waits on its own
    # Ray start for much of the time), (2) the same run, SIGKILLed with its Ray processes once its second
    # checkpoint is on disk
    straight_run = flowrl(*TRAIN, "--stop-iters", "5", "--log-dir", str(tmp_path / "straight"))
    killed = flowrl(*TRAIN, "--stop-iters", "1000", "--log-dir", str(tmp_path / "killed"))
    second = tmp_path / "killed" / "checkpoints" / "checkpoint_000002"
    deadline = time.monotonic() + 240
    while not second.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    assert killed.returncode == -signal.SIGKILL and second.exists()
    straight = finish(straight_run)
    # (3) resume from that checkpoint in a new process, for iterations 3-5
    resumed = finish(flowrl("train", "ppo", "--resume", str(second), "--stop-iters", "5",
                            "--log-dir", str(tmp_path / "resumed"),
                            "--checkpoint-dir", str(tmp_path / "resumed" / "checkpoints"), "--checkpoint-freq", "1"))
    for i in (3, 4, 5):
        expected = arrays(tmp_path / "straight" / "checkpoints" / f"checkpoint_{i:06d}")
        got = arrays(tmp_path / "resumed" / "checkpoints" / f"checkpoint_{i:06d}")
        assert sorted(got) == sorted(expected)
        different = [k for k in expected if not np.array_equal(got[k], expected[k])]
        assert not different, (i, different, straight[-2000:], resumed[-2000:])
    # the counters went on from the checkpoint, not from zero
    rows = [json.loads(line) for line in (tmp_path / "straight" / "result.json").read_text().splitlines()]
    again = [json.loads(line) for line in (tmp_path / "resumed" / "result.json").read_text().splitlines()]
    assert [r["training_iteration"] for r in again][-3:] == [3, 4, 5]
    assert [r["timesteps_total"] for r in again][-3:] == [r["timesteps_total"] for r in rows][-3:]
