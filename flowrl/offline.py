"""Recorded experience: what rollout workers write (``output=DIR``) and what a plan reads back (``input=DIR``).

**The files.** Each worker writes its own Parquet files into ``DIR``, named
``worker<index>-<token>-<part>.parquet`` (the random token keeps a replaced worker, or a second run into the same
directory, from overwriting anything). A file holds **whole episodes**, each one's rows contiguous and in time
order: a worker keeps an episode's rows until it ends, so any reader (pandas, Ray Data, DuckDB) sees complete
trajectories. Episodes still running when the worker stops are written as they are (their last row neither
terminated nor truncated: a cut). The columns are the ones the env and the behaviour policy produced
(:data:`RECORDED_COLUMNS`): ``eps_id``, ``t``, ``env_id``, ``obs``, ``actions``, ``rewards``, ``terminateds``,
``truncateds``, ``new_obs`` and, when the policy samples from a distribution, ``logp``, ``action_prob``
(``exp(logp)``) and ``action_dist_inputs``, which off-policy estimation reads. An algorithm's own columns
(advantages, n-step returns) are never recorded: a reader's policy computes its own from the episodes.

Multi-dimensional columns are Ray Data tensor columns, so ``ray.data.read_parquet(DIR)`` gives numpy arrays of the
recorded dtype and shape; columns named in ``output_compress_columns`` hold one LZ4 block per row instead (for
image observations; :mod:`flowrl.compression`), decompressed by the reader. Each file's footer holds the spaces
under the key ``flowrl.offline`` (JSON), which the reader checks against the env.

**Writing** (:class:`OutputWriter`) happens in a thread of the worker: a sample only hands its finished episodes
over (the rows are copied into Arrow arrays there, the Parquet encoding and the disk write run in the thread),
so writing holds sampling up only when the thread falls behind by more than a few batches.

**Reading** (:func:`open_dataset`, :func:`read_episodes`): the footers are read first (every file, its columns,
its spaces: errors name the file and the column), then the rows stream block by block, through Ray Data when
Ray runs (any path ``ray.data.read_parquet`` reads: a local directory, or cloud storage on a cluster) or
through pyarrow in this process under the local executor. Nothing is materialized whole on the driver.

Examples:
    >>> import gymnasium as gym, tempfile
    >>> from flowrl.sample_batch import SampleBatch
    >>> directory = tempfile.mkdtemp()
    >>> writer = OutputWriter(directory, worker_index=1, observation_space=gym.spaces.Box(-1, 1, (2,)),
    ...                       action_space=gym.spaces.Discrete(2))
    >>> episode = SampleBatch({EPS_ID: np.zeros(3, np.int64), T: np.arange(3), ENV_ID: np.zeros(3, np.int64),
    ...                        OBS: np.zeros((3, 2), np.float32), ACTIONS: np.array([0, 1, 1]),
    ...                        REWARDS: np.ones(3, np.float32), TERMINATEDS: np.array([False, False, True]),
    ...                        TRUNCATEDS: np.zeros(3, bool), NEXT_OBS: np.zeros((3, 2), np.float32)})
    >>> writer.add([episode]); writer.close()
    >>> dataset = open_dataset(directory, required=(OBS, ACTIONS))
    >>> dataset.num_rows, dataset.row_shapes[OBS], dataset.observation_space
    (3, (2,), Box(-1.0, 1.0, (2,), float32))
    >>> [piece[ACTIONS].tolist() for piece in read_episodes(dataset, executor="local")]
    [[0, 1, 1]]
"""

from __future__ import annotations

import atexit
import json
import logging
import queue
import secrets
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Iterator, Literal, Mapping, Sequence

import gymnasium as gym
import lz4.block
import numpy as np

from flowrl.policy import space_from_data, space_to_data
from flowrl.sample_batch import (ACTION_DIST_INPUTS, ACTION_PROB, ACTIONS, ENV_ID, EPS_ID, LOGP, NEXT_OBS, OBS,
                                 REWARDS, TERMINATEDS, TRUNCATEDS, T, SampleBatch)

