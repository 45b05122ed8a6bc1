"""LZ4 compression of image columns: frames cross Ray and sit in replay compressed, and come back bit for bit.

An *image column* holds ``uint8`` or ``bool`` rows of at least 2 dimensions and at least :data:`MIN_ROW_BYTES`
each (an 84x84x4 Atari stack is 28,224 bytes; a 10x10x4 MinAtar frame, 400 bytes, stays as it is). Atari frames
are mostly flat background: LZ4 shrinks a Pong stack about 40x, at about 5 us a row to compress and 4 us to
decompress on this project's 2-core machine (``benchmarks/atari.py`` measures it).

Two places use it:

- **on the wire** (:func:`mark_for_wire`): a batch marked by a rollout worker pickles its image columns as one LZ4
  block each (:func:`pack_column`) and is a plain batch again when unpickled, so whatever receives it over Ray
  (the driver, a replay shard, a learner actor) sees ordinary arrays;
- **in replay** (:class:`PackedRows`): a one-row replay store keeps each image row as its own LZ4 block and
  decompresses the rows a replay draws.

Examples:
    >>> frames = np.zeros((3, 84, 84, 4), np.uint8); frames[1, 10:20] = 7
    >>> packed = pack_column(frames)
    >>> len(packed[2]) < frames.nbytes // 40, np.array_equal(unpack_column(*packed), frames)
    (True, True)
    >>> is_image_column(frames), is_image_column(np.zeros((3, 10, 10, 4), bool)), is_image_column(np.zeros((3, 4)))
    (True, False, False)
"""

from __future__ import annotations

from typing import Any

import lz4.block
import numpy as np
import numpy.typing as npt

from flowrl.sample_batch import WIRE_ATTRIBUTE

__all__ = ["MIN_ROW_BYTES", "is_image_column", "pack_column", "unpack_column", "PackedRows", "mark_for_wire",
           "WIRE_ATTRIBUTE"]

#: The smallest row (in bytes) worth compressing: below it LZ4's per-call cost outweighs what it saves.
MIN_ROW_BYTES = 1024
_IMAGE_DTYPES = (np.dtype(np.uint8), np.dtype(np.bool_))


def is_image_column(column: np.ndarray) -> bool:
    """Whether ``column`` holds image rows worth compressing (``uint8``/``bool``, rows of >= 2 dimensions and
    >= :data:`MIN_ROW_BYTES` bytes)."""
    return (column.dtype in _IMAGE_DTYPES and column.ndim >= 3 and len(column) > 0
            and column.nbytes // len(column) >= MIN_ROW_BYTES)


def pack_column(column: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    """``(dtype, shape, lz4 block)`` of a whole column, for :func:`unpack_column`."""
    return column.dtype.str, column.shape, lz4.block.compress(np.ascontiguousarray(column), store_size=True)


def unpack_column(dtype: str, shape: tuple[int, ...], data: bytes) -> np.ndarray:
    """The writable array that :func:`pack_column` packed."""
    return np.frombuffer(bytearray(lz4.block.decompress(data)), dtype=np.dtype(dtype)).reshape(shape)


def mark_for_wire(batch: Any) -> Any:
    """Marks a :class:`~flowrl.sample_batch.SampleBatch` (or every policy batch of a ``MultiAgentBatch``) to cross
    Ray with its image columns LZ4-compressed; returns it. Batches made from it (slices, concatenations) are
    unmarked, and so is the batch that arrives."""
    policy_batches = getattr(batch, "policy_batches", None)
    for part in (policy_batches.values() if policy_batches is not None else (batch,)):
        if any(is_image_column(column) for column in part.values()):
            part.__dict__[WIRE_ATTRIBUTE] = True
    return batch


class PackedRows:
    """An image column kept as one LZ4 block per row: what a one-row replay store holds instead of the array.

    Args:
        capacity: rows it can hold.
        row_shape / dtype: one row's shape and dtype.

    Examples:
        >>> rows = PackedRows(4, (84, 84, 4), np.dtype(np.uint8))
        >>> rows[0], rows[1] = np.full((84, 84, 4), 3, np.uint8), np.zeros((84, 84, 4), np.uint8)
        >>> rows[np.array([1, 0, 0])][:, 0, 0, 0].tolist(), rows.nbytes < 1000
        ([0, 3, 3], True)
    """

    def __init__(self, capacity: int, row_shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self.row_shape, self.dtype = tuple(row_shape), np.dtype(dtype)
        self._row_bytes = int(np.prod(self.row_shape)) * self.dtype.itemsize
        self._rows: list[bytes | None] = [None] * capacity
        self.nbytes = 0  # the compressed bytes held

    @property
    def shape(self) -> tuple[int, ...]:
        """``(capacity, *row_shape)``, as the array it stands in for."""
        return (len(self._rows), *self.row_shape)

    def __setitem__(self, index: int, row: np.ndarray) -> None:
        data = lz4.block.compress(np.ascontiguousarray(row), store_size=False)
        old = self._rows[index]
        self.nbytes += len(data) - (len(old) if old is not None else 0)
        self._rows[index] = data

    def __getitem__(self, rows: npt.NDArray[np.int64]) -> np.ndarray:
        """The rows at an index array, as a new array (what indexing the array it stands in for gives)."""
        return self.take(rows)

    def take(self, indexes: npt.NDArray[np.int64] | range) -> np.ndarray:
        """The rows at ``indexes`` as one new array ``[len(indexes), *row_shape]``."""
        out = np.empty((len(indexes), *self.row_shape), self.dtype)
        if not len(indexes):
            return out
        flat = out.reshape(len(indexes), -1).view(np.uint8)
        size, rows = self._row_bytes, self._rows
        for i, index in enumerate(indexes.tolist() if isinstance(indexes, np.ndarray) else indexes):
            flat[i] = np.frombuffer(lz4.block.decompress(rows[index], uncompressed_size=size), np.uint8)
        return out
