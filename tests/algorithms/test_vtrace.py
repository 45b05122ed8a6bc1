"""V-trace against a reference written straight from the IMPALA paper's definition (arXiv:1802.01561 §4.1):
an explicit sum over time per trajectory piece, in numpy float64, on random inputs with terminated and
truncated steps inside the sequences."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrl.algorithms.vtrace import vtrace


def reference_vtrace(behaviour_logp: np.ndarray, target_logp: np.ndarray, rewards: np.ndarray, values: np.ndarray,
                     next_values: np.ndarray, discounts: np.ndarray, ends: np.ndarray, rho_bar: float,
                     pg_rho_bar: float, lam: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """One sequence ``[T]``. A piece runs up to and including a step with ``ends``; past its last step ``t``,
    ``V(x_{t+1}) = next_values[t]``. Inside a piece, ``V(x_{t+1}) = values[t+1]``.

    v_s = V(x_s) + sum_{t=s}^{e} (prod_{i=s}^{t-1} gamma_i c_i) rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)),
    c_i = lam min(1, pi/mu)_i
    pg_s = min(pg_rho_bar, pi/mu)_s (r_s + gamma_s v_{s+1} - V(x_s)),  v_{e+1} = V(x_{e+1}) (bootstrap)
    """
    n = len(values)
    ratio = np.exp(target_logp - behaviour_logp)
    rho, c = np.minimum(rho_bar, ratio), lam * np.minimum(1.0, ratio)
    vs, pg = np.zeros(n), np.zeros(n)
    start = 0
    for end in [i for i in range(n) if ends[i] or i == n - 1]:
        def v_next(t: int) -> float:
            return float(next_values[t]) if t == end else float(values[t + 1])

        for s in range(start, end + 1):
            total = 0.0
            for t in range(s, end + 1):
                weight = 1.0
                for i in range(s, t):
                    weight *= discounts[i] * c[i]
                total += weight * rho[t] * (rewards[t] + discounts[t] * v_next(t) - values[t])
            vs[s] = values[s] + total
        for s in range(start, end + 1):
            target_next = next_values[s] if s == end else vs[s + 1]
            pg[s] = min(pg_rho_bar, ratio[s]) * (rewards[s] + discounts[s] * target_next - values[s])
        start = end + 1
    return vs, pg


def random_sequences(rng: np.random.Generator, T: int, B: int, gamma: float = 0.9) -> dict[str, np.ndarray]:
    terminated = rng.random((T, B)) < 0.15
    truncated = (rng.random((T, B)) < 0.15) & ~terminated
    return {
        "behaviour_logp": np.log(rng.uniform(0.05, 1.0, (T, B))),
        "target_logp": np.log(rng.uniform(0.05, 1.0, (T, B))),
        "rewards": rng.normal(size=(T, B)),
        "values": rng.normal(size=(T, B)),
        "next_values": rng.normal(size=(T, B)),  # V(x'_t): read only where a piece ends
        "discounts": np.where(terminated, 0.0, gamma),
        "ends": terminated | truncated,
    }


def run_both(data: dict[str, np.ndarray], rho_bar: float, pg_rho_bar: float, per_step: bool = True,
             lam: float = 1.0) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    t = {k: torch.as_tensor(v) for k, v in data.items()}
    if per_step:
        out = vtrace(behaviour_logp=t["behaviour_logp"], target_logp=t["target_logp"], rewards=t["rewards"],
                     values=t["values"], bootstrap_value=t["next_values"], discounts=t["discounts"],
                     clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar, ends=t["ends"], lambda_=lam)
    else:  # the paper's form: one bootstrap value after the last step
        out = vtrace(behaviour_logp=t["behaviour_logp"], target_logp=t["target_logp"], rewards=t["rewards"],
                     values=t["values"], bootstrap_value=t["next_values"][-1], discounts=t["discounts"],
                     clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar, lambda_=lam)
    refs = []
    for b in range(data["values"].shape[1]):
        column = {k: v[:, b] for k, v in data.items()}
        refs.append(reference_vtrace(column["behaviour_logp"], column["target_logp"], column["rewards"],
                                     column["values"], column["next_values"], column["discounts"], column["ends"],
                                     rho_bar, pg_rho_bar, lam))
    expected = (np.stack([r[0] for r in refs], 1), np.stack([r[1] for r in refs], 1))
    return (out.vs.numpy(), out.pg_advantages.numpy()), expected


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("rho_bar, pg_rho_bar", [(1.0, 1.0), (0.5, 2.0), (1e9, 1e9)])
def test_vtrace_equals_the_paper_definition_with_terminated_and_truncated_steps(seed: int, rho_bar: float,
                                                                                pg_rho_bar: float) -> None:
    data = random_sequences(np.random.default_rng(seed), T=17, B=5)
    assert data["ends"].any() and (data["discounts"] == 0).any()  # both kinds of episode end occur
    (vs, pg), (ref_vs, ref_pg) = run_both(data, rho_bar, pg_rho_bar)
    np.testing.assert_allclose(vs, ref_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(pg, ref_pg, rtol=1e-10, atol=1e-10)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), T=st.integers(1, 12), B=st.integers(1, 3),
       gamma=st.floats(0.0, 1.0), rho_bar=st.floats(0.1, 3.0), pg_rho_bar=st.floats(0.1, 3.0),
       lam=st.floats(0.0, 1.0))
def test_vtrace_equals_the_reference_on_random_shapes(seed: int, T: int, B: int, gamma: float, rho_bar: float,
                                                      pg_rho_bar: float, lam: float) -> None:
    data = random_sequences(np.random.default_rng(seed), T=T, B=B, gamma=gamma)
    (vs, pg), (ref_vs, ref_pg) = run_both(data, rho_bar, pg_rho_bar, lam=lam)
    np.testing.assert_allclose(vs, ref_vs, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(pg, ref_pg, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_the_papers_single_bootstrap_form_matches_when_only_terminations_cut(seed: int) -> None:
    data = random_sequences(np.random.default_rng(seed), T=20, B=4)
    data["ends"] = np.zeros_like(data["ends"])  # terminations only: discount 0 cuts the recursion by itself
    (vs, pg), (ref_vs, ref_pg) = run_both(data, 1.0, 1.0, per_step=False)
    np.testing.assert_allclose(vs, ref_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(pg, ref_pg, rtol=1e-10, atol=1e-10)


def test_on_policy_without_clipping_gives_n_step_returns() -> None:
    T = 6
    rewards = torch.arange(1.0, T + 1, dtype=torch.float64).unsqueeze(1)
    zeros = torch.zeros(T, 1, dtype=torch.float64)
    values = torch.full((T, 1), 0.3, dtype=torch.float64)
    discounts = torch.full((T, 1), 0.9, dtype=torch.float64)
    out = vtrace(behaviour_logp=zeros, target_logp=zeros, rewards=rewards, values=values,
                 bootstrap_value=torch.tensor([2.0], dtype=torch.float64), discounts=discounts)
    returns, g = [], 2.0
    for r in reversed(rewards[:, 0].tolist()):
        g = r + 0.9 * g
        returns.append(g)
    np.testing.assert_allclose(out.vs[:, 0].numpy(), returns[::-1])
    np.testing.assert_allclose(out.pg_advantages[:, 0].numpy(), np.array(returns[::-1]) - 0.3)


def test_targets_carry_no_gradient() -> None:
    values = torch.zeros(4, 2, requires_grad=True)
    logp = torch.zeros(4, 2, requires_grad=True)
    out = vtrace(behaviour_logp=torch.zeros(4, 2), target_logp=logp, rewards=torch.ones(4, 2), values=values,
                 bootstrap_value=torch.zeros(2), discounts=torch.ones(4, 2))
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad


@pytest.mark.parametrize("kwargs, message", [
    ({"rewards": torch.zeros(3, 1)}, "rewards has shape"),
    ({"bootstrap_value": torch.zeros(3)}, "bootstrap_value has shape"),
    ({"ends": torch.zeros(4, 2, dtype=torch.bool)}, "per-step bootstrap values"),
])
def test_shape_errors_name_the_argument(kwargs: dict[str, torch.Tensor], message: str) -> None:
    args = {"behaviour_logp": torch.zeros(4, 2), "target_logp": torch.zeros(4, 2), "rewards": torch.zeros(4, 2),
            "values": torch.zeros(4, 2), "bootstrap_value": torch.zeros(2), "discounts": torch.zeros(4, 2)}
    with pytest.raises(ValueError, match=message):
        vtrace(**{**args, **kwargs})  # type: ignore[arg-type]  # the point of the test


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95])
def test_on_policy_lambda_gives_gae_advantages_and_lambda_returns(lam: float) -> None:
    """On-policy, ``v_s - V(x_s)`` is GAE(gamma, lambda)'s advantage ``sum_k (gamma lambda)^k delta_{s+k}``, and
    the policy gradient's advantage is ``delta_s + gamma (v_{s+1} - V(x_{s+1}))``; lambda 0 gives TD(0) targets."""
    rng = np.random.default_rng(7)
    T, gamma = 9, 0.9
    rewards, values = rng.normal(size=T), rng.normal(size=T)
    bootstrap = 0.7
    zeros = torch.zeros(T, 1, dtype=torch.float64)
    out = vtrace(behaviour_logp=zeros, target_logp=zeros, rewards=torch.as_tensor(rewards)[:, None],
                 values=torch.as_tensor(values)[:, None],
                 bootstrap_value=torch.tensor([bootstrap], dtype=torch.float64),
                 discounts=torch.full((T, 1), gamma, dtype=torch.float64), lambda_=lam)
    next_values = np.append(values[1:], bootstrap)
    deltas = rewards + gamma * next_values - values
    gae = np.array([sum((gamma * lam) ** k * deltas[s + k] for k in range(T - s)) for s in range(T)])
    np.testing.assert_allclose(out.vs[:, 0].numpy() - values, gae, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.pg_advantages[:, 0].numpy(), deltas + gamma * np.append(gae[1:], 0.0),
                               rtol=1e-12, atol=1e-12)
    if lam == 0.0:
        np.testing.assert_allclose(out.vs[:, 0].numpy(), rewards + gamma * next_values, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("lam", [-0.1, 1.5, float("nan")])
def test_a_lambda_outside_0_1_is_refused(lam: float) -> None:
    zeros = torch.zeros(3, 1)
    with pytest.raises(ValueError, match="lambda_=.* must lie in \\[0, 1\\]"):
        vtrace(behaviour_logp=zeros, target_logp=zeros, rewards=zeros, values=zeros, bootstrap_value=torch.zeros(1),
               discounts=zeros, lambda_=lam)
