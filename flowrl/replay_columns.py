"""One-row replay items kept as columns: the storage behind :class:`~flowrl.replay_storage.ReplayBuffer` while
every item it holds is a one-row :class:`~flowrl.sample_batch.SampleBatch` of the same columns.

A one-step replay buffer (DQN, DDPG, TD3, SAC) holds one item per env step; drawing a training batch from a list
of such items joins one small batch per drawn row, while :class:`RowStore` keeps one array per column and draws
with one fancy index per column. It behaves as the list of items it stands in for.

Examples:
    >>> store = RowStore(capacity=4)
    >>> for i in range(3):
    ...     store.append(SampleBatch({"obs": np.array([[i, i]], np.float32), "rewards": np.array([1.0])}))
    >>> len(store), store.take(np.array([2, 0, 2]))["obs"][:, 0].tolist(), store[1]["obs"].tolist()
    (3, [2.0, 0.0, 2.0], [[1.0, 1.0]])
    >>> store.fits(SampleBatch({"obs": np.zeros((2, 2), np.float32), "rewards": np.zeros(2)}))  # two rows
    False
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from flowrl.compression import PackedRows, is_image_column
from flowrl.sample_batch import SampleBatch

__all__ = ["RowStore", "row_store_of"]


class RowStore:
    """The stored items of a buffer whose every item is a one-row SampleBatch with the same columns (names in the
    same order, dtypes and row shapes), kept as one array per column whose row ``i`` is item ``i``.

    Sampling is then one fancy index per column instead of joining one small batch per drawn item (what a
    one-step replay buffer of DQN, DDPG, TD3 or SAC holds: a 256-row replay is ~20x cheaper). It stands in for the
    buffer's list of items (``append``, ``[i] = item``, ``[i]``, ``len``, iteration: a fresh one-row copy per
    item), and :meth:`fits` says whether an item can go in; the buffer turns it into that list otherwise.
    The arrays grow by doubling up to ``capacity`` rows. With ``compress``, image columns
    (:func:`flowrl.compression.is_image_column`: Atari frame stacks) are kept as one LZ4 block per row
    (:class:`~flowrl.compression.PackedRows`) and decompressed as they are drawn.
    """

    def __init__(self, capacity: int, compress: bool = False) -> None:
        self.capacity = capacity
        self.compress = compress
        # name -> np.ndarray, or PackedRows for a compressed image column (an index array gives a new array of
        # either)
        self.columns: dict[str, Any] = {}
        self.size = 0
        self._allocated = 0  # rows of the arrays

    def fits(self, item: Any) -> bool:
        """Whether ``item`` is a one-row SampleBatch of this store's columns (any, while it is empty)."""
        if type(item) is not SampleBatch or len(item) == 0:
            return False
        columns = self.columns
        if not columns:
            return all(v.ndim >= 1 and len(v) == 1 for v in item.values())
        if len(item) != len(columns):
            return False
        for (key, value), (name, column) in zip(dict.items(item), columns.items()):
            if key != name or value.dtype != column.dtype or value.shape != (1, *column.shape[1:]):
                return False
        return True

    def _reserve(self, rows: int) -> None:
        columns = self.columns
        have = self._allocated
        if rows > have:
            grown = self._allocated = max(rows, min(self.capacity, 2 * have))
            for key, column in columns.items():
                if isinstance(column, PackedRows):  # holds capacity rows from the start
                    continue
                bigger = np.empty((grown, *column.shape[1:]), column.dtype)
                bigger[:self.size] = column[:self.size]
                columns[key] = bigger

    def _new_column(self, value: np.ndarray, rows: int) -> Any:
        if self.compress and is_image_column(value):
            return PackedRows(self.capacity, value.shape[1:], value.dtype)
        return np.empty((rows, *value.shape[1:]), value.dtype)

    @property
    def nbytes(self) -> int:
        """The bytes the stored rows take (compressed ones as compressed)."""
        return sum(c.nbytes if isinstance(c, PackedRows) else c[:self.size].nbytes for c in self.columns.values())

    def __setitem__(self, index: int, item: SampleBatch) -> None:
        if not self.columns:
            self._allocated = min(self.capacity, 1024)
            self.columns = {k: self._new_column(v, self._allocated) for k, v in item.items()}
        self._reserve(index + 1)
        columns = self.columns
        for key, value in dict.items(item):
            columns[key][index] = value[0]
        self.size = max(self.size, index + 1)

    def append(self, item: SampleBatch) -> None:
        self[self.size] = item

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> SampleBatch:
        if not -self.size <= index < self.size:
            raise IndexError(f"item {index} of {self.size}")
        index %= self.size
        return self.take(np.arange(index, index + 1))

    def __iter__(self) -> Iterator[SampleBatch]:
        return (self[i] for i in range(self.size))

    def take(self, indexes: npt.NDArray[np.int64]) -> SampleBatch:
        """The items at ``indexes`` joined, as joining their one-row batches gives them."""
        return SampleBatch._of_checked({k: v[indexes] for k, v in self.columns.items()})

    def encoded(self) -> dict[str, Any]:
        """The items' plain-data state in ``flowrl.replay_storage``'s layout, from the columns (one layout)."""
        for key, column in self.columns.items():
            if column.dtype.hasobject:
                raise ValueError(f"stored column {key!r} holds Python objects (dtype {column.dtype}), which a "
                                 f"plain-data state cannot carry; drop or convert that column before storing batches")
        n = self.size
        rows = np.arange(n)  # an index array gives a new array from either kind of column, never a view
        layouts = [{"lengths": np.ones(n, np.int64), "columns": {k: v[rows] for k, v in self.columns.items()}}]
        return {"kind": "SampleBatch", "batches": {"layout_of": np.zeros(n, np.int64), "layouts": layouts if n else []}}


def row_store_of(items: Sequence[Any], capacity: int, compress: bool = False) -> RowStore | None:
    """A :class:`RowStore` holding ``items`` (in order), or ``None`` if one does not fit."""
    store = RowStore(capacity, compress)
    for item in items:
        if not store.fits(item):
            return None
        store.append(item)
    return store
