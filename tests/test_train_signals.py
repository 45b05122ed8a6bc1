"""``flowrl train`` stopped by SIGINT (Ctrl-C) or SIGTERM (docker stop, Kubernetes, batch schedulers): the
report in progress is abandoned, a final checkpoint of the last logged iteration is written, the logs hold
whole rows only, and the exit code says which signal stopped it. Also: a second signal cannot destroy a
checkpoint being replaced, and the CLI's handlers hold a signal while a report is logged."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from flowrl._checkpoint import read_checkpoint, write_checkpoint
from flowrl.cli import _Stopped, _StopSignals
from flowrl.trainer import Trainer

# PG in the driver (no Ray), 200-step batches; each report waits 1 s, so a signal sent right after an iteration's
# line lands in the next report, which is abandoned.
TRAIN = ["train", "pg", "--env", "CartPole-v1", "--seed", "0", "--config", "train_batch_size=200",
         "--config", "min_iter_time_s=1", "--stop-iters", "1000", "--checkpoint-freq", "0"]


def train_until_iteration_then_signal(run_dir: Path, signum: int, lines: int = 3) -> tuple[int, str]:
    """Runs ``python -m flowrl train`` until it has printed ``lines`` iteration lines, sends ``signum``, and
    returns its exit code and output."""
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "flowrl", *TRAIN, "--log-dir", str(run_dir)], env=env,
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    guard = threading.Timer(240, proc.kill)  # never hang the suite if the run stops printing
    guard.start()
    try:
        assert proc.stdout is not None
        out, seen = [], 0
        while seen < lines:
            line = proc.stdout.readline().decode(errors="replace")
            if not line:
                break
            out.append(line)
            seen += line.startswith("iter ")
        proc.send_signal(signum)
        rest, _ = proc.communicate()
    finally:
        guard.cancel()
    return proc.returncode, "".join(out) + rest.decode(errors="replace")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_writes_a_final_checkpoint_of_the_last_logged_iteration(tmp_path: Path, signum: int) -> None:
    run_dir = tmp_path / "run"
    code, output = train_until_iteration_then_signal(run_dir, signum)
    assert code == 128 + signum, output  # 130 for SIGINT, 143 for SIGTERM
    with open(run_dir / "progress.csv", newline="") as f:
        header, *rows = list(csv.reader(f))
    assert rows and all(len(row) == len(header) for row in rows)  # whole rows only
    last = dict(zip(header, rows[-1]))
    iteration = int(last["training_iteration"])
    assert iteration >= 3 and [int(dict(zip(header, r))["training_iteration"]) for r in rows] == \
        list(range(1, iteration + 1))
    results = [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]
    assert [r["training_iteration"] for r in results] == list(range(1, iteration + 1))
    final = run_dir / "checkpoints" / f"checkpoint_{iteration:06d}"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [final.name]
    name = signal.Signals(signum).name
    assert f"stopped by {name} after iteration {iteration}; the final checkpoint is {final}" in output
    assert "Traceback" not in output
    assert (run_dir / "learning_curve.png").is_file()
    # the checkpoint holds the state after the last logged report, not the abandoned one's
    state = read_checkpoint(final, algorithm="pg")
    assert state["metrics"]["counters"]["num_steps_sampled"] == int(last["timesteps_total"])
    assert len(state["metrics"]["episode_window"]) == len(results[-1]["hist_stats"]["episode_reward"])
    trainer = Trainer.from_checkpoint(final)
    try:
        assert trainer.training_iteration == iteration
        assert trainer.plan.metrics.counters["num_steps_sampled"] == int(last["timesteps_total"])
    finally:
        trainer.stop()


def test_signals_raise_at_once_outside_held_sections_and_at_their_end_inside() -> None:
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with _StopSignals() as signals:
        with pytest.raises(_Stopped) as raised:
            signal.raise_signal(signal.SIGTERM)
        assert raised.value.signum == signal.SIGTERM and signals.received == signal.SIGTERM
        done = []
        with pytest.raises(_Stopped):
            with signals.held():
                signal.raise_signal(signal.SIGINT)
                done.append("the rest of the section")
        assert done == ["the rest of the section"]
        with signals.held(raise_after=False):  # the final checkpoint: a second signal is recorded only
            signal.raise_signal(signal.SIGINT)
        assert signals.received == signal.SIGTERM  # the first signal decides the exit code
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == previous


def test_an_interrupted_replacement_keeps_the_previous_checkpoint(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_checkpoint(tmp_path, "checkpoint_000003", {"w": np.zeros(2)}, algorithm="pg")
    real_replace = os.replace
    calls = []

    def interrupted_after_moving_the_old_one_aside(src: str | Path, dst: str | Path) -> None:
        calls.append((src, dst))
        real_replace(src, dst)
        if len(calls) == 1:
            raise KeyboardInterrupt  # a second Ctrl-C between the two renames

    monkeypatch.setattr(os, "replace", interrupted_after_moving_the_old_one_aside)
    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(tmp_path, "checkpoint_000003", {"w": np.ones(2)}, algorithm="pg")
    monkeypatch.setattr(os, "replace", real_replace)
    assert read_checkpoint(path, algorithm="pg")["w"].tolist() == [0.0, 0.0]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint_000003"]  # no temporary left behind
    write_checkpoint(tmp_path, "checkpoint_000003", {"w": np.ones(2)}, algorithm="pg")
    assert read_checkpoint(path, algorithm="pg")["w"].tolist() == [1.0, 1.0]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint_000003"]


def test_a_final_checkpoint_that_cannot_be_written_is_reported_and_the_exit_code_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from flowrl.cli import main

    train, calls = Trainer.train, []

    def signalled_in_the_third_report(self: Trainer) -> dict[str, object]:
        calls.append(1)
        if len(calls) == 3:
            signal.raise_signal(signal.SIGTERM)  # e.g. a batch scheduler's, which also stopped the workers
        return train(self)

    def save_fails(self: Trainer, *args: object, **kwargs: object) -> Path:
        raise RuntimeError("the workers are gone")

    monkeypatch.setattr(Trainer, "train", signalled_in_the_third_report)
    monkeypatch.setattr(Trainer, "save", save_fails)
    result = CliRunner().invoke(main, ["train", "pg", "--config", "train_batch_size=200", "--stop-iters", "10",
                                       "--checkpoint-freq", "0", "--log-dir", str(tmp_path / "run")])
    assert result.exit_code == 143, result.output
    assert ("stopped by SIGTERM after iteration 2; the final checkpoint could not be written (RuntimeError: the "
            "workers are gone); the last: none") in result.output
    with open(tmp_path / "run" / "progress.csv", newline="") as f:
        assert [row["training_iteration"] for row in csv.DictReader(f)] == ["1", "2"]
