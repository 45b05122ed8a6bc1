"""GAE, discounted and n-step returns against straightforward reference loops (mixed episode ends)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrl.postprocessing import compute_gae, compute_nstep, discounted_returns


def episodes_of(ends: list[int]) -> list[tuple[int, int]]:
    """[start, stop) of each segment that the boundary flags (or the data's end) close."""
    out, start = [], 0
    for t, end in enumerate(ends):
        if end or t == len(ends) - 1:
            out.append((start, t + 1))
            start = t + 1
    return out


@st.composite
def trajectories(draw: st.DrawFn) -> dict[str, np.ndarray]:
    size = draw(st.integers(1, 25))
    kinds = draw(st.lists(st.sampled_from(["", "", "", "term", "trunc"]), min_size=size, max_size=size))
    rng = np.random.default_rng(draw(st.integers(0, 1000)))
    return {"rewards": rng.normal(size=size), "values": rng.normal(size=size), "next_values": rng.normal(size=size),
            "terminateds": np.array([k == "term" for k in kinds]), "truncateds": np.array([k == "trunc" for k in kinds])}


@settings(max_examples=100, deadline=None)
@given(traj=trajectories(), gamma=st.floats(0, 1), lambda_=st.floats(0, 1))
def test_gae_equals_the_explicit_sum_of_discounted_deltas(traj: dict[str, np.ndarray], gamma: float,
                                                          lambda_: float) -> None:
    r, v, nv, term, trunc = (traj[k] for k in ("rewards", "values", "next_values", "terminateds", "truncateds"))
    expected = np.zeros(len(r))
    for start, stop in episodes_of(list(term | trunc)):
        for t in range(start, stop):
            for step in range(t, stop):  # A_t = sum_l (gamma lambda)^l delta_{t+l}, within the segment
                # inside a segment s'_t's value is the next step's V(s_{t+1}); at its last step it is the
                # bootstrap V(s'_T) — unless the transition terminated, which has no future value
                future = 0.0 if term[step] else (nv[step] if step == stop - 1 else v[step + 1])
                delta = r[step] + gamma * future - v[step]
                expected[t] += (gamma * lambda_) ** (step - t) * delta
    # next_values must agree with values inside a segment for the recursion to be GAE: use them so
    nv_consistent = nv.copy()
    for start, stop in episodes_of(list(term | trunc)):
        nv_consistent[start:stop - 1] = v[start + 1:stop]
    adv, targets = compute_gae(rewards=r, values=v, next_values=nv_consistent, terminateds=term,
                               truncateds=trunc, gamma=gamma, lambda_=lambda_)
    np.testing.assert_allclose(adv, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(targets, expected + v, rtol=1e-4, atol=1e-4)


def test_truncation_bootstraps_and_termination_does_not() -> None:
    common = dict(rewards=np.array([1.0]), values=np.array([0.0]), next_values=np.array([10.0]), gamma=0.9, lambda_=0.95)
    terminated, _ = compute_gae(terminateds=np.array([True]), truncateds=np.array([False]), **common)
    truncated, _ = compute_gae(terminateds=np.array([False]), truncateds=np.array([True]), **common)
    cut, _ = compute_gae(terminateds=np.array([False]), truncateds=np.array([False]), **common)
    assert terminated.tolist() == [1.0]
    assert truncated.tolist() == pytest.approx([10.0]) and cut.tolist() == pytest.approx([10.0])


@settings(max_examples=100, deadline=None)
@given(traj=trajectories(), gamma=st.floats(0, 1), bootstrap=st.booleans())
def test_discounted_returns_match_a_reference_loop(traj: dict[str, np.ndarray], gamma: float, bootstrap: bool) -> None:
    r, term, trunc, nv = traj["rewards"], traj["terminateds"], traj["truncateds"], traj["next_values"]
    expected = np.zeros(len(r))
    for start, stop in episodes_of(list(term | trunc)):
        tail = 0.0 if term[stop - 1] or not bootstrap else nv[stop - 1]
        for t in range(start, stop):
            expected[t] = sum(gamma ** (k - t) * r[k] for k in range(t, stop)) + gamma ** (stop - t) * tail
    out = discounted_returns(rewards=r, terminateds=term, truncateds=trunc, gamma=gamma,
                             bootstrap=nv if bootstrap else None)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@settings(max_examples=100, deadline=None)
@given(traj=trajectories(), gamma=st.floats(0, 1), n=st.integers(1, 6))
def test_nstep_matches_a_reference_loop(traj: dict[str, np.ndarray], gamma: float, n: int) -> None:
    r, term, trunc = traj["rewards"], traj["terminateds"], traj["truncateds"]
    returns, idx, done, disc = compute_nstep(rewards=r, terminateds=term, truncateds=trunc, n=n, gamma=gamma)
    for start, stop in episodes_of(list(term | trunc)):
        for t in range(start, stop):
            last = min(t + n, stop) - 1
            assert returns[t] == pytest.approx(sum(gamma ** (k - t) * r[k] for k in range(t, last + 1)), abs=1e-4)
            assert idx[t] == last and done[t] == term[last]
            assert disc[t] == pytest.approx(0.0 if term[last] else gamma ** (last - t + 1), abs=1e-6)


@pytest.mark.parametrize("kwargs", [dict(gamma=1.5), dict(gamma=0.9, lambda_=-0.1)])
def test_bad_discounts_are_rejected(kwargs: dict[str, float]) -> None:
    args = dict(rewards=np.ones(1), values=np.ones(1), next_values=np.ones(1), terminateds=np.ones(1, bool),
                truncateds=np.zeros(1, bool), lambda_=1.0)
    with pytest.raises(ValueError):
        compute_gae(**{**args, **kwargs})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n=0"):
        compute_nstep(rewards=np.ones(1), terminateds=np.ones(1, bool), truncateds=np.zeros(1, bool), n=0, gamma=0.9)
