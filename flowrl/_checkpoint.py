"""Checkpoint files: a plain-data tree as one JSON document plus one ``.npz`` of its arrays (private).

Nothing here unpickles: arrays load with ``allow_pickle=False`` and everything else is JSON. Dicts
with non-string keys (optimizer state is keyed by parameter index) and tuples survive the round trip.
A manifest holds the format version, the algorithm and a SHA-256 of each file, so a truncated or
altered checkpoint is refused with the file's name.

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
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FORMAT_VERSION", "write_checkpoint", "read_checkpoint", "checkpoint_algorithm", "find_checkpoint"]

FORMAT_VERSION = 1
_MANIFEST, _TREE, _ARRAYS = "manifest.json", "state.json", "arrays.npz"


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


def _decode(value: Any, arrays: Any) -> Any:
    if isinstance(value, dict):
        if "__array__" in value:
            return arrays[value["__array__"]]
        if "__items__" in value:
            return {_decode(k, arrays): _decode(v, arrays) for k, v in value["__items__"]}
        if "__tuple__" in value:
            return tuple(_decode(v, arrays) for v in value["__tuple__"])
        return {k: _decode(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, arrays) for v in value]
    return value


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_checkpoint(directory: Path, name: str, tree: Any, *, algorithm: str) -> Path:
    """Writes ``tree`` as ``directory/name/`` atomically (a temporary sibling, then a rename).

    A checkpoint of the same name is replaced only once the new one is complete: it is renamed aside,
    the new one renamed in, and only then deleted, so an interruption (even a second Ctrl-C) at any
    point leaves either the old or the new checkpoint under ``name``."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / name
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=directory))
    old: Path | None = None
    try:
        arrays: dict[str, np.ndarray] = {}
        (tmp / _TREE).write_text(json.dumps(_encode(tree, arrays)))
        np.savez(tmp / _ARRAYS, **arrays)  # type: ignore[arg-type]  # numpy stubs type **kwds as allow_pickle
        manifest = {"format_version": FORMAT_VERSION, "algorithm": algorithm,
                    "sha256": {f: _sha256(tmp / f) for f in (_TREE, _ARRAYS)}}
        (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=1))
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{name}.old.", dir=directory))
            os.replace(final, old)  # onto the empty directory mkdtemp made
        os.replace(tmp, final)
    except BaseException:
        if old is not None and not final.exists():
            os.replace(old, final)  # put the previous checkpoint back
        elif old is not None:
            shutil.rmtree(old, ignore_errors=True)  # (made, but the previous checkpoint was not moved yet)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _read_manifest(path: Path) -> tuple[int, str, dict[str, str]]:
    manifest_path = path / _MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
        version, owner, sums = manifest["format_version"], str(manifest["algorithm"]), dict(manifest["sha256"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{manifest_path} is missing or unreadable ({e}); pass the path save() returned") from e
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
    for fname in (_TREE, _ARRAYS):
        file = path / fname
        if not file.is_file() or _sha256(file) != sums.get(fname):
            raise ValueError(f"{file} is missing, truncated or altered (its SHA-256 does not match the "
                             f"manifest); the checkpoint cannot be trusted")
    with np.load(path / _ARRAYS, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    return _decode(json.loads((path / _TREE).read_text()), arrays)
