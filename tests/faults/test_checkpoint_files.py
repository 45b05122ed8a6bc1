"""Checkpoint files under faults: a replacement cut short at any step (a failure, or a kill that leaves the
previous checkpoint aside) keeps one complete checkpoint; killed saves leave debris that the next save or
resume sweeps (never the user's files); every file is fsynced before the rename that publishes it; crafted
checkpoints with valid checksums (object arrays, missing keys, dangling array references, deep nesting, a
non-numeric counter, another model size, non-regular or huge files) are one ValueError naming the file and
the key; and nothing in a checkpoint makes flowrl import a module."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import flowrl
from flowrl import _checkpoint
from flowrl._checkpoint import read_checkpoint, sweep_checkpoint_dir, write_checkpoint
from flowrl.algorithms.pg import PGConfig
from flowrl.cli import main
from flowrl.config import ModelConfig
from flowrl.evaluation import evaluate_checkpoint
from flowrl.inference import load
from flowrl.trainer import Trainer, load_checkpoint_config

REPO = Path(__file__).resolve().parents[2]
NAME = "checkpoint_000003"
OLD, NEW = {"w": np.zeros(3), "step": 1}, {"w": np.ones(3), "step": 2}


def resign(path: Path) -> None:
    """Recomputes the manifest's checksums, as someone crafting a checkpoint would."""
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["sha256"] = {f: hashlib.sha256((path / f).read_bytes()).hexdigest() for f in manifest["sha256"]}
    (path / "manifest.json").write_text(json.dumps(manifest))


def edit_tree(path: Path, edit: Callable[[Any], Any]) -> None:
    """Rewrites the checkpoint's state.json as ``edit`` returns it, then re-signs the checkpoint."""
    tree = json.loads((path / "state.json").read_text())
    (path / "state.json").write_text(json.dumps(edit(tree)))
    resign(path)


def complete_checkpoints(directory: Path) -> dict[str, int]:
    """Where a complete checkpoint sits in ``directory`` (its name or a temporary one) -> its ``step``."""
    found = {}
    for p in directory.iterdir():
        try:
            found[p.name] = read_checkpoint(p, algorithm="pg")["step"]
        except ValueError:
            pass
    return found


# -- 1, 4: a replacement cut short ----------------------------------------------------------------

