"""Replay operators: store experience, replay it, update priorities, mix replays into a stream.

Writing to replay (:class:`StoreToReplayBuffer`) and reading from it (:func:`Replay`) are separate
pieces. Both take either a buffer in this process (``local_buffer=``, e.g. a
:class:`~flowrl.replay_buffers.LocalReplayBuffer`) or replay shards (``actors=``, the shard actors made by
:func:`~flowrl.replay_buffers.make_replay_shards`), never both. An empty replay says "nothing yet"
through the iterator core's public mechanisms: a local ``Replay`` is a ``from_poll`` source, and the
shards' ``None`` answers go through ``none_as_not_ready()``. So a DQN-shaped round robin keeps storing
until the buffer reaches ``learning_starts``.

Examples:
    >>> from flowrl.replay_buffers import LocalReplayBuffer
    >>> from flowrl.testing import fake_batch
    >>> buf = LocalReplayBuffer(learning_starts=200, capacity=1000, replay_batch_size=100)
    >>> store_op = iter_list([fake_batch(100, start=100 * i) for i in range(4)]).for_each(
    ...     StoreToReplayBuffer(local_buffer=buf))
    >>> replay_op = Replay(local_buffer=buf)
    >>> out = store_op.union(replay_op, deterministic=True).take(5)
    >>> [type(b).__name__ for b in out]  # the replay branch is not ready after the first store
    ['SampleBatch', 'SampleBatch', 'MultiAgentBatch', 'SampleBatch', 'MultiAgentBatch']
"""

from __future__ import annotations

import math
import random
from typing import Any, Mapping, Sequence

import numpy as np

from flowrl import executor
from flowrl.contracts import PriorityUpdater, ReplayReader, ReplayWriter, check_conforms
from flowrl.iter import LocalIterator, RetryLater, from_actors
from flowrl.metrics import LEARNER_STATS_KEY, STEPS_SAMPLED_COUNTER, MetricsBinding
from flowrl.ops._common import check_batch, check_int
from flowrl.replay_buffers import SimpleReplayBuffer
from flowrl.sample_batch import BATCH_INDEXES, TD_ERROR, AnyBatch, SampleBatch
from flowrl.validation import check_number


__all__ = ["StoreToReplayBuffer", "Replay", "UpdatePriorities", "MixInReplay", "WaitUntilTimestepsElapsed",
           "UpdateReplayShardPriorities"]


def _one_source(op: str, local_buffer: Any, actors: Sequence[Any] | None) -> list[Any] | None:
    """Checks the exactly-one-of rule (``is not None``, never truthiness); returns the shards as a list."""
    if (local_buffer is None) == (actors is None):
        given = "both" if local_buffer is not None else "neither"
        raise ValueError(f"{op} got {given} of local_buffer= and actors=; pass exactly one: local_buffer= for a "
                         f"buffer in this process, or actors= for replay shards")
    if actors is None:
        return None
    if isinstance(actors, (str, bytes)) or not isinstance(actors, Sequence):
        raise ValueError(f"{op} actors={actors!r} must be a list of replay shard handles "
                         f"(see flowrl.replay_buffers.make_replay_shards)")
    if len(actors) == 0:
        raise ValueError(f"{op} got actors=[]; pass at least one replay shard, or use local_buffer=")
    return list(actors)


_BUFFER_FIX = "pass a replay buffer such as flowrl.replay_buffers.LocalReplayBuffer"