__all__ = ["RECORDED_COLUMNS", "METADATA_KEY", "OutputWriter", "RecordedDataset", "open_dataset", "read_blocks",
           "read_episodes", "ESTIMATORS", "off_policy_estimates"]

logger = logging.getLogger(__name__)

#: the columns a worker records, in file order (those a batch has; ``action_prob`` is derived from ``logp``)
RECORDED_COLUMNS = (EPS_ID, T, ENV_ID, OBS, ACTIONS, REWARDS, TERMINATEDS, TRUNCATEDS, NEXT_OBS, LOGP, ACTION_PROB,
                    ACTION_DIST_INPUTS)
#: the footer key of a recorded file's metadata (JSON: format, spaces, LZ4 columns, worker index)
METADATA_KEY = b"flowrl.offline"
FORMAT_VERSION = 1
#: finished episodes are handed to the writing thread once this many rows wait (or at close): one row group each
ROWS_PER_GROUP = 4096
#: a file is closed, and the next one opened, once it holds about this many bytes of column data
DEFAULT_MAX_FILE_BYTES = 64 * 2**20
_QUEUE_DEPTH = 4  # row groups waiting for the thread before ``add`` waits for it


def _space_json(space: gym.Space[Any]) -> Any:
    data = space_to_data(space)
    if data is None:
        return {"type": "other", "repr": repr(space)}
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in data.items()}


def _space_of(data: Mapping[str, Any]) -> gym.Space[Any] | None:
    return None if data.get("type") == "other" else space_from_data(data)


def _recorded(piece: SampleBatch) -> dict[str, np.ndarray]:
    """The recorded columns of one trajectory piece (``action_prob`` added where ``logp`` is)."""
    columns = {k: piece[k] for k in RECORDED_COLUMNS if k in piece}
    if LOGP in columns:
        columns[ACTION_PROB] = np.exp(columns[LOGP])
    return {k: columns[k] for k in RECORDED_COLUMNS if k in columns}


