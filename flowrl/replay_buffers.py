"""Replay buffers: segment trees, uniform and prioritized buffers, and the multi-agent replay shard.

The replay operators of :mod:`flowrl.ops.replay` read and write them. The layers, bottom up:

- :class:`SumSegmentTree` and :class:`MinSegmentTree`: ``O(log n)`` range reductions and the
  proportional-sampling descent (Schaul et al., *Prioritized Experience Replay*, arXiv:1511.05952).
- :class:`ReplayBuffer`: a FIFO of *items* (timestep rows or sequences) whose capacity counts
  timesteps, sampled uniformly with replacement; :class:`PrioritizedReplayBuffer` samples in
  proportion to ``priority ** alpha`` and adds importance weights.
- :class:`SimpleReplayBuffer`: a ring of whole batches (IMPALA's ``MixInReplay``).
- :class:`LocalReplayBuffer`: the multi-agent buffer a DQN-style plan stores into and replays from,
  with ``learning_starts``, independent or lockstep replay, priority updates and plain-data state;
  :class:`ReplayActor` is its shard-actor version, made by :func:`make_replay_actors`.

Every buffer owns its ``numpy.random.Generator``: the same ``seed`` and the same calls give the same
samples, and ``get_state()``/``set_state()`` carry the generator state with the contents.

Examples:
    >>> buf = LocalReplayBuffer(learning_starts=4, capacity=100, replay_batch_size=2, seed=0)
    >>> buf.add_batch(SampleBatch({OBS: np.arange(3.0), REWARDS: np.ones(3)}))
    >>> buf.replay() is None  # 3 < learning_starts env steps stored
    True
    >>> buf.add_batch(SampleBatch({OBS: np.arange(3.0), REWARDS: np.ones(3)}))
    >>> replayed = buf.replay()
    >>> replayed.count, sorted(replayed.policy_batches[DEFAULT_POLICY_ID])
    (2, ['batch_indexes', 'obs', 'rewards', 'weights'])
"""

from __future__ import annotations

import math
import numbers
import operator
import time
from typing import Any, Callable, Generic, Iterator, Literal, Mapping, Sequence, TypeVar, overload

import numpy as np
import numpy.typing as npt

from flowrl import runtime  # first: sets Ray's loopback variable before anything imports ray
from flowrl.iter import ParallelIteratorWorker
from flowrl.sample_batch import (BATCH_INDEXES, EPS_ID, PRIORITIES, T, WEIGHTS, AnyBatch, MultiAgentBatch,
                                 SampleBatch)
from flowrl.sample_batch import DEFAULT_POLICY_ID, OBS, REWARDS  # noqa: F401  (the examples above use them)

import ray  # noqa: E402  (after flowrl.runtime, which sets Ray's environment first)
from ray.actor import ActorHandle  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

__all__ = [
    "SegmentTree", "SumSegmentTree", "MinSegmentTree",
    "ReplayBuffer", "PrioritizedReplayBuffer", "SimpleReplayBuffer",
    "LocalReplayBuffer", "ReplayActor", "make_replay_actors", "ALL_POLICIES",
]

# Key of the single lockstep buffer in stats and state (it holds whole multi-agent time slices).
ALL_POLICIES = "__all__"

# Version of the plain-data layout returned by LocalReplayBuffer.get_state().
_STATE_VERSION = 1

# Items of one buffer are all SampleBatches or all MultiAgentBatches (lockstep time slices).
BatchT = TypeVar("BatchT", SampleBatch, MultiAgentBatch)

# SegmentTree.set_many sets up to this many leaves one by one (about the measured crossover on a 2^17-leaf tree).
_SCALAR_SET_LIMIT = 16

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


# ---------------------------------------------------------------------------------------------
# Argument checks shared by the constructors: each names the argument, the value and the fix.

def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}")
    return int(value)


def _check_real(name: str, value: Any, minimum: float, *, strict: bool = False) -> float:
    bound = ">" if strict else ">="
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)) \
            or (float(value) <= minimum if strict else float(value) < minimum):
        raise ValueError(f"{name}={value!r} must be a finite number {bound} {minimum}")
    return float(value)


def _check_seed(seed: Any) -> int | None:
    if seed is None:
        return None
    return _check_int("seed", seed, 0)


def _check_batch(where: str, batch: Any) -> None:
    if not isinstance(batch, (SampleBatch, MultiAgentBatch)):
        raise ValueError(f"{where} takes a SampleBatch or MultiAgentBatch, got {type(batch).__name__}")


# ---------------------------------------------------------------------------------------------
# Segment trees.

