"""SampleBatch and MultiAgentBatch: rows and columns are conserved by every reshaping."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrl.sample_batch import (ACTIONS, EPS_ID, OBS, REWARDS, DEFAULT_POLICY_ID, MultiAgentBatch,
                                 SampleBatch)


def make_batch(n: int, offset: int = 0, eps: list[int] | None = None) -> SampleBatch:
    return SampleBatch({OBS: np.arange(offset, offset + n * 2, dtype=np.float32).reshape(n, 2),
                        ACTIONS: np.arange(offset, offset + n), REWARDS: np.ones(n),
                        EPS_ID: np.asarray(eps if eps is not None else [0] * n)})


sizes = st.lists(st.integers(0, 12), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(sizes=sizes)
def test_concat_conserves_rows_and_columns(sizes: list[int]) -> None:
    parts = [make_batch(n, offset=100 * i) for i, n in enumerate(sizes)]
    joined = SampleBatch.concat(parts)
    assert joined.count == sum(sizes)
    assert set(joined) == {OBS, ACTIONS, REWARDS, EPS_ID}
    assert joined[ACTIONS].tolist() == [a for p in parts for a in p[ACTIONS].tolist()]
    assert joined[OBS].shape == (sum(sizes), 2)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 40), size=st.integers(1, 9), seed=st.integers(0, 5), shuffle=st.booleans())
def test_minibatches_partition_the_rows(n: int, size: int, seed: int, shuffle: bool) -> None:
    batch = make_batch(n)
    minis = list(batch.minibatches(size, seed=seed, shuffle=shuffle))
    assert [m.count for m in minis[:-1]] == [size] * (len(minis) - 1)
    assert sum(m.count for m in minis) == n
    rows = [a for m in minis for a in m[ACTIONS].tolist()]
    assert sorted(rows) == list(range(n)) and (shuffle or rows == list(range(n)))
    for m in minis:  # a row's columns stay together
        assert np.array_equal(m[OBS][:, 0], 2 * m[ACTIONS])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 20), a=st.integers(0, 20), b=st.integers(0, 20))
def test_slices_keep_every_column_aligned(n: int, a: int, b: int) -> None:
    batch = make_batch(n)
    part = batch[a:b]
    assert part.count == len(range(n)[a:b])
    assert part[ACTIONS].tolist() == list(range(n))[a:b]
    assert np.array_equal(part[OBS][:, 0], 2 * part[ACTIONS])


def test_shuffle_is_seeded_and_keeps_rows_together() -> None:
    batch = make_batch(20)
    a, b = batch.shuffle(seed=3), batch.shuffle(seed=3)
    assert a == b and a != batch
    assert np.array_equal(a[OBS][:, 0], 2 * a[ACTIONS])
    assert batch[ACTIONS].tolist() == list(range(20))  # not mutated


def test_split_by_episode() -> None:
    batch = make_batch(6, eps=[4, 4, 7, 7, 7, 4])
    assert [p[ACTIONS].tolist() for p in batch.split_by_episode()] == [[0, 1], [2, 3, 4], [5]]
    assert SampleBatch({REWARDS: [1.0]}).split_by_episode()[0].count == 1
    assert SampleBatch().split_by_episode() == []


def test_column_length_mismatch_and_scalars_are_rejected() -> None:
    with pytest.raises(ValueError, match="'b' has 3 rows but column 'a' has 2"):
        SampleBatch({"a": [1, 2], "b": [1, 2, 3]})
    batch = SampleBatch({"a": [1, 2]})
    with pytest.raises(ValueError, match="scalar"):
        batch["c"] = 5
    with pytest.raises(ValueError, match="column sets differ"):
        SampleBatch.concat([batch, SampleBatch({"z": [1]})])
    with pytest.raises(ValueError, match="at least one"):
        SampleBatch.concat([])
    with pytest.raises(ValueError, match="size"):
        list(batch.minibatches(0))


def test_multi_agent_batch_counts_and_concat() -> None:
    mb = MultiAgentBatch({"p0": make_batch(3), "p1": make_batch(1)}, env_steps=3)
    assert (mb.count, mb.agent_steps()) == (3, 4)
    both = MultiAgentBatch.concat([mb, MultiAgentBatch({"p1": make_batch(2)}, env_steps=2)])
    assert (both.count, both.agent_steps(), both.policy_batches["p1"].count) == (5, 6, 3)
    assert make_batch(2).as_multi_agent().policy_batches[DEFAULT_POLICY_ID].count == 2
    assert mb.copy() == mb and mb.copy().policy_batches["p0"] is not mb.policy_batches["p0"]
    with pytest.raises(ValueError, match="env_steps"):
        MultiAgentBatch({}, env_steps=-1)
    with pytest.raises(ValueError, match="SampleBatch"):
        MultiAgentBatch({"p": {"a": [1]}}, env_steps=1)  # type: ignore[dict-item]


# -- pickling: small batches travel as one buffer, large ones column by column ---------------------------------
_DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int8, np.uint8, np.bool_, np.complex64]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 30), picks=st.lists(st.tuples(st.sampled_from(_DTYPES), st.integers(0, 3)), min_size=1,
                                            max_size=6),
       order=st.sampled_from(["C", "F", "strided"]))
def test_pickle_round_trips_every_column_exactly(n: int, picks: list[tuple[type, int]], order: str) -> None:
    import pickle
    rng = np.random.default_rng(n)
    columns = {}
    for i, (dtype, width) in enumerate(picks):
        shape = (n,) if width == 0 else (n, width, 2)
        x = (rng.normal(size=(2 * n, *shape[1:])) * 50).astype(dtype)
        x = x[::2] if order == "strided" else x[:n]
        columns[f"c{i}"] = np.asfortranarray(x) if order == "F" else x
    batch = SampleBatch(columns)
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        back = pickle.loads(pickle.dumps(batch, protocol=protocol))
        assert type(back) is SampleBatch and list(back) == list(batch)
        for k, v in batch.items():
            assert back[k].dtype == v.dtype and back[k].shape == v.shape
            np.testing.assert_array_equal(back[k], v)
            assert back[k].flags.writeable and back[k].ctypes.data % back[k].dtype.alignment == 0


def test_small_batches_pickle_as_one_buffer_and_large_ones_out_of_band() -> None:
    import pickle

    from flowrl.sample_batch import PACK_MAX_BYTES

    def out_of_band(batch: SampleBatch) -> int:
        buffers: list[pickle.PickleBuffer] = []
        pickle.loads(pickle.dumps(batch, protocol=5, buffer_callback=buffers.append), buffers=buffers)
        return len(buffers)

    small = make_batch(50)
    back = pickle.loads(pickle.dumps(small, protocol=5))
    back[REWARDS][0] = 7.0  # writable, and the columns (views of one buffer) do not overlap
    assert back[REWARDS].tolist() == [7.0] + [1.0] * 49 and back[ACTIONS].tolist() == list(range(50))
    assert out_of_band(small) == 0
    rows = PACK_MAX_BYTES // 8 + 1
    big = SampleBatch({OBS: np.zeros((rows, 2), np.float32), REWARDS: np.zeros(rows)})
    assert out_of_band(big) == 2  # numpy's zero-copy buffers, one per column
    objects = SampleBatch({"info": np.array([{"a": 1}, None], dtype=object), REWARDS: np.ones(2)})
    back = pickle.loads(pickle.dumps(objects, protocol=5))
    assert back["info"].tolist() == [{"a": 1}, None] and back == objects


class _TaggedBatch(SampleBatch):
    pass


@pytest.mark.parametrize("rows", [3, 20_000])  # packed, and column by column
def test_pickle_keeps_the_subclass_and_instance_attributes(rows: int) -> None:
    import pickle
    batch = _TaggedBatch({REWARDS: np.arange(float(rows))})
    batch.source = "worker-3"
    back = pickle.loads(pickle.dumps(batch, protocol=5))
    assert type(back) is _TaggedBatch and back.source == "worker-3" and back == batch


def test_only_small_plain_batches_offer_the_shard_wire() -> None:
    from flowrl.sample_batch import PACK_MAX_BYTES
    small = SampleBatch({OBS: np.zeros((50, 4), np.float32), ACTIONS: np.arange(50)})
    assert small.__flowrl_wire__()
    assert not SampleBatch({OBS: np.zeros(PACK_MAX_BYTES // 8 + 1)}).__flowrl_wire__()  # zero-copy via Ray
    assert not SampleBatch({OBS: np.array([object()] * 3)}).__flowrl_wire__()
    assert not _TaggedBatch(small).__flowrl_wire__()  # a subclass may live in a script's __main__
    tagged = small.copy()
    tagged.source = "worker-3"
    assert not tagged.__flowrl_wire__()  # instance attributes may hold anything (ObjectRefs too)
    assert MultiAgentBatch({"p0": small, "p1": small}, env_steps=50).__flowrl_wire__()
    assert not MultiAgentBatch({"p0": small, "p1": _TaggedBatch(small)}, env_steps=50).__flowrl_wire__()
    half = SampleBatch({OBS: np.zeros(PACK_MAX_BYTES // 16)})  # each packs; together they are over the bound
    assert half.__flowrl_wire__() and not MultiAgentBatch({"a": half, "b": half, "c": half}, 1).__flowrl_wire__()
    extra = MultiAgentBatch({"p0": small}, env_steps=50)
    extra.note = "x"
    assert not extra.__flowrl_wire__()