def test_a_replacement_killed_at_any_step_leaves_one_complete_checkpoint_that_the_next_start_finds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The directory is copied, as a SIGKILL would leave it, before and after every rename, fsync and file
    deletion of the replacement; in each copy a complete checkpoint exists, and after the sweep a next save
    or start does, it is the one under the checkpoint's name, with nothing else left."""
    directory, copies = tmp_path / "ckpts", tmp_path / "copies"
    write_checkpoint(directory, NAME, OLD, algorithm="pg")
    copies.mkdir()

    def copy_now() -> None:
        shutil.copytree(directory, copies / f"{len(list(copies.iterdir())):03d}", symlinks=True)

    def copying(real: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            copy_now()
            out = real(*args, **kwargs)
            copy_now()
            return out
        return step

    def rmtree_one_file_at_a_time(path: Any, ignore_errors: bool = False) -> None:
        for p in sorted(Path(path).iterdir()):
            p.unlink()
            copy_now()
        Path(path).rmdir()

    monkeypatch.setattr(os, "replace", copying(os.replace))
    monkeypatch.setattr(os, "fsync", copying(os.fsync))
    monkeypatch.setattr(_checkpoint.shutil, "rmtree", rmtree_one_file_at_a_time)
    write_checkpoint(directory, NAME, NEW, algorithm="pg")
    monkeypatch.undo()

    states = sorted(copies.iterdir())
    assert len(states) > 12  # three files written, two renames, the previous checkpoint deleted file by file
    seen = set()
    for state in states:
        found = complete_checkpoints(state)
        assert found, f"no complete checkpoint in {sorted(p.name for p in state.iterdir())}"
        aside = [name for name in found if name.startswith(f".{NAME}.old.")]
        assert NAME in found or aside, found
        sweep_checkpoint_dir(state)  # what the next save (or a resume, or Trainer.restore) does first
        assert [p.name for p in state.iterdir()] == [NAME]
        step = read_checkpoint(state / NAME, algorithm="pg")["step"]
        assert step == (found[NAME] if NAME in found else 1)  # the published one, else the previous one
        seen.add((NAME in found, step))
    assert seen == {(True, 1), (False, 1), (True, 2)}  # incl. the instant between the two renames


def test_a_replacement_that_fails_at_any_step_keeps_one_complete_checkpoint_and_no_debris(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing fsync or rename (EIO, ENOSPC) at each step in turn: the error reaches the caller, and the
    directory holds only the checkpoint, complete: the previous one, or the new one once it was published."""
    calls: list[str] = []
    fail_at: list[int] = []
    real = {name: getattr(os, name) for name in ("fsync", "replace")}

    def failing(name: str) -> Callable[..., Any]:
        def step(*args: Any) -> Any:
            calls.append(name)
            if len(calls) in fail_at:
                raise OSError(5, "Input/output error")
            return real[name](*args)
        return step

    for name in real:
        monkeypatch.setattr(os, name, failing(name))
    write_checkpoint(tmp_path / "count", NAME, OLD, algorithm="pg")
    first = len(calls)
    write_checkpoint(tmp_path / "count", NAME, NEW, algorithm="pg")
    steps = len(calls) - first  # a replacement's fsyncs and renames
    assert steps >= 7
    outcomes = set()
    for step in range(1, steps + 1):
        directory = tmp_path / f"fail_{step}"
        calls.clear()
        fail_at[:] = []
        write_checkpoint(directory, NAME, OLD, algorithm="pg")
        fail_at[:] = [len(calls) + step]
        with pytest.raises(OSError, match="Input/output error"):
            write_checkpoint(directory, NAME, NEW, algorithm="pg")
        assert [p.name for p in directory.iterdir()] == [NAME], step
        outcomes.add(read_checkpoint(directory / NAME, algorithm="pg")["step"])
    assert outcomes == {1, 2}  # failed before the publishing rename; after it (the directory's fsync)


KILLED_SAVE = """
import os, signal, sys
from pathlib import Path
import numpy as np
from flowrl._checkpoint import write_checkpoint
directory, name, when = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
real_replace, real_fsync = os.replace, os.fsync
def killed(real):
    def step(*args):
        if when == "after the first rename":
            real(*args)
        os.kill(os.getpid(), signal.SIGKILL)
    return step
if when == "while writing":
    os.fsync = killed(real_fsync)
else:
    os.replace = killed(real_replace)
write_checkpoint(directory, name, {"w": np.ones(3), "step": 2}, algorithm="pg")
"""


def killed_save(directory: Path, when: str) -> None:
    proc = subprocess.run([sys.executable, "-c", KILLED_SAVE, str(directory), NAME, when], capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()


def test_a_save_killed_between_its_renames_keeps_the_previous_checkpoint_for_the_next_save(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, NAME, OLD, algorithm="pg")
    killed_save(tmp_path, "after the first rename")
    assert not (tmp_path / NAME).exists()  # the kill came between moving it aside and moving the new one in
    found = complete_checkpoints(tmp_path)  # the previous one aside, the new one complete but never published
    assert sorted((".old." in name, step) for name, step in found.items()) == [(False, 2), (True, 1)]
    write_checkpoint(tmp_path, "checkpoint_000004", NEW, algorithm="pg")  # the next save puts it back
    assert complete_checkpoints(tmp_path) == {NAME: 1, "checkpoint_000004": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == [NAME, "checkpoint_000004"]


def test_killed_saves_leave_debris_that_the_next_save_sweeps_and_the_users_files_stay(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, NAME, OLD, algorithm="pg")
    mine = [tmp_path / "notes.txt", tmp_path / f".{NAME}.abcd1234" / "mine.txt",
            tmp_path / f".{NAME}.old.abcd1234" / "state.json.bak", tmp_path / ".checkpoint_x" / "state.json"]
    for path in mine:
        path.parent.mkdir(exist_ok=True)
        path.write_text("the user's")
    ours = {NAME, *(p.relative_to(tmp_path).parts[0] for p in mine)}
    killed_save(tmp_path, "while writing")
    debris = [p for p in tmp_path.iterdir() if p.name not in ours]
    assert len(debris) == 1 and [p.name for p in debris[0].iterdir()] == ["state.json"]  # cut short after one file
    killed_save(tmp_path, "before the first rename")  # it swept that debris, and leaves its own
    debris = [p for p in tmp_path.iterdir() if p.name not in ours]
    assert sorted(len(list(p.iterdir())) for p in debris) == [0, 3]  # the new one, and the empty one for the old
    write_checkpoint(tmp_path, NAME, NEW, algorithm="pg")
    assert complete_checkpoints(tmp_path) == {NAME: 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({NAME, *(p.relative_to(tmp_path).parts[0]
                                                                         for p in mine)})
    assert all(path.read_text() == "the user's" for path in mine)


@pytest.mark.parametrize("during", ["fsync", "replace"])  # while writing; while the previous one is aside
def test_a_sweep_from_another_resume_or_restore_leaves_a_save_in_progress_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, during: str) -> None:
    write_checkpoint(tmp_path, NAME, OLD, algorithm="pg")
    real = getattr(os, during)
    swept: list[list[str]] = []

    def and_a_sweep(*args: Any) -> Any:
        out = real(*args)
        if not swept:
            swept.append(sweep_checkpoint_dir(tmp_path))  # as a resume in another process would, right now
        return out

    monkeypatch.setattr(os, during, and_a_sweep)
    write_checkpoint(tmp_path, NAME, NEW, algorithm="pg")
    monkeypatch.undo()
    assert swept == [[]]
    assert complete_checkpoints(tmp_path) == {NAME: 2}
    assert [p.name for p in tmp_path.iterdir()] == [NAME]


def test_a_sweep_that_cannot_change_the_directory_says_so_and_does_not_raise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_checkpoint(tmp_path, NAME, OLD, algorithm="pg")
    aside = tmp_path / f".{NAME}.old.abcd1234"
    os.replace(tmp_path / NAME, aside)

    def read_only(src: Any, dst: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", read_only)  # a read-only checkpoint directory (root ignores chmod)
    assert sweep_checkpoint_dir(tmp_path) == [f"left: {aside}, which a killed save left, could not be cleaned up "
                                              f"(Permission denied)"]
    monkeypatch.undo()
    assert sweep_checkpoint_dir(tmp_path) == [f"recovered: {tmp_path / NAME} (its replacement was killed before "
                                              f"it was written)"]


def test_resume_puts_back_a_checkpoint_that_a_killed_save_left_aside(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["train", "pg", "--config", "num_workers=0", "--config", "train_batch_size=50", "--seed", "0",
            "--log-dir", str(run)]
    first = CliRunner().invoke(main, [*args, "--stop-iters", "1"])
    assert first.exit_code == 0, first.output
    checkpoint = run / "checkpoints" / "checkpoint_000001"
    os.replace(checkpoint, run / "checkpoints" / ".checkpoint_000001.old.abcd1234")  # as the kill leaves it

    resumed = CliRunner().invoke(main, ["train", "pg", "--resume", str(run), "--stop-iters", "2"])
    assert resumed.exit_code == 0, resumed.output
    assert f"recovered: {checkpoint}" in resumed.output
    assert f"resuming {checkpoint} at iteration 1" in resumed.output


# -- 21: fsync ------------------------------------------------------------------------------------

def test_every_file_and_the_directories_are_fsynced_around_the_publishing_rename(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_checkpoint(tmp_path, NAME, OLD, algorithm="pg")
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        events.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_checkpoint(tmp_path, NAME, NEW, algorithm="pg")
    publish = events.index(("replace", str(tmp_path / NAME)))
    synced_before = [Path(path) for kind, path in events[:publish] if kind == "fsync"]
    tmp = next(p.parent for p in synced_before if p.name == "manifest.json")
    assert set(synced_before) >= {tmp / "state.json", tmp / "arrays.npz", tmp / "manifest.json", tmp}
    assert ("fsync", str(tmp_path.resolve())) in events[publish:]  # the rename itself is made durable


# -- 13, 14: crafted content with valid checksums ---------------------------------------------------

@pytest.fixture(scope="module")
def pg_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PG checkpoint (in the driver, 64x64 hidden layers) after one train step."""
    trainer = Trainer("pg", PGConfig(num_workers=0, train_batch_size=50, seed=0,
                                     model=ModelConfig(hidden_sizes=(64, 64))))
    trainer.train()
    path = trainer.save(tmp_path_factory.mktemp("pg") / "checkpoints")
    trainer.stop()
    return path


@pytest.fixture
def crafted(pg_checkpoint: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pg_checkpoint, tmp_path / pg_checkpoint.name))


@pytest.fixture
def trainer_64() -> Iterator[Trainer]:
    trainer = Trainer("pg", PGConfig(num_workers=0, train_batch_size=50, seed=0,
                                     model=ModelConfig(hidden_sizes=(64, 64))))
    yield trainer
    trainer.stop()


def test_an_object_array_is_refused_naming_the_file_and_key_and_never_unpickled(crafted: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    payload = np.empty(1, dtype=object)
    payload[0] = _Planted(str(marker))
    arrays = dict(np.load(crafted / "arrays.npz"))
    np.savez(crafted / "arrays.npz", **arrays, a_planted=payload)
    resign(crafted)
    with pytest.raises(ValueError, match=r"arrays\.npz: the array 'a_planted' cannot be loaded without unpickling"):
        read_checkpoint(crafted, algorithm="pg")
    assert not marker.exists()


class _Planted:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def test_a_dangling_array_reference_is_refused_naming_the_key(crafted: Path) -> None:
    def dangle(tree: Any) -> Any:
        tree["local_worker"]["policies"]["default_policy"]["torch_rng"] = {"__array__": "a999"}
        return tree

    edit_tree(crafted, dangle)
    with pytest.raises(ValueError, match=r"state\.json: local_worker\.policies\.default_policy\.torch_rng refers "
                                         r"to the array 'a999', which arrays\.npz lacks"):
        read_checkpoint(crafted, algorithm="pg")


@pytest.mark.parametrize("depth", [150, 100_000])  # deeper than flowrl writes; deeper than the JSON parser takes
def test_a_deeply_nested_tree_is_a_value_error_naming_the_file(crafted: Path, depth: int) -> None:
    (crafted / "state.json").write_text("[" * depth + "]" * depth)
    resign(crafted)
    with pytest.raises(ValueError, match=rf"{crafted / 'state.json'}.*(nests deeper|not JSON flowrl can read)"):
        read_checkpoint(crafted, algorithm="pg")


@pytest.mark.parametrize(("items", "message"), [
    ([[0]], r"\.__items__ is not a list of \[key, value\] pairs"),
    ([[{"__tuple__": [[1]]}, 0]], r"\.__items__\[0\] has a key of type tuple, which no dict can have"),
])
def test_malformed_item_lists_are_refused_naming_the_key(crafted: Path, items: Any, message: str) -> None:
    def malform(tree: Any) -> Any:
        tree["local_worker"]["policies"]["default_policy"]["optimizer"]["state"] = {"__items__": items}
        return tree

    edit_tree(crafted, malform)
    with pytest.raises(ValueError, match=r"state\.json: local_worker\.policies\.default_policy\.optimizer\.state"
                                         + message):
        read_checkpoint(crafted, algorithm="pg")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: {k: v for k, v in t.items() if k != "trainer"}, r"state\.json lacks the key trainer"),
    (lambda t: {k: v for k, v in t.items() if k != "local_worker"}, r"state\.json lacks the key local_worker"),
    (lambda t: {**t, "trainer": {**t["trainer"], "training_iteration": "x"}},
     r"state\.json: trainer\.training_iteration is 'x' of type str"),
    (lambda t: {**t, "trainer": {**t["trainer"], "episodes_total": True}},
     r"state\.json: trainer\.episodes_total is True of type bool"),
    (lambda t: {**t, "remote_workers": {}}, r"state\.json: remote_workers is \{\} of type dict"),
    (lambda t: (t["local_worker"]["policies"]["default_policy"].pop("weights"), t)[1],
     r"state\.json: local_worker lacks the key 'weights'"),
    (lambda t: (t["local_worker"]["policies"]["default_policy"].update(global_timestep=[1]), t)[1],
     r"state\.json: local_worker cannot be restored"),
    (lambda t: (t["metrics"].update(counters={"num_steps_sampled": "many"}), t)[1],
     r"state\.json: metrics cannot be restored"),
], ids=["no trainer", "no local_worker", "non-numeric counter", "bool counter", "remote_workers not a list",
        "no weights", "list timestep", "non-numeric metrics counter"])