class SegmentTree:
    """A complete binary tree over ``capacity`` leaves that keeps ``operation`` over every subtree.

    The tree is one array of ``2 * capacity`` floats: node 1 is the root, node ``i`` has children
    ``2i`` and ``2i + 1``, and the leaves are the second half (leaf ``j`` is node ``capacity + j``).
    Setting a leaf recomputes its ancestors, so a range reduction costs ``O(log capacity)``.

    Args:
        capacity: the number of leaves; a power of two (round up with
            ``1 << (n - 1).bit_length()``).
        operation: an associative binary function that also works element-wise on numpy arrays
            (``np.add``, ``np.minimum``); used for scalar and batched updates alike.
        neutral_element: the identity of ``operation`` (``0.0`` for a sum, ``inf`` for a min); every
            leaf starts at it.

    Raises:
        ValueError: ``capacity`` is not a positive power of two.

    Examples:
        >>> tree = SegmentTree(4, np.maximum, -np.inf)
        >>> tree[1], tree[2] = 5.0, 3.0
        >>> tree.reduce(), tree.reduce(2, 4), tree.reduce(0, 1)
        (5.0, 3.0, -inf)
    """

    def __init__(self, capacity: int, operation: Callable[[Any, Any], Any], neutral_element: float) -> None:
        capacity = _check_int("capacity", capacity, 1)
        if capacity & (capacity - 1):
            raise ValueError(f"capacity={capacity} must be a power of two; use "
                             f"{1 << (capacity - 1).bit_length()} (the next one up)")
        self.capacity = capacity
        self.operation = operation
        self.neutral_element = float(neutral_element)
        self.value: FloatArray = np.full(2 * capacity, self.neutral_element, dtype=np.float64)
        self._depth = capacity.bit_length() - 1  # levels between the root and the leaves
        self._scalar_operation: Callable[[Any, Any], Any] = operation

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self.capacity}, root={self.value[1]!r})"

    def _check_index(self, idx: int) -> int:
        if isinstance(idx, bool) or not isinstance(idx, (int, np.integer)) or not 0 <= idx < self.capacity:
            raise IndexError(f"leaf index {idx!r} is out of range; it must be an int in [0, {self.capacity})")
        return int(idx)

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
            return float(self.value[self.capacity + self._check_index(idx)])
        return self.value[self.capacity + self._check_indexes(idx)]

    def __setitem__(self, idx: int, val: float) -> None:
        """Sets leaf ``idx`` to ``val`` and recomputes its ancestors."""
        node = self.capacity + self._check_index(idx)
        value, op, item = self.value, self._scalar_operation, self.value.item
        value[node] = val
        node >>= 1
        while node >= 1:  # on Python floats: IEEE-identical to the array operation, and ~5x faster
            value[node] = op(item(2 * node), item(2 * node + 1))
            node >>= 1

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
        self.value[nodes] = vals[::-1][where]
        keep = np.empty(nodes.size, dtype=bool)
        while True:
            nodes = nodes >> 1  # still sorted, so equal parents are adjacent
            if nodes[0] == 0:  # all nodes of a round share one level: the root is done
                break
            keep = keep[:nodes.size]
            keep[0] = True
            np.not_equal(nodes[1:], nodes[:-1], out=keep[1:])
            nodes = nodes[keep]
            self.value[nodes] = self.operation(self.value[2 * nodes], self.value[2 * nodes + 1])

    def _rebuild(self) -> None:
        """Recomputes every internal node from the leaves, one vectorised level at a time."""
        value, level = self.value, self.capacity // 2
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
        if end is None:
            end = self.capacity
        if isinstance(start, bool) or isinstance(end, bool) or not isinstance(start, (int, np.integer)) \
                or not isinstance(end, (int, np.integer)) or not 0 <= start <= end <= self.capacity:
            raise ValueError(f"reduce(start={start!r}, end={end!r}) needs ints with "
                             f"0 <= start <= end <= capacity={self.capacity} (the range is half-open)")
        value, op = self.value, self.operation
        result: Any = self.neutral_element
        lo, hi = int(start) + self.capacity, int(end) + self.capacity
        while lo < hi:
            if lo & 1:
                result = op(result, value[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                result = op(result, value[hi])
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
        self._scalar_operation = operator.add

    def sum(self, start: int = 0, end: int | None = None) -> float:
        """The sum of the leaves ``[start, end)`` (see :meth:`SegmentTree.reduce`)."""
        return self.reduce(start, end)

    def _check_prefixsum(self, prefixsum: Any) -> None:
        total = float(self.value[1])
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
        value, node, mass = self.value, 1, float(prefixsum)
        for _ in range(self._depth):
            left = 2 * node
            if value[left] > mass:
                node = left
            else:
                mass -= float(value[left])
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
            bad = np.flatnonzero(~((masses >= 0) & (masses <= float(self.value[1]) + 1e-5)))
            if bad.size:
                self._check_prefixsum(float(masses.ravel()[bad[0]]))
        return self._descend(masses)

    def _descend(self, masses: FloatArray) -> IntArray:
        """The vectorised descent, unchecked (the same float operations as the scalar one)."""
        mass = np.array(masses, dtype=np.float64)
        node = np.ones(mass.shape, dtype=np.int64)
        for _ in range(self._depth):
            left = 2 * node
            left_sum = self.value[left]
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
        self._scalar_operation = min

    def min(self, start: int = 0, end: int | None = None) -> float:
        """The minimum of the leaves ``[start, end)`` (see :meth:`SegmentTree.reduce`)."""
        return self.reduce(start, end)


# ---------------------------------------------------------------------------------------------
# Item buffers.

def _concat_rows(items: Sequence[SampleBatch]) -> tuple[SampleBatch, list[int]]:
    """Joins SampleBatch items row-wise and returns each item's row count.

    :meth:`SampleBatch.concat` does the same for any batches; this hot path of every replay reads the
    columns with the plain ``dict`` lookup (items are never empty), about twice as fast for 512 rows.
    """
    keys = items[0].keys()
    for item in items:
        if item.keys() != keys:
            raise ValueError(f"replayed items have different columns, {sorted(keys)} and {sorted(item)}; store "
                             f"batches with the same columns in one buffer")
    get = dict.__getitem__
    first_key = next(iter(keys))
    lengths = [len(get(item, first_key)) for item in items]
    return SampleBatch({k: np.concatenate([get(item, k) for item in items]) for k in keys}), lengths


def _concat(items: list[BatchT]) -> BatchT:
    first = items[0]
    if isinstance(first, SampleBatch):
        return _concat_rows(items)[0]
    return MultiAgentBatch.concat(items)


# Plain-data state of stored items. A buffer holds up to millions of small items, so the state is
# columnar: the items are grouped by layout (column names, dtypes and row shapes, which are nearly
# always the same for all of them) and each layout keeps one concatenated array per column plus
# every item's row count. A checkpoint then holds a few large arrays, not one per item and column.

def _encode_batches(batches: Sequence[SampleBatch]) -> dict[str, Any]:
    layout_ids: dict[tuple[tuple[str, np.dtype[Any], tuple[int, ...]], ...], int] = {}
    members: list[list[SampleBatch]] = []
    layout_of = np.empty(len(batches), dtype=np.int64)
    for i, batch in enumerate(batches):
        signature = tuple((k, v.dtype, v.shape[1:]) for k, v in batch.items())
        group = layout_ids.setdefault(signature, len(layout_ids))
        if group == len(members):
            members.append([])
            for k, v in batch.items():
                if v.dtype.hasobject:
                    raise ValueError(f"stored column {k!r} holds Python objects (dtype {v.dtype}), which a plain-data "
                                     f"state cannot carry; drop or convert that column before storing batches")
        members[group].append(batch)
        layout_of[i] = group
    layouts = [{"lengths": np.array([b.count for b in group], dtype=np.int64),
                "columns": {k: np.concatenate([b[k] for b in group]) for k in group[0]}} for group in members]
    return {"layout_of": layout_of, "layouts": layouts}


def _decode_batches(state: Mapping[str, Any]) -> list[SampleBatch]:
    layout_of = np.asarray(state["layout_of"], dtype=np.int64).ravel()
    out: list[SampleBatch | None] = [None] * layout_of.size
    for group, layout in enumerate(state["layouts"]):
        positions = np.flatnonzero(layout_of == group).tolist()
        lengths = np.asarray(layout["lengths"], dtype=np.int64).ravel()
        columns = {str(k): np.array(v) for k, v in layout["columns"].items()}  # copies: no alias of the state
        bounds = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        if len(positions) != lengths.size or np.any(lengths < 0) or any(len(v) != bounds[-1] for v in columns.values()):
            raise ValueError(f"replay state layout {group} is inconsistent: {len(positions)} items, row counts "
                             f"{lengths.tolist()[:8]}..., column lengths {[len(v) for v in columns.values()]}")
        for position, start, end in zip(positions, bounds[:-1], bounds[1:]):
            out[position] = SampleBatch({k: v[start:end] for k, v in columns.items()})
    missing = [i for i, b in enumerate(out) if b is None]
    if missing:
        raise ValueError(f"replay state names layouts that it does not hold, for items {missing[:8]}")
    return [b for b in out if b is not None]


def _encode_items(items: Sequence[AnyBatch]) -> dict[str, Any]:
    rows = [item for item in items if isinstance(item, SampleBatch)]
    slices = [item for item in items if isinstance(item, MultiAgentBatch)]
    if not slices:
        return {"kind": "SampleBatch", "batches": _encode_batches(rows)}
    if rows:
        raise ValueError("a replay buffer holds SampleBatch and MultiAgentBatch items together; it holds one kind")
    policy_ids: dict[str, int] = {}
    pieces: list[SampleBatch] = []
    piece_item: list[int] = []
    piece_policy: list[int] = []
    for i, time_slice in enumerate(slices):
        for policy_id, batch in time_slice.policy_batches.items():
            pieces.append(batch)
            piece_item.append(i)
            piece_policy.append(policy_ids.setdefault(policy_id, len(policy_ids)))
    return {"kind": "MultiAgentBatch", "env_steps": np.array([s.count for s in slices], dtype=np.int64),
            "policy_ids": list(policy_ids), "piece_item": np.array(piece_item, dtype=np.int64),
            "piece_policy": np.array(piece_policy, dtype=np.int64), "pieces": _encode_batches(pieces)}


def _decode_items(state: Mapping[str, Any]) -> list[SampleBatch] | list[MultiAgentBatch]:
    kind = state["kind"]
    if kind == "SampleBatch":
        return _decode_batches(state["batches"])
    if kind == "MultiAgentBatch":
        env_steps = np.asarray(state["env_steps"], dtype=np.int64).ravel().tolist()
        policy_ids = [str(p) for p in state["policy_ids"]]
        pieces = _decode_batches(state["pieces"])
        piece_item = np.asarray(state["piece_item"], dtype=np.int64).ravel().tolist()
        piece_policy = np.asarray(state["piece_policy"], dtype=np.int64).ravel().tolist()
        if not len(pieces) == len(piece_item) == len(piece_policy):
            raise ValueError(f"replay state has {len(pieces)} policy pieces but {len(piece_item)} item and "
                             f"{len(piece_policy)} policy references")
        parts: list[dict[str, SampleBatch]] = [{} for _ in env_steps]
        for piece, i, p in zip(pieces, piece_item, piece_policy):
            parts[i][policy_ids[p]] = piece
        return [MultiAgentBatch(part, n) for part, n in zip(parts, env_steps)]
    raise ValueError(f"replay buffer state holds items of kind {kind!r}; expected 'SampleBatch' or "
                     f"'MultiAgentBatch' (was the state written by another version?)")


def _num_items(state: Mapping[str, Any]) -> int:
    """The number of items in an :func:`_encode_items` state, without decoding it."""
    if state["kind"] == "MultiAgentBatch":
        return int(np.asarray(state["env_steps"]).size)
    return int(np.asarray(state["batches"]["layout_of"]).size)


def _restored_rng(state: Mapping[str, Any]) -> np.random.Generator:
    rng = np.random.Generator(np.random.PCG64())
    rng.bit_generator.state = dict(state)  # raises ValueError on a state of another kind
    return rng


class ReplayBuffer(Generic[BatchT]):
    """A FIFO of items sampled uniformly with replacement; ``capacity`` counts timesteps.

    Items are SampleBatches (timestep rows, or sequences of several rows) or, for lockstep replay,
    MultiAgentBatch time slices; one buffer holds one kind. :meth:`add` writes at the write index
    (appending while the storage grows, overwriting afterwards) and adds the item's timesteps to a
    running total; once that total reaches ``capacity`` the index wraps to 0 and the total resets.
    So it never holds more than ``capacity`` items, and with items of one length it holds about
    ``capacity`` timesteps. (After a wrap, slots past the current write index keep older items until
    they are overwritten, as in the upstream design.)

    Args:
        capacity: timesteps to hold before the write index wraps; an int >= 1.
        seed: seeds the buffer's own ``numpy.random.Generator`` (``None``: fresh entropy).

    Attributes:
        capacity: as given.
        num_added: items added so far.
        num_timesteps_added: timesteps added so far.
        num_sampled: items drawn by :meth:`sample` so far.
        num_evicted: items overwritten so far.

    Raises:
        ValueError: ``capacity`` or ``seed`` invalid.

    Examples:
        >>> buf = ReplayBuffer(capacity=4, seed=0)
        >>> for i in range(6):  # one-step items: the 5th and 6th overwrite the 1st and 2nd
        ...     buf.add(SampleBatch({OBS: [i]}))
        >>> len(buf), buf.num_evicted, buf.sample(3).count
        (4, 2, 3)
        >>> sorted(set(buf.sample(100)[OBS].tolist()))
        [2, 3, 4, 5]
    """

    def __init__(self, capacity: int, seed: int | None = None) -> None:
        self.capacity = _check_int("capacity", capacity, 1)
        self._rng = np.random.default_rng(_check_seed(seed))
        self._storage: list[BatchT] = []
        self._next_idx = 0
        self._timesteps_since_wrap = 0
        self.num_added = 0
        self.num_timesteps_added = 0
        self.num_sampled = 0
        self.num_evicted = 0

    def __len__(self) -> int:
        """The number of items stored."""
        return len(self._storage)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self.capacity}, items={len(self)})"

    def _check_item(self, item: BatchT) -> None:
        where = f"{type(self).__name__}.add()"
        _check_batch(where, item)
        if item.count < 1:
            raise ValueError(f"{where} got an item with {item.count} timesteps; items need at least one "
                             f"(drop empty batches before storing)")
        if self._storage and type(item) is not type(self._storage[0]):
            raise ValueError(f"{where} got a {type(item).__name__} but the buffer holds "
                             f"{type(self._storage[0]).__name__} items; use one buffer per item kind")

    def _write(self, item: BatchT) -> int:
        """Stores a checked ``item`` at the write index, advances or wraps it, and returns the slot."""
        idx = self._next_idx
        if idx >= len(self._storage):
            self._storage.append(item)
        else:
            self._storage[idx] = item
            self.num_evicted += 1
        self.num_added += 1
        self.num_timesteps_added += item.count
        self._timesteps_since_wrap += item.count
        if self._timesteps_since_wrap >= self.capacity:
            self._next_idx, self._timesteps_since_wrap = 0, 0
        else:
            self._next_idx += 1
        return idx

    def add(self, item: BatchT) -> None:
        """Stores ``item``, overwriting the oldest slot once the buffer has wrapped.

        Raises:
            ValueError: not a batch, an empty batch, or a different kind from the stored items.
        """
        self._check_item(item)
        self._write(item)

    def _check_sample(self, num_items: int) -> int:
        num_items = _check_int("num_items", num_items, 1)
        if not self._storage:
            raise IndexError(f"cannot sample from an empty {type(self).__name__}; add items first")
        return num_items

    def _draw(self, idxes: IntArray) -> list[BatchT]:
        self.num_sampled += int(idxes.size)
        storage = self._storage
        return [storage[i] for i in idxes.tolist()]

    def sample(self, num_items: int) -> BatchT:
        """Concatenates ``num_items`` items drawn uniformly with replacement.

        Raises:
            ValueError: ``num_items`` is not an int >= 1.
            IndexError: the buffer is empty.
        """
        num_items = self._check_sample(num_items)
        return _concat(self._draw(self._rng.integers(0, len(self._storage), size=num_items)))

    def stats(self, debug: bool = False) -> dict[str, Any]:
        """Counters; ``debug=True`` adds the stored timesteps and bytes (a pass over the items)."""
        stats: dict[str, Any] = {"num_entries": len(self), "num_added": self.num_added,
                                 "num_timesteps_added": self.num_timesteps_added,
                                 "num_sampled": self.num_sampled, "num_evicted": self.num_evicted}
        if debug:
            stats["timesteps_stored"] = sum(item.count for item in self._storage)
            stats["est_size_bytes"] = sum(_nbytes(item) for item in self._storage)
        return stats

    def get_state(self) -> dict[str, Any]:
        """Contents, write index, counters and RNG state, as plain data (copies, never views).

        The contents are columnar (a few arrays per column, whatever the number of items).
        """
        return {"type": type(self).__name__, "capacity": self.capacity, "items": _encode_items(self._storage),
                "next_idx": self._next_idx, "timesteps_since_wrap": self._timesteps_since_wrap,
                "num_added": self.num_added, "num_timesteps_added": self.num_timesteps_added,
                "num_sampled": self.num_sampled, "num_evicted": self.num_evicted,
                "rng": self._rng.bit_generator.state}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`get_state` output exactly; on error the buffer is left unchanged.

        Raises:
            ValueError: the state belongs to another buffer type or capacity, or is inconsistent.
        """
        if state.get("type") != type(self).__name__ or state.get("capacity") != self.capacity:
            raise ValueError(f"cannot restore a {state.get('type')}(capacity={state.get('capacity')}) state into "
                             f"{type(self).__name__}(capacity={self.capacity}); build the buffer with the "
                             f"configuration that wrote the state")
        items = _decode_items(state["items"])
        counters = {key: int(state[key]) for key in ("next_idx", "timesteps_since_wrap", "num_added",
                                                     "num_timesteps_added", "num_sampled", "num_evicted")}
        if any(v < 0 for v in counters.values()) or counters["next_idx"] > len(items):
            raise ValueError(f"replay buffer state has inconsistent counters {counters} for {len(items)} items")
        rng = _restored_rng(state["rng"])
        # BatchT is not known at run time; _decode_items gives items of one kind, as add() keeps them.
        self._storage = items  # type: ignore[assignment]
        self._next_idx, self._timesteps_since_wrap = counters["next_idx"], counters["timesteps_since_wrap"]
        self.num_added, self.num_timesteps_added = counters["num_added"], counters["num_timesteps_added"]
        self.num_sampled, self.num_evicted = counters["num_sampled"], counters["num_evicted"]
        self._rng = rng


def _nbytes(item: AnyBatch) -> int:
    batches = [item] if isinstance(item, SampleBatch) else list(item.policy_batches.values())
    return sum(int(v.nbytes) for b in batches for v in b.values())


class PrioritizedReplayBuffer(ReplayBuffer[SampleBatch]):
    """A replay buffer sampled in proportion to ``priority ** alpha``, with importance weights.

    Schaul et al., *Prioritized Experience Replay* (arXiv:1511.05952), proportional variant.
    Priorities live in a sum tree (for proportional draws) and a min tree (for the largest importance
    weight), each over the next power of two >= ``capacity`` leaves. New items get ``max_priority``
    (initially 1.0) unless :meth:`add` is given one; :meth:`update_priorities` raises
    ``max_priority`` to the largest priority it has set.

    Args:
        capacity: timesteps to hold (see :class:`ReplayBuffer`).
        alpha: how strongly priorities shape sampling; > 0 (use :class:`ReplayBuffer` for uniform).
        seed: seeds the buffer's generator.

    Attributes:
        alpha: as given.
        max_priority: the priority new items get by default.
        sum_tree: a :class:`SumSegmentTree` of ``priority ** alpha`` per stored item (read-only).
        min_tree: a :class:`MinSegmentTree` of the same values (read-only).

    Raises:
        ValueError: ``alpha <= 0``, or an invalid ``capacity`` or ``seed``.

    Examples:
        >>> buf = PrioritizedReplayBuffer(capacity=8, alpha=1.0, seed=0)
        >>> for i, priority in enumerate([1.0, 4.0]):
        ...     buf.add(SampleBatch({OBS: [i]}), priority=priority)
        >>> batch = buf.sample(20, beta=1.0)
        >>> sorted({int(i): float(w) for i, w in zip(batch[BATCH_INDEXES], batch[WEIGHTS])}.items())
        [(0, 1.0), (1, 0.25)]
        >>> buf.update_priorities([0], [8.0])
        >>> buf.max_priority
        8.0
    """

    def __init__(self, capacity: int, alpha: float, seed: int | None = None) -> None:
        super().__init__(capacity, seed)
        self.alpha = _check_real("alpha", alpha, 0.0, strict=True)
        tree_capacity = 1 << (self.capacity - 1).bit_length()
        self.sum_tree = SumSegmentTree(tree_capacity)
        self.min_tree = MinSegmentTree(tree_capacity)
        self.max_priority = 1.0

    def _check_item(self, item: SampleBatch) -> None:
        if isinstance(item, MultiAgentBatch):
            raise ValueError("PrioritizedReplayBuffer.add() takes SampleBatch items, got a MultiAgentBatch; "
                             "lockstep time slices go into a plain ReplayBuffer")
        super()._check_item(item)

    def _leaves(self, priorities: npt.ArrayLike) -> FloatArray:
        """``priorities ** alpha``, checking that each priority and each result is a finite number > 0."""
        prio = np.asarray(priorities, dtype=np.float64).ravel()
        bad = np.flatnonzero(~((prio > 0) & np.isfinite(prio)))
        if bad.size:
            where = f" (position {int(bad[0])})" if prio.size > 1 else ""
            raise ValueError(f"priority {float(prio[bad[0]])!r}{where} must be a finite number > 0; "
                             f"add a small eps to |td_error|")
        with np.errstate(over="ignore", under="ignore"):  # checked just below, with a better message
            leaves: FloatArray = prio ** self.alpha
        bad = np.flatnonzero(~((leaves > 0) & np.isfinite(leaves)))
        if bad.size:
            raise ValueError(f"priority {float(prio[bad[0]])!r} ** alpha={self.alpha} = {float(leaves[bad[0]])!r} "
                             f"leaves the positive float range; keep priorities and alpha moderate "
                             f"(e.g. priorities in [1e-6, 1e6] with alpha <= 1)")
        return leaves

    def add(self, item: SampleBatch, priority: float | None = None) -> None:
        """Stores ``item`` with ``priority`` (default: ``max_priority``).

        Raises:
            ValueError: a priority that is not a finite number > 0, or an invalid item.
        """
        if priority is not None:
            priority = _check_real("priority", priority, 0.0, strict=True)
        self._add_many([item], None if priority is None else np.array([priority]))

    def _add_many(self, items: Sequence[SampleBatch], priorities: npt.ArrayLike | None) -> None:
        """:meth:`add` for many items (``None``: all at ``max_priority``), one batched update per tree.

        Everything is checked before anything is stored, and the result is the state that adding
        the items one by one would give.
        """
        for item in items:
            self._check_item(item)
        if priorities is None:
            leaves = np.repeat(self._leaves(self.max_priority), len(items))
        else:
            leaves = self._leaves(priorities)
            if leaves.size != len(items):
                raise ValueError(f"got {len(items)} items but {leaves.size} priorities; pass one per item")
        idxes = [self._write(item) for item in items]
        self.sum_tree.set_many(idxes, leaves)
        self.min_tree.set_many(idxes, leaves)

    def sample(self, num_items: int, beta: float = 0.4) -> SampleBatch:
        """Concatenates ``num_items`` proportional draws and adds ``weights`` and ``batch_indexes``.

        Each draw takes ``mass = U[0, 1) * sum(0, N)`` over the ``N`` stored items and descends the
        sum tree; a result ``>= N`` or on a zero leaf (floating-point error) is clamped to the last
        stored index. The importance weight of item ``i`` is ``(N * P(i)) ** -beta`` divided by
        that of the minimum-priority item, so every weight is ``<= 1`` and that item's is exactly 1.
        Both columns repeat each item's value over its timesteps.

        Args:
            num_items: the number of items to draw, with replacement.
            beta: importance-sampling exponent, >= 0 (0: all weights 1; 1: full correction).

        Raises:
            ValueError: ``num_items < 1`` or ``beta < 0``.
            IndexError: the buffer is empty.
        """
        num_items = self._check_sample(num_items)
        beta = _check_real("beta", beta, 0.0)
        n, tree = len(self._storage), self.sum_tree
        idxes = tree._descend(self._rng.random(num_items) * tree.sum(0, n))
        leaves = tree.value[tree.capacity + np.minimum(idxes, n - 1)]
        clamped = (idxes >= n) | ~(leaves > 0)
        idxes = np.where(clamped, n - 1, idxes)
        leaves = np.where(clamped, tree.value[tree.capacity + n - 1], leaves)
        # (N * P(i)) ** -beta / (N * P_min) ** -beta == (leaf_i / leaf_min) ** -beta: N and the total
        # cancel, so the minimum-priority item gets exactly 1.0 and every other ratio >= 1 a weight <= 1.
        weights = (leaves / self.min_tree.min(0, n)) ** (-beta)
        batch, lengths = _concat_rows(self._draw(idxes))
        batch[WEIGHTS] = np.repeat(weights.astype(np.float32), lengths)
        batch[BATCH_INDEXES] = np.repeat(idxes.astype(np.int64), lengths)
        return batch

    def update_priorities(self, idxes: npt.ArrayLike, priorities: npt.ArrayLike) -> None:
        """Sets the priorities of the stored items ``idxes``; a repeated index keeps its last value.

        Args:
            idxes: item indexes (the ``batch_indexes`` of a sample, one per item), ``0 <= idx < N``.
            priorities: one finite priority > 0 per index (typically ``|td_error| + eps``).

        Raises:
            ValueError: different lengths, a priority that is not > 0 and finite, or an index out of
                range; the message names the first offending value. Nothing is updated then.
        """
        idx = np.asarray(idxes).ravel()
        prio = np.asarray(priorities, dtype=np.float64).ravel()
        if idx.size != prio.size:
            raise ValueError(f"update_priorities got {idx.size} indexes but {prio.size} priorities; pass one "
                             f"priority per item (for sequences, one batch index every replay_sequence_length rows)")
        if not idx.size:
            return
        leaves = self._leaves(prio)
        n = len(self._storage)
        integral = np.issubdtype(idx.dtype, np.integer) or (
            np.issubdtype(idx.dtype, np.floating) and bool(np.all(np.isfinite(idx) & (idx == np.round(idx)))))
        if not integral:
            raise ValueError(f"update_priorities indexes must be integers, got dtype {idx.dtype}; pass the "
                             f"sample's batch_indexes column")
        idx = idx.astype(np.int64)
        bad = np.flatnonzero((idx < 0) | (idx >= n))
        if bad.size:
            raise ValueError(f"index {int(idx[bad[0]])} (position {int(bad[0])}) is out of range; indexes must "
                             f"satisfy 0 <= idx < {n} (the number of stored items)")
        self.sum_tree.set_many(idx, leaves)
        self.min_tree.set_many(idx, leaves)
        self.max_priority = max(self.max_priority, float(prio.max()))

    def stats(self, debug: bool = False) -> dict[str, Any]:
        """:meth:`ReplayBuffer.stats` plus ``max_priority``."""
        return {**super().stats(debug), "max_priority": self.max_priority}

    def get_state(self) -> dict[str, Any]:
        """:meth:`ReplayBuffer.get_state` plus ``alpha``, ``max_priority`` and the stored items' leaves.

        Only the leaves (``priority ** alpha`` of the ``N`` stored items) are kept: every internal
        node is a function of its children, so :meth:`set_state` rebuilds both trees bit for bit.
        """
        n, leaves = len(self._storage), self.sum_tree.value[self.sum_tree.capacity:]
        return {**super().get_state(), "alpha": self.alpha, "max_priority": self.max_priority,
                "leaves": leaves[:n].copy()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`get_state` output exactly; on error the buffer is left unchanged.

        Raises:
            ValueError: the state belongs to another buffer type, capacity or ``alpha``, or is
                inconsistent.
        """
        if state.get("type") == type(self).__name__ and state.get("alpha") != self.alpha:
            raise ValueError(f"cannot restore a state written with alpha={state.get('alpha')} into a buffer "
                             f"with alpha={self.alpha}: the trees hold priority ** alpha")
        leaves = np.array(state["leaves"], dtype=np.float64).ravel()
        max_priority = float(state["max_priority"])
        if leaves.size != _num_items(state["items"]) or not np.all((leaves > 0) & np.isfinite(leaves)) \
                or not (max_priority > 0 and math.isfinite(max_priority)):
            raise ValueError(f"PrioritizedReplayBuffer state has {leaves.size} leaves for "
                             f"{_num_items(state['items'])} items (each must be a finite number > 0) and "
                             f"max_priority={max_priority}")
        super().set_state(state)
        for tree in (self.sum_tree, self.min_tree):
            tree.value.fill(tree.neutral_element)
            tree.value[tree.capacity:tree.capacity + leaves.size] = leaves
            tree._rebuild()
        self.max_priority = max_priority


