"""The replay stores under :mod:`flowrl.replay_buffers` (which re-exports them): item buffers and a batch ring.

- :class:`ReplayBuffer`: a FIFO of *items* (timestep rows or sequences) whose capacity counts
  timesteps, sampled uniformly with replacement; :class:`PrioritizedReplayBuffer` samples in
  proportion to ``priority ** alpha`` and adds importance weights, keeping its priorities in the segment
  trees of :mod:`flowrl.segment_tree`.
- :class:`SimpleReplayBuffer`: a ring of whole batches (IMPALA's ``MixInReplay``).

Every buffer owns its ``numpy.random.Generator``: the same ``seed`` and the same calls give the same
samples, and ``get_state()``/``set_state()`` carry the generator state with the contents, as plain data.

Examples:
    >>> buf = ReplayBuffer(capacity=8, seed=0)
    >>> buf.add(SampleBatch({OBS: [1.0, 2.0]}))
    >>> buf.sample(2).count, len(buf)
    (4, 1)
"""

from __future__ import annotations

import math
from typing import Any, Generic, Mapping, Sequence, TypeVar

import numpy as np
import numpy.typing as npt

from flowrl.sample_batch import BATCH_INDEXES, WEIGHTS, AnyBatch, MultiAgentBatch, SampleBatch
from flowrl.sample_batch import OBS  # noqa: F401  (the examples use it)
from flowrl.replay_columns import RowStore, row_store_of
from flowrl.segment_tree import FloatArray, IntArray, MinSegmentTree, SumSegmentTree
from flowrl.validation import check_int, check_number

__all__ = ["ReplayBuffer", "PrioritizedReplayBuffer", "SimpleReplayBuffer"]

# Items of one buffer are all SampleBatches or all MultiAgentBatches (lockstep time slices).
BatchT = TypeVar("BatchT", SampleBatch, MultiAgentBatch)


# Helpers shared with flowrl.replay_buffers (outside __all__). Argument checks name the argument, value and meaning.
def check_seed(seed: Any) -> int | None:
    if seed is None:
        return None
    check_int("seed", seed, 0, "seeds the buffer's numpy generator; None: fresh entropy")
    return int(seed)


def check_batch_arg(where: str, batch: Any) -> None:
    if not isinstance(batch, (SampleBatch, MultiAgentBatch)):
        raise ValueError(f"{where} takes a SampleBatch or MultiAgentBatch, got {type(batch).__name__}")


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


