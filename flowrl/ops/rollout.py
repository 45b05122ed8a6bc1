"""Rollout operators: where experience enters a plan, and how fragments become train batches.

``ParallelRollouts`` and ``AsyncGradients`` are sources (functions returning an iterator);
``ConcatBatches``, ``SelectExperiences`` and ``StandardizeFields`` are stages.

Examples:
    >>> from flowrl.testing import make_fake_workers
    >>> workers = make_fake_workers(0, rollout_fragment_length=100)
    >>> it = ParallelRollouts(workers, mode="bulk_sync").combine(ConcatBatches(min_batch_size=250))
    >>> it
    LocalIterator[ParallelRollouts(bulk_sync).combine(ConcatBatches(250))]
    >>> next(it).count, it.metrics.counters["num_steps_sampled"]
    (300, 300)
"""

from __future__ import annotations

import logging
import time
from fractions import Fraction
from typing import Any, Collection, Iterator, Literal, Sequence

import numpy as np

from flowrl.iter import LocalIterator, from_actors, get_shard_worker
from flowrl.metrics import GRAD_WAIT_TIMER, LEARNER_INFO, SAMPLE_TIMER, STEPS_SAMPLED_COUNTER, MetricsBinding
from flowrl.ops._common import ReportSampled, check_batch, check_int
from flowrl.ops.offline import ReadInput
from flowrl.sample_batch import DEFAULT_POLICY_ID, AnyBatch, MultiAgentBatch, SampleBatch
from flowrl.sequences import pad_batch
from flowrl.workers import WorkerSet

__all__ = ["ParallelRollouts", "AsyncGradients", "ConcatBatches", "SelectExperiences", "StandardizeFields",
           "PadSequences"]

logger = logging.getLogger(__name__)

_MODES = ("bulk_sync", "async", "raw")


def concat_batches(batches: Sequence[AnyBatch]) -> AnyBatch:
    """One batch from a non-empty list of SampleBatches, or of MultiAgentBatches."""
    if all(isinstance(b, SampleBatch) for b in batches):
        return SampleBatch.concat(batches)  # type: ignore[arg-type]  # checked just above
    if all(isinstance(b, MultiAgentBatch) for b in batches):
        return MultiAgentBatch.concat(batches)  # type: ignore[arg-type]  # checked just above
    kinds = sorted({type(b).__name__ for b in batches})
    raise ValueError(f"cannot concatenate a mix of {kinds}; every worker of a plan must return the same kind "
                     f"(single-agent SampleBatch or MultiAgentBatch)")


def _local_samples(workers: WorkerSet) -> Iterator[AnyBatch]:
    local = workers.local_worker()
    while True:
        yield local.sample()


