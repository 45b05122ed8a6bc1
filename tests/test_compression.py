"""LZ4 compression of image columns (flowrl.compression): exact round trips of columns and rows, batches crossing Ray
compressed and arriving plain, and replay keeping frames compressed while replaying exactly what an uncompressed
buffer replays."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrl import executor
from flowrl.compression import (MIN_ROW_BYTES, WIRE_ATTRIBUTE, PackedRows, is_image_column, mark_for_wire,
                                pack_column, unpack_column)
from flowrl.config import ModelConfig
from flowrl.replay_buffers import LocalReplayBuffer
from flowrl.sample_batch import ACTIONS, NEXT_OBS, OBS, REWARDS, MultiAgentBatch, SampleBatch
from flowrl.workers import RolloutConfig, RolloutWorker


def _frames(rng: np.random.Generator, n: int, dtype: type = np.uint8) -> np.ndarray:
    """Atari-like stacks: a flat background with a few random blocks (what LZ4 shrinks), random elsewhere."""
    frames = np.full((n, 84, 84, 4), 87, np.uint8)
    for i in range(n):
        y, x = rng.integers(0, 70, size=2)
        frames[i, y:y + 14, x:x + 4] = rng.integers(0, 256, size=(14, 4, 4))
    return frames.astype(dtype) if dtype is not np.uint8 else frames


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(0, 5), height=st.integers(16, 40), channels=st.integers(1, 4), boolean=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_a_column_and_its_rows_come_back_bit_for_bit(rows: int, height: int, channels: int, boolean: bool,
                                                     seed: int) -> None:
    rng = np.random.default_rng(seed)
    column = rng.integers(0, 2 if boolean else 256, size=(rows, height, height + 3, channels)).astype(
        bool if boolean else np.uint8)
    back = unpack_column(*pack_column(column))
    assert back.dtype == column.dtype and back.shape == column.shape and np.array_equal(back, column)
    assert back.flags.writeable
    store = PackedRows(max(rows, 1), column.shape[1:], column.dtype)
    for i in range(rows):
        store[i] = column[i]
    order = rng.permutation(rows)
    assert np.array_equal(store.take(order), column[order])


def test_only_image_rows_of_a_kilobyte_or_more_count_as_image_columns() -> None:
    assert is_image_column(np.zeros((2, 84, 84, 4), np.uint8))
    assert is_image_column(np.zeros((2, 32, 32), bool))  # 1,024 bytes a row
    assert not is_image_column(np.zeros((2, 10, 10, 4), bool))  # MinAtar: 400 bytes a row
    assert not is_image_column(np.zeros((2, 84, 84, 4), np.float32))
    assert not is_image_column(np.zeros((2, MIN_ROW_BYTES * 2), np.uint8))  # a flat vector, not an image
    assert not is_image_column(np.zeros((0, 84, 84, 4), np.uint8))


def test_a_marked_batch_pickles_small_and_arrives_equal_and_unmarked() -> None:
    rng = np.random.default_rng(0)
    batch = SampleBatch({OBS: _frames(rng, 50), ACTIONS: np.arange(50), NEXT_OBS: _frames(rng, 50),
                         REWARDS: rng.normal(size=50).astype(np.float32)})
    plain = len(pickle.dumps(batch, protocol=5))
    marked = mark_for_wire(batch.copy())
    wire = pickle.dumps(marked, protocol=5)
    assert len(wire) < plain / 10, (len(wire), plain)
    back = pickle.loads(wire)
    assert back == batch and list(back) == list(batch) and back.__dict__ == {}
    assert all(back[k].dtype == batch[k].dtype for k in batch)
    multi = mark_for_wire(MultiAgentBatch({"p": batch.copy(), "q": SampleBatch({REWARDS: [1.0]})}, env_steps=50))
    assert WIRE_ATTRIBUTE in multi.policy_batches["p"].__dict__
    assert WIRE_ATTRIBUTE not in multi.policy_batches["q"].__dict__  # nothing to compress


@pytest.mark.on_ray
def test_a_remote_workers_frames_cross_ray_compressed_and_arrive_as_the_same_uint8_frames() -> None:
    from flowrl.testing import TinyPGPolicy

    config = RolloutConfig(env="ALE/Pong-v5", seed=0, rollout_fragment_length=20, compress_observations=True,
                           model=ModelConfig(hidden_sizes=(8,)), num_cpus_per_worker=0)
    remote = executor.create_actor(RolloutWorker, options={"num_cpus": 0}, policy_class=TinyPGPolicy, config=config)
    try:
        arrived = executor.get(remote.sample.remote())
        sent = executor.get(remote.apply.remote(lambda worker: pickle.dumps(mark_for_wire(worker.sample()))))
    finally:
        executor.kill(remote)
    assert arrived[OBS].dtype == np.uint8 and arrived[OBS].shape == (20, 84, 84, 4) and arrived.__dict__ == {}
    assert arrived[OBS].flags.writeable
    # the next fragment, as the worker pickled it: a tenth of the frames' bytes, and the frames come back exactly
    assert len(sent) < 2 * 20 * 84 * 84 * 4 / 10
    again = pickle.loads(sent)
    assert again[OBS].dtype == np.uint8 and np.array_equal(again[OBS][1:], again[NEXT_OBS][:-1])


@pytest.mark.parametrize("prioritized", [False, True])
def test_compressed_replay_holds_frames_in_a_fraction_of_the_bytes_and_replays_the_same_rows(
        prioritized: bool) -> None:
    rng = np.random.default_rng(1)
    alpha = 0.6 if prioritized else 0.0
    buffers = [LocalReplayBuffer(learning_starts=0, capacity=400, replay_batch_size=32, seed=5,
                                 prioritized_replay_alpha=alpha, compress=compress) for compress in (False, True)]
    for _ in range(6):
        frames = _frames(rng, 101)
        batch = SampleBatch({OBS: frames[:-1], NEXT_OBS: frames[1:], ACTIONS: rng.integers(0, 6, 100),
                             REWARDS: rng.normal(size=100).astype(np.float32)})
        for buffer in buffers:
            buffer.add_batch(batch)  # 600 rows into 400: the oldest are overwritten
    plain, packed = buffers
    for _ in range(3):
        assert plain.replay() == packed.replay()
    plain_bytes = plain.stats(debug=True)["policy_default_policy"]["est_size_bytes"]
    packed_bytes = packed.stats(debug=True)["policy_default_policy"]["est_size_bytes"]
    assert packed_bytes < plain_bytes / 10, (packed_bytes, plain_bytes)
    # a checkpoint holds plain arrays either way: each restores into the other
    twin = LocalReplayBuffer(learning_starts=0, capacity=400, replay_batch_size=32, prioritized_replay_alpha=alpha)
    twin.set_state(packed.get_state())
    assert twin.replay() == plain.replay()


def test_a_replay_buffer_refuses_a_compress_that_is_not_a_bool() -> None:
    with pytest.raises(ValueError, match="compress='yes' must be True or False"):
        LocalReplayBuffer(compress="yes")  # type: ignore[arg-type]


def test_compress_observations_is_checked_in_the_config() -> None:
    with pytest.raises(ValueError, match="compress_observations='auto' must be None"):
        RolloutConfig(compress_observations="auto")  # type: ignore[arg-type]