class SimpleReplayBuffer:
    """A ring of whole batches, replayed uniformly (IMPALA's ``MixInReplay``).

    It appends until ``num_slots`` batches are held, then overwrites round-robin, oldest first.
    Batches are stored and replayed as given (not copied).

    Args:
        num_slots: how many batches to hold; 0 stores nothing.
        seed: seeds the buffer's generator.

    Raises:
        ValueError: ``num_slots`` or ``seed`` invalid.

    Examples:
        >>> buf = SimpleReplayBuffer(num_slots=2, seed=0)
        >>> for i in range(3):
        ...     buf.add_batch(SampleBatch({OBS: [i]}))
        >>> len(buf), sorted({int(buf.replay()[OBS][0]) for _ in range(50)})
        (2, [1, 2])
    """

    def __init__(self, num_slots: int, seed: int | None = None) -> None:
        self.num_slots = _check_int("num_slots", num_slots, 0)
        self._rng = np.random.default_rng(_check_seed(seed))
        self._slots: list[AnyBatch] = []
        self._next_idx = 0

    def __len__(self) -> int:
        """The number of batches held."""
        return len(self._slots)

    def __repr__(self) -> str:
        return f"SimpleReplayBuffer(num_slots={self.num_slots}, batches={len(self)})"

    def add_batch(self, batch: AnyBatch) -> None:
        """Stores ``batch``, overwriting the oldest once full; does nothing when ``num_slots == 0``.

        Raises:
            ValueError: ``batch`` is not a SampleBatch or MultiAgentBatch.
        """
        _check_batch("SimpleReplayBuffer.add_batch()", batch)
        if self.num_slots == 0:
            return
        if len(self._slots) < self.num_slots:
            self._slots.append(batch)
        else:
            self._slots[self._next_idx] = batch
        self._next_idx = (self._next_idx + 1) % self.num_slots

    def replay(self) -> AnyBatch:
        """A uniformly random stored batch.

        Raises:
            IndexError: nothing is stored yet.
        """
        if not self._slots:
            raise IndexError("replay() on an empty SimpleReplayBuffer; add_batch() first "
                             "(a buffer with num_slots=0 never holds anything)")
        return self._slots[int(self._rng.integers(len(self._slots)))]