class StoreToReplayBuffer:
    """Consumes batches; stores each in a local buffer or in one of the replay shards; emits it unchanged.

    Use with ``.for_each()``. With ``local_buffer`` it calls ``local_buffer.add_batch(batch)`` at once.
    With ``actors`` it first reaps finished ``add_batch`` calls without blocking (their errors surface
    here), then submits ``add_batch.remote(batch)`` to a shard chosen uniformly at random among those
    with fewer than ``max_outstanding_adds`` unacknowledged calls. If every shard is at the limit it
    raises :class:`~flowrl.iter.RetryLater`: the core offers the same batch again later, so nothing is
    lost and nothing is stored twice, and the stream is throttled to what the shards can absorb.

    Metrics: none.

    Args:
        local_buffer: a buffer with ``add_batch`` in this process; exclusive with ``actors``.
        actors: replay shard handles (non-empty); exclusive with ``local_buffer``.
        max_outstanding_adds: unacknowledged ``add_batch`` calls allowed per shard; >= 1.
        seed: seeds the choice of shard (``None``: a fresh seed), so a seeded run stores the same batches in the
            same shards.

    Raises:
        ValueError: both or neither of ``local_buffer`` and ``actors``, an empty ``actors``, a buffer
            without ``add_batch``, or ``max_outstanding_adds < 1``; on a call, an item that is not a batch.

    Examples:
        >>> from flowrl.replay_buffers import LocalReplayBuffer
        >>> from flowrl.testing import fake_batch
        >>> buf = LocalReplayBuffer(learning_starts=0, capacity=100)
        >>> it = iter_list([fake_batch(3), fake_batch(4)]).for_each(StoreToReplayBuffer(local_buffer=buf))
        >>> it
        LocalIterator[iter_list.for_each(StoreToReplayBuffer(local))]
        >>> [b.count for b in it], buf.num_added
        ([3, 4], 7)
    """

    def __init__(self, *, local_buffer: Any = None, actors: Sequence[Any] | None = None,
                 max_outstanding_adds: int = 2, seed: int | None = None) -> None:
        self.actors = _one_source("StoreToReplayBuffer", local_buffer, actors)
        if self.actors is None:
            check_conforms(local_buffer, ReplayWriter, "StoreToReplayBuffer local_buffer", _BUFFER_FIX)
        check_int("StoreToReplayBuffer max_outstanding_adds", max_outstanding_adds, 1,
                  "unacknowledged add_batch calls per replay shard")
        self.local_buffer = local_buffer
        self.max_outstanding_adds = max_outstanding_adds
        self._outstanding: list[list[Any]] = [[] for _ in self.actors or ()]
        self._rng = random.Random(seed)

    def __repr__(self) -> str:
        return "StoreToReplayBuffer(local)" if self.actors is None else \
            f"StoreToReplayBuffer(actors={len(self.actors)})"

    def num_outstanding(self) -> list[int]:
        """Per shard, the ``add_batch`` calls submitted and not yet reaped (empty for a local buffer)."""
        return [len(refs) for refs in self._outstanding]

    def flush(self) -> None:
        """Waits until every submitted ``add_batch`` has finished (before a checkpoint of the replay shards,
        say); a failed add raises here. Does nothing for a local buffer."""
        refs = [ref for per_actor in self._outstanding for ref in per_actor]
        self._outstanding = [[] for _ in self._outstanding]
        executor.get(refs)

    def _reap(self) -> None:
        refs = [ref for per_actor in self._outstanding for ref in per_actor]
        if not refs:
            return
        ready, _ = executor.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        if not ready:
            return
        done = set(ready)
        self._outstanding = [[ref for ref in per_actor if ref not in done] for per_actor in self._outstanding]
        executor.get(ready)  # an add_batch that failed raises here

    def __call__(self, batch: AnyBatch) -> AnyBatch:
        check_batch(batch, self)
        if self.actors is None:
            self.local_buffer.add_batch(batch)
            return batch
        self._reap()
        free = [i for i, refs in enumerate(self._outstanding) if len(refs) < self.max_outstanding_adds]
        if not free:
            raise RetryLater
        i = self._rng.choice(free)
        self._outstanding[i].append(self.actors[i].add_batch.remote(batch))
        return batch


