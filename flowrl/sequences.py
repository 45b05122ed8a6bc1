"""Sequences of timesteps for recurrent policies: where they start, how they are padded, and how they are shuffled
and cut into minibatches without ever splitting one.

A batch needs no extra column to know its sequences: a sequence is a run of rows of one episode (``eps_id``) at
consecutive timesteps (``t`` growing by one), cut every ``max_seq_len`` rows. A worker writes each env's rows in
time order, so a fragment's runs are its episodes' pieces; batches concatenated later keep them, and a run that an
episode continues in the next fragment of the same env joins it only if those rows follow each other in the
batch and in time. A recurrent worker stores the state its policy acted with at every row (``state_in_*``), so a
sequence can start at any row with the right initial state.

- :func:`sequence_lengths` finds the sequences of a batch's rows (``seq_lens``, summing to the row count).
- :func:`pad` / :func:`unpad` move a column between rows ``[N, ...]`` and padded sequences ``[S, T, ...]``, and
  :func:`sequence_mask` is the ``[S, T]`` mask of real (not padding) steps.
- :func:`sequence_starts` gives each sequence's first row (where its initial state is read).
- :func:`shuffled_sequence_minibatches` permutes whole sequences and cuts them into minibatches of about a given
  number of rows, never splitting a sequence.
- :func:`pad_batch` lays a batch's sequences out as blocks of exactly ``max_seq_len`` rows (``seq_valid`` marks
  the real ones), so that a replay buffer cutting every ``max_seq_len`` rows stores one whole sequence per item.

Examples:
    >>> eps_id, t = np.array([7, 7, 7, 7, 7, 9, 9]), np.array([0, 1, 2, 3, 4, 0, 1])
    >>> sequence_lengths(eps_id, t, max_seq_len=2).tolist()
    [2, 2, 1, 2]
    >>> pad(np.arange(7), np.array([2, 2, 1, 2]), 2).tolist()
    [[0, 1], [2, 3], [4, 0], [5, 6]]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from flowrl.sample_batch import AGENT_INDEX, EPS_ID, STATE_OUT, T, SampleBatch

__all__ = ["sequence_lengths", "sequence_starts", "sequence_mask", "pad", "unpad", "shuffled_sequence_minibatches",
           "pad_batch", "batch_sequence_lengths", "SEQ_VALID"]

SEQ_VALID = "seq_valid"
"""The column of a :func:`pad_batch` batch that is True at a sequence's real rows and False at its padding."""


def _check_max_seq_len(max_seq_len: int) -> None:
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, (int, np.integer)) or max_seq_len < 1:
        raise ValueError(f"max_seq_len={max_seq_len!r} must be an int >= 1 (the longest sequence a recurrent "
                         f"policy trains on, e.g. 20)")


def sequence_lengths(eps_id: npt.ArrayLike, t: npt.ArrayLike, max_seq_len: int) -> npt.NDArray[np.int64]:
    """The lengths of the sequences that a batch's rows form, in row order: a new sequence starts where the
    episode id changes, where ``t`` does not grow by exactly one, and after every ``max_seq_len`` rows of a run.

    Args:
        eps_id: ``[N]`` each row's episode id. t: ``[N]`` each row's timestep within its episode.
        max_seq_len: the longest sequence (>= 1).

    Returns:
        ``seq_lens`` ``[S]`` int64, each in ``[1, max_seq_len]``, summing to ``N`` (empty for no rows).

    Raises:
        ValueError: ``max_seq_len`` < 1, or ``eps_id`` and ``t`` of different lengths or not one-dimensional.

    Examples:
        >>> sequence_lengths([1, 1, 1, 2], [5, 6, 8, 0], max_seq_len=10).tolist()  # t jumps from 6 to 8
        [2, 1, 1]
    """
    _check_max_seq_len(max_seq_len)
    eps, steps = np.asarray(eps_id), np.asarray(t)
    if eps.ndim != 1 or eps.shape != steps.shape:
        raise ValueError(f"eps_id and t must be two 1-D columns of the same length, got shapes {eps.shape} and "
                         f"{steps.shape}")
    if len(eps) == 0:
        return np.zeros(0, np.int64)
    breaks = np.flatnonzero((eps[1:] != eps[:-1]) | (steps[1:] != steps[:-1] + 1)) + 1
    run_lengths = np.diff(np.concatenate([[0], breaks, [len(eps)]]))
    full, rest = np.divmod(run_lengths, max_seq_len)  # each run: `full` sequences of max_seq_len, then `rest`
    counts = full + (rest > 0)
    lengths = np.full(int(counts.sum()), max_seq_len, np.int64)
    ends = np.cumsum(counts) - 1  # the last sequence of each run takes the remainder, where there is one
    has_rest = rest > 0
    lengths[ends[has_rest]] = rest[has_rest]
    return lengths


