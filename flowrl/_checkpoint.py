"""Checkpoint files: a plain-data tree as one JSON document plus one ``.npz`` of its arrays (private).

Nothing here unpickles: arrays load with ``allow_pickle=False`` and everything else is JSON. Dicts
with non-string keys (optimizer state is keyed by parameter index) and tuples survive the round trip.
A manifest holds the format version, the algorithm and a SHA-256 of each file, so a truncated or
altered checkpoint is refused with the file's name. Checksums catch accidents, not intent, so reading also
refuses what a crafted checkpoint could hold: a file that is not a regular file (a link to a device, a FIFO)
or is absurdly large, an object array, a reference to an array the ``.npz`` lacks, a nesting deeper than
any flowrl writes. Every such refusal is one ``ValueError`` naming the file (and the key, where one is at fault).

Writing is crash-safe: the files are written and fsynced in a temporary sibling directory, which is renamed
into place; a checkpoint of the same name is first renamed aside and deleted only once the new one is in
place. What a killed save leaves behind (its temporary directory, or the previous checkpoint still aside) is
swept by the next save into that directory (:func:`sweep_checkpoint_dir`): the previous checkpoint is put back
under its name when the new one never arrived.

Examples:
    >>> import tempfile
    >>> tree = {"w": np.arange(3.0), "opt": {0: {"step": 2}}, "betas": (0.9, 0.99), "big": 2**100}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = write_checkpoint(Path(d), "checkpoint_000001", tree, algorithm="pg")
    ...     back = read_checkpoint(path, algorithm="pg")
    ...     owner = checkpoint_algorithm(path)
    >>> back["w"].tolist(), back["opt"], back["betas"], back["big"] == 2**100, owner
    ([0.0, 1.0, 2.0], {0: {'step': 2}}, (0.9, 0.99), True, 'pg')
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

if sys.platform != "win32":
    import fcntl

__all__ = ["FORMAT_VERSION", "write_checkpoint", "read_checkpoint", "checkpoint_algorithm", "find_checkpoint",
           "sweep_checkpoint_dir", "check_tree", "restoring", "check_env_named", "fsync_dir"]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
_MANIFEST, _TREE, _ARRAYS = "manifest.json", "state.json", "arrays.npz"
_FILES = frozenset({_MANIFEST, _TREE, _ARRAYS})
#: The most bytes read from a manifest (a few hundred bytes in practice) and from a state.json (kilobytes to
#: megabytes: the arrays, replay data included, are in the .npz).
_MANIFEST_CAP, _TREE_CAP = 1 << 20, 1 << 30
#: The deepest nesting read back from state.json: flowrl's own trees nest about ten levels.
_MAX_DEPTH = 100
#: A temporary directory of :func:`write_checkpoint`: ``.<name>.<8 chars of mkdtemp>`` for a new checkpoint,
#: ``.<name>.old.<8 chars>`` for the previous one of that name, renamed aside.
_TEMPORARY = re.compile(r"\.(?P<name>.+?)\.(?P<old>old\.)?[a-z0-9_]{8}")


def _encode(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(value, np.ndarray):
        key = f"a{len(arrays)}"
        arrays[key] = value
        return {"__array__": key}
    if isinstance(value, np.generic):
        return _encode(value.item(), arrays)
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: _encode(v, arrays) for k, v in value.items()}
        return {"__items__": [[_encode(k, arrays), _encode(v, arrays)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, arrays) for v in value]}
    if isinstance(value, list):
        return [_encode(v, arrays) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"a checkpoint holds plain data (numpy arrays, numbers, strings, lists, tuples, dicts); "
                    f"got {type(value).__name__}: {value!r:.80}")


def _decode(value: Any, arrays: Mapping[str, np.ndarray], file: Path, key: str = "", depth: int = 0) -> Any:
    """``value`` (at ``key`` in ``file``) with its array references, item lists and tuples rebuilt.

    Raises:
        ValueError: a nesting deeper than ``_MAX_DEPTH``, a reference to an array ``arrays`` lacks, or a
            malformed ``__items__``/``__tuple__`` entry (naming ``file`` and ``key``).
    """
    if depth > _MAX_DEPTH:
        raise ValueError(f"{file}: {key[:120] or 'the tree'}... nests deeper than {_MAX_DEPTH} levels, which flowrl "
                         f"never writes; the checkpoint is malformed")
    if isinstance(value, dict):
        if "__array__" in value:
            ref = value["__array__"]
            if not isinstance(ref, str) or ref not in arrays:
                raise ValueError(f"{file}: {key or 'the tree'} refers to the array {ref!r:.40}, which {_ARRAYS} "
                                 f"lacks; the checkpoint is malformed")
            return arrays[ref]
        if "__items__" in value:
            items = value["__items__"]
            if not isinstance(items, list) or not all(isinstance(kv, list) and len(kv) == 2 for kv in items):
                raise ValueError(f"{file}: {key or 'the tree'}.__items__ is not a list of [key, value] pairs; the "
                                 f"checkpoint is malformed")
            out = {}
            for i, (k, v) in enumerate(items):
                dict_key = _decode(k, arrays, file, f"{key}.__items__[{i}]", depth + 1)
                try:
                    hash(dict_key)
                except TypeError:
                    raise ValueError(f"{file}: {key}.__items__[{i}] has a key of type {type(dict_key).__name__}, "
                                     f"which no dict can have; the checkpoint is malformed") from None
                out[dict_key] = _decode(v, arrays, file, f"{key}[{dict_key!r:.40}]", depth + 1)
            return out
        if "__tuple__" in value:
            if not isinstance(value["__tuple__"], list):
                raise ValueError(f"{file}: {key or 'the tree'}.__tuple__ is not a list; the checkpoint is malformed")
            return tuple(_decode(v, arrays, file, f"{key}[{i}]", depth + 1) for i, v in enumerate(value["__tuple__"]))
        return {k: _decode(v, arrays, file, f"{key}.{k}" if key else k, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, arrays, file, f"{key}[{i}]", depth + 1) for i, v in enumerate(value)]
    return value


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextmanager
def _open_regular(path: Path) -> Iterator[int]:
    """An open descriptor of ``path`` once it is known to be a regular file (a symlink to one is followed;
    one to a device, a FIFO or a directory is not read: opening does not block and nothing is read).

    Raises:
        ValueError: ``path`` is missing, unreadable, or not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise ValueError(f"{path} is missing or unreadable ({e.strerror}); pass the path save() returned") from e
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a device, FIFO or socket"
            raise ValueError(f"{path} is {kind}, not a regular file; a checkpoint's files are regular files "
                             f"(the checkpoint is damaged or crafted)")
        yield fd
    finally:
        os.close(fd)


