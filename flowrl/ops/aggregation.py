"""Tree aggregation: actors that turn one group of rollout workers' fragments into train batches.

With many rollout workers a single driver spends its time receiving fragments, concatenating them and
sending weights. Tree aggregation moves that work into G :class:`Aggregator` actors on the driver's node.
Each gathers its own group of workers (``raw.select_shards(group)``; group *g* holds the workers
``i ≡ g (mod G)``), keeps them on the weights it was last sent, mixes in replay and concatenates; the
driver gathers only finished train batches, counts their **fresh** steps and sends the aggregator the
learner's weights::

    raw = ParallelRollouts(workers, mode="raw")
    aggregators = make_aggregators(raw, G, train_batch_size=...)       # one actor per group
    (from_actors(aggregators).gather_async().zip_with_source_actor()
        .for_each(CountFreshSteps())                                     # sampled counters: fresh steps only
        .for_each(BroadcastUpdateLearnerWeights(learner, workers, k)))   # learner weights -> the aggregator

Every actor :func:`make_aggregators` starts is the caller's to kill (:func:`flowrl.executor.kill`) when its plan closes.

Examples:
    >>> from flowrl.metrics import MetricsContext
    >>> from flowrl.testing import fake_batch
    >>> op = CountFreshSteps()
    >>> op.bind(metrics := MetricsContext())
    >>> actor, batch = op(("aggregator", (fake_batch(20), 10, 10)))  # 10 of the 20 steps were replayed
    >>> actor, batch.count, metrics.counters["num_steps_sampled"]
    ('aggregator', 20, 10)
"""

from __future__ import annotations

from typing import Any, Iterator, Literal

import numpy as np

from flowrl import executor, runtime  # first: sets Ray's loopback variable before anything imports ray
from flowrl.iter import LocalIterator, ParallelIterator, ParallelIteratorWorker
from flowrl.metrics import AGENT_STEPS_SAMPLED_COUNTER, STEPS_SAMPLED_COUNTER, MetricsBinding
from flowrl.ops._common import check_batch, check_int
from flowrl.ops.metrics import CountSteps
from flowrl.ops.replay import MixInReplay
from flowrl.ops.rollout import ConcatBatches
from flowrl.sample_batch import AnyBatch

__all__ = ["Aggregator", "make_aggregators", "aggregator_groups", "CountFreshSteps"]

# What an aggregator emits: a train batch and the env / agent steps of its newly sampled fragments.
AggregatedBatch = tuple[AnyBatch, int, int]


class _PushCachedWeights:
    """Inside an aggregator: consumes ``(worker, fragment)``, emits the fragment; first sends the worker the
    aggregator's cached weights unless it already holds that version."""

    def __init__(self, aggregator: Aggregator) -> None:
        self.aggregator = aggregator

    def __call__(self, item: tuple[Any, AnyBatch]) -> AnyBatch:
        worker, fragment = item
        self.aggregator.push_weights(worker)
        return check_batch(fragment, self)

    def __repr__(self) -> str:
        return "PushCachedWeights"


class _WithFreshSteps(MetricsBinding):
    """Inside an aggregator: consumes a train batch, emits ``(batch, fresh_env_steps, fresh_agent_steps)``:
    what the aggregator's sampled counters grew by since the previous train batch.

    Fresh fragments are counted as they arrive, before replays are mixed in, and each is concatenated
    before any later input, so the growth is exactly the fresh steps inside this batch."""

    def __init__(self) -> None:
        self.emitted = (0, 0)  # the sampled counters at the previous train batch

    def __call__(self, batch: AnyBatch) -> AggregatedBatch:
        counters = self.metrics.counters
        now = (counters[STEPS_SAMPLED_COUNTER], counters[AGENT_STEPS_SAMPLED_COUNTER])
        (env, agent), self.emitted = (now[0] - self.emitted[0], now[1] - self.emitted[1]), now
        return batch, env, agent

    def __repr__(self) -> str:
        return "WithFreshSteps"