def batch_sequence_lengths(batch: SampleBatch, max_seq_len: int) -> npt.NDArray[np.int64]:
    """:func:`sequence_lengths` of a batch's rows: by ``eps_id`` and ``t``, and in a multi-agent batch (an
    ``agent_index`` column) also by agent, since the agents of one episode share its id and timesteps.

    Examples:
        >>> batch = SampleBatch({EPS_ID: [4, 4, 4, 4], T: [0, 1, 2, 3], AGENT_INDEX: [0, 0, 1, 1]})
        >>> batch_sequence_lengths(batch, 10).tolist()  # agent 1's rows at t = 2, 3 are not agent 0's
        [2, 2]
    """
    eps = np.asarray(batch[EPS_ID])
    if AGENT_INDEX in batch and len(eps):  # a new id at every change of episode or agent
        agents = np.asarray(batch[AGENT_INDEX])
        eps = np.concatenate([[0], np.cumsum((eps[1:] != eps[:-1]) | (agents[1:] != agents[:-1]))])
    return sequence_lengths(eps, batch[T], max_seq_len)


def sequence_starts(seq_lens: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """The first row of each sequence (``[S]``).

    Examples:
        >>> sequence_starts([2, 3, 1]).tolist()
        [0, 2, 5]
    """
    lens = np.asarray(seq_lens, np.int64)
    return np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64) if len(lens) else np.zeros(0, np.int64)


def sequence_mask(seq_lens: npt.ArrayLike, max_seq_len: int) -> npt.NDArray[np.bool_]:
    """``[S, max_seq_len]``: True at the steps a sequence has, False at its padding.

    Examples:
        >>> sequence_mask([2, 1], 3).astype(int).tolist()
        [[1, 1, 0], [1, 0, 0]]
    """
    _check_max_seq_len(max_seq_len)
    lens = np.asarray(seq_lens, np.int64)
    if len(lens) and (lens.min() < 1 or lens.max() > max_seq_len):
        raise ValueError(f"seq_lens must lie in [1, max_seq_len={max_seq_len}], got min {lens.min()} and max "
                         f"{lens.max()}")
    return np.arange(max_seq_len) < lens[:, None]


def pad(column: npt.NDArray[Any], seq_lens: npt.ArrayLike, max_seq_len: int) -> npt.NDArray[Any]:
    """Rows ``[N, ...]`` as padded sequences ``[S, max_seq_len, ...]`` (padding: zeros of the column's dtype).

    Raises:
        ValueError: ``seq_lens`` that do not sum to ``N`` or a length outside ``[1, max_seq_len]``.

    Examples:
        >>> pad(np.array([[1.0], [2.0], [3.0]]), [1, 2], 2)[:, :, 0].tolist()
        [[1.0, 0.0], [2.0, 3.0]]
    """
    lens = np.asarray(seq_lens, np.int64)
    if int(lens.sum()) != len(column):
        raise ValueError(f"seq_lens sum to {int(lens.sum())} rows, but the column has {len(column)}")
    mask = sequence_mask(lens, max_seq_len)
    out = np.zeros((len(lens), max_seq_len, *column.shape[1:]), column.dtype)
    out[mask] = column  # the mask's True entries, row-major, are the rows in order
    return out


def unpad(padded: npt.NDArray[Any], seq_lens: npt.ArrayLike) -> npt.NDArray[Any]:
    """Padded sequences ``[S, T, ...]`` back to their rows ``[sum(seq_lens), ...]`` (the inverse of :func:`pad`).

    Examples:
        >>> unpad(np.array([[1, 0], [2, 3]]), [1, 2]).tolist()
        [1, 2, 3]
    """
    lens = np.asarray(seq_lens, np.int64)
    if padded.ndim < 2 or len(padded) != len(lens):
        raise ValueError(f"padded has shape {padded.shape}; it needs [S={len(lens)}, T, ...]")
    return padded[sequence_mask(lens, padded.shape[1])]


