"""Segment trees: ``O(log n)`` range reductions over an array of leaves, and the prefix-sum descent of
proportional sampling (Schaul et al., *Prioritized Experience Replay*, arXiv:1511.05952).

:class:`~flowrl.replay_buffers.PrioritizedReplayBuffer` keeps its priorities in a :class:`SumSegmentTree` (for
proportional draws) and a :class:`MinSegmentTree` (for the largest importance weight).

The tree is one numpy array (``value``), so batched writes (:meth:`SegmentTree.set_many`) and batched descents
(:meth:`SumSegmentTree.find_prefixsum_idxes`) run one vectorised operation per tree level. A single write, a
range reduction and a single descent walk the same array through a ``memoryview``, whose items are plain
Python floats: each step costs what a step over a Python list costs, several times less than a numpy scalar
operation. Both ways give the same bits: a node is always ``operation(left child, right child)``, and the
scalar form of each operation is IEEE-identical to the array one (only the payload of a NaN that adds two NaNs
may differ).

Examples:
    >>> tree = SumSegmentTree(8)
    >>> tree.set_many([0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0])
    >>> tree[5] = 0.5
    >>> tree.sum(), tree.sum(1, 3), tree.find_prefixsum_idx(6.2)
    (10.5, 5.0, 3)
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Sequence, overload

import numpy as np
import numpy.typing as npt

from flowrl.validation import check_int

__all__ = ["SegmentTree", "SumSegmentTree", "MinSegmentTree"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# SegmentTree.set_many sets up to this many leaves one by one: about the measured crossover on 2^14- to 2^20-leaf
# trees (on 2^20 leaves a single write takes ~3.5 us, one vectorised pass over the levels ~130 us).
_SCALAR_SET_LIMIT = 32


def _minimum(a: float, b: float) -> float:
    """``np.minimum`` of two floats, bit for bit (NaN wins; of two equal values, ``b``), without a ufunc call."""
    return a if a < b or a != a else b


def _maximum(a: float, b: float) -> float:
    """``np.maximum`` of two floats, bit for bit (NaN wins; of two equal values, ``b``), without a ufunc call."""
    return a if a > b or a != a else b


# The scalar form of the array operations, used on the Python floats of the tree's memoryview.
_SCALAR_OPERATIONS: dict[Any, Callable[[float, float], float]] = {
    np.add: operator.add, np.minimum: _minimum, np.maximum: _maximum}


class SegmentTree:
    """A complete binary tree over ``capacity`` leaves that keeps ``operation`` over every subtree.

    The tree is one array of ``2 * capacity`` floats: node 1 is the root, node ``i`` has children
    ``2i`` and ``2i + 1``, and the leaves are the second half (leaf ``j`` is node ``capacity + j``).
    Setting a leaf recomputes its ancestors, so a range reduction costs ``O(log capacity)``.

    Args:
        capacity: the number of leaves; a power of two (round up with
            ``1 << (n - 1).bit_length()``).
        operation: an associative binary function that also works element-wise on numpy arrays
            (``np.add``, ``np.minimum``); used for scalar and batched updates alike (for ``np.add``,
            ``np.minimum`` and ``np.maximum``, scalar steps use an identical Python form).
        neutral_element: the identity of ``operation`` (``0.0`` for a sum, ``inf`` for a min); every
            leaf starts at it.

    Attributes:
        value: the tree's array (read-only attribute: change its contents in place, never rebind it).

    Raises:
        ValueError: ``capacity`` is not a positive power of two.

    Examples:
        >>> tree = SegmentTree(4, np.maximum, -np.inf)
        >>> tree[1], tree[2] = 5.0, 3.0
        >>> tree.reduce(), tree.reduce(2, 4), tree.reduce(0, 1)
        (5.0, 3.0, -inf)
    """

    def __init__(self, capacity: int, operation: Callable[[Any, Any], Any], neutral_element: float) -> None:
        check_int("capacity", capacity, 1, "leaves; a power of two")
        capacity = int(capacity)
        if capacity & (capacity - 1):
            raise ValueError(f"capacity={capacity} must be a power of two; use "
                             f"{1 << (capacity - 1).bit_length()} (the next one up)")
        self.capacity = capacity
        self.operation = operation
        self.neutral_element = float(neutral_element)
        self._value: FloatArray = np.full(2 * capacity, self.neutral_element, dtype=np.float64)
        # The same memory, whose items are Python floats (typed Any: typeshed types memoryview items as int).
        self._view: Any = self._value.data
        self._depth = capacity.bit_length() - 1  # levels between the root and the leaves
        self._scalar_operation: Callable[[Any, Any], Any] = _SCALAR_OPERATIONS.get(operation, operation)

    @property
    def value(self) -> FloatArray:
        """The tree's array: the root at 1, leaf ``j`` at ``capacity + j``."""
        return self._value

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_view"}  # a memoryview does not pickle

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._view = self._value.data

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self.capacity}, root={self._value[1]!r})"

    def _node(self, idx: int) -> int:
        """The node of leaf ``idx``, checked."""
        if type(idx) is not int and (isinstance(idx, bool) or not isinstance(idx, np.integer)) \
                or not 0 <= idx < self.capacity:
            raise IndexError(f"leaf index {idx!r} is out of range; it must be an int in [0, {self.capacity})")
        return self.capacity + int(idx)

    def _check_indexes(self, idxes: Any) -> IntArray:
        idx = np.asarray(idxes)
        if idx.size and not np.issubdtype(idx.dtype, np.integer):
            raise IndexError(f"leaf indexes must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64).ravel()
        bad = np.flatnonzero((idx < 0) | (idx >= self.capacity))
        if bad.size:
            raise IndexError(f"leaf index {int(idx[bad[0]])} (position {int(bad[0])}) is out of range; "
                             f"indexes must be in [0, {self.capacity})")
        return idx

    @overload
    def __getitem__(self, idx: int) -> float: ...

    @overload
    def __getitem__(self, idx: npt.NDArray[Any] | Sequence[int]) -> FloatArray: ...

    def __getitem__(self, idx: int | npt.NDArray[Any] | Sequence[int]) -> float | FloatArray:
        """The leaf value at ``idx``, or the leaf values at an array of indexes."""
        if isinstance(idx, (int, np.integer)):
            result: float = self._view[self._node(idx)]
            return result
        return self._value[self.capacity + self._check_indexes(idx)]

    def __setitem__(self, idx: int, val: float) -> None:
        """Sets leaf ``idx`` to ``val`` and recomputes its ancestors."""
        node, view, op = self._node(idx), self._view, self._scalar_operation
        view[node] = val = float(val)
        while node > 1:  # carry the new child value up; read only its sibling
            if node & 1:
                val = op(view[node - 1], val)
            else:
                val = op(val, view[node + 1])
            node >>= 1
            view[node] = val

    def set_many(self, idxes: npt.NDArray[Any] | Sequence[int], values: npt.ArrayLike) -> None:
        """Sets many leaves at once; a repeated index keeps its last value, as sequential sets would.

        A few leaves are set one by one; more are set with one vectorised ``operation`` per tree
        level. Either way the array ends up identical to that of setting the leaves one by one,
        because every internal node is always ``operation(left child, right child)``.

        Args:
            idxes: leaf indexes in ``[0, capacity)``.
            values: one value per index (or one value for all).

        Raises:
            IndexError: an index out of range or not an integer.
            ValueError: ``values`` does not have one value per index.
        """
        idx = self._check_indexes(idxes)
        vals = np.asarray(values, dtype=np.float64).ravel()
        if vals.size == 1:
            vals = np.full(idx.size, vals[0])
        if vals.size != idx.size:
            raise ValueError(f"set_many got {idx.size} indexes but {vals.size} values; pass one value per index")
        if idx.size <= _SCALAR_SET_LIMIT:  # below this, the per-level numpy calls cost more than they save
            for i, v in zip(idx.tolist(), vals.tolist()):
                self[i] = v
            return
        last, where = np.unique(idx[::-1], return_index=True)  # sorted; the last occurrence of each index
        nodes = self.capacity + last
        value = self._value
        value[nodes] = vals[::-1][where]
        keep = np.empty(nodes.size, dtype=bool)
        while True:
            nodes = nodes >> 1  # still sorted, so equal parents are adjacent
            if nodes[0] == 0:  # all nodes of a round share one level: the root is done
                break
            keep = keep[:nodes.size]
            keep[0] = True
            np.not_equal(nodes[1:], nodes[:-1], out=keep[1:])
            nodes = nodes[keep]
            value[nodes] = self.operation(value[2 * nodes], value[2 * nodes + 1])

    def _rebuild(self) -> None:
        """Recomputes every internal node from the leaves, one vectorised level at a time."""
        value, level = self._value, self.capacity // 2
        while level >= 1:
            value[level:2 * level] = self.operation(value[2 * level:4 * level:2], value[2 * level + 1:4 * level:2])
            level //= 2

    def reduce(self, start: int = 0, end: int | None = None) -> float:
        """``operation`` over the leaves ``[start, end)``; the neutral element for an empty range.

        Args:
            start: first leaf, inclusive.
            end: last leaf, exclusive; ``None`` means ``capacity``.

        Raises:
            ValueError: unless ``0 <= start <= end <= capacity``.
        """
        capacity = self.capacity
        if end is None:
            end = capacity
        if not (type(start) is int and type(end) is int) and (
                isinstance(start, bool) or isinstance(end, bool) or not isinstance(start, (int, np.integer))
                or not isinstance(end, (int, np.integer))) or not 0 <= start <= end <= capacity:
            raise ValueError(f"reduce(start={start!r}, end={end!r}) needs ints with "
                             f"0 <= start <= end <= capacity={capacity} (the range is half-open)")
        view, op = self._view, self._scalar_operation
        result: Any = self.neutral_element
        lo, hi = int(start) + capacity, int(end) + capacity
        while lo < hi:
            if lo & 1:
                result = op(result, view[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                result = op(result, view[hi])
            lo >>= 1
            hi >>= 1
        return float(result)


class SumSegmentTree(SegmentTree):
    """A segment tree of sums, with the prefix-sum descent used for proportional sampling.

    Args:
        capacity: the number of leaves; a power of two.

    Examples:
        >>> tree = SumSegmentTree(4)
        >>> tree.set_many([0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0])
        >>> tree.sum(), tree.sum(1, 3)
        (10.0, 5.0)
        >>> [tree.find_prefixsum_idx(m) for m in (0.0, 0.5, 1.0, 2.9, 3.0, 9.0, 10.0)]
        [0, 0, 1, 1, 2, 3, 3]
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, np.add, 0.0)

    def __setitem__(self, idx: int, val: float) -> None:
        """Sets leaf ``idx`` to ``val`` and recomputes its ancestors (:meth:`SegmentTree.__setitem__` with the
        addition written out: the hottest write of prioritized replay)."""
        node, view = self._node(idx), self._view
        view[node] = val = float(val)
        while node > 1:
            if node & 1:
                val = view[node - 1] + val  # left + right, in that order, as np.add on the two children
            else:
                val += view[node + 1]
            node >>= 1
            view[node] = val

    def sum(self, start: int = 0, end: int | None = None) -> float:
        """The sum of the leaves ``[start, end)`` (see :meth:`SegmentTree.reduce`)."""
        return self.reduce(start, end)

    def _check_prefixsum(self, prefixsum: Any) -> None:
        total: float = self._view[1]
        if not 0 <= prefixsum <= total + 1e-5:  # also rejects NaN
            raise ValueError(f"prefixsum={prefixsum!r} is out of range; it must satisfy "
                             f"0 <= prefixsum <= sum() + 1e-5 = {total} + 1e-5")

    def find_prefixsum_idx(self, prefixsum: float) -> int:
        """The leaf ``i`` with ``sum(0, i) <= prefixsum < sum(0, i + 1)``.

        It descends from the root: left if the left child's sum is ``> prefixsum``, otherwise it
        subtracts that sum and goes right. A mass equal to the total therefore ends on the last leaf
        (which may hold zero); callers that sample stored items clamp such a result.

        Args:
            prefixsum: a mass with ``0 <= prefixsum <= sum() + 1e-5``.

        Raises:
            ValueError: ``prefixsum`` out of that range.
        """
        self._check_prefixsum(prefixsum)
        view, node, mass = self._view, 1, float(prefixsum)
        for _ in range(self._depth):
            left = 2 * node
            left_sum = view[left]
            if left_sum > mass:
                node = left
            else:
                mass -= left_sum
                node = left + 1
        return node - self.capacity

    def find_prefixsum_idxes(self, prefixsums: npt.ArrayLike) -> IntArray:
        """:meth:`find_prefixsum_idx` for an array of masses, descending all of them at once.

        Raises:
            ValueError: any mass out of ``[0, sum() + 1e-5]``.

        Examples:
            >>> tree = SumSegmentTree(4)
            >>> tree.set_many([0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0])
            >>> tree.find_prefixsum_idxes([0.0, 1.0, 9.99]).tolist()
            [0, 1, 3]
        """
        masses = np.asarray(prefixsums, dtype=np.float64)
        if masses.size:
            bad = np.flatnonzero(~((masses >= 0) & (masses <= float(self._value[1]) + 1e-5)))
            if bad.size:
                self._check_prefixsum(float(masses.ravel()[bad[0]]))
        return self._descend(masses)

    def _descend(self, masses: FloatArray) -> IntArray:
        """The vectorised descent, unchecked (the same float operations as the scalar one)."""
        mass = np.array(masses, dtype=np.float64)
        node = np.ones(mass.shape, dtype=np.int64)
        for _ in range(self._depth):
            left = 2 * node
            left_sum = self._value[left]
            go_right = ~(left_sum > mass)
            mass = np.where(go_right, mass - left_sum, mass)
            node = left + go_right
        return node - self.capacity


class MinSegmentTree(SegmentTree):
    """A segment tree of minima; empty leaves hold ``inf``.

    Args:
        capacity: the number of leaves; a power of two.

    Examples:
        >>> tree = MinSegmentTree(4)
        >>> tree.set_many([0, 1, 2], [3.0, 1.0, 2.0])
        >>> tree.min(), tree.min(2, 4), tree.min(3, 4)
        (1.0, 2.0, inf)
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, np.minimum, math.inf)

    def min(self, start: int = 0, end: int | None = None) -> float:
        """The minimum of the leaves ``[start, end)`` (see :meth:`SegmentTree.reduce`)."""
        return self.reduce(start, end)