def restored_rng(state: Mapping[str, Any]) -> np.random.Generator:
    """A generator in the ``bit_generator.state`` that ``state`` holds (a PCG64 state)."""
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
        compress: keep image columns of one-row items (Atari frame stacks) LZ4-compressed, one block per row
            (:mod:`flowrl.compression`); items of several rows are kept as they are.

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

    def __init__(self, capacity: int, seed: int | None = None, compress: bool = False) -> None:
        check_int("capacity", capacity, 1, "timesteps held before the write index wraps")
        self.capacity = int(capacity)
        self.compress = bool(compress)
        self._rng = np.random.default_rng(check_seed(seed))
        # the items: columns while every one is a one-row SampleBatch of the same columns, else a list
        self._storage: list[BatchT] | RowStore = RowStore(self.capacity, self.compress)
        self._item_type: type | None = None
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
        check_batch_arg(where, item)
        if item.count < 1:
            raise ValueError(f"{where} got an item with {item.count} timesteps; items need at least one "
                             f"(drop empty batches before storing)")
        if self._storage and type(item) is not self._item_type:
            raise ValueError(f"{where} got a {type(item).__name__} but the buffer holds "
                             f"{getattr(self._item_type, '__name__', None)} items; use one buffer per item kind")

    def _write(self, item: BatchT) -> int:
        """Stores a checked ``item`` at the write index, advances or wraps it, and returns the slot."""
        idx, storage = self._next_idx, self._storage
        if isinstance(storage, RowStore) and not storage.fits(item):
            storage = self._storage = list(storage)  # type: ignore[arg-type]  # a RowStore holds SampleBatches
        if not storage:
            self._item_type = type(item)
        if idx >= len(storage):
            storage.append(item)  # type: ignore[arg-type]  # a RowStore only gets the SampleBatches that fit
        else:
            storage[idx] = item  # type: ignore[assignment]
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
        check_int("num_items", num_items, 1, "items to draw")
        num_items = int(num_items)
        if not self._storage:
            raise IndexError(f"cannot sample from an empty {type(self).__name__}; add items first")
        return num_items

    def _draw(self, idxes: IntArray) -> tuple[BatchT, list[int] | None]:
        """The items at ``idxes`` joined, and each one's row count (``None``: one row each)."""
        self.num_sampled += int(idxes.size)
        storage = self._storage
        if isinstance(storage, RowStore):
            return storage.take(idxes), None  # type: ignore[return-value]  # it holds SampleBatches
        items = [storage[i] for i in idxes.tolist()]
        if isinstance(items[0], SampleBatch):
            batch, lengths = _concat_rows(items)
            return batch, lengths  # type: ignore[return-value]
        return _concat(items), None

    def sample(self, num_items: int) -> BatchT:
        """Concatenates ``num_items`` items drawn uniformly with replacement.

        Raises:
            ValueError: ``num_items`` is not an int >= 1.
            IndexError: the buffer is empty.
        """
        num_items = self._check_sample(num_items)
        return self._draw(self._rng.integers(0, len(self._storage), size=num_items))[0]

    def stats(self, debug: bool = False) -> dict[str, Any]:
        """Counters; ``debug=True`` adds the stored timesteps and bytes (a pass over the items)."""
        stats: dict[str, Any] = {"num_entries": len(self), "num_added": self.num_added,
                                 "num_timesteps_added": self.num_timesteps_added,
                                 "num_sampled": self.num_sampled, "num_evicted": self.num_evicted}
        if debug:
            stats["timesteps_stored"] = sum(item.count for item in self._storage)
            storage = self._storage
            stats["est_size_bytes"] = (storage.nbytes if isinstance(storage, RowStore)
                                       else sum(_nbytes(item) for item in storage))
        return stats

    def get_state(self) -> dict[str, Any]:
        """Contents, write index, counters and RNG state, as plain data (copies, never views).

        The contents are columnar (a few arrays per column, whatever the number of items).
        """
        storage = self._storage
        items = storage.encoded() if isinstance(storage, RowStore) else _encode_items(storage)
        return {"type": type(self).__name__, "capacity": self.capacity, "items": items,
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
        rng = restored_rng(state["rng"])
        # BatchT is not known at run time; _decode_items gives items of one kind, as add() keeps them.
        self._storage = row_store_of(items, self.capacity, self.compress) or items  # type: ignore[assignment]
        self._item_type = type(items[0]) if items else None
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

    def __init__(self, capacity: int, alpha: float, seed: int | None = None, compress: bool = False) -> None:
        super().__init__(capacity, seed, compress)
        check_number("alpha", alpha, gt=0, lt=math.inf,
                     meaning="how strongly priorities shape sampling; ReplayBuffer samples uniformly")
        self.alpha = float(alpha)
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
            check_number("priority", priority, gt=0, lt=math.inf, meaning="add a small eps to |td_error|")
            priority = float(priority)
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
        check_number("beta", beta, ge=0, lt=math.inf, meaning="importance-sampling exponent; 0: no correction")
        beta = float(beta)
        n, tree = len(self._storage), self.sum_tree
        idxes = tree._descend(self._rng.random(num_items) * tree.sum(0, n))
        leaves = tree.value[tree.capacity + np.minimum(idxes, n - 1)]
        clamped = (idxes >= n) | ~(leaves > 0)
        idxes = np.where(clamped, n - 1, idxes)
        leaves = np.where(clamped, tree.value[tree.capacity + n - 1], leaves)
        # (N * P(i)) ** -beta / (N * P_min) ** -beta == (leaf_i / leaf_min) ** -beta: N and the total
        # cancel, so the minimum-priority item gets exactly 1.0 and every other ratio >= 1 a weight <= 1.
        weights = (leaves / self.min_tree.min(0, n)) ** (-beta)
        batch, lengths = self._draw(idxes)
        if lengths is None:  # one row per item
            batch[WEIGHTS], batch[BATCH_INDEXES] = weights.astype(np.float32), idxes.astype(np.int64)
        else:
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
        check_int("num_slots", num_slots, 0, "batches held; 0 stores nothing")
        self.num_slots = int(num_slots)
        self._rng = np.random.default_rng(check_seed(seed))
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
        check_batch_arg("SimpleReplayBuffer.add_batch()", batch)
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