class OutputWriter:
    """Records one worker's experiences as Parquet files of whole episodes in ``directory`` (see the module doc).

    Args:
        directory: where to write (created if missing).
        worker_index: the worker's index, part of each file name and of the footer.
        observation_space / action_space: the env's spaces, kept in every footer.
        compress_columns: columns stored as one LZ4 block per row.
        max_file_bytes: a file is closed once it holds about this many bytes of column data.

    Attributes:
        rows_written: rows handed to the thread so far; ``files``: the files opened so far.
        add_seconds: the time :meth:`add` took in all (what writing cost the sampling loop).
    """

    def __init__(self, directory: str | Path, *, worker_index: int, observation_space: gym.Space[Any],
                 action_space: gym.Space[Any], compress_columns: Collection[str] = (),
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.worker_index, self.max_file_bytes = worker_index, max_file_bytes
        self.compress_columns = tuple(compress_columns)
        self._spaces = {"observation_space": _space_json(observation_space),
                        "action_space": _space_json(action_space)}
        self._token = secrets.token_hex(4)
        self._open: dict[int, list[dict[str, np.ndarray]]] = {}  # eps_id -> its pieces so far
        self._ready: list[dict[str, np.ndarray]] = []  # finished episodes not yet handed over
        self._ready_rows = 0
        self.rows_written, self.add_seconds = 0, 0.0
        self.files: list[Path] = []
        self._queue: queue.Queue[list[dict[str, np.ndarray]] | None] = queue.Queue(_QUEUE_DEPTH)
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"flowrl-output-{worker_index}", daemon=True)
        self._thread.start()
        _LIVE_WRITERS.add(self)

    # -- the sampling side -------------------------------------------------------------------------
    def add(self, trajectories: Sequence[SampleBatch]) -> None:
        """Takes a sample's raw trajectory pieces (one env's rows each, in time order, before any postprocessing):
        episodes that end in them are queued for writing, the others wait for their next rows.

        Raises:
            RuntimeError: the writing thread failed (the message names the file and the cause), or the writer
                is closed.
        """
        start = time.perf_counter()
        self._check()
        for trajectory in trajectories:
            for piece in trajectory.split_by_episode():
                eps_id = int(piece[EPS_ID][0])
                self._open.setdefault(eps_id, []).append(_recorded(piece))
                if piece[TERMINATEDS][-1] or piece[TRUNCATEDS][-1]:
                    self._finish(eps_id)
        if self._ready_rows >= ROWS_PER_GROUP:
            self._hand_over()
        self.add_seconds += time.perf_counter() - start

    def _finish(self, eps_id: int) -> None:
        pieces = self._open.pop(eps_id)
        episode = pieces[0] if len(pieces) == 1 else {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}
        self._ready.append(episode)
        self._ready_rows += len(episode[EPS_ID])

    def _hand_over(self) -> None:
        if self._ready:
            self._queue.put(self._ready)
            self.rows_written += self._ready_rows
            self._ready, self._ready_rows = [], 0

    def flush(self) -> None:
        """Writes every finished episode and waits until the thread has written everything handed to it."""
        self._check()
        self._hand_over()
        self._queue.join()
        self._check()

    def close(self) -> None:
        """Writes every episode, the unfinished ones as they are (cut), closes the file and stops the thread.
        Idempotent."""
        if self._closed:
            return
        self._check()
        for eps_id in list(self._open):
            self._finish(eps_id)
        self._hand_over()
        self._closed = True
        self._queue.put(None)
        self._thread.join()
        _LIVE_WRITERS.discard(self)
        self._raise_thread_error()

    def _check(self) -> None:
        self._raise_thread_error()
        if self._closed:
            raise RuntimeError(f"the output writer of {self.directory} is closed")

    def _raise_thread_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"recording experiences to {self.directory} failed: {self._error!r}; the episodes "
                               f"after it were not written (free disk space or fix the directory's permissions "
                               f"and run again)") from self._error

    # -- the writing thread --------------------------------------------------------------------------
    def _run(self) -> None:
        writer: Any = None
        file_bytes = 0
        while True:
            episodes = self._queue.get()
            try:
                if episodes is None:
                    if writer is not None:
                        writer.close()
                    return
                if self._error is None:
                    table = self._table(episodes)
                    if writer is None:
                        writer, file_bytes = self._open_file(table.schema), 0
                    writer.write_table(table)
                    file_bytes += table.nbytes
                    if file_bytes >= self.max_file_bytes:
                        writer.close()
                        writer = None
            except BaseException as error:  # kept for the sampling side, which raises it  # noqa: BLE001
                self._error = error
                if writer is not None:
                    try:
                        writer.close()
                    except BaseException:  # noqa: BLE001  # the first error is the one to report
                        pass
                    writer = None
            finally:
                self._queue.task_done()

    def _open_file(self, schema: Any) -> Any:
        import pyarrow.parquet as pq
        path = self.directory / f"worker{self.worker_index}-{self._token}-{len(self.files):05d}.parquet"
        self.files.append(path)
        return pq.ParquetWriter(path, schema)

    def _table(self, episodes: list[dict[str, np.ndarray]]) -> Any:
        import pyarrow as pa
        from ray.data.extensions import ArrowTensorArray
        columns = {k: np.concatenate([e[k] for e in episodes]) for k in episodes[0]}
        arrays, compressed = {}, {}
        for name, column in columns.items():
            if name in self.compress_columns:
                compressed[name] = {"dtype": column.dtype.str, "shape": list(column.shape[1:])}
                arrays[name] = pa.array([lz4.block.compress(np.ascontiguousarray(row), store_size=True)
                                         for row in column], type=pa.binary())
            elif column.ndim > 1:
                arrays[name] = ArrowTensorArray.from_numpy(np.ascontiguousarray(column))
            else:
                arrays[name] = pa.array(column)
        metadata = {"format": FORMAT_VERSION, "worker_index": self.worker_index, **self._spaces,
                    "compressed": compressed}
        return pa.table(arrays).replace_schema_metadata({METADATA_KEY: json.dumps(metadata).encode()})


_LIVE_WRITERS: weakref.WeakSet[OutputWriter] = weakref.WeakSet()