def test_malformed_trees_are_one_value_error_naming_the_file_and_key(crafted: Path, trainer_64: Trainer,
                                                                     edit: Callable[[Any], Any], message: str) -> None:
    edit_tree(crafted, edit)
    with pytest.raises(ValueError, match=message) as raised:
        trainer_64.restore(crafted)
    assert str(crafted / "state.json") in str(raised.value)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: [t], r"state\.json holds a list, where flowrl writes a dict"),
    (lambda t: {**t, "config": [1]}, r"state\.json: config is \[1\] of type list"),
    (lambda t: {**t, "config": {k: v for k, v in t["config"].items() if k != "fields"}},
     r"its config is malformed \(KeyError\('fields'\)\)"),
], ids=["a list", "config a list", "config without fields"])
def test_a_malformed_tree_or_config_is_refused_before_a_trainer_or_policy_is_built(
        crafted: Path, edit: Callable[[Any], Any], message: str) -> None:
    edit_tree(crafted, edit)
    for read in (load_checkpoint_config, load):
        with pytest.raises(ValueError, match=message) as raised:
            read(crafted)
        assert str(crafted) in str(raised.value)


def test_load_refuses_a_checkpoint_without_policies_naming_the_key(crafted: Path) -> None:
    edit_tree(crafted, lambda t: {**t, "local_worker": {}})
    with pytest.raises(ValueError, match=r"state\.json lacks the key local_worker\.policies"):
        load(crafted)