def _read_capped(path: Path, cap: int) -> bytes:
    """The bytes of the regular file ``path``, refused past ``cap`` bytes.

    Raises:
        ValueError: not a regular file (see :func:`_open_regular`), or larger than ``cap``.
    """
    with _open_regular(path) as fd, os.fdopen(os.dup(fd), "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise ValueError(f"{path} is larger than {cap} bytes, far more than flowrl writes there; the checkpoint "
                         f"is damaged or crafted")
    return data


def _sha256_of_file(path: Path) -> str:
    """The SHA-256 of the regular file ``path``, read in chunks (an arrays file can be large)."""
    digest = hashlib.sha256()
    with _open_regular(path) as fd, os.fdopen(os.dup(fd), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_synced(path: Path, write: Any) -> None:
    """Creates ``path``, lets ``write(file)`` fill it, then flushes it to the disk (fsync)."""
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(directory: Path) -> None:
    """Flushes ``directory``'s entries (the names created or renamed in it) to the disk (not on Windows, where
    a directory cannot be opened to fsync it)."""
    if sys.platform == "win32":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _locked(directory: Path, *, wait: bool) -> Iterator[bool]:
    """Holds an exclusive advisory lock (``flock``) on ``directory`` while the block runs, and says whether it
    got it: without ``wait``, ``False`` when another process holds it. A save holds its temporary directory
    and the checkpoint it moves aside, so that a sweep in another process (a resume, a restore) leaves a save
    in progress alone; the lock ends with the process, so a killed save's leftovers are free. (No locking on
    Windows: there, the block always runs.)"""
    if sys.platform == "win32":
        yield True
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _holds_only_checkpoint_files(path: Path) -> bool:
    """Whether ``path`` is a real directory holding nothing but files a checkpoint is made of."""
    try:
        return path.is_dir() and not path.is_symlink() and {p.name for p in path.iterdir()} <= _FILES
    except OSError:
        return False


def sweep_checkpoint_dir(directory: Path | str) -> list[str]:
    """Cleans up after saves into ``directory`` that were killed, and says what it did.

    A killed :func:`write_checkpoint` can leave its temporary directory (``.<name>.XXXXXXXX``) or the previous
    checkpoint of that name, renamed aside (``.<name>.old.XXXXXXXX``). Such a previous checkpoint is renamed
    back to ``<name>`` when no ``<name>`` exists (the new one never arrived), and deleted when one does; a
    temporary directory is deleted. Only directories named like that and holding nothing but a checkpoint's
    files (or nothing: a save killed before it wrote one) are touched: nothing else in ``directory`` (the
    user's files) ever is, nor are the directories of a save still running in another process.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = write_checkpoint(Path(d), "checkpoint_000001", {"w": 1}, algorithm="pg")
        ...     os.replace(Path(d, "checkpoint_000001"), Path(d, ".checkpoint_000001.old.abcd1234"))
        ...     (Path(d) / ".notes.abcd1234").mkdir()  # named alike, but not a checkpoint's files: left alone
        ...     _ = (Path(d) / ".notes.abcd1234" / "todo.txt").write_text("mine")
        ...     done = sweep_checkpoint_dir(d)
        ...     names = sorted(p.name for p in Path(d).iterdir())
        >>> names
        ['.notes.abcd1234', 'checkpoint_000001']
        >>> [line.split(": ")[0] for line in done]
        ['recovered']

    Returns:
        One line per directory recovered or deleted.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    done = []
    for path in sorted(directory.iterdir()):
        match = _TEMPORARY.fullmatch(path.name)
        if match is None or not _holds_only_checkpoint_files(path):
            continue
        try:
            with _locked(path, wait=False) as free:
                if not free:
                    continue  # a save in progress in another process
                final = directory / match["name"]
                if match["old"] and not final.exists() and (path / _MANIFEST).is_file():
                    os.replace(path, final)
                    fsync_dir(directory)
                    done.append(f"recovered: {final} (its replacement was killed before it was written)")
                else:
                    shutil.rmtree(path, ignore_errors=True)
                    done.append(f"deleted: {path} (left by a killed save)")
        except OSError as e:  # e.g. a read-only checkpoint directory: restoring from it must still work
            done.append(f"left: {path}, which a killed save left, could not be cleaned up ({e.strerror})")
    return done


def write_checkpoint(directory: Path, name: str, tree: Any, *, algorithm: str) -> Path:
    """Writes ``tree`` as ``directory/name/`` atomically (a temporary sibling, then a rename).

    Each file and the temporary directory are fsynced before the rename that publishes them, and
    ``directory`` after it, so a published checkpoint is whole on the disk even across a power loss. What
    killed saves left in ``directory`` is swept first (:func:`sweep_checkpoint_dir`).

    A checkpoint of the same name is replaced only once the new one is complete: it is renamed aside,
    the new one renamed in, and only then deleted, so an interruption (even a second Ctrl-C) at any
    point leaves either the old or the new checkpoint under ``name``; a kill between the two renames
    leaves the old one aside, where the next save (or :func:`sweep_checkpoint_dir`) puts it back."""
    directory.mkdir(parents=True, exist_ok=True)
    for line in sweep_checkpoint_dir(directory):
        logger.warning("%s", line)
    final = directory / name
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=directory))
    old: Path | None = None
    locks = ExitStack()
    try:
        locks.enter_context(_locked(tmp, wait=True))
        arrays: dict[str, np.ndarray] = {}
        tree_bytes = json.dumps(_encode(tree, arrays)).encode()
        _write_synced(tmp / _TREE, lambda f: f.write(tree_bytes))
        # numpy stubs type **kwds as allow_pickle:
        _write_synced(tmp / _ARRAYS, lambda f: np.savez(f, **arrays))  # type: ignore[arg-type]
        manifest = {"format_version": FORMAT_VERSION, "algorithm": algorithm,
                    "sha256": {f: _sha256(tmp / f) for f in (_TREE, _ARRAYS)}}
        _write_synced(tmp / _MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
        fsync_dir(tmp)
        if final.exists():
            locks.enter_context(_locked(final, wait=True))  # held by it while it is aside
            old = Path(tempfile.mkdtemp(prefix=f".{name}.old.", dir=directory))
            os.replace(final, old)  # onto the empty directory mkdtemp made
        os.replace(tmp, final)
        fsync_dir(directory)
    except BaseException:
        if old is not None and not final.exists():
            os.replace(old, final)  # put the previous checkpoint back
        elif old is not None:
            shutil.rmtree(old, ignore_errors=True)  # (made, but the previous checkpoint was not moved yet)
        shutil.rmtree(tmp, ignore_errors=True)
        locks.close()
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    locks.close()
    return final


def _read_manifest(path: Path) -> tuple[int, str, dict[str, str]]:
    manifest_path = path / _MANIFEST
    data = _read_capped(manifest_path, _MANIFEST_CAP)
    try:
        manifest = json.loads(data)
        version, owner, sums = manifest["format_version"], str(manifest["algorithm"]), dict(manifest["sha256"])
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise ValueError(f"{manifest_path} is missing or unreadable ({e!r:.200}); pass the path save() returned") from e
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(f"{manifest_path} has checkpoint format {version!r}, newer than this flowrl's "
                         f"{FORMAT_VERSION}; restore it with the flowrl version that wrote it")
    return version, owner, sums


def _is_checkpoint(path: Path) -> bool:
    return (path / _MANIFEST).is_file()


def find_checkpoint(path: Path | str) -> Path:
    """``path`` if it is a checkpoint, else the latest checkpoint of the run directory ``path`` (or of the run
    whose checkpoint directory ``path`` is), so a run directory of ``flowrl train`` names its latest checkpoint.

    "Latest" is the run's own record (``run_info.json``, which ``flowrl train`` rewrites at every checkpoint
    and at ``--resume``): after a resume from an earlier checkpoint it is the newest branch's, even while the
    abandoned branch's higher-numbered checkpoints are on disk. Without a record (a run of an older flowrl, a
    bare folder), it is the highest-numbered ``checkpoint_*`` in ``path`` or in ``path/checkpoints``; a
    ``checkpoint_*`` symlink that points out of its folder is not taken.

    Raises:
        ValueError: ``path`` is no checkpoint and holds none, or its record names a checkpoint that is gone.
    """
    from flowrl.logger import RUN_INFO, recorded_checkpoint, recorded_checkpoint_dir

    path = Path(path)
    if _is_checkpoint(path):
        return path
    latest = recorded_checkpoint(path) if path.is_dir() else None
    if latest is None and path.is_dir() and (path.parent / RUN_INFO).is_file():
        folder = recorded_checkpoint_dir(path.parent)  # `path` may be the run's checkpoint directory
        if folder is not None and folder.resolve() == path.resolve():
            latest, path = recorded_checkpoint(path.parent), path.parent
    if latest is not None:
        if not _is_checkpoint(latest):
            raise ValueError(f"{path / RUN_INFO} records {str(latest)!r} as the run's latest checkpoint, but it is "
                             f"gone (no {_MANIFEST}); pass a checkpoint_* directory itself")
        return latest
    for folder in (path, path / "checkpoints"):
        found = [p for p in folder.glob("checkpoint_*") if _is_checkpoint(p) and
                 (not p.is_symlink() or p.resolve().parent == folder.resolve())] if folder.is_dir() else []
        if found:
            return max(found, key=lambda p: (int(m.group()) if (m := re.search(r"\d+$", p.name)) else -1, p.name))
    raise ValueError(f"{str(path)!r} is not a checkpoint (no {_MANIFEST}) and holds no checkpoint_* directory; "
                     f"pass a path that `flowrl train` printed")


def checkpoint_algorithm(path: Path | str) -> str:
    """The algorithm name a checkpoint's manifest records (read before knowing which trainer to build).

    Raises:
        ValueError: a missing or unreadable manifest, or a newer format.
    """
    return _read_manifest(Path(path))[1]


def read_checkpoint(path: Path | str, *, algorithm: str) -> Any:
    """The tree written by :func:`write_checkpoint`, after checking format, algorithm and checksums.

    Raises:
        ValueError: a missing, truncated or altered file, a newer format, or another algorithm's checkpoint.
    """
    path = Path(path)
    _, owner, sums = _read_manifest(path)
    if owner != algorithm:
        raise ValueError(f"{path} is a checkpoint of {owner!r}, not {algorithm!r}; restore it into a "
                         f"{owner!r} trainer")
    tree_file, arrays_file = path / _TREE, path / _ARRAYS
    tree_bytes = _read_capped(tree_file, _TREE_CAP)  # hashed and parsed from the same bytes
    for file, digest in ((tree_file, hashlib.sha256(tree_bytes).hexdigest()), (arrays_file, None)):
        if (digest or _sha256_of_file(file)) != sums.get(file.name):
            raise ValueError(f"{file} is missing, truncated or altered (its SHA-256 does not match the "
                             f"manifest); the checkpoint cannot be trusted")
    arrays = _load_arrays(arrays_file)
    try:
        encoded = json.loads(tree_bytes)
    except (ValueError, RecursionError) as e:  # RecursionError: a nesting deeper than the JSON parser takes
        raise ValueError(f"{tree_file} is not JSON flowrl can read ({e!r:.200}); the checkpoint is malformed") from e
    return _decode(encoded, arrays, tree_file)


def _load_arrays(file: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz``, loaded without unpickling.

    Raises:
        ValueError: not an ``.npz``, or an array that only unpickling could load (naming the file and key).
    """
    try:
        loaded = np.load(file, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"{file} is not an .npz of arrays ({e}); the checkpoint is malformed") from e
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(f"{file} is not an .npz of arrays (it holds a single {type(loaded).__name__}); the "
                         f"checkpoint is malformed")
    arrays = {}
    with loaded as npz:
        for key in npz.files:
            try:
                arrays[key] = npz[key]
            except (ValueError, OSError, EOFError) as e:  # an object array: it would need unpickling
                raise ValueError(f"{file}: the array {key!r} cannot be loaded without unpickling ({e}); a "
                                 f"checkpoint holds only plain arrays, so it is malformed or crafted") from e
    return arrays