@atexit.register
def _close_live_writers() -> None:
    """A process that exits without closing its writers (a script that never stopped its trainer) still writes
    what it sampled."""
    for writer in list(_LIVE_WRITERS):
        try:
            writer.close()
        except Exception as error:  # noqa: BLE001  # at exit: report, and close the others
            logger.error("closing the output writer of %s at exit failed: %r", writer.directory, error)


# -- reading ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RecordedDataset:
    """A recorded dataset as its files' footers describe it (:func:`open_dataset`).

    Attributes:
        source: the path or URI given.
        files: its Parquet files, sorted (paths as the filesystem names them).
        filesystem: the pyarrow filesystem they are on.
        num_rows: rows in all files.
        row_shapes / dtypes: each column's row shape and dtype (LZ4 columns: the decompressed ones).
        compressed: the columns stored as LZ4 blocks, ``name -> (dtype, row shape)``.
        observation_space / action_space: the spaces the footers name (``None`` for data flowrl did not write).
    """

    source: str
    files: tuple[str, ...]
    filesystem: Any
    num_rows: int
    row_shapes: Mapping[str, tuple[int, ...]]
    dtypes: Mapping[str, np.dtype[Any]]
    compressed: Mapping[str, tuple[np.dtype[Any], tuple[int, ...]]] = field(default_factory=dict)
    observation_space: gym.Space[Any] | None = None
    action_space: gym.Space[Any] | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self.row_shapes)


_HOW_TO_RECORD = "record a dataset with output=DIR (flowrl train ALGO --output DIR)"


def _list_files(source: str) -> tuple[Any, list[str]]:
    import pyarrow.fs as pafs
    if "://" in source:
        filesystem, root = pafs.FileSystem.from_uri(source)
    else:
        filesystem, root = pafs.LocalFileSystem(), str(Path(source).expanduser().resolve())
    try:
        info = filesystem.get_file_info(root)
    except OSError as error:
        raise ValueError(f"input={source!r} cannot be read: {error}") from error
    if info.type == pafs.FileType.NotFound:
        raise ValueError(f"input={source!r}: no such file or directory; {_HOW_TO_RECORD}")
    if info.type == pafs.FileType.File:
        return filesystem, [root]
    try:
        found = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
    except OSError as error:
        raise ValueError(f"input={source!r}: the directory cannot be listed ({error}); check its permissions"
                         ) from error
    files = sorted(f.path for f in found if f.type == pafs.FileType.File and f.path.endswith(".parquet"))
    if not files:
        raise ValueError(f"input={source!r} holds no .parquet files; {_HOW_TO_RECORD}")
    return filesystem, files


def _register_tensor_type() -> None:
    """Makes pyarrow know Ray Data's tensor column type (importing its module registers it), so that files read
    here give arrays of the recorded shape rather than lists."""
    import ray.data.extensions  # noqa: F401


def _column_spec(field: Any, compressed: Mapping[str, Any]) -> tuple[np.dtype[Any], tuple[int, ...]]:
    import pyarrow as pa
    if field.name in compressed:
        spec = compressed[field.name]
        return np.dtype(spec["dtype"]), tuple(spec["shape"])
    kind = field.type
    if isinstance(kind, pa.ExtensionType) and hasattr(kind, "shape"):  # a Ray Data tensor column
        return np.dtype(kind.storage_type.value_type.to_pandas_dtype()), tuple(kind.shape)
    if pa.types.is_fixed_size_list(kind):
        return np.dtype(kind.value_type.to_pandas_dtype()), (kind.list_size,)
    try:
        return np.dtype(kind.to_pandas_dtype()), ()
    except (NotImplementedError, TypeError):
        return np.dtype(object), ()


