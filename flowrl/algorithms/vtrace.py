"""V-trace off-policy targets (IMPALA, Espeholt et al. 2018, https://arxiv.org/abs/1802.01561, §4.1).

For a trajectory piece ``x_s .. x_{s+n-1}`` sampled by a behaviour policy ``mu`` and learned by ``pi``, with
``rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))``, ``c_t = lambda min(1, pi(a_t|x_t) / mu(a_t|x_t))`` and
``delta_t V = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))``, the n-step V-trace target is

    v_s = V(x_s) + sum_{t=s}^{s+n-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t V

computed backwards as ``v_s - V(x_s) = delta_s V + gamma_s c_s (v_{s+1} - V(x_{s+1}))``, and the policy
gradient advantage is ``rho^pg_s (r_s + gamma_s v_{s+1} - V(x_s))`` with ``rho^pg_s`` clipped at
``clip_pg_rho_threshold``. Past a piece's last step, ``v`` is the bootstrap value ``V(x_{s+n})``.

``lambda`` (the paper's §4.1 remark: ``c_i = lambda min(c_bar, rho_i)``) is 1 in the paper's V-trace. Below 1
it cuts the traces as GAE's lambda does: on-policy, ``v_s - V(x_s)`` is then GAE(gamma, lambda)'s advantage, trading
the variance of long returns for the bias of the value function.

``gamma_t`` is a per-step discount: 0 where the episode terminated at step ``t`` (no future value), ``gamma``
otherwise. A truncated episode, or a fragment cut mid-episode, keeps ``gamma`` and bootstraps from the value of
its next observation. Everything here is a target: it is computed without gradients.

Examples:
    >>> T, B = 3, 1
    >>> zeros = torch.zeros(T, B)
    >>> out = vtrace(behaviour_logp=zeros, target_logp=zeros, rewards=torch.ones(T, B), values=zeros,
    ...              bootstrap_value=torch.tensor([10.0]), discounts=torch.full((T, B), 0.5))
    >>> out.vs[:, 0].tolist()  # on-policy: discounted returns 1 + .5 + .25 + .125 * 10 ...
    [3.0, 4.0, 6.0]
    >>> out.pg_advantages[:, 0].tolist()
    [3.0, 4.0, 6.0]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["VTraceReturns", "vtrace"]


@dataclass(frozen=True)
class VTraceReturns:
    """What :func:`vtrace` returns, each shaped like its ``values`` input.

    Attributes:
        vs: the V-trace value targets ``v_s``.
        pg_advantages: ``rho^pg_s (r_s + gamma_s v_{s+1} - V(x_s))``, the policy gradient's advantages.
        clipped_rhos: ``min(rho_bar, pi / mu)`` per step (for stats).
    """

    vs: torch.Tensor
    pg_advantages: torch.Tensor
    clipped_rhos: torch.Tensor


def _clip(x: torch.Tensor, threshold: float | None) -> torch.Tensor:
    return x if threshold is None else x.clamp(max=threshold)


@torch.no_grad()
def vtrace(*, behaviour_logp: torch.Tensor, target_logp: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor,
           bootstrap_value: torch.Tensor, discounts: torch.Tensor, clip_rho_threshold: float | None = 1.0,
           clip_pg_rho_threshold: float | None = 1.0, ends: torch.Tensor | None = None,
           lambda_: float = 1.0) -> VTraceReturns:
    """V-trace targets over time-major tensors ``[T, B...]`` (B: a batch of sequences, possibly empty).

    Args:
        behaviour_logp: ``log mu(a_t|x_t)``, from the sampling policy.
        target_logp: ``log pi(a_t|x_t)``, from the policy being learned.
        rewards: ``r_t``.
        values: ``V(x_t)`` under the learned policy's value function.
        bootstrap_value: ``V(x_T)``, the value after the last step, shaped ``[B...]``; or ``V(x'_t)``, the
            value of every step's next observation, shaped ``[T, B...]``, read where a piece ends.
        discounts: ``gamma_t``: 0 where the episode terminated at step ``t``, else ``gamma``.
        clip_rho_threshold: ``rho_bar``, the clip of the weights in ``delta_t V`` (``None``: no clipping).
        clip_pg_rho_threshold: the clip of the policy gradient's weights (``None``: no clipping).
        ends: optional bool ``[T, B...]``, true where a step is the last of its trajectory piece (an episode
            that terminated or was truncated there); the recursion then does not carry back across it and
            ``v_{t+1}`` is the bootstrap value ``bootstrap_value[t]`` (per-step form needed). The last step
            always ends a piece.
        lambda_: the traces' ``lambda`` in ``[0, 1]`` (1: the paper's V-trace).

    Returns:
        :class:`VTraceReturns` with ``vs`` and ``pg_advantages``.

    Raises:
        ValueError: mismatched shapes, ``ends`` without per-step bootstrap values, or ``lambda_`` outside [0, 1].
    """
    shape = values.shape
    for name, x in (("behaviour_logp", behaviour_logp), ("target_logp", target_logp), ("rewards", rewards),
                    ("discounts", discounts)):
        if x.shape != shape:
            raise ValueError(f"vtrace: {name} has shape {tuple(x.shape)} but values has {tuple(shape)}; pass "
                             f"time-major [T, B...] tensors of one shape")
    if len(shape) == 0 or shape[0] == 0:
        raise ValueError(f"vtrace: values of shape {tuple(shape)} hold no time steps; pass [T >= 1, B...] tensors")
    per_step = bootstrap_value.shape == shape
    if not per_step and bootstrap_value.shape != shape[1:]:
        raise ValueError(f"vtrace: bootstrap_value has shape {tuple(bootstrap_value.shape)}; pass V(x_T) shaped "
                         f"{tuple(shape[1:])} or per-step next values shaped {tuple(shape)}")
    if ends is not None and (ends.shape != shape or not per_step):
        raise ValueError(f"vtrace: ends (shape {None if ends is None else tuple(ends.shape)}) needs the shape of "
                         f"values {tuple(shape)} and per-step bootstrap values")

    if not 0.0 <= lambda_ <= 1.0:
        raise ValueError(f"vtrace: lambda_={lambda_!r} must lie in [0, 1] (1: the paper's V-trace)")
    rhos = torch.exp(target_logp - behaviour_logp)
    clipped_rhos = _clip(rhos, clip_rho_threshold)
    cs = lambda_ * rhos.clamp(max=1.0)
    last_bootstrap = bootstrap_value[-1] if per_step else bootstrap_value
    values_tp1 = torch.cat([values[1:], last_bootstrap.unsqueeze(0)])  # V(x_{t+1}) within a piece
    carries = torch.ones_like(values)  # 1 where v_{t+1} - V(x_{t+1}) flows back into step t
    carries[-1] = 0.0
    if ends is not None:
        values_tp1 = torch.where(ends, bootstrap_value, values_tp1)
        carries = carries * (~ends).to(values.dtype)
    deltas = clipped_rhos * (rewards + discounts * values_tp1 - values)
    decay = discounts * cs * carries

    vs_minus_v = torch.empty_like(values)
    acc = torch.zeros_like(values[0])
    for t in range(shape[0] - 1, -1, -1):
        acc = deltas[t] + decay[t] * acc
        vs_minus_v[t] = acc
    vs = values + vs_minus_v
    # v_{t+1}: the next target inside a piece, the bootstrap value past its end
    vs_tp1 = values_tp1 + carries * torch.cat([vs_minus_v[1:], torch.zeros_like(vs_minus_v[:1])])
    pg_advantages = _clip(rhos, clip_pg_rho_threshold) * (rewards + discounts * vs_tp1 - values)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages, clipped_rhos=clipped_rhos)