class Aggregator(ParallelIteratorWorker):
    """A shard source over one group of rollout workers whose items are train batches; runs as a Ray actor.

    Consumes the group's fragments; emits ``(train_batch, fresh_env_steps, fresh_agent_steps)``, where the
    fresh steps are those of newly sampled fragments in ``train_batch`` (replayed ones excluded). Its stream is
    built and run inside the actor on the first gather::

        group.gather_async(num_async=num_async).zip_with_source_actor()
             .for_each(PushCachedWeights)        # the cached weights, unless the worker holds that version
             .for_each(CountSteps(num_steps_sampled)).for_each(CountSteps(num_agent_steps_sampled))
             .combine(MixInReplay(replay_buffer_num_slots, replay_proportion))
             .combine(ConcatBatches(train_batch_size, count_steps_by))
             .for_each(WithFreshSteps)

    :meth:`set_weights` caches the weights it is sent (one ``ray.put``, a new version); a worker gets them
    with its next fragment. Start aggregators with :func:`make_aggregators`; the class itself is a plain
    Python class, usable in-process.

    Args:
        group: the rollout workers to gather, e.g. ``ParallelRollouts(workers, mode="raw").select_shards([0, 2])``.
        train_batch_size: steps per emitted batch (``ConcatBatches``' ``min_batch_size``).
        count_steps_by: ``"env_steps"`` or ``"agent_steps"``, as for ``ConcatBatches``.
        replay_buffer_num_slots: fragments held for replay (``MixInReplay``'s ``num_slots``).
        replay_proportion: expected replayed fragments per fresh one.
        num_async: sample requests in flight per worker.
        seed: seeds the replay draws.

    Raises:
        ValueError: an invalid setting (checked at construction, as the operators check it).

    Examples:
        >>> from flowrl.iter import from_actors
        >>> agg = Aggregator(from_actors([]), train_batch_size=10)  # in-process: only settings are checked
        >>> agg.weights_version, agg.ping()
        (0, 'ok')
        >>> Aggregator(from_actors([]), train_batch_size=10, replay_proportion=0.5)
        Traceback (most recent call last):
        ...
        ValueError: MixInReplay replay_proportion=0.5 needs stored batches, but num_slots=0 stores nothing; ...
    """

    def __init__(self, group: ParallelIterator[AnyBatch], *, train_batch_size: int,
                 count_steps_by: Literal["env_steps", "agent_steps"] = "env_steps", replay_buffer_num_slots: int = 0,
                 replay_proportion: float = 0.0, num_async: int = 1, seed: int | None = None) -> None:
        if not isinstance(group, ParallelIterator):
            raise TypeError(f"Aggregator group={group!r} must be a ParallelIterator over rollout workers, e.g. "
                            f"ParallelRollouts(workers, mode='raw').select_shards([...])")
        check_int("Aggregator num_async", num_async, 1, "sample requests in flight per worker")
        self.group, self.num_async = group, num_async
        self.mix_in_replay = MixInReplay(replay_buffer_num_slots, replay_proportion, seed=seed)
        self.concat = ConcatBatches(train_batch_size, count_steps_by)
        self.weights_ref: Any = None
        self.global_vars: dict[str, Any] | None = None
        self.weights_version = 0  # bumped by each set_weights
        self.held: dict[Any, int] = {}  # worker -> the weights version it was sent last
        self._outstanding: list[Any] = []  # set_weights calls not yet known to have succeeded
        self._executor = executor.current()  # where this aggregator runs: its puts go there too
        super().__init__(self._stream)

    def _stream(self) -> Iterator[AggregatedBatch]:
        it: LocalIterator[AggregatedBatch] = (
            self.group.gather_async(num_async=self.num_async).zip_with_source_actor()
            .for_each(_PushCachedWeights(self))
            .for_each(CountSteps(STEPS_SAMPLED_COUNTER, by="env_steps"))
            .for_each(CountSteps(AGENT_STEPS_SAMPLED_COUNTER, by="agent_steps"))
            .combine(self.mix_in_replay)
            .combine(self.concat)
            .for_each(_WithFreshSteps()))
        return it

    def set_weights(self, weights: Any, global_vars: dict[str, Any] | None = None) -> None:
        """Caches ``weights`` (one ``ray.put``) with ``global_vars`` as a new version for the group's workers."""
        with executor.using(self._executor):
            self.weights_ref = executor.put(weights)
        self.global_vars = global_vars
        self.weights_version += 1

    def push_weights(self, worker: Any) -> None:
        """Sends ``worker`` the cached weights unless it already holds this version (fire and forget).

        Earlier sends are checked without blocking first, so a worker that died raises its actor error here.
        """
        if self.weights_ref is None or self.held.get(worker) == self.weights_version:
            return
        ready, self._outstanding = executor.wait(self._outstanding, num_returns=len(self._outstanding), timeout=0)
        executor.get(ready)
        self._outstanding.append(worker.set_weights.remote(self.weights_ref, self.global_vars))
        self.held[worker] = self.weights_version

    def ping(self) -> str:
        """Health probe."""
        return "ok"