# ---------------------------------------------------------------------------------------------
# The multi-agent buffer and its shard actor.

def _timeslices(batch: MultiAgentBatch, length: int) -> list[MultiAgentBatch]:
    """Consecutive slices of ``length`` env steps across all policies (lockstep replay).

    If every policy batch has one row per env step, row ``i`` of each is env step ``i``. Otherwise
    rows are matched by env step through their ``(eps_id, t)`` columns, in sorted order.
    """
    parts = {p: b for p, b in batch.policy_batches.items() if b.count}
    if not parts:
        return []
    if all(b.count == batch.count for b in parts.values()):
        return [MultiAgentBatch({p: b[i:i + length] for p, b in parts.items()}, min(length, batch.count - i))
                for i in range(0, batch.count, length)]
    missing = {p: sorted({EPS_ID, T} - set(b)) for p, b in parts.items() if not {EPS_ID, T} <= set(b)}
    if missing:
        raise ValueError(f"lockstep replay needs policy batches with one row per env step, or "
                         f"{EPS_ID!r} and {T!r} columns to align them; policies {missing} lack those columns")
    keys = {p: list(zip(b[EPS_ID].tolist(), b[T].tolist())) for p, b in parts.items()}
    ordinal = {key: i for i, key in enumerate(sorted({k for ks in keys.values() for k in ks}))}
    num_steps = len(ordinal)
    slice_of = {p: np.array([ordinal[k] for k in ks], dtype=np.int64) for p, ks in keys.items()}
    out = []
    for start in range(0, num_steps, length):
        pieces = {}
        for p, b in parts.items():
            steps = slice_of[p]
            rows = np.flatnonzero((steps >= start) & (steps < start + length))
            if rows.size:
                pieces[p] = b.rows(rows[np.argsort(steps[rows], kind="stable")])
        out.append(MultiAgentBatch(pieces, min(length, num_steps - start)))
    return out