def check_tree(tree: Any, checkpoint: Path | str, required: Mapping[str, type | tuple[type, ...]]) -> None:
    """Checks that ``tree`` (read from ``checkpoint``) is a dict holding each dotted key of ``required`` with a
    value of its type (a bool is not an int here), before any of it is restored.

    Examples:
        >>> check_tree({"trainer": {"training_iteration": "x"}}, "ckpt", {"trainer.training_iteration": int})
        Traceback (most recent call last):
        ...
        ValueError: ckpt/state.json: trainer.training_iteration is 'x' of type str, where flowrl writes type int; ...

    Raises:
        ValueError: a missing key, or a value of another type, naming the file and the key.
    """
    file = Path(checkpoint) / _TREE
    if not isinstance(tree, dict):
        raise ValueError(f"{file} holds a {type(tree).__name__}, where flowrl writes a dict; the checkpoint is "
                         f"malformed or was not written by Trainer.save")
    for dotted, kinds in required.items():
        value, parts = tree, dotted.split(".")
        for i, part in enumerate(parts):
            if not isinstance(value, dict) or part not in value:
                raise ValueError(f"{file} lacks the key {'.'.join(parts[:i + 1])}; the checkpoint is malformed or "
                                 f"was not written by Trainer.save")
            value = value[part]
        wanted = kinds if isinstance(kinds, tuple) else (kinds,)
        if not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted):
            names = " or ".join(k.__name__ for k in wanted)
            raise ValueError(f"{file}: {dotted} is {value!r:.60} of type {type(value).__name__}, where flowrl "
                             f"writes type {names}; the checkpoint is malformed")


