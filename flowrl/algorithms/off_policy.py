"""What the replay-based (off-policy) algorithms share: the replay settings of DQN, DDPG, TD3 and SAC, their
n-step postprocessing, and the helpers of the continuous-control policies (RLlib Flow,
https://arxiv.org/abs/2011.12719: "DDPG analogously" to DQN's dataflow).

:class:`OffPolicyConfig` holds what :func:`flowrl.algorithms.dqn.plan` — the two sub-flows that store rollouts
into a replay buffer and replay them into the learner — reads: the buffer, prioritized replay, n-step returns,
the target-network period and the training intensity. Each algorithm's config extends it with its loss and
model settings. :func:`nstep_postprocess` rewrites a trajectory piece with n-step windows, and
:func:`soft_update` moves a target network towards its online network. This module registers no algorithm.

Examples:
    >>> config = OffPolicyConfig(seed=0)
    >>> config.n_step, config.buffer_size, config.learning_starts, config.round_robin_weights
    (1, 50000, 1000, [1.0, 1.0])
    >>> OffPolicyConfig(n_step=8)
    Traceback (most recent call last):
    ...
    ValueError: rollout_fragment_length=4 is shorter than n_step=8; raise rollout_fragment_length to at least 8
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch
from torch import nn

from flowrl.config import TrainerConfig
from flowrl.postprocessing import compute_nstep
from flowrl.sample_batch import NEXT_OBS, REWARDS, TERMINATEDS, TRUNCATEDS, AnyBatch, SampleBatch
from flowrl.validation import bounded
from flowrl.workers import WorkerSet

__all__ = ["OffPolicyConfig", "NSTEP_DISCOUNTS", "nstep_postprocess", "soft_update"]

NSTEP_DISCOUNTS = "nstep_discounts"  # gamma^m of each row's n-step window, 0 where the window terminated


@dataclass(frozen=True, kw_only=True)
class OffPolicyConfig(TrainerConfig):
    """The replay settings of the DQN family: :class:`~flowrl.config.TrainerConfig` plus a replay buffer.

    Attributes:
        num_workers: remote rollout workers (0: the driver samples between train steps).
        rollout_fragment_length: steps per env per stored fragment (4); at least ``n_step``.
        train_batch_size: rows per replayed train batch (32).
        timesteps_per_iteration: a report waits for 1000 new env steps (no wall-time gate).
        n_step: steps summed before bootstrapping (1).
        target_network_update_freq: sampled env steps between target-network updates (500; 0: after every train
            step, as soft ``tau`` updates want).
        buffer_size: timesteps the replay buffer holds (50000).
        learning_starts: timesteps stored before the first replay (1000).
        prioritized_replay: proportional prioritized replay (True) or uniform replay (False).
        prioritized_replay_alpha / _beta / _eps: priority exponent (0.6), importance-weight exponent (0.4)
            and the constant added to ``|td_error|`` (1e-6).
        replay_mode / replay_sequence_length: as for :class:`~flowrl.replay_buffers.LocalReplayBuffer`.
        training_intensity: trained steps per sampled step; ``None`` alternates one store and one replay.
            See :attr:`round_robin_weights`.
        before_learn_on_batch: ``hook(batch, workers, config) -> batch`` applied to each replayed batch.
    """

    num_workers: int = 0
    rollout_fragment_length: int = 4
    train_batch_size: int = 32
    timesteps_per_iteration: int = 1000
    n_step: int = bounded(1, ge=1, meaning="steps per return, 1: one-step TD")
    target_network_update_freq: int = bounded(500, ge=0, meaning="steps between target-network updates")
    buffer_size: int = bounded(50000, ge=1, meaning="timesteps the replay buffer holds")
    learning_starts: int = bounded(1000, ge=0, meaning="timesteps stored before the first replay")
    prioritized_replay: bool = True
    prioritized_replay_alpha: float = 0.6
    prioritized_replay_beta: float = bounded(0.4, ge=0, meaning="0: no importance weighting")
    prioritized_replay_eps: float = bounded(1e-6, gt=0, meaning="added to |td_error| in each priority")
    replay_mode: Literal["independent", "lockstep"] = "independent"
    replay_sequence_length: int = bounded(1, ge=1, meaning="timesteps per stored item")
    training_intensity: float | None = bounded(
        None, gt=0, meaning="trained steps per sampled step; None: one replay per store")
    before_learn_on_batch: Callable[[AnyBatch, WorkerSet, OffPolicyConfig], AnyBatch] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rollout_fragment_length < self.n_step:
            raise ValueError(f"rollout_fragment_length={self.rollout_fragment_length} is shorter than n_step="
                             f"{self.n_step}; raise rollout_fragment_length to at least {self.n_step}")
        if self.replay_mode not in ("independent", "lockstep"):
            raise ValueError(f"replay_mode={self.replay_mode!r}; use 'independent' or 'lockstep'")
        if self.prioritized_replay:
            if not self.prioritized_replay_alpha > 0:
                raise ValueError(f"prioritized_replay_alpha={self.prioritized_replay_alpha!r} must be > 0 with "
                                 f"prioritized_replay=True; raise it (e.g. 0.6) or set prioritized_replay=False")
            if self.replay_mode == "lockstep":
                raise ValueError("replay_mode='lockstep' replays uniformly, so prioritized_replay=True has no "
                                 "priorities to update; set prioritized_replay=False or replay_mode='independent'")
            if not self.use_simple_optimizer:
                raise ValueError(f"prioritized_replay=True with the multi-device learner (num_gpus={self.num_gpus}) "
                                 f"is unsupported: MultiGPUTrainOneStep reports no per-row td_error; set "
                                 f"prioritized_replay=False or simple_optimizer=True")

    @property
    def round_robin_weights(self) -> list[float]:
        """The plan's ``[store, replay]`` pulls per round-robin turn.

        ``[1, 1]`` without ``training_intensity``; otherwise ``[1, training_intensity / native_ratio]`` with
        ``native_ratio = train_batch_size / steps_per_store_item``, where one store item is one fragment from
        every worker: ``rollout_fragment_length x num_envs_per_worker x max(num_workers, 1)`` steps (zero
        remote workers: the local worker samples one fragment).
        """
        if self.training_intensity is None:
            return [1.0, 1.0]
        steps_per_store_item = self.rollout_fragment_length * self.num_envs_per_worker * max(self.num_workers, 1)
        native_ratio = self.train_batch_size / steps_per_store_item
        return [1.0, self.training_intensity / native_ratio]

    @property
    def actual_train_batch_size(self) -> int | None:
        """``train_batch_size``: ``Replay`` draws exactly that many rows, whatever the fragments."""
        return self.train_batch_size


def nstep_postprocess(batch: SampleBatch, *, n_step: int, gamma: float) -> SampleBatch:
    """Rewrites one env's time-ordered rows (which may span episodes) with n-step windows, in place.

    ``rewards`` become ``sum_{k<m} gamma^k r_{t+k}``, ``new_obs`` the observation after the window,
    ``terminateds`` whether the window ended in a terminal state, and the column ``nstep_discounts`` holds
    ``gamma^m`` (0 when terminated); see :func:`~flowrl.postprocessing.compute_nstep`. A window stops at the
    episode's end: a terminated episode does not bootstrap, a truncated one (time limit) or a fragment cut
    mid-episode does.
    """
    returns, next_index, terminated, discounts = compute_nstep(
        rewards=batch[REWARDS], terminateds=batch[TERMINATEDS], truncateds=batch[TRUNCATEDS], n=n_step, gamma=gamma)
    batch[REWARDS], batch[NEXT_OBS] = returns, batch[NEXT_OBS][next_index]
    batch[TERMINATEDS], batch[NSTEP_DISCOUNTS] = terminated, discounts
    return batch


@torch.no_grad()
def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """``target <- (1 - tau) target + tau source``, parameter by parameter (``tau=1``: a copy).

    Examples:
        >>> target, source = nn.Linear(1, 1).requires_grad_(False), nn.Linear(1, 1)
        >>> _ = target.weight.fill_(0.0), source.weight.data.fill_(1.0)
        >>> soft_update(target, source, 0.25); target.weight.item()
        0.25
    """
    targets: list[torch.Tensor] = list(target.parameters())
    sources: list[torch.Tensor] = list(source.parameters())
    if tau >= 1.0:
        torch._foreach_copy_(targets, sources)
    else:
        torch._foreach_lerp_(targets, sources, tau)