class LocalReplayBuffer:
    """The multi-agent replay buffer of DQN-style plans: store rollouts, replay training batches.

    It keeps one buffer per policy (independent mode) or one buffer of whole multi-agent time slices
    (lockstep mode). With several replay shards each holds ``learning_starts // num_shards`` and
    ``capacity // num_shards``. Use it with ``StoreToReplayBuffer(local_buffer=...)`` and
    ``Replay(local_buffer=...)``, or as :class:`ReplayActor` shards.

    Args:
        num_shards: how many shards share ``learning_starts`` and ``capacity``; >= 1.
        learning_starts: env steps to store (in total over the shards) before :meth:`replay`
            returns batches.
        capacity: timesteps held (in total over the shards); at least ``num_shards``.
        replay_batch_size: timesteps per policy per replay (``max(1, B // T)`` sequences of
            ``T = replay_sequence_length`` in independent mode).
        prioritized_replay_alpha: > 0 for prioritized per-policy buffers, 0 for uniform ones.
        prioritized_replay_beta: importance-sampling exponent for replays, >= 0.
        prioritized_replay_eps: added to ``|td_error|`` for new priorities (and the floor of a
            ``"priorities"`` column); > 0.
        replay_mode: ``"independent"`` (each policy sampled on its own) or ``"lockstep"`` (whole
            multi-agent time slices, sampled uniformly: alpha and beta do not apply).
        replay_sequence_length: timesteps per stored item; 1 stores timestep rows.
        seed: seeds the generator from which every sub-buffer's generator is drawn.

    Attributes:
        learning_starts: this shard's share, ``learning_starts // num_shards``.
        capacity: this shard's share, ``capacity // num_shards``.
        num_added: env steps stored so far.
        replay_buffers: policy id to its buffer (independent mode).
        lockstep_buffer: the buffer of time slices (lockstep mode), else ``None``.

    Raises:
        ValueError: any argument invalid; the message names it.

    Examples:
        >>> buf = LocalReplayBuffer(learning_starts=0, capacity=100, replay_batch_size=4, seed=0)
        >>> buf.add_batch(MultiAgentBatch({"a": SampleBatch({OBS: [0.0, 1.0]}),
        ...                                "b": SampleBatch({OBS: [5.0, 6.0]})}, env_steps=2))
        >>> replayed = buf.replay()
        >>> replayed.count, {p: b.count for p, b in replayed.policy_batches.items()}
        (4, {'a': 4, 'b': 4})
        >>> buf.update_priorities({"a": (replayed.policy_batches["a"][BATCH_INDEXES], np.zeros(4))})
        >>> len(buf), buf.stats()["policy_a"]["num_sampled"]
        (4, 4)
    """

    def __init__(self, num_shards: int = 1, learning_starts: int = 1000, capacity: int = 10000,
                 replay_batch_size: int = 1, prioritized_replay_alpha: float = 0.6,
                 prioritized_replay_beta: float = 0.4, prioritized_replay_eps: float = 1e-6,
                 replay_mode: Literal["independent", "lockstep"] = "independent",
                 replay_sequence_length: int = 1, seed: int | None = None) -> None:
        self.num_shards = _check_int("num_shards", num_shards, 1)
        learning_starts = _check_int("learning_starts", learning_starts, 0)
        capacity = _check_int("capacity", capacity, 1)
        if capacity < self.num_shards:
            raise ValueError(f"capacity={capacity} is less than num_shards={self.num_shards}, so a shard would "
                             f"hold nothing; raise capacity to at least {self.num_shards}")
        self.replay_batch_size = _check_int("replay_batch_size", replay_batch_size, 1)
        self.prioritized_replay_alpha = _check_real("prioritized_replay_alpha", prioritized_replay_alpha, 0.0)
        self.prioritized_replay_beta = _check_real("prioritized_replay_beta", prioritized_replay_beta, 0.0)
        self.prioritized_replay_eps = _check_real("prioritized_replay_eps", prioritized_replay_eps, 0.0,
                                                  strict=True)
        if replay_mode not in ("independent", "lockstep"):
            raise ValueError(f"replay_mode={replay_mode!r} must be 'independent' or 'lockstep'")
        self.replay_mode = replay_mode
        self.replay_sequence_length = _check_int("replay_sequence_length", replay_sequence_length, 1)
        self.learning_starts = learning_starts // self.num_shards
        self.capacity = capacity // self.num_shards
        self._rng = np.random.default_rng(_check_seed(seed))
        self.num_added = 0
        self.replay_buffers: dict[str, ReplayBuffer[SampleBatch]] = {}
        self.lockstep_buffer: ReplayBuffer[MultiAgentBatch] | None = None
        self._timers = {name: [0.0, 0] for name in ("add_batch", "replay", "update_priorities")}

    def __len__(self) -> int:
        """The number of items stored, over all policies."""
        return sum(len(b) for b in self._buffers().values())

    def __repr__(self) -> str:
        return (f"LocalReplayBuffer(mode={self.replay_mode}, capacity={self.capacity}, "
                f"learning_starts={self.learning_starts}, added={self.num_added})")

    @property
    def prioritized(self) -> bool:
        """Whether replays are prioritized (independent mode with alpha > 0)."""
        return self.replay_mode == "independent" and self.prioritized_replay_alpha > 0

    def _buffers(self) -> dict[str, ReplayBuffer[Any]]:
        if self.lockstep_buffer is not None:
            return {ALL_POLICIES: self.lockstep_buffer}
        return dict(self.replay_buffers)

    def _child_seed(self) -> int:
        return int(self._rng.integers(2 ** 63))

    def _policy_buffer(self, policy_id: str) -> ReplayBuffer[SampleBatch]:
        buffer = self.replay_buffers.get(policy_id)
        if buffer is None:
            if self.prioritized:
                buffer = PrioritizedReplayBuffer(self.capacity, self.prioritized_replay_alpha,
                                                 seed=self._child_seed())
            else:
                buffer = ReplayBuffer(self.capacity, seed=self._child_seed())
            self.replay_buffers[policy_id] = buffer
        return buffer

    def _initial_priorities(self, policy_id: str, policy_batch: SampleBatch) -> FloatArray | None:
        """Per-item initial priorities from a ``"priorities"`` column, or ``None`` (``max_priority``).

        Worker-side prioritization sends one priority per timestep; an item takes the mean over its
        rows, at least ``prioritized_replay_eps``. The ``"weights"`` column is never read here.
        """
        if PRIORITIES not in policy_batch:
            return None
        column = np.asarray(policy_batch[PRIORITIES], dtype=np.float64)
        n = policy_batch.count
        if column.ndim != 1:
            raise ValueError(f"policy {policy_id!r}: the {PRIORITIES!r} column has shape {column.shape}; it needs "
                             f"one priority per timestep, shape ({n},)")
        starts = np.arange(0, n, self.replay_sequence_length)
        means = np.add.reduceat(column, starts) / np.diff(np.append(starts, n))
        bad = np.flatnonzero(~np.isfinite(means))
        if bad.size:
            raise ValueError(f"policy {policy_id!r}: the {PRIORITIES!r} column gives item {int(bad[0])} the "
                             f"priority {float(means[bad[0]])!r}; worker-side priorities must be finite")
        floored: FloatArray = np.maximum(means, self.prioritized_replay_eps)
        return floored

    def _time(self, name: str, start: float) -> None:
        timer = self._timers[name]
        timer[0] += time.perf_counter() - start
        timer[1] += 1

    def add_batch(self, batch: AnyBatch) -> None:
        """Copies ``batch``, slices it and stores the slices; counts ``batch.count`` env steps.

        In independent mode each policy's rows are cut into items of ``replay_sequence_length``
        (the last may be shorter). A prioritized item gets ``max_priority``, or, when the batch
        carries a ``"priorities"`` column (worker-side prioritization), that column's mean over the
        item, at least ``prioritized_replay_eps``. The ``"weights"`` column is never read as a
        priority. In lockstep mode the whole multi-agent batch is cut into time slices.

        Raises:
            ValueError: ``batch`` is not a SampleBatch or MultiAgentBatch (or, in lockstep mode,
                its policies cannot be aligned by env step).
        """
        start = time.perf_counter()
        _check_batch("LocalReplayBuffer.add_batch()", batch)
        multi = batch.copy().as_multi_agent()
        length = self.replay_sequence_length
        if self.replay_mode == "lockstep":
            time_slices = _timeslices(multi, length)  # checks the alignment before anything is stored
            lockstep = self.lockstep_buffer
            if lockstep is None:
                lockstep = self.lockstep_buffer = ReplayBuffer(self.capacity, seed=self._child_seed())
            for time_slice in time_slices:
                lockstep.add(time_slice)
        else:
            # Slice and check every policy's rows first, so a bad batch stores nothing at all.
            staged = [(policy_id, [policy_batch[i:i + length] for i in range(0, policy_batch.count, length)],
                       self._initial_priorities(policy_id, policy_batch) if self.prioritized else None)
                      for policy_id, policy_batch in multi.policy_batches.items() if policy_batch.count]
            for policy_id, items, priorities in staged:
                buffer = self._policy_buffer(policy_id)
                if isinstance(buffer, PrioritizedReplayBuffer):
                    buffer._add_many(items, priorities)
                else:
                    for item in items:
                        buffer.add(item)
        self.num_added += batch.count
        self._time("add_batch", start)

    def replay(self) -> MultiAgentBatch | None:
        """A training batch, or ``None`` while fewer than ``learning_starts`` env steps are stored.

        Independent mode samples every policy's buffer (``replay_batch_size`` rows, or
        ``max(1, replay_batch_size // T)`` sequences) into a MultiAgentBatch whose env count is
        ``replay_batch_size``; prioritized samples carry ``weights`` and ``batch_indexes``. Lockstep
        mode concatenates ``replay_batch_size`` time slices.
        """
        if self.num_added < self.learning_starts:
            return None
        start = time.perf_counter()
        result: MultiAgentBatch | None = None
        if self.lockstep_buffer is not None:
            if len(self.lockstep_buffer):
                result = self.lockstep_buffer.sample(self.replay_batch_size)
        else:
            num_items = self.replay_batch_size if self.replay_sequence_length == 1 else \
                max(1, self.replay_batch_size // self.replay_sequence_length)
            samples: dict[str, SampleBatch] = {}
            for policy_id, buffer in self.replay_buffers.items():
                if not len(buffer):
                    continue
                if isinstance(buffer, PrioritizedReplayBuffer):
                    samples[policy_id] = buffer.sample(num_items, beta=self.prioritized_replay_beta)
                else:
                    samples[policy_id] = buffer.sample(num_items)
            if samples:
                result = MultiAgentBatch(samples, self.replay_batch_size)
        self._time("replay", start)
        return result

    def update_priorities(self, prio_dict: Mapping[str, tuple[npt.ArrayLike, npt.ArrayLike]]) -> None:
        """Sets the replayed items' priorities to ``|td_error| + prioritized_replay_eps``.

        A no-op for uniform buffers (alpha 0, or lockstep mode).

        Args:
            prio_dict: policy id to ``(batch_indexes, td_errors)``, one index per item.

        Raises:
            ValueError: an unknown policy id, different lengths, a non-finite TD error, or an index
                that is not stored.
        """
        if not self.prioritized:
            return
        start = time.perf_counter()
        unknown = sorted(set(prio_dict) - set(self.replay_buffers))
        if unknown:
            raise ValueError(f"update_priorities got policies {unknown}, which have no stored data; "
                             f"known policies: {sorted(self.replay_buffers)}")
        for policy_id, (batch_indexes, td_errors) in prio_dict.items():
            buffer = self.replay_buffers[policy_id]
            assert isinstance(buffer, PrioritizedReplayBuffer)  # self.prioritized: every policy buffer is
            priorities = np.abs(np.asarray(td_errors, dtype=np.float64)) + self.prioritized_replay_eps
            buffer.update_priorities(batch_indexes, priorities)
        self._time("update_priorities", start)

    def stats(self, debug: bool = False) -> dict[str, Any]:
        """Mean call times, ``num_added`` (env steps), this shard's ``capacity`` and ``learning_starts``, the
        items stored (``num_entries``), and each buffer's stats under ``policy_<id>`` (added, sampled and
        evicted counts; ``max_priority`` when prioritized). Plain data only.

        Args:
            debug: include the buffers' debug stats (stored timesteps and bytes).
        """
        stats: dict[str, Any] = {f"{name}_time_ms": 1000 * total / count if count else 0.0
                                 for name, (total, count) in self._timers.items()}
        stats.update(num_added=self.num_added, capacity=self.capacity, learning_starts=self.learning_starts,
                     num_entries=len(self))
        for policy_id, buffer in self._buffers().items():
            stats[f"policy_{policy_id}"] = buffer.stats(debug=debug)
        return stats

    def _config(self) -> dict[str, Any]:
        # alpha shapes the stored trees only when prioritized; a uniform buffer records 0.
        return {"capacity": self.capacity,
                "prioritized_replay_alpha": self.prioritized_replay_alpha if self.prioritized else 0.0,
                "replay_mode": self.replay_mode, "replay_sequence_length": self.replay_sequence_length}

    def get_state(self) -> dict[str, Any]:
        """Everything :meth:`set_state` needs to restore this buffer exactly, as plain data.

        That is the contents (columnar: a few arrays per column), the priorities (the trees' leaves),
        write indexes, counters and generator states, as numpy arrays, numbers, strings, lists and
        dicts (no pickled objects), all copies. Call times are not included.

        Raises:
            ValueError: a stored column holds Python objects (dtype ``object``).

        Examples:
            >>> buf = LocalReplayBuffer(learning_starts=0, capacity=8, replay_batch_size=2, seed=0)
            >>> buf.add_batch(SampleBatch({OBS: np.arange(4.0)}))
            >>> twin = LocalReplayBuffer(learning_starts=0, capacity=8, replay_batch_size=2)
            >>> twin.set_state(buf.get_state())
            >>> twin.replay() == buf.replay()  # the same contents, priorities and generator state
            True
        """
        return {"version": _STATE_VERSION, "config": self._config(), "num_added": self.num_added,
                "rng": self._rng.bit_generator.state,
                "buffers": {p: b.get_state() for p, b in self._buffers().items()}}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`get_state` output, replacing the current contents.

        The settings that shape the stored data (per-shard capacity, alpha, replay mode and sequence
        length) must match; ``learning_starts``, ``replay_batch_size``, beta and eps stay this
        buffer's own. On error the buffer is left unchanged.

        Raises:
            ValueError: another state version, a state written with other storage settings, or a
                malformed state.
        """
        try:
            version = state.get("version")
            if version != _STATE_VERSION:
                raise ValueError(f"LocalReplayBuffer state version {version!r} is not supported; this flowrl "
                                 f"reads version {_STATE_VERSION}")
            config = dict(state["config"])
            if config != self._config():
                raise ValueError(f"LocalReplayBuffer state was written with {config}, but this buffer has "
                                 f"{self._config()}; build it with the settings of the checkpointed one")
            buffers: dict[str, ReplayBuffer[SampleBatch]] = {}
            lockstep: ReplayBuffer[MultiAgentBatch] | None = None
            for policy_id, buffer_state in state["buffers"].items():
                if self.replay_mode == "lockstep":
                    if policy_id != ALL_POLICIES:
                        raise ValueError(f"a lockstep state holds one buffer, {ALL_POLICIES!r}, not {policy_id!r}")
                    lockstep = ReplayBuffer(self.capacity)
                    lockstep.set_state(buffer_state)
                else:
                    buffer: ReplayBuffer[SampleBatch] = ReplayBuffer(self.capacity)
                    if self.prioritized:
                        buffer = PrioritizedReplayBuffer(self.capacity, self.prioritized_replay_alpha)
                    buffer.set_state(buffer_state)
                    buffers[str(policy_id)] = buffer
            num_added = int(state["num_added"])
            rng = _restored_rng(state["rng"])
        except (KeyError, TypeError, IndexError, AttributeError) as error:
            raise ValueError(f"malformed LocalReplayBuffer state ({type(error).__name__}: {error}); pass the "
                             f"unchanged output of get_state()") from error
        self.replay_buffers, self.lockstep_buffer = buffers, lockstep
        self.num_added, self._rng = num_added, rng


class ReplayActor(LocalReplayBuffer, ParallelIteratorWorker):
    """A :class:`LocalReplayBuffer` shard as an actor; its shard stream is ``replay()`` forever.

    So ``from_actors(actors).gather_async()`` pulls replays, where ``None`` means "no data yet"
    (``Replay(actors=...)`` turns it into not-ready). Create them with :func:`make_replay_actors`;
    the class itself is a plain Python class, usable in-process.

    Args:
        *args: as :class:`LocalReplayBuffer`.
        **kwargs: as :class:`LocalReplayBuffer`.

    Examples:
        >>> shard = ReplayActor(learning_starts=2, capacity=10, seed=0)  # in-process, not an actor
        >>> shard.replay() is None
        True
        >>> shard.add_batch(SampleBatch({OBS: [1.0, 2.0]}))
        >>> shard.ping(), shard.replay().count
        ('ok', 1)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        LocalReplayBuffer.__init__(self, *args, **kwargs)
        ParallelIteratorWorker.__init__(self, self._replay_forever, False)

    def _replay_forever(self) -> Iterator[MultiAgentBatch | None]:
        while True:
            yield self.replay()

    def ping(self) -> str:
        """Health probe."""
        return "ok"


# Typed as Any: Ray's stubs do not model .options(...).remote(...) on an actor class.
_RemoteReplayActor: Any = ray.remote(ReplayActor)


def make_replay_actors(num_actors: int, *, colocated_with_driver: bool = False,
                       shard_indices: Sequence[int] | None = None,
                       **buffer_kwargs: Any) -> list[ActorHandle[ReplayActor]]:
    """Starts ``num_actors`` replay shards with ``num_cpus=0``, sharing ``learning_starts`` and ``capacity``.

    Each shard is a :class:`ReplayActor` with ``num_shards=num_actors``, so it holds
    ``learning_starts // num_actors`` and ``capacity // num_actors``. Both placements go through
    this one creation path: pinned to the driver's node by node affinity, or placed freely by Ray.
    The arguments are checked in the driver first, so a bad one raises here rather than killing the
    actors. With a ``seed``, each shard gets its own seed derived from it.

    Args:
        num_actors: the number of shards (their ``num_shards``); >= 1.
        colocated_with_driver: pin the shards to the driver's node (Ape-X's
            ``replay_buffer_shards_colocated_with_driver``); ``False`` lets Ray place them.
        shard_indices: start only these shards of the ``num_actors`` (each as it would be in the full set,
            with the same seed), in this order: how a dead shard is replaced; ``None``: all of them.
        **buffer_kwargs: :class:`LocalReplayBuffer` arguments other than ``num_shards``.

    Raises:
        ValueError: ``num_actors < 1``, ``num_shards`` given, a shard index outside ``range(num_actors)``, or
            an invalid buffer argument.

    Examples:
        >>> [actor] = make_replay_actors(1, learning_starts=0, capacity=10, seed=0)
        >>> ray.get(actor.add_batch.remote(SampleBatch({OBS: [1.0, 2.0]})))
        >>> ray.get(actor.replay.remote()).count
        1
    """
    num_actors = _check_int("num_actors", num_actors, 1)
    if "num_shards" in buffer_kwargs:
        raise ValueError(f"make_replay_actors sets num_shards to num_actors={num_actors}; drop "
                         f"num_shards={buffer_kwargs['num_shards']!r}")
    if not isinstance(colocated_with_driver, bool):
        raise ValueError(f"colocated_with_driver={colocated_with_driver!r} must be True or False")
    indices = list(range(num_actors)) if shard_indices is None else list(shard_indices)
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_actors for i in indices):
        raise ValueError(f"shard_indices={indices!r} must be shard numbers in range({num_actors}) (num_actors)")
    LocalReplayBuffer(num_shards=num_actors, **buffer_kwargs)  # validate before starting actors
    seed = buffer_kwargs.pop("seed", None)
    seeds: list[int | None] = [None] * num_actors
    if seed is not None:
        seeds = [int(s.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
                 for s in np.random.SeedSequence(seed).spawn(num_actors)]
    runtime.ensure_initialized()
    extra: dict[str, Any] = {}
    if colocated_with_driver:
        extra["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
            node_id=ray.get_runtime_context().get_node_id(), soft=False)
    options = runtime.actor_options(num_cpus=0, **extra)
    return [_RemoteReplayActor.options(**options).remote(num_shards=num_actors, seed=seeds[i], **buffer_kwargs)
            for i in indices]
