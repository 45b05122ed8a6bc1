"""Offline input: a recorded dataset as the experience source of a plan (``input=DIR``).

``ReadInput`` is a source, like ``ParallelRollouts``, and ``ParallelRollouts`` hands over to it when the config sets
``input`` (mixing its items with sampled ones by ``input_mix``), so every plan that samples in lockstep reads a
dataset unchanged: MARWIL and BC are PG's plan with another loss.

Examples:
    >>> import tempfile
    >>> from flowrl.testing import make_fake_workers, record_fake_episodes
    >>> directory = record_fake_episodes(tempfile.mkdtemp(), episodes=3, length=10)
    >>> workers = make_fake_workers(0, rollout_fragment_length=8, input=directory, input_shuffle_rows=1, executor="local")
    >>> it = ReadInput(workers)
    >>> it
    LocalIterator[ReadInput(8 rows)]
    >>> [b.count for b in it.take(3)], it.metrics.counters["num_steps_sampled"]
    ([8, 8, 8], 24)
"""

from __future__ import annotations

import collections
import weakref
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from flowrl.iter import LocalIterator
from flowrl.offline import RecordedDataset, off_policy_estimates, open_dataset, read_episodes
from flowrl.ops._common import ReportSampled, check_int
from flowrl.policy import Policy
from flowrl.sample_batch import (ACTIONS, EPS_ID, LOGP, NEXT_OBS, OBS, REWARDS, TERMINATEDS, TRUNCATEDS, AnyBatch,
                                 SampleBatch)
from flowrl.workers import WorkerSet

__all__ = ["ReadInput", "INPUT_COLUMNS", "RecentEpisodes", "EstimateOffPolicy"]

#: the columns every dataset read as input must have; a policy adds its own (``Policy.offline_columns``)
INPUT_COLUMNS = (EPS_ID, OBS, ACTIONS, REWARDS, TERMINATEDS, TRUNCATEDS)


def _postprocessed(policy: Any, episode: SampleBatch) -> SampleBatch:
    """One recorded episode through the reading policy's postprocessing (its returns, advantages, n-step rows)."""
    hook = getattr(type(policy), "postprocess_trajectory", None)
    if hook is None or hook is Policy.postprocess_trajectory:
        return episode
    return policy.postprocess_trajectory(episode)  # type: ignore[no-any-return]


class RecentEpisodes:
    """The last whole episodes a ``ReadInput`` source read, as recorded and only the columns off-policy estimation
    reads (observations, actions, rewards, the behaviour's ``logp``): at most ``max_episodes`` of them in at most
    ``max_bytes`` (the newest always kept), so that image datasets do not pile up in the driver."""

    COLUMNS = (OBS, ACTIONS, REWARDS, LOGP)

    def __init__(self, max_episodes: int = 100, max_bytes: int = 64 * 2**20) -> None:
        self.max_episodes, self.max_bytes = max_episodes, max_bytes
        self.episodes: collections.deque[SampleBatch] = collections.deque()
        self._bytes = 0

    def add(self, episode: SampleBatch) -> None:
        if not (episode[TERMINATEDS][-1] or episode[TRUNCATEDS][-1]):
            return  # a cut episode has no return to estimate
        kept = SampleBatch._of_checked({k: episode[k].copy() for k in self.COLUMNS})  # not views of whole blocks
        self.episodes.append(kept)
        self._bytes += _nbytes(kept)
        while len(self.episodes) > self.max_episodes or (self._bytes > self.max_bytes and len(self.episodes) > 1):
            self._bytes -= _nbytes(self.episodes.popleft())


def _nbytes(batch: SampleBatch) -> int:
    return sum(column.nbytes for column in batch.values())


def _items(dataset: RecordedDataset, policy: Any, *, item_size: int, shuffle_rows: int, epochs: int | None,
           seed: int | None, executor: Any, recent: RecentEpisodes | None = None) -> Iterator[SampleBatch]:
    """Items of ``item_size`` rows: episodes read in a random file order each epoch, postprocessed, and shuffled
    ``shuffle_rows`` at a time (the last item of a finite read may be shorter)."""
    rng = np.random.default_rng(seed)
    pending: list[SampleBatch] = []
    rows, epoch = 0, 0

    def cut(final: bool) -> Iterator[SampleBatch]:
        nonlocal pending, rows
        joined, pending = SampleBatch.concat(pending), []
        order = rng.permutation(joined.count) if shuffle_rows > 1 else np.arange(joined.count)
        whole = joined.count if final else joined.count - joined.count % item_size
        for start in range(0, whole, item_size):  # each item gathers its rows: no second copy of the window
            yield joined.rows(order[start:start + item_size])
        pending = [joined.rows(order[whole:])] if whole < joined.count else []
        rows = joined.count - whole

    while epochs is None or epoch < epochs:
        files = [str(f) for f in rng.permutation(dataset.files)] if shuffle_rows > 1 else list(dataset.files)
        for episode in read_episodes(dataset, executor=executor, files=files):
            if recent is not None:
                recent.add(episode)
            pending.append(_postprocessed(policy, episode))
            rows += episode.count
            if rows >= max(shuffle_rows, item_size):
                yield from cut(final=False)
        epoch += 1
    if rows:
        yield from cut(final=True)