def open_dataset(source: str, *, required: Collection[str] = (OBS, ACTIONS),
                 observation_space: gym.Space[Any] | None = None,
                 action_space: gym.Space[Any] | None = None) -> RecordedDataset:
    """Reads the footers of the Parquet files at ``source`` (a file, a directory, or a URI pyarrow reads) and
    checks them: every file readable, with the ``required`` columns, the same columns as the others, and
    observations and actions that fit the given spaces.

    Raises:
        ValueError: naming the file and the column: a missing path, no Parquet files, an unreadable file (a worker
            that died while writing leaves one), a missing or differing column, observations or actions of other
            spaces than the env's.
    """
    import pyarrow.parquet as pq
    _register_tensor_type()
    filesystem, files = _list_files(source)
    rows, first_columns, first_file = 0, None, files[0]
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, np.dtype[Any]] = {}
    compressed: dict[str, tuple[np.dtype[Any], tuple[int, ...]]] = {}
    spaces: dict[str, gym.Space[Any] | None] = {"observation_space": None, "action_space": None}
    for path in files:
        try:
            with filesystem.open_input_file(path) as handle:
                parquet = pq.ParquetFile(handle)
                meta, schema = parquet.metadata, parquet.schema_arrow
        except Exception as error:  # pyarrow raises ArrowInvalid, OSError, ...
            raise ValueError(f"input={source!r}: {path} is not a readable Parquet file ({error}); a worker that "
                             f"died while writing leaves such a file: delete it or move it out of the directory"
                             ) from error
        rows += meta.num_rows
        info = json.loads((schema.metadata or {}).get(METADATA_KEY, b"{}"))
        lz4_columns = info.get("compressed", {})
        names = [name for name in schema.names]
        for column in required:
            if column not in names:
                raise ValueError(f"input={source!r}: {path} has no column {column!r}, which this run reads; it has "
                                 f"{names}. {_HOW_TO_RECORD[0].upper()}{_HOW_TO_RECORD[1:]}")
        if first_columns is None:
            first_columns = names
            for f in schema:
                dtype, shape = _column_spec(f, lz4_columns)
                shapes[f.name], dtypes[f.name] = shape, dtype
                if f.name in lz4_columns:
                    compressed[f.name] = (dtype, shape)
            for key in spaces:
                if key in info:
                    spaces[key] = _space_of(info[key])
        elif set(names) != set(first_columns):
            raise ValueError(f"input={source!r}: {path} has columns {sorted(names)} and {first_file} has "
                             f"{sorted(first_columns)}; a dataset's files must record the same columns (record "
                             f"each setting into its own directory)")
        else:
            for f in schema:
                dtype, shape = _column_spec(f, lz4_columns)
                if (dtype, shape) != (dtypes[f.name], shapes[f.name]):
                    raise ValueError(f"input={source!r}: column {f.name!r} of {path} holds {dtype} rows of shape "
                                     f"{shape} and {first_file} holds {dtypes[f.name]} rows of shape "
                                     f"{shapes[f.name]}; record each env into its own directory")
    dataset = RecordedDataset(source, tuple(files), filesystem, rows, shapes, dtypes, compressed, **spaces)
    _check_spaces(dataset, observation_space, action_space)
    return dataset


def _check_spaces(dataset: RecordedDataset, observation_space: gym.Space[Any] | None,
                  action_space: gym.Space[Any] | None) -> None:
    where = f"input={dataset.source!r} ({dataset.files[0]})"
    for column, space, recorded in ((OBS, observation_space, dataset.observation_space),
                                    (ACTIONS, action_space, dataset.action_space)):
        if space is None or column not in dataset.row_shapes:
            continue
        kind = "observations" if column == OBS else "actions"
        if recorded is not None and recorded != space:
            raise ValueError(f"{where}: column {column!r} holds {kind} of {recorded}, and this run's env has "
                             f"{space}; read a dataset recorded in this env, or set env= to the one it was "
                             f"recorded in")
        shape, dtype = dataset.row_shapes[column], dataset.dtypes[column]
        expected_shape = tuple(space.shape) if space.shape is not None else ()
        fits = shape == expected_shape and (
            dtype.kind in "iu" if isinstance(space, gym.spaces.Discrete) else dtype == np.dtype(space.dtype))
        if not fits:
            raise ValueError(f"{where}: column {column!r} holds {dtype} rows of shape {shape}, and this run's env "
                             f"has {kind} of {space}; read a dataset recorded in this env, or set env= to the one it "
                             f"was recorded in")


