"""A Tune sweep killed part-way, for tests of ``Tuner.restore`` (:mod:`flowrl.tune`).

The sweep: PPO on CartPole, a grid over ``seed`` (0 to 3), 3 iterations a trial, a checkpoint after each, two
trials at a time. While the hold file exists, every trial but seed 0's holds inside its second ``train()``
(:class:`HoldSecondIteration`, after its first iteration was reported and checkpointed), and
:class:`KillWhenHeld` SIGKILLs the driver at the first step where seed 0's trial has finished and both running
trials are held and the sweep's files on disk say so: the sweep then says exactly what each trial did (one finished, two with one checkpointed
iteration, one never started), which the restored sweep must finish, each trial exactly once.

``python -m flowrl.testing.sweeps ADDRESS STORAGE NAME HOLD_FILE`` runs it against the Ray cluster at ``ADDRESS``
(set ``TUNE_GLOBAL_CHECKPOINT_S=0`` so that the sweep's state is written at every step).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ray import tune

from flowrl.callbacks import Callbacks

__all__ = ["SEEDS", "TRAIN_BATCH_SIZE", "ITERATIONS", "HoldSecondIteration", "KillWhenHeld", "sweep_trainable", "trained",
           "sweep_tuner", "main"]

SEEDS = (0, 1, 2, 3)
TRAIN_BATCH_SIZE = 200
ITERATIONS = 3


class HoldSecondIteration(Callbacks):
    """Holds a trainer (seed 0's excepted) in its second ``train()`` while :attr:`hold_file` exists, and records
    every ``train()`` that completes: one JSON line (iteration, timesteps, pid) in ``trained-seed<S>.jsonl`` beside
    the hold file, written through before the result is returned (:func:`trained`)."""

    hold_file = ""

    def on_train_result(self, *, trainer: Any, result: dict[str, Any]) -> None:
        seed = trainer.config.seed
        if seed != SEEDS[0] and result["training_iteration"] == 2:
            while Path(self.hold_file).exists():  # until the driver is killed, and this actor with it
                time.sleep(0.05)
        line = json.dumps({"iteration": result["training_iteration"], "timesteps": result["timesteps_total"],
                           "pid": os.getpid()}) + "\n"
        fd = os.open(_record(self.hold_file, seed), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)


def _record(hold_file: str | Path, seed: int) -> Path:
    return Path(hold_file).with_name(f"trained-seed{seed}.jsonl")


def trained(hold_file: str | Path, seed: int) -> list[dict[str, Any]]:
    """Every ``train()`` the trial of ``seed`` completed, in order, across the killed and the restored sweep."""
    path = _record(hold_file, seed)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class KillWhenHeld(tune.Callback):
    """SIGKILLs this process once a trial has finished, every running trial is held with its first iteration
    checkpointed, and the sweep's files on disk say exactly that. Only while the hold file exists: the restored
    sweep, which Tune gives the same callbacks, is not killed.

    Tune writes its state at every step (with ``TUNE_GLOBAL_CHECKPOINT_S=0``) into a staging directory and copies it
    to the storage path in the background, one copy at a time and not atomically (a kill during a copy leaves a
    truncated file: a first version of this test left an empty searcher state, from which ``Tuner.restore`` started
    a new sweep). So once the trials are where the kill wants them, the callback, holding the controller (no new copy
    starts), waits for every copy in flight (every syncer in the process) and kills only if
    the files on disk then load and show the trials so; else the controller takes another step and copies again.
    """

    def __init__(self, hold_file: str | Path) -> None:
        self.hold_file = Path(hold_file)

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        if not self.hold_file.exists() or not trials:
            return
        running = [t for t in trials if t.status == "RUNNING"]
        finished = [t for t in trials if t.status == "TERMINATED"]
        if not (finished and len(running) == 2 and all(_checkpointed_iteration(t) == 1 for t in running)):
            return
        for syncer in _syncers():
            syncer.wait()
        if _settled_state(Path(trials[0].storage.experiment_fs_path)) is not None:
            os.kill(os.getpid(), signal.SIGKILL)


def _syncers() -> list[Any]:
    """Every Ray Train/Tune background syncer in this process (the experiment's and the trials' storage each make
    one)."""
    import gc

    from ray.train._internal.syncer import _BackgroundSyncer

    return [o for o in gc.get_objects() if isinstance(o, _BackgroundSyncer)]


def _settled_state(experiment: Path) -> dict[str, bytes] | None:
    """The sweep's state files on disk if each loads and the newest experiment state shows one finished trial and
    two running ones checkpointed at iteration 1, else ``None``."""
    from ray import cloudpickle

    files = {p.name: p.read_bytes() for p in experiment.iterdir() if p.is_file() and p.suffix in (".json", ".pkl")}
    parsed = {}
    try:
        for name, data in files.items():  # the experiment state is JSON; the searcher's state and the tuner pickles
            parsed[name] = json.loads(data) if name.startswith("experiment_state-") else cloudpickle.loads(data)
    except Exception:  # a copy in progress: truncated
        return None
    states = sorted(name for name in parsed if name.startswith("experiment_state-"))
    if not states or "tuner.pkl" not in files or not any(n.startswith("basic-variant-state-") for n in files):
        return None
    statuses = []
    for trial, meta in parsed[states[-1]]["trial_data"]:
        trial = json.loads(trial) if isinstance(trial, str) else trial
        meta = json.loads(meta) if isinstance(meta, str) else meta
        manager = meta.get("checkpoint_manager")
        if isinstance(manager, dict) and "value" in manager:  # Tune's JSON keeps it pickled, as hex
            manager = cloudpickle.loads(bytes.fromhex(manager["value"]))
        latest = getattr(manager, "latest_checkpoint_result", None)
        statuses.append((trial.get("status"), latest.metrics.get("training_iteration") if latest else None))
    running = [iteration for status, iteration in statuses if status == "RUNNING"]
    if not any(status == "TERMINATED" for status, _ in statuses) or running != [1, 1]:
        return None
    return files


def _checkpointed_iteration(trial: Any) -> int | None:
    latest = trial.latest_checkpoint_result
    if latest is None or (trial.last_result or {}).get("training_iteration") != 1:
        return None
    iteration = latest.metrics.get("training_iteration")
    return int(iteration) if iteration is not None else None


def sweep_trainable(hold_file: str | Path) -> type:
    """The sweep's Trainable: small PPO batches, no remote workers, holding as the module docstring says."""
    from flowrl.algorithms.ppo import PPOConfig
    from flowrl.tune import trainable

    hold = type("Hold", (HoldSecondIteration,), {"hold_file": str(hold_file)})
    config = PPOConfig(env="CartPole-v1", num_workers=0, train_batch_size=TRAIN_BATCH_SIZE, sgd_minibatch_size=100,
                       num_sgd_iter=2, callbacks=hold)
    return trainable("ppo", config)


def sweep_tuner(hold_file: str | Path, storage: str | Path, name: str, *, kill: bool) -> tune.Tuner:
    run_config = tune.RunConfig(name=name, storage_path=str(storage), stop={"training_iteration": ITERATIONS},
                                checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1), verbose=0,
                                callbacks=[KillWhenHeld(hold_file)] if kill else None)
    return tune.Tuner(sweep_trainable(hold_file), param_space={"seed": tune.grid_search(list(SEEDS))},
                      tune_config=tune.TuneConfig(max_concurrent_trials=2), run_config=run_config)


def main(argv: list[str]) -> None:
    from flowrl import runtime

    address, storage, name, hold_file = argv
    runtime.init(address)
    sweep_tuner(hold_file, storage, name, kill=True).fit()
    raise SystemExit("the sweep finished without being killed")


if __name__ == "__main__":
    main(sys.argv[1:])