def test_a_checkpoint_of_another_model_size_names_the_layer_and_both_shapes(pg_checkpoint: Path) -> None:
    trainer = Trainer("pg", PGConfig(num_workers=0, train_batch_size=50, seed=0,
                                     model=ModelConfig(hidden_sizes=(32, 32))))
    try:
        with pytest.raises(ValueError, match=r"state\.json: local_worker cannot be restored \(set_weights: layer "
                                             r"'[\w.]+' has shape \(64, 4\) in the given weights and \(32, 4\) in "
                                             r"this model"):
            trainer.restore(pg_checkpoint)
    finally:
        trainer.stop()


def test_optimizer_state_of_another_model_size_names_the_layer_and_both_shapes(trainer_64: Trainer) -> None:
    policy = trainer_64.get_policy()
    small = Trainer("pg", PGConfig(num_workers=0, train_batch_size=50, seed=0,
                                   model=ModelConfig(hidden_sizes=(32, 32))))
    try:
        for p in small.get_policy().model.parameters():
            p.grad = torch.zeros_like(p)
        small.get_policy().optimizer.step()  # Adam's moments now exist, shaped for 32x32
        state = {**policy.get_state(), "optimizer": small.get_policy().get_state()["optimizer"]}
    finally:
        small.stop()
    with pytest.raises(ValueError, match=r"the optimizer's 'exp_avg' for layer '[\w.]+' has shape \(32, 4\) in the "
                                         r"given state and \(64, 4\) in this model"):
        policy.set_state(state)