def _decode(block: Mapping[str, Any], dataset: RecordedDataset) -> SampleBatch:
    """One block of rows (``column -> numpy``) as a SampleBatch, LZ4 columns decompressed."""
    columns: dict[str, np.ndarray] = {}
    for name, values in block.items():
        if name not in dataset.row_shapes:
            continue  # a column a reader added (Ray Data's "path")
        if name in dataset.compressed:
            dtype, shape = dataset.compressed[name]
            values = np.stack([np.frombuffer(lz4.block.decompress(v), dtype=dtype).reshape(shape) for v in values]) \
                if len(values) else np.zeros((0, *shape), dtype)
        columns[name] = np.asarray(values)
    return SampleBatch(columns)


def read_blocks(dataset: RecordedDataset, *, executor: Literal["ray", "local"] = "ray",
                files: Sequence[str] | None = None) -> Iterator[SampleBatch]:
    """The rows of ``files`` (default: all the dataset's), in that order, block by block as SampleBatches.

    ``executor="ray"`` streams them with Ray Data (read tasks on the cluster; a block at a time reaches this
    process), ``"local"`` with pyarrow in this process (no Ray)."""
    files = list(dataset.files if files is None else files)
    _register_tensor_type()
    if executor == "local":
        import pyarrow.parquet as pq
        for path in files:
            with dataset.filesystem.open_input_file(path) as handle:
                for record_batch in pq.ParquetFile(handle).iter_batches(batch_size=65536):
                    yield _decode({name: _to_numpy(record_batch.column(name)) for name in record_batch.schema.names},
                                  dataset)
        return
    import ray.data
    _quiet_ray_data()
    ds = ray.data.read_parquet(files, filesystem=dataset.filesystem)
    ds.context.execution_options.preserve_order = True  # episodes stay whole and in order
    for block in ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=1):
        yield _decode(block, dataset)


def _quiet_ray_data() -> None:
    """Keeps Ray Data's progress bars and per-read INFO lines off the console, where flowrl's own progress goes
    (its log file in the Ray session directory, ``logs/ray-data``, still has every line); its warnings still show."""
    import ray.data
    from ray.util.debug import log_once

    context = ray.data.DataContext.get_current()
    if context.enable_progress_bars:
        log_once("ray_data_progress_manager_disabled")  # the one-line notice that the bars are off: taken here
        context.enable_progress_bars = False
    context.print_on_execution_start = False
    for handler in logging.getLogger("ray.data").handlers:
        if not isinstance(handler, logging.FileHandler) and handler.level < logging.WARNING:
            handler.setLevel(logging.WARNING)


def _to_numpy(array: Any) -> np.ndarray:
    if hasattr(array, "to_numpy_ndarray"):
        return np.asarray(array.to_numpy_ndarray())
    try:
        return np.asarray(array.to_numpy(zero_copy_only=False))
    except TypeError:  # an extension array's to_numpy takes no arguments
        return np.asarray(array.to_numpy())


def read_episodes(dataset: RecordedDataset, *, executor: Literal["ray", "local"] = "ray",
                  files: Sequence[str] | None = None) -> Iterator[SampleBatch]:
    """The dataset's episodes, one SampleBatch each, in file order; an episode split across two blocks of a file
    is joined again. A piece that ends neither terminated nor truncated is a cut (the run stopped mid-episode)."""
    carry: SampleBatch | None = None
    for block in read_blocks(dataset, executor=executor, files=files):
        pieces = block.split_by_episode()
        if not pieces:
            continue
        if carry is not None:
            first = pieces[0]
            if first[EPS_ID][0] == carry[EPS_ID][-1] and (T not in first or first[T][0] == carry[T][-1] + 1):
                pieces[0] = SampleBatch.concat([carry, first])
            else:
                yield carry
        *whole, last = pieces
        yield from whole
        carry = last if not (last[TERMINATEDS][-1] or last[TRUNCATEDS][-1]) else None
        if carry is None:
            yield last
    if carry is not None:
        yield carry


