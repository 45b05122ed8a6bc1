"""Replay buffers: the multi-agent buffer that DQN-style plans store into and replay from, and its replay shards.

The replay operators of :mod:`flowrl.ops.replay` read and write them. The layers, bottom up (every name is
importable from here):

- :class:`SumSegmentTree` and :class:`MinSegmentTree` (:mod:`flowrl.segment_tree`): ``O(log n)`` range
  reductions and the proportional-sampling descent (Schaul et al., *Prioritized Experience Replay*,
  arXiv:1511.05952).
- :class:`ReplayBuffer` (:mod:`flowrl.replay_storage`): a FIFO of *items* (timestep rows or sequences) whose
  capacity counts timesteps, sampled uniformly with replacement; :class:`PrioritizedReplayBuffer` samples in
  proportion to ``priority ** alpha`` and adds importance weights.
- :class:`SimpleReplayBuffer` (:mod:`flowrl.replay_storage`): a ring of whole batches (IMPALA's ``MixInReplay``).
- :class:`LocalReplayBuffer` (here): the multi-agent buffer a DQN-style plan stores into and replays from,
  with ``learning_starts``, independent or lockstep replay, priority updates and plain-data state;
  :class:`ReplayShard` is one of ``num_shards`` such buffers run as an actor, started by
  :func:`make_replay_shards`.

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
import time
from typing import Any, Iterator, Literal, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from flowrl import executor, runtime  # first: sets Ray's loopback variable before anything imports ray
from flowrl.iter import ParallelIteratorWorker
from flowrl.replay_storage import (PrioritizedReplayBuffer, ReplayBuffer, SimpleReplayBuffer, check_batch_arg,
                                   check_seed, restored_rng)
from flowrl.sample_batch import EPS_ID, PRIORITIES, T, AnyBatch, MultiAgentBatch, SampleBatch
from flowrl.sample_batch import BATCH_INDEXES, DEFAULT_POLICY_ID, OBS, REWARDS  # noqa: F401  (the examples use them)
from flowrl.segment_tree import FloatArray, MinSegmentTree, SegmentTree, SumSegmentTree
from flowrl.validation import check_int, check_number

__all__ = [
    "SegmentTree", "SumSegmentTree", "MinSegmentTree",
    "ReplayBuffer", "PrioritizedReplayBuffer", "SimpleReplayBuffer",
    "LocalReplayBuffer", "ReplayShard", "make_replay_shards", "ALL_POLICIES",
]

# Key of the single lockstep buffer in stats and state (it holds whole multi-agent time slices).
ALL_POLICIES = "__all__"

# Version of the plain-data layout returned by LocalReplayBuffer.get_state().
_STATE_VERSION = 1


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
    ``Replay(local_buffer=...)``, or as :class:`ReplayShard` actors.

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
        compress: keep the image columns of stored timestep rows LZ4-compressed (:mod:`flowrl.compression`):
            about 40x less memory for Atari frame stacks, a few microseconds a row to store and to draw.

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
                 replay_sequence_length: int = 1, seed: int | None = None, compress: bool = False) -> None:
        check_int("num_shards", num_shards, 1, "shards sharing learning_starts and capacity")
        check_int("learning_starts", learning_starts, 0, "env steps stored before replays start")
        check_int("capacity", capacity, 1, "timesteps held over all shards")
        self.num_shards, learning_starts, capacity = int(num_shards), int(learning_starts), int(capacity)
        if capacity < self.num_shards:
            raise ValueError(f"capacity={capacity} is less than num_shards={self.num_shards}, so a shard would "
                             f"hold nothing; raise capacity to at least {self.num_shards}")
        check_int("replay_batch_size", replay_batch_size, 1, "timesteps per policy per replay")
        check_number("prioritized_replay_alpha", prioritized_replay_alpha, ge=0, lt=math.inf,
                     meaning="0: uniform replay")
        check_number("prioritized_replay_beta", prioritized_replay_beta, ge=0, lt=math.inf,
                     meaning="importance-sampling exponent")
        check_number("prioritized_replay_eps", prioritized_replay_eps, gt=0, lt=math.inf,
                     meaning="added to |td_error| for new priorities")
        self.replay_batch_size = int(replay_batch_size)
        self.prioritized_replay_alpha = float(prioritized_replay_alpha)
        self.prioritized_replay_beta = float(prioritized_replay_beta)
        self.prioritized_replay_eps = float(prioritized_replay_eps)
        if replay_mode not in ("independent", "lockstep"):
            raise ValueError(f"replay_mode={replay_mode!r} must be 'independent' or 'lockstep'")
        self.replay_mode = replay_mode
        check_int("replay_sequence_length", replay_sequence_length, 1, "timesteps per stored item")
        self.replay_sequence_length = int(replay_sequence_length)
        if not isinstance(compress, bool):
            raise ValueError(f"compress={compress!r} must be True or False (LZ4 for stored image columns)")
        self.compress = compress
        self.learning_starts = learning_starts // self.num_shards
        self.capacity = capacity // self.num_shards
        self._rng = np.random.default_rng(check_seed(seed))
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
                                                 seed=self._child_seed(), compress=self.compress)
            else:
                buffer = ReplayBuffer(self.capacity, seed=self._child_seed(), compress=self.compress)
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
        check_batch_arg("LocalReplayBuffer.add_batch()", batch)
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
                    buffer: ReplayBuffer[SampleBatch] = ReplayBuffer(self.capacity, compress=self.compress)
                    if self.prioritized:
                        buffer = PrioritizedReplayBuffer(self.capacity, self.prioritized_replay_alpha,
                                                         compress=self.compress)
                    buffer.set_state(buffer_state)
                    buffers[str(policy_id)] = buffer
            num_added = int(state["num_added"])
            rng = restored_rng(state["rng"])
        except (KeyError, TypeError, IndexError, AttributeError) as error:
            raise ValueError(f"malformed LocalReplayBuffer state ({type(error).__name__}: {error}); pass the "
                             f"unchanged output of get_state()") from error
        self.replay_buffers, self.lockstep_buffer = buffers, lockstep
        self.num_added, self._rng = num_added, rng


class ReplayShard(LocalReplayBuffer, ParallelIteratorWorker):
    """One of ``num_shards`` :class:`LocalReplayBuffer` shards, run as an actor; its stream is ``replay()``
    forever.

    So ``from_actors(shards).gather_async()`` pulls replays, where ``None`` means "no data yet"
    (``Replay(actors=...)`` turns it into not-ready). Start them with :func:`make_replay_shards`;
    the class itself is a plain Python class, usable in-process.

    Args:
        *args: as :class:`LocalReplayBuffer`.
        **kwargs: as :class:`LocalReplayBuffer`.

    Examples:
        >>> shard = ReplayShard(learning_starts=2, capacity=10, seed=0)  # in-process, not an actor
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


