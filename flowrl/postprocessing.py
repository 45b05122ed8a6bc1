"""Trajectory postprocessing as plain numpy: Generalized Advantage Estimation and n-step returns.

Bootstrapping follows gymnasium's two ways for an episode to stop: a *terminated* transition (a
terminal state) has no future value; a *truncated* one (a time limit) and a fragment that was cut
mid-episode bootstrap from the value of the next observation.

Examples:
    >>> adv, targets = compute_gae(rewards=np.array([1.0, 1.0]), values=np.array([0.5, 0.5]),
    ...                            next_values=np.array([0.5, 9.0]), terminateds=np.array([False, True]),
    ...                            truncateds=np.array([False, False]), gamma=1.0, lambda_=1.0)
    >>> adv.tolist(), targets.tolist()
    ([1.5, 0.5], [2.0, 1.0])
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from flowrl.sample_batch import (ADVANTAGES, NEXT_OBS, REWARDS, TERMINATEDS, TRUNCATEDS, VALUE_TARGETS, VF_PREDS,
                                 SampleBatch)
from flowrl.validation import check_int

__all__ = ["compute_gae", "discounted_returns", "compute_nstep", "add_advantages"]


def _check_discount(gamma: float, lambda_: float = 1.0) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma={gamma} must be in [0, 1]")
    if not 0.0 <= lambda_ <= 1.0:
        raise ValueError(f"lambda_={lambda_} must be in [0, 1]")


def compute_gae(*, rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray, terminateds: np.ndarray,
                truncateds: np.ndarray, gamma: float, lambda_: float) -> tuple[np.ndarray, np.ndarray]:
    """GAE(gamma, lambda) over one env's time-ordered steps, which may span several episodes.

    Args:
        rewards: ``r_t``, shape [T].
        values: ``V(s_t)``, shape [T].
        next_values: ``V(s'_t)`` of each transition's next observation, shape [T]; read only where
            the episode did not terminate.
        terminateds: True where ``s'_t`` is terminal (no bootstrap).
        truncateds: True where the episode was cut by a time limit (bootstrap, then stop the recursion).
        gamma: discount. lambda_: GAE's bias-variance trade-off.

    Returns:
        ``(advantages, value_targets)``, float32 [T]; ``value_targets = advantages + values``.
    """
    _check_discount(gamma, lambda_)
    rewards, values, next_values = (np.asarray(x, dtype=np.float64) for x in (rewards, values, next_values))
    terminated, boundary = np.asarray(terminateds, bool), np.asarray(terminateds, bool) | np.asarray(truncateds, bool)
    deltas = rewards + gamma * np.where(terminated, 0.0, next_values) - values
    out, running, decay = [0.0] * len(deltas), 0.0, gamma * lambda_
    for t, delta, cut in zip(range(len(deltas) - 1, -1, -1), deltas[::-1].tolist(), boundary[::-1].tolist()):
        running = delta + (0.0 if cut else decay * running)  # Python floats: same float64 math, 3x faster loop
        out[t] = running
    advantages = np.asarray(out)
    return advantages.astype(np.float32), (advantages + values).astype(np.float32)


def discounted_returns(*, rewards: np.ndarray, terminateds: np.ndarray, truncateds: np.ndarray,
                       gamma: float, bootstrap: np.ndarray | None = None) -> np.ndarray:
    """Discounted reward-to-go per step, restarting at episode boundaries.

    Args:
        bootstrap: optional ``V(s'_t)`` per step, added (discounted) where a non-terminal boundary or
            the end of the data cuts an episode; ``None`` treats every cut as zero-valued (REINFORCE).

    Examples:
        >>> discounted_returns(rewards=np.ones(3), terminateds=np.array([0, 0, 1], bool),
        ...                    truncateds=np.zeros(3, bool), gamma=0.5).tolist()
        [1.75, 1.5, 1.0]
    """
    _check_discount(gamma)
    rewards = np.asarray(rewards, dtype=np.float64)
    terminated = np.asarray(terminateds, bool)
    boundary = terminated | np.asarray(truncateds, bool)
    last = len(rewards) - 1
    out, running = [0.0] * len(rewards), 0.0
    ends = (boundary[::-1] | (np.arange(last, -1, -1) == last)).tolist()
    boot = [0.0] * len(rewards) if bootstrap is None else np.asarray(bootstrap, np.float64)[::-1].tolist()
    for t, reward, cut, term, value in zip(range(last, -1, -1), rewards[::-1].tolist(), ends,
                                           terminated[::-1].tolist(), boot):
        running = reward + gamma * ((0.0 if term else value) if cut else running)  # Python floats: faster loop
        out[t] = running
    return np.asarray(out, np.float32)


def compute_nstep(*, rewards: np.ndarray, terminateds: np.ndarray, truncateds: np.ndarray, n: int,
                  gamma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """n-step returns over one env's time-ordered steps; windows stop at episode ends and at the data's end.

    For each step ``t`` with window length ``m = min(n, steps to the episode's last step in the data)``:
    ``R_t = sum_{k<m} gamma^k r_{t+k}``; the bootstrap observation is ``new_obs[t+m-1]``, whose value
    counts with ``gamma^m`` unless that transition terminated.

    Returns:
        ``(returns, next_index, terminateds, discounts)``: float32 [T], int64 [T] (row holding the
        bootstrap ``new_obs``), bool [T] (no bootstrap), float32 [T] (``gamma^m``, 0 where terminated).

    Examples:
        >>> r, idx, term, disc = compute_nstep(rewards=np.ones(3), terminateds=np.array([0, 0, 1], bool),
        ...                                    truncateds=np.zeros(3, bool), n=2, gamma=0.5)
        >>> r.tolist(), idx.tolist(), term.tolist(), disc.tolist()
        ([1.5, 1.5, 1.0], [1, 2, 2], [False, True, True], [0.25, 0.0, 0.0])
    """
    check_int("n", n, 1, "1 is the one-step return")
    _check_discount(gamma)
    rewards = np.asarray(rewards, dtype=np.float64)
    terminated = np.asarray(terminateds, bool)
    boundary = terminated | np.asarray(truncateds, bool)
    size = len(rewards)
    returns = np.zeros(size)
    next_index = np.arange(size, dtype=np.int64)
    done = np.zeros(size, dtype=bool)
    discounts = np.zeros(size)
    for t in range(size):
        total, k = 0.0, 0
        while True:
            total += gamma ** k * rewards[t + k]
            if k + 1 == n or boundary[t + k] or t + k + 1 == size:
                break
            k += 1
        returns[t], next_index[t], done[t] = total, t + k, terminated[t + k]
        discounts[t] = 0.0 if done[t] else gamma ** (k + 1)
    return returns.astype(np.float32), next_index, done, discounts.astype(np.float32)


def add_advantages(batch: SampleBatch, value_fn: Callable[..., np.ndarray], *, gamma: float,
                   lambda_: float, use_gae: bool = True, state_columns: Sequence[str] = ()) -> SampleBatch:
    """Adds ``advantages`` and ``value_targets`` to one trajectory piece (one env, one episode or part of one).

    ``V(s_{t+1})`` inside the piece is the sampled ``vf_preds`` of the next row. The last row (and any
    truncated row) bootstraps from ``value_fn(new_obs)`` unless its episode terminated. With ``use_gae``
    the columns are GAE(gamma, lambda_) and ``advantages + vf_preds``; without, ``value_targets`` are the
    bootstrapped discounted returns and ``advantages = value_targets - vf_preds``.

    Args:
        batch: the piece, with ``rewards``, ``vf_preds``, ``terminateds``, ``truncateds`` and ``new_obs``.
        value_fn: ``V`` for a batch of observations (a policy's :meth:`~flowrl.policy.Policy.value`); with
            ``state_columns``, ``value_fn(obs, states)`` where ``states`` holds those columns at the bootstrapped
            rows (a recurrent policy's :meth:`~flowrl.policy.Policy.value_with_state` with its ``state_out_*``).

    Returns:
        ``batch``, with the two columns added in place.

    Examples:
        >>> piece = SampleBatch({REWARDS: np.ones(2, np.float32), VF_PREDS: np.full(2, 0.5, np.float32),
        ...                      NEXT_OBS: np.zeros((2, 1), np.float32), TERMINATEDS: np.zeros(2, bool),
        ...                      TRUNCATEDS: np.zeros(2, bool)})  # cut mid-episode: bootstrap V(new_obs) = 9
        >>> out = add_advantages(piece, lambda obs: np.full(len(obs), 9.0, np.float32), gamma=1.0, lambda_=1.0)
        >>> out[ADVANTAGES].tolist(), out[VALUE_TARGETS].tolist()
        ([10.5, 9.5], [11.0, 10.0])
    """
    values, terminated, truncated = batch[VF_PREDS], batch[TERMINATEDS], batch[TRUNCATEDS]
    bootstrap = truncated.copy()
    bootstrap[-1:] = True  # the piece's last row ends its episode or cuts it
    bootstrap &= ~terminated
    next_values = np.append(values[1:], np.float32(0.0)).astype(np.float32)  # V(s_{t+1}) inside the piece
    if bootstrap.any():
        if state_columns:
            next_values[bootstrap] = value_fn(batch[NEXT_OBS][bootstrap],
                                              tuple(batch[c][bootstrap] for c in state_columns))
        else:
            next_values[bootstrap] = value_fn(batch[NEXT_OBS][bootstrap])
    if use_gae:
        batch[ADVANTAGES], batch[VALUE_TARGETS] = compute_gae(
            rewards=batch[REWARDS], values=values, next_values=next_values, terminateds=terminated,
            truncateds=truncated, gamma=gamma, lambda_=lambda_)
    else:
        batch[VALUE_TARGETS] = discounted_returns(rewards=batch[REWARDS], terminateds=terminated,
                                                  truncateds=truncated, gamma=gamma, bootstrap=next_values)
        batch[ADVANTAGES] = batch[VALUE_TARGETS] - values.astype(np.float32)
    return batch
