"""flowrl.sequences: sequences found from eps_id and t, padding, and minibatches that never split a sequence; exact
examples and Hypothesis properties over random episode lengths, fragment cuts and max_seq_len."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrl.ops import PadSequences
from flowrl.sample_batch import EPS_ID, STATE_IN, STATE_OUT, T, SampleBatch
from flowrl.sequences import (SEQ_VALID, pad, sequence_lengths, sequence_mask, sequence_starts,
                              shuffled_sequence_minibatches, unpad)


@st.composite
def batches(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int]:
    """(eps_id, t, max_seq_len) of rows as workers and ConcatBatches lay them out: pieces of episodes, each a run of
    consecutive timesteps, some episodes continued by a later piece (the next fragment), in any order."""
    pieces = draw(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 30)), min_size=0, max_size=12))
    next_t: dict[int, int] = {}
    eps, steps = [], []
    for episode, length in pieces:
        start = next_t.get(episode, 0) + draw(st.sampled_from([0, 0, 0, 3]))  # sometimes a gap in time
        eps += [episode] * length
        steps += list(range(start, start + length))
        next_t[episode] = start + length
    return np.array(eps, np.int64), np.array(steps, np.int64), draw(st.integers(1, 12))


def test_exact_sequences_of_a_small_batch() -> None:
    eps = np.array([3, 3, 3, 3, 3, 3, 3, 5, 5, 3, 3])
    t = np.array([0, 1, 2, 3, 4, 5, 6, 0, 1, 7, 8])  # episode 3 goes on after episode 5's rows: a new sequence
    assert sequence_lengths(eps, t, 3).tolist() == [3, 3, 1, 2, 2]
    assert sequence_lengths(eps, t, 100).tolist() == [7, 2, 2]
    assert sequence_lengths(eps, t, 1).tolist() == [1] * 11
    assert sequence_starts([3, 3, 1, 2, 2]).tolist() == [0, 3, 6, 7, 9]
    assert sequence_lengths([], [], 4).tolist() == []


@pytest.mark.parametrize("max_seq_len", [0, -1, 1.5, True, "20"])
def test_bad_max_seq_len_is_a_clear_error(max_seq_len: object) -> None:
    with pytest.raises(ValueError, match=r"max_seq_len=.* must be an int >= 1"):
        sequence_lengths([1], [0], max_seq_len)  # type: ignore[arg-type]


def test_columns_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="same length"):
        sequence_lengths([1, 1], [0], 4)


@settings(max_examples=300, deadline=None)
@given(batches())
def test_sequences_cover_the_rows_lie_in_one_episode_in_time_and_are_cut_only_where_needed(
        batch: tuple[np.ndarray, np.ndarray, int]) -> None:
    eps, t, max_len = batch
    lens = sequence_lengths(eps, t, max_len)
    assert lens.sum() == len(eps) and (len(lens) == 0 or (lens.min() >= 1 and lens.max() <= max_len))
    for start, length in zip(sequence_starts(lens), lens):
        rows = slice(start, start + length)
        assert len(set(eps[rows].tolist())) == 1 and np.all(np.diff(t[rows]) == 1)
        end = start + length
        if length < max_len and end < len(eps):  # a short sequence ends only where its run ends
            assert eps[end] != eps[end - 1] or t[end] != t[end - 1] + 1


@settings(max_examples=200, deadline=None)
@given(batches())
def test_pad_then_unpad_gives_the_rows_back_and_the_mask_counts_them(batch: tuple[np.ndarray, np.ndarray, int]) -> None:
    eps, t, max_len = batch
    lens = sequence_lengths(eps, t, max_len)
    column = np.stack([eps, t], axis=1).astype(np.float32) + 1.0  # no zero: padding is distinguishable
    padded = pad(column, lens, max_len)
    assert padded.shape == (len(lens), max_len, 2)
    mask = sequence_mask(lens, max_len)
    assert mask.sum() == len(eps) and np.all(padded[~mask] == 0)
    np.testing.assert_array_equal(unpad(padded, lens), column)
    for s, (start, length) in enumerate(zip(sequence_starts(lens), lens)):
        np.testing.assert_array_equal(padded[s, :length], column[start:start + length])


@settings(max_examples=300, deadline=None)
@given(batches(), st.integers(-1, 60), st.integers(0, 2**31 - 1))
def test_minibatches_partition_the_rows_into_whole_sequences_of_about_the_asked_size(
        batch: tuple[np.ndarray, np.ndarray, int], rows_wanted: int, seed: int) -> None:
    eps, t, max_len = batch
    lens = sequence_lengths(eps, t, max_len)
    starts = sequence_starts(lens)
    whole = {(int(s), int(n)) for s, n in zip(starts, lens)}
    parts = shuffled_sequence_minibatches(lens, rows_wanted, np.random.default_rng(seed))
    seen = np.concatenate([rows for rows, _ in parts]) if parts else np.zeros(0, np.int64)
    assert sorted(seen.tolist()) == list(range(len(eps)))  # every row exactly once
    for index, (rows, part_lens) in enumerate(parts):
        assert part_lens.sum() == len(rows)
        offset = 0
        for n in part_lens:  # the minibatch's sequences, each one whole sequence of the batch, in time order
            piece = rows[offset:offset + n]
            assert (int(piece[0]), int(n)) in whole and np.all(np.diff(piece) == 1)
            offset += n
        if 0 < rows_wanted < len(eps) and index < len(parts) - 1:  # enough rows, and not one sequence too many
            assert len(rows) >= rows_wanted and len(rows) - part_lens[-1] < rows_wanted
    if rows_wanted <= 0 or rows_wanted >= len(eps):
        assert len(parts) == 1


def test_minibatch_order_depends_on_the_generator_only() -> None:
    lens = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    a = shuffled_sequence_minibatches(lens, 8, np.random.default_rng(1))
    b = shuffled_sequence_minibatches(lens, 8, np.random.default_rng(1))
    c = shuffled_sequence_minibatches(lens, 8, np.random.default_rng(2))
    assert all(np.array_equal(x[0], y[0]) for x, y in zip(a, b)) and len(a) == len(b)
    assert any(not np.array_equal(x[0], y[0]) for x, y in zip(a, c))


@given(batches())
def test_pad_batch_lays_each_sequence_out_as_one_block_of_max_seq_len_rows(batch: tuple[np.ndarray, np.ndarray,
                                                                                          int]) -> None:
    """What a sequence replay buffer relies on: cutting the padded rows every max_seq_len rows gives whole sequences
    (one episode, consecutive steps, real rows first), the blocks in order give the rows back, and state_out goes."""
    eps, t, max_len = batch
    rows = SampleBatch({EPS_ID: eps, T: t, "x": np.arange(len(eps), dtype=np.float32) + 1,
                        STATE_IN.format(0): np.ones((len(eps), 3), np.float32),
                        STATE_OUT.format(0): np.ones((len(eps), 3), np.float32)})
    out = PadSequences(max_len)(rows)
    lens = sequence_lengths(eps, t, max_len)
    assert out.count == len(lens) * max_len and STATE_OUT.format(0) not in out
    valid = out[SEQ_VALID].reshape(-1, max_len)
    assert valid.sum(axis=1).tolist() == lens.tolist()
    assert all(block[:n].all() and not block[n:].any() for block, n in zip(valid, lens))
    for block_eps, block_t, n in zip(out[EPS_ID].reshape(-1, max_len), out[T].reshape(-1, max_len), lens):
        assert len(set(block_eps[:n].tolist())) == 1 and (np.diff(block_t[:n]) == 1).all()
    assert out["x"][out[SEQ_VALID]].tolist() == rows["x"].tolist()
    assert (out["x"][~out[SEQ_VALID]] == 0).all()