@contextmanager
def restoring(checkpoint: Path | str, key: str) -> Iterator[None]:
    """Turns an error that restoring the part ``key`` of ``checkpoint`` raises (a missing key, a value of
    the wrong type or shape) into one ``ValueError`` naming the file and the key.

    Examples:
        >>> with restoring("ckpt", "local_worker"):
        ...     {"policies": {}}["weights"]
        Traceback (most recent call last):
        ...
        ValueError: ckpt/state.json: local_worker lacks the key 'weights'; the checkpoint is malformed or ...
    """
    file = Path(checkpoint) / _TREE
    try:
        yield
    except KeyError as e:
        raise ValueError(f"{file}: {key} lacks the key {e.args[0]!r}; the checkpoint is malformed or was written "
                         f"for another model or config") from e
    except (TypeError, ValueError, IndexError, AttributeError, RuntimeError) as e:
        raise ValueError(f"{file}: {key} cannot be restored ({' '.join(str(e).split())[:300]}); the checkpoint is "
                         f"malformed or was written for another model or config") from e



def check_env_named(checkpoint: Path | str, saved_env: object, env: str | None) -> None:
    """Refuses to go on with a checkpoint whose saved env id would make flowrl import a module (``"module:Id"``)
    unless the caller named that env itself (``env``): nothing in a checkpoint may cause an import, as a
    crafted checkpoint could name a module planted beside it. An ``env`` that differs from the saved one is
    refused too (a checkpoint is evaluated and resumed on its own env).

    Examples:
        >>> check_env_named("ckpt", "CartPole-v1", None)  # a registered id imports nothing
        >>> check_env_named("ckpt", "my_envs:Grid-v0", "my_envs:Grid-v0")  # named by the user
        >>> check_env_named("ckpt", "my_envs:Grid-v0", None)
        Traceback (most recent call last):
        ...
        ValueError: ckpt was trained on the env 'my_envs:Grid-v0', which imports the module 'my_envs'; ...

    Raises:
        ValueError: as above, saying how to name the env.
    """
    if env is not None and env != saved_env:
        raise ValueError(f"env {env!r} differs from the env {saved_env!r} that {checkpoint} was trained on; a "
                         f"checkpoint is resumed and evaluated on its own env: name {saved_env!r} or drop the env")
    if env is None and isinstance(saved_env, str) and ":" in saved_env:
        module = saved_env.partition(":")[0]
        raise ValueError(f"{checkpoint} was trained on the env {saved_env!r}, which imports the module {module!r}; "
                         f"nothing in a checkpoint may make flowrl import code (a crafted checkpoint could name a "
                         f"module planted beside it), so name the env yourself if you trust that module: "
                         f"--env {saved_env} (from Python: env={saved_env!r})")