def Replay(*, local_buffer: Any = None, actors: Sequence[Any] | None = None,
           num_async: int = 4) -> LocalIterator[AnyBatch]:
    """The replay source: training batches from a local buffer or from replay shards.

    With ``local_buffer`` it is a ``from_poll`` source over ``local_buffer.replay()``, whose ``None``
    (before ``learning_starts``) means "not ready"; ``current_actor`` is ``None``. With ``actors`` it is
    ``from_actors(actors).gather_async(num_async=num_async).none_as_not_ready()``: up to ``num_async``
    replay requests in flight per shard, a shard's "no data yet" answer (``None``) reported as not
    ready (a blocking round-robin branch yields its turn instead of spinning), and ``current_actor``
    is the replay shard that produced the batch (Ape-X updates its priorities there).

    Metrics: none.

    Args:
        local_buffer: a buffer with ``replay()`` in this process; exclusive with ``actors``.
        actors: replay shard handles (non-empty); exclusive with ``local_buffer``.
        num_async: replay requests in flight per shard (``actors`` only); >= 1.

    Raises:
        ValueError: both or neither source, an empty ``actors``, a buffer without ``replay``, or
            ``num_async < 1``.

    Examples:
        >>> from flowrl.replay_buffers import LocalReplayBuffer
        >>> from flowrl.testing import fake_batch
        >>> buf = LocalReplayBuffer(learning_starts=0, capacity=100, replay_batch_size=4, seed=0)
        >>> buf.add_batch(fake_batch(10))
        >>> it = Replay(local_buffer=buf)
        >>> it
        LocalIterator[Replay(local)]
        >>> [b.count for b in it.take(2)]
        [4, 4]
    """
    actor_list = _one_source("Replay", local_buffer, actors)
    check_int("Replay num_async", num_async, 1, "replay requests in flight per shard")
    if actor_list is None:
        check_conforms(local_buffer, ReplayReader, "Replay local_buffer", _BUFFER_FIX)
        return LocalIterator.from_poll(local_buffer.replay, name="Replay(local)")
    return (from_actors(actor_list).gather_async(num_async=num_async).none_as_not_ready()
            .named(f"Replay(actors={len(actor_list)})"))


class UpdatePriorities:
    """Consumes TrainOneStep's ``(batch, learner_info)``; sets the replayed items' priorities; emits its input.

    Use with ``.for_each()`` after ``TrainOneStep`` or ``MultiGPUTrainOneStep`` (DQN). For each policy
    in ``learner_info`` it takes ``td_error`` (from the policy's info, else from its ``learner_stats``)
    and the batch's ``batch_indexes`` column; when they differ in length (sequence replay, where each
    sequence's index repeats for each of its ``T`` timesteps) it takes every ``T``-th index. Then it
    calls ``local_buffer.update_priorities({pid: (batch_indexes, td_error)})``. ``T`` is the buffer's
    ``replay_sequence_length`` when it has one, else the ratio of the two lengths.

    Metrics: none.

    Raises:
        ValueError: the input is not a ``(batch, dict)`` pair; a policy lacks ``td_error``, is missing
            from the batch, or its batch lacks ``batch_indexes``; the lengths cannot be matched.

    Examples:
        >>> from flowrl.replay_buffers import LocalReplayBuffer
        >>> from flowrl.testing import fake_batch
        >>> buf = LocalReplayBuffer(learning_starts=0, capacity=100, replay_batch_size=3, seed=0)
        >>> buf.add_batch(fake_batch(5))
        >>> batch = buf.replay()
        >>> info = {"default_policy": {"td_error": np.array([0.5, 0.0, 2.0])}}
        >>> out = UpdatePriorities(buf)((batch, info))
        >>> out[0] is batch, buf.replay_buffers["default_policy"].max_priority
        (True, 2.000001)
    """

    def __init__(self, local_buffer: Any) -> None:
        check_conforms(local_buffer, PriorityUpdater, "UpdatePriorities local_buffer", _BUFFER_FIX)
        self.local_buffer = local_buffer

    def __repr__(self) -> str:
        return "UpdatePriorities"

    def _indexes(self, pid: str, policy_batch: SampleBatch, td_error: np.ndarray) -> np.ndarray:
        if BATCH_INDEXES not in policy_batch:
            raise ValueError(f"{self!r}: policy {pid!r}'s batch has no {BATCH_INDEXES!r} column; replay it from a "
                             f"prioritized buffer (prioritized_replay_alpha > 0) before training")
        idx = np.asarray(policy_batch[BATCH_INDEXES])
        if len(idx) != len(td_error) and len(td_error) > 0:
            seq_len = getattr(self.local_buffer, "replay_sequence_length", None)
            step = seq_len if isinstance(seq_len, int) and seq_len > 1 else len(idx) // len(td_error)
            idx = idx[::max(step, 1)]
        if len(idx) != len(td_error):
            raise ValueError(f"{self!r}: policy {pid!r} has {len(policy_batch[BATCH_INDEXES])} batch indexes but "
                             f"{len(td_error)} TD errors, and taking every T-th index does not match them; the "
                             f"learner must report one TD error per replayed row or per sequence")
        return idx

    def __call__(self, item: tuple[AnyBatch, Mapping[str, Any]]) -> tuple[AnyBatch, Mapping[str, Any]]:
        if not isinstance(item, tuple) or len(item) != 2 or not isinstance(item[1], Mapping):
            raise ValueError(f"{self!r} consumes (batch, learner_info) pairs from TrainOneStep, got "
                             f"{type(item).__name__}: {item!r:.80}")
        batch, learner_info = item
        policy_batches = check_batch(batch, self).as_multi_agent().policy_batches
        prio_dict: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for pid, info in learner_info.items():
            td = info.get(TD_ERROR) if isinstance(info, Mapping) else None
            if td is None and isinstance(info, Mapping) and isinstance(info.get(LEARNER_STATS_KEY), Mapping):
                td = info[LEARNER_STATS_KEY].get(TD_ERROR)
            if td is None:
                raise ValueError(f"{self!r}: the learner info of policy {pid!r} has no {TD_ERROR!r} (nor under "
                                 f"{LEARNER_STATS_KEY!r}); use a policy whose learn_on_batch reports TD errors")
            if pid not in policy_batches:
                raise ValueError(f"{self!r}: policy {pid!r} trained but the batch holds only "
                                 f"{sorted(policy_batches)}; pass TrainOneStep's (batch, learner_info) unchanged")
            td_error = np.asarray(td).reshape(-1)
            prio_dict[pid] = (self._indexes(pid, policy_batches[pid], td_error), td_error)
        self.local_buffer.update_priorities(prio_dict)
        return item