def ParallelRollouts(workers: WorkerSet, *, mode: Literal["bulk_sync", "async", "raw"] = "bulk_sync",
                     num_async: int = 1) -> Any:
    """The experience source: fragments from the workers, counted into ``num_steps_sampled``.

    ``"bulk_sync"`` yields one fragment from **every** remote worker per item, concatenated (the
    samples of one round were all taken with the weights of the last broadcast, so the plan stays on-policy with
    TrainOneStep); ``"async"`` yields each worker's
    fragment as it arrives (``num_async`` requests in flight per worker, ``current_actor`` = the
    producer); ``"raw"`` returns the ParallelIterator over the workers itself (nothing counted). With no
    remote workers, ``"bulk_sync"`` and ``"async"`` sample the local worker.

    Calls ``workers.sync_weights()`` now, so every worker samples with the local weights. The driver waits at
    most ``workers.config.sample_timeout_s`` for each request to a remote worker (``"raw"``: not applied).

    With ``input`` in the config the items come from that recorded dataset instead (:func:`~flowrl.ops.offline.
    ReadInput`, items of the size this source would sample), or with ``input_mix`` a deterministic interleaving of
    dataset and sampled items in that ratio; ``"bulk_sync"`` only, since the other modes hand each worker's own
    samples (or the workers themselves) downstream.

    Metrics: ``num_steps_sampled``, ``num_agent_steps_sampled``.

    Raises:
        ValueError: an unknown mode, ``num_async < 1``, ``"raw"`` without remote workers, ``input`` with a mode
            other than ``"bulk_sync"``, or a dataset that does not fit (:func:`~flowrl.offline.open_dataset`).
        flowrl.iter.ShardTimeoutError: on a pull, a remote worker that delivered nothing within
            ``sample_timeout_s`` (its ``actor`` is the worker's handle).

    Examples:
        >>> from flowrl.testing import make_fake_workers
        >>> it = ParallelRollouts(make_fake_workers(0, rollout_fragment_length=10), mode="async")
        >>> [b.count for b in it.take(2)], it.metrics.counters["num_steps_sampled"]
        ([10, 10], 20)
    """
    if mode not in _MODES:
        raise ValueError(f"ParallelRollouts mode={mode!r}; use one of {list(_MODES)}")
    check_int("ParallelRollouts num_async", num_async, 1, "sample requests in flight per worker")
    config = workers.config
    if getattr(config, "input", None) is not None:
        if mode != "bulk_sync":
            raise ValueError(f"input={config.input!r}: this plan samples with ParallelRollouts(mode={mode!r}), which "
                             f"hands each worker's own samples on; a dataset is read by plans that sample in lockstep "
                             f"(PG, A2C, PPO, DQN, SAC, MARWIL, BC, ...): pick one of those, or drop input")
        offline = ReadInput(workers)
        if config.input_mix is None:
            return offline
        share = Fraction(config.input_mix).limit_denominator(20)
        weights = [share.numerator, share.denominator - share.numerator]
        return offline.union(_sampled(workers, mode, num_async), deterministic=True, round_robin_weights=weights)
    return _sampled(workers, mode, num_async)


def _sampled(workers: WorkerSet, mode: str, num_async: int) -> Any:
    """``ParallelRollouts`` from the workers' envs."""
    remote = workers.remote_workers()
    if mode == "raw":
        if not remote:
            raise ValueError("ParallelRollouts(mode='raw') needs remote workers (num_workers >= 1): there is no "
                             "actor set to return; use mode='bulk_sync' or 'async' to sample the local worker")
        workers.sync_weights()
        return from_actors(remote, name="ParallelRollouts(raw)")
    workers.sync_weights()
    source: LocalIterator[AnyBatch]
    if not remote:
        source = LocalIterator.from_iterable(lambda: _local_samples(workers), name="local_worker.sample")
    elif mode == "bulk_sync":
        source = (from_actors(remote).batch_across_shards(timeout_s=workers.config.sample_timeout_s)
                  .for_each(concat_batches))
    else:
        source = from_actors(remote).gather_async(num_async=num_async, timeout_s=workers.config.sample_timeout_s)
    return source.for_each(ReportSampled()).named(f"ParallelRollouts({mode})")


class _ComputeGradientsOnShard:
    """Runs inside a worker actor: its sampled batch to ``((grads, info), count)``."""

    def __call__(self, batch: AnyBatch) -> tuple[tuple[Any, Any], int]:
        grads, info = get_shard_worker().compute_gradients(batch)
        return (grads, info), batch.count

    def __repr__(self) -> str:
        return "ComputeGradients"


class _ReportGradients(MetricsBinding):
    """Counts a worker's gradient item and unwraps it to ``(grads, count)``."""

    def __init__(self) -> None:
        self._fetch_start: float | None = None

    def _on_fetch_start(self) -> None:
        self._fetch_start = time.perf_counter()

    def __call__(self, item: tuple[tuple[Any, Any], int]) -> tuple[Any, int]:
        (grads, info), count = item
        self.metrics.counters[STEPS_SAMPLED_COUNTER] += count
        self.metrics.info[LEARNER_INFO] = info
        if self._fetch_start is not None:
            self.metrics.timers[GRAD_WAIT_TIMER].push(time.perf_counter() - self._fetch_start)
        return grads, count

    def __repr__(self) -> str:
        return "ReportGradients"