# -- off-policy estimation -------------------------------------------------------------------------

#: the estimators :func:`off_policy_estimates` computes: per-decision importance sampling and its weighted form
ESTIMATORS = ("is", "wis")


def off_policy_estimates(episodes: Sequence[SampleBatch], target_logp: Sequence[np.ndarray], *, gamma: float,
                         estimators: Collection[str] = ESTIMATORS) -> dict[str, dict[str, float]]:
    """How well a target policy would do on recorded episodes, from the behaviour policy's action probabilities
    (``logp``) and the target's (``target_logp``, one array per episode), without running it.

    Per step ``t`` of an episode, ``p_t`` is the product of the ratios ``pi(a_i|s_i) / mu(a_i|s_i)`` up to ``t``.
    ``"is"`` (per-decision importance sampling, Precup et al. 2000) estimates the target's discounted return as
    the mean over episodes of ``sum_t gamma^t p_t r_t``; ``"wis"`` (weighted) divides each ``p_t`` by the mean of
    ``p_t`` over the episodes that reach step ``t`` (biased, far lower variance). Each estimator reports
    ``v_behaviour`` (the mean discounted return recorded), ``v_target`` and ``v_gain = v_target / v_behaviour``.

    Examples:
        >>> from flowrl.testing import fake_episode
        >>> episodes = [fake_episode(0, 3), fake_episode(1, 2)]  # behaviour: every action with probability 0.5
        >>> same = [e[LOGP] for e in episodes]  # the target is the behaviour policy: nothing to correct
        >>> {k: round(v, 4) for k, v in off_policy_estimates(episodes, same, gamma=1.0)["is"].items()}
        {'v_behaviour': 2.5, 'v_target': 2.5, 'v_gain': 1.0}
        >>> always = [np.log(np.where(e[ACTIONS] == 1, 1.0, 1e-9)) for e in episodes]  # takes action 1 only
        >>> round(off_policy_estimates(episodes, always, gamma=1.0)["is"]["v_target"], 4)  # actions 0,1,0 / 0,1
        0.0
    """
    unknown = sorted(set(estimators) - set(ESTIMATORS))
    if unknown:
        raise ValueError(f"unknown off-policy estimators {unknown}; use some of {list(ESTIMATORS)}")
    if len(episodes) != len(target_logp) or not episodes:
        raise ValueError(f"off_policy_estimates needs one target logp array per episode (>= 1 episode); got "
                         f"{len(episodes)} episodes and {len(target_logp)} arrays")
    cumulative, discounted = [], []
    for episode, logp in zip(episodes, target_logp):
        ratios = np.exp(np.asarray(logp, np.float64) - np.asarray(episode[LOGP], np.float64))
        cumulative.append(np.cumprod(ratios))
        discounted.append(np.asarray(episode[REWARDS], np.float64) * gamma ** np.arange(episode.count))
    v_behaviour = float(np.mean([d.sum() for d in discounted]))
    out: dict[str, dict[str, float]] = {}
    if "is" in estimators:
        v_target = float(np.mean([(p * d).sum() for p, d in zip(cumulative, discounted)]))
        out["is"] = _estimate(v_behaviour, v_target)
    if "wis" in estimators:
        longest = max(len(p) for p in cumulative)
        sums, counts = np.zeros(longest), np.zeros(longest)
        for p in cumulative:
            sums[:len(p)] += p
            counts[:len(p)] += 1
        mean_weight = sums / counts
        normalized = [np.divide(p, mean_weight[:len(p)], out=np.zeros_like(p), where=mean_weight[:len(p)] > 0)
                      for p in cumulative]
        v_target = float(np.mean([(w * d).sum() for w, d in zip(normalized, discounted)]))
        out["wis"] = _estimate(v_behaviour, v_target)
    return out


def _estimate(v_behaviour: float, v_target: float) -> dict[str, float]:
    return {"v_behaviour": v_behaviour, "v_target": v_target,
            "v_gain": v_target / v_behaviour if v_behaviour != 0 else float("nan")}