# -- 15: files that are no regular files, or absurdly large -----------------------------------------

NON_REGULAR = """
import os, resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a read of /dev/zero fails here, not the machine
from flowrl._checkpoint import checkpoint_algorithm, read_checkpoint
for path in map(Path, sys.argv[1:]):
    try:
        (read_checkpoint(path, algorithm="pg") if path.name.startswith("tree") else checkpoint_algorithm(path))
    except ValueError as e:
        print(e)
"""


def test_files_that_are_no_regular_files_are_refused_without_reading_them(pg_checkpoint: Path, tmp_path: Path) -> None:
    cases = []
    for name, make in [("zero", lambda p: p.symlink_to("/dev/zero")), ("fifo", os.mkfifo), ("dir", os.mkdir)]:
        for file in ("manifest.json", "state.json"):
            prefix = "tree" if file == "state.json" else "man"
            case = Path(shutil.copytree(pg_checkpoint, tmp_path / f"{prefix}_{name}"))
            (case / file).unlink()
            make(case / file)
            cases.append(case)
    proc = subprocess.run([sys.executable, "-c", NON_REGULAR, *map(str, cases)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)  # a guard: a FIFO read blocks
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == len(cases), proc.stdout + proc.stderr
    for case, line in zip(cases, lines):
        file = "state.json" if case.name.startswith("tree") else "manifest.json"
        kind = "a directory" if case.name.endswith("dir") else "a device, FIFO or socket"
        assert line.startswith(f"{case / file} is {kind}, not a regular file"), line


def test_an_absurdly_large_manifest_is_refused(crafted: Path) -> None:
    manifest = (crafted / "manifest.json").read_text()
    (crafted / "manifest.json").write_text(manifest + " " * (2 << 20))  # valid JSON, 2 MiB
    with pytest.raises(ValueError, match=r"manifest\.json is larger than 1048576 bytes"):
        read_checkpoint(crafted, algorithm="pg")


# -- 16: nothing in a checkpoint causes an import ---------------------------------------------------

@pytest.fixture
def planted(crafted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str, Path]:
    """The checkpoint, its config's env now 'planted_env_mod:CartPole-v1', and a module of that name beside it
    (importable) that leaves a marker file when imported."""
    marker = tmp_path / "imported"
    (tmp_path / "planted_env_mod.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "planted_env_mod", raising=False)
    env = "planted_env_mod:CartPole-v1"
    edit_tree(crafted, lambda t: (t["config"]["fields"].update(env=env), t)[1])
    return crafted, env, marker


def test_a_module_env_in_a_checkpoint_is_imported_only_when_the_user_names_it(
        planted: tuple[Path, str, Path]) -> None:
    path, env, marker = planted
    refusals = [lambda: load_checkpoint_config(path), lambda: Trainer.from_checkpoint(path),
                lambda: evaluate_checkpoint(path, episodes=1),
                lambda: Trainer.from_checkpoint(path, env="CartPole-v1")]
    for refused in refusals:
        with pytest.raises(ValueError, match=rf"(--env {env}|differs from the env '{env}')"):
            refused()
    assert not marker.exists() and "planted_env_mod" not in sys.modules

    result = CliRunner().invoke(main, ["evaluate", str(path), "--episodes", "1"])
    assert result.exit_code == 2 and f"--env {env}" in result.output and "nothing in a checkpoint" in result.output
    result = CliRunner().invoke(main, ["train", "pg", "--resume", str(path), "--stop-iters", "3",
                                       "--log-dir", str(path.parent / "run")])
    assert result.exit_code == 2 and f"--env {env}" in result.output
    assert not marker.exists()

    result = CliRunner().invoke(main, ["evaluate", str(path), "--episodes", "1", "--env", env])
    assert result.exit_code == 0, result.output
    assert marker.exists()  # named by the user: imported


def test_resume_and_load_import_a_module_env_the_user_names(planted: tuple[Path, str, Path]) -> None:
    path, env, marker = planted
    trainer = Trainer.from_checkpoint(path, env=env)
    try:
        assert trainer.training_iteration == 1 and trainer.config.env == env
    finally:
        trainer.stop()
    assert marker.exists()


def test_load_without_saved_spaces_builds_a_module_env_only_when_named(planted: tuple[Path, str, Path]) -> None:
    path, env, marker = planted
    edit_tree(path, lambda t: (t["local_worker"]["policies"]["default_policy"].pop("spaces"), t)[1])
    with pytest.raises(ValueError, match=rf"--env {env}"):
        flowrl.load(path)
    assert not marker.exists()
    assert flowrl.load(path, env=env).observation_space.shape == (4,)
    assert marker.exists()