def AsyncGradients(workers: WorkerSet) -> LocalIterator[tuple[Any, int]]:
    """Gradients computed on the workers, each on its own fresh sample, as they arrive (A3C).

    Yields ``(grads, count)`` with ``current_actor`` = the producing worker; one request in flight per
    worker, each waited for at most ``workers.config.sample_timeout_s`` (then
    :class:`~flowrl.iter.ShardTimeoutError`). Calls ``workers.sync_weights()`` now.

    Metrics: ``num_steps_sampled += count``; ``info["learner"]`` = the worker's per-policy info; times
    ``grad_wait``.

    Raises:
        ValueError: the worker set has no remote workers, or the config sets ``input``.
    """
    if getattr(workers.config, "input", None) is not None:
        raise ValueError(f"input={workers.config.input!r}: AsyncGradients computes each gradient on a worker's own "
                         f"fresh sample (A3C), so a dataset has nowhere to go; use a plan that samples in lockstep "
                         f"(A2C, PG, PPO, MARWIL, ...), or drop input")
    remote = workers.remote_workers()
    if not remote:
        raise ValueError("AsyncGradients needs remote workers (num_workers >= 1): gradients are computed on the "
                         "workers; use ParallelRollouts + ComputeGradients to compute them in the driver")
    workers.sync_weights()
    grads = (from_actors(remote).for_each(_ComputeGradientsOnShard())
             .gather_async(num_async=1, timeout_s=workers.config.sample_timeout_s))
    return grads.for_each(_ReportGradients()).named("AsyncGradients")


class ConcatBatches(MetricsBinding):
    """Consumes batches; emits one concatenated batch once at least ``min_batch_size`` steps are held.

    Use with ``.combine()``. Sizes count env steps (``count``) or, with ``count_steps_by="agent_steps"``,
    agent steps (multi-agent batches only). Empty batches are ignored; a large input may overshoot.

    Metrics: times ``sample`` from the fetch of the first held input to the emission (units = size).

    Examples:
        >>> from flowrl.testing import fake_batch
        >>> op = ConcatBatches(min_batch_size=4)
        >>> [b.count for b in iter_list([fake_batch(3), fake_batch(0), fake_batch(3)]).combine(op)]
        [6]
    """

    def __init__(self, min_batch_size: int,
                 count_steps_by: Literal["env_steps", "agent_steps"] = "env_steps") -> None:
        check_int("ConcatBatches min_batch_size", min_batch_size, 1, "the train batch size in steps")
        if count_steps_by not in ("env_steps", "agent_steps"):
            raise ValueError(f"ConcatBatches count_steps_by={count_steps_by!r}; use 'env_steps' or 'agent_steps'")
        self.min_batch_size, self.count_steps_by = min_batch_size, count_steps_by
        self.buffer: list[AnyBatch] = []
        self.size = 0
        self._fetch_start: float | None = None

    def _on_fetch_start(self) -> None:
        if not self.buffer:
            self._fetch_start = time.perf_counter()

    def _size(self, batch: AnyBatch) -> int:
        if self.count_steps_by == "env_steps":
            return batch.count
        if not isinstance(batch, MultiAgentBatch):
            raise ValueError("ConcatBatches(count_steps_by='agent_steps') got a single-agent SampleBatch; agent "
                             "steps are for multi-agent batches; use count_steps_by='env_steps'")
        return batch.agent_steps()

    def __call__(self, batch: AnyBatch) -> list[AnyBatch]:
        size = self._size(check_batch(batch, self))
        if size == 0:
            return []
        self.buffer.append(batch)
        self.size += size
        if self.size < self.min_batch_size:
            return []
        out, total = concat_batches(self.buffer), self.size
        self.buffer, self.size = [], 0
        if total > 2 * self.min_batch_size:
            logger.info("ConcatBatches(%d) emitted %d steps (over 2x the target): fragments are large relative "
                        "to the train batch size", self.min_batch_size, total)
        timer = self.metrics.timers[SAMPLE_TIMER]
        if self._fetch_start is not None:
            timer.push(time.perf_counter() - self._fetch_start)
            timer.push_units_processed(total)
        self._fetch_start = None
        return [out]

    def __repr__(self) -> str:
        return f"ConcatBatches({self.min_batch_size})"