def shuffled_sequence_minibatches(seq_lens: npt.ArrayLike, minibatch_rows: int,
                                  rng: np.random.Generator) -> list[tuple[npt.NDArray[np.int64],
                                                                          npt.NDArray[np.int64]]]:
    """Whole sequences in a random order, cut into consecutive minibatches: ``[(rows, seq_lens), ...]``.

    The sequences are permuted; each minibatch takes the next sequences until it holds at least
    ``minibatch_rows`` rows (or the sequences run out), so no sequence is ever split and every row lands in
    exactly one minibatch. ``rows`` are the minibatch's row indices into the batch, sequence by sequence in time
    order, and ``seq_lens`` its sequences' lengths. ``minibatch_rows`` <= 0 or >= the batch's rows: one minibatch.

    Examples:
        >>> parts = shuffled_sequence_minibatches([2, 1, 2], 3, np.random.default_rng(0))
        >>> sorted(int(i) for rows, _ in parts for i in rows), [lens.tolist() for _, lens in parts]
        ([0, 1, 2, 3, 4], [[2, 2], [1]])
    """
    lens = np.asarray(seq_lens, np.int64)
    starts = sequence_starts(lens)
    order = rng.permutation(len(lens))
    total = int(lens.sum())
    if minibatch_rows <= 0 or minibatch_rows >= total:
        cuts = [len(order)]
    else:
        ends = np.cumsum(lens[order])  # rows up to and including each permuted sequence
        cuts, taken = [], 0
        while taken < len(order):
            done = int(ends[taken - 1]) if taken else 0
            taken = min(int(np.searchsorted(ends, done + minibatch_rows)) + 1, len(order))
            cuts.append(taken)
    out, begin = [], 0
    for end in cuts:
        chosen = order[begin:end]
        rows = np.concatenate([np.arange(starts[s], starts[s] + lens[s]) for s in chosen]) if len(chosen) \
            else np.zeros(0, np.int64)
        out.append((rows.astype(np.int64), lens[chosen]))
        begin = end
    return out


def pad_batch(batch: SampleBatch, max_seq_len: int) -> SampleBatch:
    """The batch's sequences (:func:`sequence_lengths` of its ``eps_id`` and ``t``), each padded with zero rows to
    exactly ``max_seq_len`` rows, one after the other; the column :data:`SEQ_VALID` is True at the real rows. Rows
    keep their order. The ``state_out_<k>`` columns are dropped: a sequence's later states come from unrolling
    the model over it from its first row's ``state_in_<k>``.

    Returns:
        a batch of ``S x max_seq_len`` rows (``S`` sequences); row ``s * max_seq_len + i`` is step ``i`` of
        sequence ``s``.

    Raises:
        ValueError: ``max_seq_len`` < 1, or a batch without ``eps_id`` and ``t``.

    Examples:
        >>> batch = SampleBatch({EPS_ID: np.array([3, 3, 3, 8]), T: np.array([0, 1, 2, 0]),
        ...                      "obs": np.array([1.0, 2.0, 3.0, 4.0])})
        >>> out = pad_batch(batch, 2)
        >>> out["obs"].tolist(), out[SEQ_VALID].tolist()
        ([1.0, 2.0, 3.0, 0.0, 4.0, 0.0], [True, True, True, False, True, False])
    """
    _check_max_seq_len(max_seq_len)
    if EPS_ID not in batch or T not in batch:
        raise ValueError(f"pad_batch needs the {EPS_ID!r} and {T!r} columns to find sequences; the batch has "
                         f"{sorted(batch.keys())}")
    lens = batch_sequence_lengths(batch, max_seq_len)
    mask = sequence_mask(lens, max_seq_len).reshape(-1)
    dropped = STATE_OUT.format("")  # the prefix of every state_out_<k> column
    out = {}
    for key, column in batch.items():
        if key.startswith(dropped):
            continue
        padded = np.zeros((len(mask), *column.shape[1:]), column.dtype)
        padded[mask] = column
        out[key] = padded
    out[SEQ_VALID] = mask
    return SampleBatch(out)