def ReadInput(workers: WorkerSet, *, item_size: int | None = None) -> LocalIterator[AnyBatch]:
    """The experience source of a recorded dataset (``workers.config.input``): items of ``item_size`` rows
    (default: one sample of every remote worker, what ``ParallelRollouts(bulk_sync)`` yields), counted into
    ``num_steps_sampled``.

    The dataset's footers are read and checked now (files, columns, the env's spaces); its rows then stream block by
    block as the plan pulls: each epoch reads the files in a new random order (seeded by the config's ``seed``),
    postprocesses each episode with the local worker's policy and shuffles ``input_shuffle_rows`` rows at a time;
    after ``input_epochs`` passes the stream ends (``None``: never). When the data holds the behaviour policy's
    ``logp``, the last episodes read are kept in ``workers.input_episodes`` (:class:`RecentEpisodes`) for
    :class:`EstimateOffPolicy`.

    Metrics: ``num_steps_sampled``, ``num_agent_steps_sampled``.

    Raises:
        ValueError: no ``input`` in the config, or a dataset that does not fit (the message names the file and
            the column; see :func:`flowrl.offline.open_dataset`).
    """
    config = workers.config
    if config.input is None:
        raise ValueError("ReadInput needs a dataset: set input=DIR in the config (a directory recorded with "
                         "output=DIR)")
    size = item_size if item_size is not None else config.sample_size * max(len(workers.remote_workers()), 1)
    check_int("ReadInput item_size", size, 1, "rows per item")
    policy = workers.local_worker().get_policy()
    required = INPUT_COLUMNS + tuple(getattr(policy, "offline_columns", (NEXT_OBS,)))
    dataset = open_dataset(config.input, required=required,
                           observation_space=getattr(policy, "observation_space", None),
                           action_space=getattr(policy, "action_space", None))
    workers.reads_input = True
    estimable = LOGP in dataset.row_shapes and bool(getattr(config, "off_policy_estimation", ()))
    recent = workers.input_episodes = RecentEpisodes() if estimable else None
    stream = _Stream(lambda: _items(dataset, policy, item_size=size, shuffle_rows=config.input_shuffle_rows,
                                    epochs=config.input_epochs, seed=config.seed, executor=config.executor,
                                    recent=recent))
    return (LocalIterator.from_iterable(stream, name=f"ReadInput({size} rows)")
            .for_each(ReportSampled())
            .named(f"ReadInput({size} rows)")
            .on_close(stream.close))


class _Stream:
    """The iterable a ``ReadInput`` source pulls: each iteration a new ``_items`` generator; :meth:`close` closes
    the live ones, so that a plan closed before Ray shuts down ends its Ray Data reads while Ray still runs."""

    def __init__(self, make: Callable[[], Iterator[SampleBatch]]) -> None:
        self._make, self._live = make, weakref.WeakSet[Any]()

    def __iter__(self) -> Iterator[SampleBatch]:
        generator = self._make()
        self._live.add(generator)
        return generator

    def close(self) -> None:
        for generator in list(self._live):
            generator.close()


class EstimateOffPolicy:
    """Adds ``result["off_policy_estimation"]`` to each report: the config's estimators
    (:func:`flowrl.offline.off_policy_estimates`) of the local policy's return on the last episodes ``ReadInput``
    read (``workers.input_episodes``), and ``num_episodes``; nothing while no episode has been read, or for a policy
    whose actions have no likelihood (:meth:`flowrl.policy.Policy.action_log_likelihoods` is ``None``).

    Consumes and emits result dicts (the trainer attaches it after the reporting stage of a plan that reads input).
    """

    def __init__(self, workers: WorkerSet, estimators: Sequence[str], gamma: float) -> None:
        self.workers, self.estimators, self.gamma = workers, tuple(estimators), gamma

    def __call__(self, result: dict[str, Any]) -> dict[str, Any]:
        recent = getattr(self.workers, "input_episodes", None)
        if recent is None or not recent.episodes:
            return result
        likelihoods = getattr(self.workers.local_worker().get_policy(), "action_log_likelihoods", None)
        episodes = list(recent.episodes)
        target = [likelihoods(e[OBS], e[ACTIONS]) for e in episodes] if likelihoods is not None else [None]
        known = [t for t in target if t is not None]
        if len(known) < len(target):
            return result
        estimates: dict[str, Any] = dict(off_policy_estimates(episodes, known, gamma=self.gamma,
                                                              estimators=self.estimators))
        estimates["num_episodes"] = len(episodes)
        return {**result, "off_policy_estimation": estimates}

    def __repr__(self) -> str:
        return f"EstimateOffPolicy({', '.join(self.estimators)})"