class SelectExperiences:
    """Keeps only the listed policies' sub-batches of a MultiAgentBatch (the env-step count is kept);
    a SampleBatch passes unchanged.

    Use with ``.for_each()``. Metrics: none.

    Examples:
        >>> from flowrl.testing import fake_batch
        >>> out = SelectExperiences(["a"])(MultiAgentBatch({"a": fake_batch(2), "b": fake_batch(3)}, 2))
        >>> sorted(out.policy_batches), out.count
        (['a'], 2)
    """

    def __init__(self, policy_ids: Collection[str]) -> None:
        if isinstance(policy_ids, (str, bytes)) or not isinstance(policy_ids, Collection):
            raise ValueError(f"SelectExperiences policy_ids={policy_ids!r} must be a list of policy ids, e.g. "
                             f"['{policy_ids}'] rather than a bare string")
        self.policy_ids = list(policy_ids)

    def __call__(self, batch: AnyBatch) -> AnyBatch:
        if isinstance(check_batch(batch, self), SampleBatch):
            return batch
        assert isinstance(batch, MultiAgentBatch)  # check_batch allows only the two kinds
        return MultiAgentBatch({pid: b for pid, b in batch.policy_batches.items() if pid in self.policy_ids},
                               batch.count)

    def __repr__(self) -> str:
        return f"SelectExperiences({self.policy_ids})"


class StandardizeFields:
    """Standardizes columns in place, per policy: ``(x - mean) / max(1e-4, std)``; returns its input.

    Use with ``.for_each()``. Metrics: none.

    Raises:
        KeyError: a batch lacks one of the fields (the message lists the columns it has).

    Examples:
        >>> from flowrl.testing import fake_batch
        >>> StandardizeFields(["obs"])(fake_batch(3))["obs"].tolist()
        [-1.224744..., 0.0, 1.224744...]
    """

    def __init__(self, fields: Sequence[str]) -> None:
        if isinstance(fields, (str, bytes)) or not all(isinstance(f, str) for f in fields):
            raise ValueError(f"StandardizeFields fields={fields!r} must be a list of column names, e.g. "
                             f"['advantages']")
        self.fields = list(fields)

    def __call__(self, batch: AnyBatch) -> AnyBatch:
        per_policy = check_batch(batch, self).as_multi_agent().policy_batches
        for pid, b in per_policy.items():
            for name in self.fields:
                if name not in b:
                    where = "" if pid == DEFAULT_POLICY_ID else f" of policy {pid!r}"
                    raise KeyError(f"StandardizeFields: the batch{where} has no column {name!r}; it has "
                                   f"{sorted(b)}")
                x = b[name]
                b[name] = (x - x.mean()) / max(1e-4, float(np.std(x)))
        return batch

    def __repr__(self) -> str:
        return f"StandardizeFields({self.fields})"


class PadSequences:
    """Consumes batches of rows; emits each policy's rows as whole sequences padded to exactly ``max_seq_len`` rows
    (:func:`flowrl.sequences.pad_batch`: a ``seq_valid`` column marks the real rows, ``state_out_*`` is dropped).

    Use with ``.for_each()`` before ``StoreToReplayBuffer`` into a buffer with ``replay_sequence_length =
    max_seq_len``: each stored item is then one whole sequence with its initial state (R2D2). The env-step count
    of a MultiAgentBatch is kept (padding is not sampling). Metrics: none.

    Examples:
        >>> from flowrl.sample_batch import EPS_ID, T
        >>> out = PadSequences(4)(SampleBatch({EPS_ID: [1, 1, 2], T: [5, 6, 0]}))
        >>> out.count, out["seq_valid"].astype(int).tolist()
        (8, [1, 1, 0, 0, 1, 0, 0, 0])
    """

    def __init__(self, max_seq_len: int) -> None:
        check_int("PadSequences max_seq_len", max_seq_len, 1, "rows per stored sequence, e.g. 20")
        self.max_seq_len = int(max_seq_len)

    def __call__(self, batch: AnyBatch) -> AnyBatch:
        if isinstance(batch, SampleBatch):
            return pad_batch(batch, self.max_seq_len)
        assert isinstance(check_batch(batch, self), MultiAgentBatch)  # check_batch allows only the two kinds
        return MultiAgentBatch({pid: pad_batch(b, self.max_seq_len) for pid, b in batch.policy_batches.items()},
                               batch.count)

    def __repr__(self) -> str:
        return f"PadSequences({self.max_seq_len})"