class MixInReplay:
    """Consumes batches; stores each in a ring of ``num_slots`` batches; emits ``[input] + replays``.

    With ``replay_proportion=0`` nothing is ever replayed, so nothing is stored either: APPO's default 100 slots
    held 100 copies of 800-step Atari fragments, 4.5 GB, for no use.

    Use with ``.combine()`` (or ``.for_each(...).flatten()``). The replays are drawn with
    ``f = replay_proportion; while random() < f: f -= 1; append(a uniformly drawn stored batch)``, so
    their number has expected value ``replay_proportion``: the integer part is certain, the
    fractional part a Bernoulli draw. The just-stored input may itself be drawn (IMPALA's replay).

    The buffer holds a copy of each input and every replay is a fresh copy, so an in-place stage
    downstream (``StandardizeFields``) can change neither the stored data nor another output.

    Metrics: none.

    Args:
        num_slots: batches held (a :class:`~flowrl.replay_buffers.SimpleReplayBuffer`); 0 stores nothing.
        replay_proportion: expected replays per input; >= 0, and 0 when ``num_slots`` is 0.
        seed: seeds the draws and the buffer.

    Raises:
        ValueError: ``replay_proportion < 0``, or ``> 0`` with ``num_slots == 0``.

    Examples:
        >>> from flowrl.testing import fake_batch
        >>> it = iter_list([fake_batch(2), fake_batch(3)]).combine(MixInReplay(num_slots=4, replay_proportion=2))
        >>> it
        LocalIterator[iter_list.combine(MixInReplay(4, 2))]
        >>> len(it.take(6))
        6
    """

    def __init__(self, num_slots: int, replay_proportion: float, *, seed: int | None = None) -> None:
        check_number("MixInReplay replay_proportion", replay_proportion, ge=0, lt=math.inf,
                     meaning="expected replays per input batch")
        if replay_proportion > 0 and num_slots == 0:
            raise ValueError(f"MixInReplay replay_proportion={replay_proportion} needs stored batches, but "
                             f"num_slots=0 stores nothing; raise num_slots or set replay_proportion=0")
        self.buffer = SimpleReplayBuffer(num_slots, seed=seed)
        self.num_slots, self.replay_proportion = num_slots, replay_proportion
        self._rng = random.Random(seed)

    def __repr__(self) -> str:
        return f"MixInReplay({self.num_slots}, {self.replay_proportion})"

    def __call__(self, batch: AnyBatch) -> list[AnyBatch]:
        check_batch(batch, self)
        if self.num_slots > 0 and self.replay_proportion > 0:
            self.buffer.add_batch(batch.copy())
        output = [batch]
        f = self.replay_proportion
        while self._rng.random() < f:
            f -= 1
            output.append(self.buffer.replay().copy())
        return output