def make_replay_shards(num_shards: int, /, *, colocated_with_driver: bool = False,
                       shard_indices: Sequence[int] | None = None,
                       **buffer_kwargs: Any) -> list[Any]:
    """Starts ``num_shards`` replay shards with ``num_cpus=0``, sharing ``learning_starts`` and ``capacity``.

    Each shard is a :class:`ReplayShard` actor (a Ray actor, or a local one under the local executor:
    :mod:`flowrl.executor`) with this ``num_shards``, so it holds
    ``learning_starts // num_shards`` and ``capacity // num_shards``. Both placements go through
    this one creation path: pinned to the driver's node by node affinity, or placed freely by Ray.
    The arguments are checked in the driver first, so a bad one raises here rather than killing the
    shards. With a ``seed``, each shard gets its own seed derived from it.

    Args:
        num_shards: the number of shards (each one's ``num_shards``); >= 1.
        colocated_with_driver: pin the shards to the driver's node (Ape-X's
            ``replay_buffer_shards_colocated_with_driver``); ``False`` lets Ray place them.
        shard_indices: start only these shards of the ``num_shards`` (each as it would be in the full set,
            with the same seed), in this order: how a dead shard is replaced; ``None``: all of them.
        **buffer_kwargs: :class:`LocalReplayBuffer` arguments other than ``num_shards``.

    Raises:
        ValueError: ``num_shards < 1``, ``num_shards`` given again as a buffer argument, a shard index outside
            ``range(num_shards)``, or an invalid buffer argument.

    Examples:
        >>> [shard] = make_replay_shards(1, learning_starts=0, capacity=10, seed=0)
        >>> executor.get(shard.add_batch.remote(SampleBatch({OBS: [1.0, 2.0]})))
        >>> executor.get(shard.replay.remote()).count
        1
    """
    check_int("num_shards", num_shards, 1, "replay shard actors to start")
    num_shards = int(num_shards)
    if "num_shards" in buffer_kwargs:
        raise ValueError(f"make_replay_shards sets each shard's num_shards to its first argument ({num_shards}); "
                         f"drop num_shards={buffer_kwargs['num_shards']!r}")
    if not isinstance(colocated_with_driver, bool):
        raise ValueError(f"colocated_with_driver={colocated_with_driver!r} must be True or False")
    indices = list(range(num_shards)) if shard_indices is None else list(shard_indices)
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_shards for i in indices):
        raise ValueError(f"shard_indices={indices!r} must be shard numbers in range({num_shards}) (num_shards)")
    LocalReplayBuffer(num_shards=num_shards, **buffer_kwargs)  # validate before starting actors
    seed = buffer_kwargs.pop("seed", None)
    seeds: list[int | None] = [None] * num_shards
    if seed is not None:
        seeds = [int(s.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
                 for s in np.random.SeedSequence(seed).spawn(num_shards)]
    options = runtime.actor_options(num_cpus=0, **(executor.node_affinity_options() if colocated_with_driver else {}))
    return [executor.create_actor(ReplayShard, options=options, num_shards=num_shards, seed=seeds[i], **buffer_kwargs)
            for i in indices]


# The old names, from when the code said "replay actor" for a replay shard; kept importable.
ReplayActor = ReplayShard
make_replay_actors = make_replay_shards
