"""Columnar experience batches: :class:`SampleBatch` and :class:`MultiAgentBatch`.

A ``SampleBatch`` is a dict of equal-length numpy columns, one row per env step (or agent step).
A ``MultiAgentBatch`` maps policy ids to SampleBatches and carries the env-step count.

Examples:
    >>> b = SampleBatch({OBS: np.zeros((4, 2)), REWARDS: np.arange(4.0)})
    >>> b.count, b[1:3][REWARDS].tolist()
    (4, [1.0, 2.0])
    >>> SampleBatch.concat([b, b]).count
    8
    >>> [mb.count for mb in b.minibatches(3)]
    [3, 1]
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence, Union

import numpy as np

from flowrl.validation import check_int

__all__ = [
    "SampleBatch", "MultiAgentBatch", "AnyBatch", "DEFAULT_POLICY_ID",
    "OBS", "NEXT_OBS", "ACTIONS", "REWARDS", "TERMINATEDS", "TRUNCATEDS", "LOGP", "ACTION_PROB", "ACTION_DIST_INPUTS",
    "VF_PREDS", "ADVANTAGES", "VALUE_TARGETS", "RETURNS", "EPS_ID", "ENV_ID", "AGENT_INDEX", "T",
    "WEIGHTS", "BATCH_INDEXES", "PRIORITIES", "TD_ERROR", "WEIGHTS_VERSION", "PACK_MAX_BYTES", "STATE_IN", "STATE_OUT",
    "PREV_ACTIONS", "PREV_REWARDS",
]

DEFAULT_POLICY_ID = "default_policy"

# Standard column names.
OBS = "obs"
NEXT_OBS = "new_obs"
ACTIONS = "actions"
REWARDS = "rewards"
TERMINATEDS = "terminateds"
TRUNCATEDS = "truncateds"
LOGP = "logp"
ACTION_PROB = "action_prob"
"""The probability (density, for continuous actions) of a row's action under the policy that took it,
``exp(logp)``: recorded experiences carry it for off-policy estimation."""
ACTION_DIST_INPUTS = "action_dist_inputs"
VF_PREDS = "vf_preds"
ADVANTAGES = "advantages"
VALUE_TARGETS = "value_targets"
RETURNS = "returns"
EPS_ID = "eps_id"
ENV_ID = "env_id"
AGENT_INDEX = "agent_index"
T = "t"
WEIGHTS = "weights"
BATCH_INDEXES = "batch_indexes"
PRIORITIES = "priorities"
TD_ERROR = "td_error"
# The version of the weights that sampled a row: the sampling policy's count of learner updates (stamped when
# the config sets ``profile``; flowrl.testing.FakeWorker always stamps it). Learners measure staleness with it.
WEIGHTS_VERSION = "weights_version"

STATE_IN = "state_in_{}"
"""A recurrent policy's state before acting, per row: ``STATE_IN.format(k)`` is the ``k``-th state tensor's column
(for an LSTM, ``state_in_0`` holds h and ``state_in_1`` holds c)."""
STATE_OUT = "state_out_{}"
"""The state after acting, per row (equal to the next row's ``state_in`` within an episode)."""
PREV_ACTIONS = "prev_actions"
"""The previous step's action a recurrent model read at this row (``model.lstm_use_prev_action``; zeros at an
episode's first step)."""
PREV_REWARDS = "prev_rewards"
"""The previous step's reward a recurrent model read at this row (``model.lstm_use_prev_reward``)."""


def _rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


PACK_MAX_BYTES = 1 << 16
"""Batches up to this many bytes of column data pickle as one buffer (``SampleBatch.__reduce__``)."""
_ALIGN = 16  # each packed column starts at a multiple of this, so every dtype is aligned when unpacked


def _packed_size(columns: Mapping[str, np.ndarray]) -> int | None:
    """The bytes :func:`_pack_columns` would lay out, or None where it would not pack these columns."""
    total = 0
    for column in columns.values():
        if column.dtype.hasobject or column.dtype.fields is not None:
            return None
        total += -(-column.nbytes // _ALIGN) * _ALIGN
    return total if total <= PACK_MAX_BYTES else None


def _wire_size(batch: SampleBatch) -> int | None:
    """The packed bytes of a batch that may cross a shard's wire (a plain ``SampleBatch``, no instance
    attributes), or None."""
    return _packed_size(batch) if type(batch) is SampleBatch and not batch.__dict__ else None


def _pack_columns(columns: Mapping[str, np.ndarray]) -> tuple[tuple[str, ...], tuple[str, ...],
                                                               tuple[tuple[int, ...], ...], bytes] | None:
    """``(names, dtypes, shapes, buffer)`` of C-ordered columns laid end to end (each at a multiple of
    ``_ALIGN`` bytes), or None for more than :data:`PACK_MAX_BYTES` or a column numpy cannot lay out as bytes
    (object or structured dtypes)."""
    if _packed_size(columns) is None:
        return None
    parts: list[bytes] = []
    for column in columns.values():
        parts.append(column.tobytes())
        pad = -column.nbytes % _ALIGN
        if pad:
            parts.append(bytes(pad))
    return (tuple(columns), tuple(c.dtype.str for c in columns.values()),
            tuple(c.shape for c in columns.values()), b"".join(parts))


def _unpack_columns(cls: type[SampleBatch], names: tuple[str, ...], dtypes: tuple[str, ...],
                    shapes: tuple[tuple[int, ...], ...], data: bytes) -> SampleBatch:
    """The ``cls`` batch that :func:`_pack_columns` laid out: writable arrays over one copy of ``data``."""
    buffer, offset, columns = bytearray(data), 0, {}
    for name, dtype, shape in zip(names, dtypes, shapes):
        column = np.ndarray(shape, dtype, buffer=buffer, offset=offset)
        columns[name] = column
        offset += -(-column.nbytes // _ALIGN) * _ALIGN
    return cls._of_checked(columns)


WIRE_ATTRIBUTE = "_lz4_on_wire"
"""The instance attribute by which a batch asks to cross Ray with its image columns LZ4-compressed
(:func:`flowrl.compression.mark_for_wire` sets it; it is never sent)."""


def _compressed_reduce(batch: SampleBatch, state: dict[str, Any]) -> tuple[Any, ...]:
    from flowrl.compression import is_image_column, pack_column

    plain = {k: v for k, v in batch.items() if not is_image_column(v)}
    packed = {k: pack_column(v) for k, v in batch.items() if k not in plain}
    rest = {k: v for k, v in state.items() if k != WIRE_ATTRIBUTE} or None
    return _uncompressed, (type(batch), list(batch), plain, packed), rest


def _uncompressed(cls: type[SampleBatch], order: list[str], plain: dict[str, np.ndarray],
                  packed: dict[str, tuple[str, tuple[int, ...], bytes]]) -> SampleBatch:
    """The batch :func:`_compressed_reduce` sent, its columns in their order."""
    from flowrl.compression import unpack_column

    return cls._of_checked({k: plain[k] if k in plain else unpack_column(*packed[k]) for k in order})


class SampleBatch(dict[str, np.ndarray]):
    """A dict of equal-length numpy columns.

    Args:
        columns: column name to array-like; every column must have the same first dimension.

    Raises:
        ValueError: columns of different lengths, or a scalar column.
    """

    def __init__(self, columns: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__()
        for key, value in {**(columns or {}), **kwargs}.items():
            self[key] = value

    def __setitem__(self, key: str, value: Any) -> None:
        array = np.asarray(value)
        if array.ndim == 0:
            raise ValueError(f"SampleBatch column {key!r} is a scalar; columns need one row per step")
        for other, column in self.items():
            if other != key and len(column) != len(array):
                raise ValueError(f"SampleBatch column {key!r} has {len(array)} rows but column {other!r} has "
                                 f"{len(column)}; every column needs one row per step")
            break
        super().__setitem__(key, array)

    @classmethod
    def _of_checked(cls, columns: dict[str, np.ndarray]) -> SampleBatch:
        """A batch of columns already known to be equal-length arrays (rows of existing batches):
        skips the per-column checks, which dominate slicing small trajectory pieces."""
        batch = cls()
        dict.update(batch, columns)
        return batch

    def __getitem__(self, key: Any) -> Any:  # a slice selects rows
        if isinstance(key, slice):
            return SampleBatch._of_checked({k: v[key] for k, v in self.items()})
        return super().__getitem__(key)

    @property
    def count(self) -> int:
        """The number of rows (env steps)."""
        for column in self.values():
            return len(column)
        return 0

    def agent_steps(self) -> int:
        """Equal to :attr:`count` for a single-agent batch."""
        return self.count

    def env_steps(self) -> int:
        return self.count

    def copy(self) -> SampleBatch:
        """A deep copy of every column."""
        return SampleBatch._of_checked({k: v.copy() for k, v in self.items()})

    def rows(self, indices: np.ndarray | Sequence[int]) -> SampleBatch:
        """The rows at ``indices``, in that order."""
        idx = np.asarray(indices, dtype=np.int64)
        return SampleBatch._of_checked({k: v[idx] for k, v in self.items()})

    def shuffle(self, seed: int | np.random.Generator | None = None) -> SampleBatch:
        """A new batch with the rows permuted (the same permutation for every column)."""
        return self.rows(_rng(seed).permutation(self.count))

    def minibatches(self, size: int, seed: int | np.random.Generator | None = None,
                    shuffle: bool = False) -> Iterator[SampleBatch]:
        """Consecutive slices of ``size`` rows (the last may be shorter); optionally shuffled first."""
        check_int("minibatch size", size, 1, "rows per minibatch")
        batch = self.shuffle(seed) if shuffle else self
        for start in range(0, self.count, size):
            yield batch[start:start + size]

    def split_by_episode(self) -> list[SampleBatch]:
        """Runs of consecutive rows with the same ``eps_id`` (the whole batch if there is no such column)."""
        if EPS_ID not in self:
            return [self] if self.count else []
        ids = self[EPS_ID]
        cuts = [0, *(np.flatnonzero(ids[1:] != ids[:-1]) + 1).tolist(), self.count]
        return [self[a:b] for a, b in zip(cuts[:-1], cuts[1:]) if b > a]

    def as_multi_agent(self) -> MultiAgentBatch:
        """This batch as the default policy's part of a MultiAgentBatch."""
        return MultiAgentBatch({DEFAULT_POLICY_ID: self}, self.count)

    @staticmethod
    def concat(batches: Sequence[SampleBatch]) -> SampleBatch:
        """Joins batches row-wise; all must have the same columns.

        Raises:
            ValueError: an empty list, or batches whose columns differ.
        """
        batches = [b for b in batches if b.count > 0] or list(batches[:1])
        if not batches:
            raise ValueError("SampleBatch.concat() needs at least one batch")
        keys = set(batches[0])
        for b in batches[1:]:
            if set(b) != keys:
                raise ValueError(f"SampleBatch.concat(): column sets differ: {sorted(keys)} vs {sorted(b)}")
        return SampleBatch._of_checked({k: np.concatenate([dict.__getitem__(b, k) for b in batches])
                                        for k in batches[0]})

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles a small batch as one buffer (:func:`_pack_columns`): a Ray call returning a 50-row fragment
        costs ~0.2 ms less CPU (both ends together, Ray 2.60) than with numpy's per-array out-of-band buffers.
        A batch over :data:`PACK_MAX_BYTES`, or with object or structured columns, pickles its columns one by
        one as before (zero-copy through Ray's object store). The class and any instance attributes travel. A batch
        marked by :func:`flowrl.compression.mark_for_wire` sends its image columns LZ4-compressed (unmarked on
        arrival)."""
        state = self.__dict__ or None  # attributes a subclass or a caller set travel too
        if state is not None and WIRE_ATTRIBUTE in state:  # flowrl.compression.mark_for_wire
            return _compressed_reduce(self, state)
        packed = _pack_columns(self)
        if packed is None:
            return type(self)._of_checked, (dict(self),), state
        return _unpack_columns, (type(self), *packed), state

    def __flowrl_wire__(self) -> bool:
        """Whether a shard may send this batch as one plain pickle (``flowrl.iter``'s wire format): a
        ``SampleBatch`` itself (not a subclass, which may live in a script's ``__main__``), with no instance
        attributes, that packs into one buffer."""
        return _wire_size(self) is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SampleBatch):
            return NotImplemented
        return _batches_equal(self, other)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # mutable container

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self.items())
        return f"SampleBatch({self.count}: {cols})"


class MultiAgentBatch:
    """Per-policy SampleBatches plus the number of env steps they came from.

    Examples:
        >>> a = SampleBatch({REWARDS: [1.0, 2.0]})
        >>> mb = MultiAgentBatch({"p0": a, "p1": a[0:1]}, env_steps=2)
        >>> mb.count, mb.agent_steps()
        (2, 3)
        >>> MultiAgentBatch.concat([mb, mb]).policy_batches["p1"].count
        2
    """

    def __init__(self, policy_batches: Mapping[str, SampleBatch], env_steps: int) -> None:
        check_int("MultiAgentBatch env_steps", env_steps, 0, "env steps the batch holds")
        for pid, b in policy_batches.items():
            if not isinstance(b, SampleBatch):
                raise ValueError(f"MultiAgentBatch policy {pid!r} holds {type(b).__name__}; pass SampleBatches")
        self.policy_batches: dict[str, SampleBatch] = dict(policy_batches)
        self.env_steps_count = int(env_steps)

    @property
    def count(self) -> int:
        """The number of env steps."""
        return self.env_steps_count

    def env_steps(self) -> int:
        return self.env_steps_count

    def agent_steps(self) -> int:
        """The sum of the policy batches' rows."""
        return sum(b.count for b in self.policy_batches.values())

    def copy(self) -> MultiAgentBatch:
        return MultiAgentBatch({p: b.copy() for p, b in self.policy_batches.items()}, self.env_steps_count)

    def as_multi_agent(self) -> MultiAgentBatch:
        return self

    @staticmethod
    def concat(batches: Sequence[MultiAgentBatch]) -> MultiAgentBatch:
        """Joins per policy and adds the env steps."""
        if not batches:
            raise ValueError("MultiAgentBatch.concat() needs at least one batch")
        per_policy: dict[str, list[SampleBatch]] = {}
        for b in batches:
            for pid, pb in b.policy_batches.items():
                per_policy.setdefault(pid, []).append(pb)
        return MultiAgentBatch({p: SampleBatch.concat(bs) for p, bs in per_policy.items()},
                               sum(b.count for b in batches))

    def __flowrl_wire__(self) -> bool:
        """Whether a shard may send this batch as one plain pickle: a ``MultiAgentBatch`` itself whose policy
        batches all may and pack into :data:`PACK_MAX_BYTES` together (see ``SampleBatch.__flowrl_wire__``)."""
        if type(self) is not MultiAgentBatch or vars(self).keys() != {"policy_batches", "env_steps_count"}:
            return False
        total = 0
        for batch in self.policy_batches.values():
            size = _wire_size(batch)
            if size is None:
                return False
            total += size
        return total <= PACK_MAX_BYTES

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MultiAgentBatch):
            return NotImplemented
        return self.env_steps_count == other.env_steps_count and self.policy_batches.keys() == \
            other.policy_batches.keys() and all(
                _batches_equal(b, other.policy_batches[p]) for p, b in self.policy_batches.items())

    __hash__ = None  # type: ignore[assignment]  # mutable container

    def __repr__(self) -> str:
        parts = ", ".join(f"{p}: {b.count}" for p, b in self.policy_batches.items())
        return f"MultiAgentBatch(env_steps={self.count}, {{{parts}}})"


AnyBatch = Union[SampleBatch, MultiAgentBatch]


def _batches_equal(a: SampleBatch, b: SampleBatch) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