def make_aggregators(raw: ParallelIterator[AnyBatch], num_aggregators: int, *, train_batch_size: int,
                     count_steps_by: Literal["env_steps", "agent_steps"] = "env_steps",
                     replay_buffer_num_slots: int = 0, replay_proportion: float = 0.0, num_async: int = 1,
                     seed: int | None = None) -> list[Any]:
    """Deals ``raw``'s workers round-robin into ``num_aggregators`` groups and starts one :class:`Aggregator`
    actor per group, with ``num_cpus=0``, pinned to the driver's node.

    Group *g* is ``raw.select_shards([g, g + G, g + 2G, ...])``. The settings are checked in the driver before
    any actor starts; aggregator *g*'s replay seed is derived from ``seed``. The caller owns the actors and
    kills them when done (a plan registers that with ``on_close``).

    Args:
        raw: the rollout workers, ``ParallelRollouts(workers, mode="raw")``.
        num_aggregators: G, at least 1 and at most ``raw.num_shards()``.
        **settings: the other arguments of :class:`Aggregator`.

    Returns:
        The aggregator actor handles, in group order.

    Raises:
        ValueError: ``num_aggregators`` out of range, or an invalid setting.
    """
    settings: dict[str, Any] = dict(train_batch_size=train_batch_size, count_steps_by=count_steps_by,
                                    replay_buffer_num_slots=replay_buffer_num_slots,
                                    replay_proportion=replay_proportion, num_async=num_async)
    groups = aggregator_groups(raw, num_aggregators, seed=seed, **settings)
    seeds: list[int | None] = [None] * num_aggregators
    if seed is not None:
        seeds = [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(num_aggregators)]
    options = runtime.actor_options(num_cpus=0, **executor.node_affinity_options())
    return [executor.create_actor(Aggregator, group, options=options, seed=seeds[g], **settings)
            for g, group in enumerate(groups)]


def aggregator_groups(raw: ParallelIterator[AnyBatch], num_aggregators: int, **settings: Any
                      ) -> list[ParallelIterator[AnyBatch]]:
    """The groups :func:`make_aggregators` deals ``raw``'s workers into, after checking ``num_aggregators`` and the
    :class:`Aggregator` settings; starts nothing (``flowrl plan show`` draws tree aggregation with it).

    Raises:
        ValueError: ``num_aggregators`` out of range, or an invalid setting.
    """
    check_int("num_aggregators", num_aggregators, 1, "aggregator actors")
    n = raw.num_shards()
    if num_aggregators > n:
        raise ValueError(f"num_aggregators={num_aggregators} exceeds the {n} rollout workers of {raw!r}; each "
                         f"aggregator needs at least one worker, so lower num_aggregation_workers or add workers")
    Aggregator(raw, **settings)  # its checks; a plain object, nothing starts
    return [raw.select_shards(list(range(g, n, num_aggregators))) for g in range(num_aggregators)]


class CountFreshSteps(MetricsBinding):
    """Counts an aggregator's fresh steps as sampled: consumes ``(aggregator, (train_batch, fresh_env_steps,
    fresh_agent_steps))`` (from ``.zip_with_source_actor()`` over aggregators) and emits
    ``(aggregator, train_batch)``.

    Use with ``.for_each()``, before ``BroadcastUpdateLearnerWeights``. Replayed steps inside the batch are
    never counted as sampled.

    Metrics: ``num_steps_sampled += fresh_env_steps``, ``num_agent_steps_sampled += fresh_agent_steps``.
    """

    def __call__(self, item: tuple[Any, AggregatedBatch]) -> tuple[Any, AnyBatch]:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], tuple) and len(item[1]) == 3):
            raise ValueError(f"{self!r} consumes (aggregator, (train_batch, fresh_env_steps, fresh_agent_steps)) "
                             f"pairs, got {type(item).__name__}: {item!r:.80}; put it after "
                             f"from_actors(aggregators).gather_async().zip_with_source_actor()")
        aggregator, (batch, env_steps, agent_steps) = item
        check_batch(batch, self)
        self.metrics.counters[STEPS_SAMPLED_COUNTER] += env_steps
        self.metrics.counters[AGENT_STEPS_SAMPLED_COUNTER] += agent_steps
        return aggregator, batch

    def __repr__(self) -> str:
        return "CountFreshSteps"