class WaitUntilTimestepsElapsed(MetricsBinding):
    """A predicate over any item: true once ``num_steps_sampled > target``.

    Use with ``.filter()``. Metrics: reads ``num_steps_sampled``.

    Examples:
        >>> from flowrl.metrics import MetricsContext
        >>> wait = WaitUntilTimestepsElapsed(100)
        >>> wait.bind(metrics := MetricsContext())
        >>> metrics.counters["num_steps_sampled"] = 100
        >>> wait(None)
        False
        >>> metrics.counters["num_steps_sampled"] = 101
        >>> wait(None)
        True
    """

    def __init__(self, target: int) -> None:
        check_number("WaitUntilTimestepsElapsed target", target, meaning="sampled steps")
        self.target = target

    def __repr__(self) -> str:
        return f"WaitUntilTimestepsElapsed({self.target})"

    def __call__(self, item: Any) -> bool:
        return bool(self.metrics.counters[STEPS_SAMPLED_COUNTER] > self.target)



class UpdateReplayShardPriorities:
    """Consumes :class:`~flowrl.ops.ApexLearnerThread` out-queue items ``(replay_shard, {pid: (batch_indexes,
    td_error)}, env_steps, agent_steps)``; sends the new priorities to the shard that replayed the batch;
    emits ``(env_steps, agent_steps, learner_thread.learner_info)`` for ``RecordLearnerOutput`` (Ape-X).

    Use with ``.for_each()`` right after ``Dequeue(learner.outqueue)``. The update is fire-and-forget
    (``replay_shard.update_priorities.remote(prios)``); each call first reaps the finished updates
    without blocking, so a failed one raises here within a few items. ``prioritized=False`` (uniform
    replay) sends nothing.

    Metrics: none (``RecordLearnerOutput`` counts the trained steps).

    Args:
        learner_thread: the thread whose ``learner_info`` accompanies each output.
        prioritized: whether the shards are prioritized buffers.

    Raises:
        ValueError: on a call, an item that is not a 4-tuple from an Ape-X learner thread.

    Examples:
        >>> from flowrl.replay_buffers import make_replay_shards
        >>> from flowrl.testing import fake_batch
        >>> import types
        >>> [shard] = make_replay_shards(1, learning_starts=0, capacity=10, replay_batch_size=2, seed=0)
        >>> executor.get(shard.add_batch.remote(fake_batch(4)))
        >>> learner = types.SimpleNamespace(learner_info={"default_policy": {}})
        >>> op = UpdateReplayShardPriorities(learner)
        >>> op((shard, {"default_policy": (np.array([1, 2]), np.array([3.0, 0.5]))}, 2, 2))
        (2, 2, {'default_policy': {}})
        >>> op.flush(); executor.get(shard.stats.remote())["policy_default_policy"]["max_priority"]
        3.000001
    """

    def __init__(self, learner_thread: Any, prioritized: bool = True) -> None:
        if not hasattr(learner_thread, "learner_info"):
            raise ValueError(f"UpdateReplayShardPriorities needs a learner thread with learner_info (an "
                             f"ApexLearnerThread), got {learner_thread!r:.80}")
        self.learner_thread, self.prioritized = learner_thread, prioritized
        self._outstanding: list[Any] = []

    def __repr__(self) -> str:
        return "UpdateReplayShardPriorities" if self.prioritized else "UpdateReplayShardPriorities(off)"

    def flush(self) -> None:
        """Waits for every submitted priority update; a failed one raises here."""
        refs, self._outstanding = self._outstanding, []
        executor.get(refs)

    def __call__(self, item: tuple[Any, Mapping[str, Any], int, int]) -> tuple[int, int, Any]:
        if not isinstance(item, tuple) or len(item) != 4 or not isinstance(item[1], Mapping):
            raise ValueError(f"{self!r} consumes an ApexLearnerThread's (replay_shard, priorities, env_steps, "
                             f"agent_steps) out-queue items, got {type(item).__name__}: {item!r:.80}; put it "
                             f"right after Dequeue(learner.outqueue)")
        shard, prios, env_steps, agent_steps = item
        if self._outstanding:
            ready, self._outstanding = executor.wait(self._outstanding, num_returns=len(self._outstanding), timeout=0,
                                                fetch_local=False)
            executor.get(ready)  # a failed update raises here
        if self.prioritized:
            self._outstanding.append(shard.update_priorities.remote(dict(prios)))
        return env_steps, agent_steps, self.learner_thread.learner_info
