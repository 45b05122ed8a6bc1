"""What the actor-critic algorithms share: the loss settings and policy of A2C and A3C, and the adaptive KL
coefficient of PPO and APPO (RLlib Flow, https://arxiv.org/abs/2011.12719; A3C, https://arxiv.org/abs/1602.01783).

:class:`ActorCriticConfig` and :class:`ActorCriticPolicy` are the advantage actor-critic of A2C
(:mod:`flowrl.algorithms.a2c`) and A3C (:mod:`flowrl.algorithms.a3c`), which differ only in their dataflow:
GAE advantages, and the loss ``policy gradient + vf_loss_coeff * value loss - entropy_coeff * entropy``, with
gradients clipped to ``grad_clip``. :func:`adapt_kl_coeff` is RLlib's schedule for the KL penalty's
coefficient, which PPO and APPO policies follow. This module registers no algorithm.

Examples:
    >>> config = ActorCriticConfig(seed=0)
    >>> config.use_gae, config.lambda_, config.vf_loss_coeff, config.entropy_coeff, config.lr
    (True, 1.0, 0.5, 0.01, 0.0001)
    >>> ActorCriticConfig(entropy_coeff=-0.1)
    Traceback (most recent call last):
    ...
    ValueError: entropy_coeff=-0.1 must be a number >= 0 (0 turns the entropy bonus off)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from flowrl.config import TrainerConfig
from flowrl.policy import Policy, TensorBatch
from flowrl.sample_batch import (ACTIONS, ADVANTAGES, NEXT_OBS, OBS, REWARDS, TERMINATEDS, TRUNCATEDS, VALUE_TARGETS,
                                 VF_PREDS, SampleBatch)
from flowrl.validation import bounded

__all__ = ["ActorCriticConfig", "ActorCriticPolicy", "adapt_kl_coeff"]


@dataclass(frozen=True, kw_only=True)
class ActorCriticConfig(TrainerConfig):
    """The actor-critic loss settings that A2C and A3C share (RLlib's A3C defaults).

    Attributes:
        use_gae: advantages by GAE(gamma, lambda_) (True) or as discounted returns minus ``V(s)`` (False).
        lambda_: GAE's bias-variance trade-off, in [0, 1].
        vf_loss_coeff: weight of the value loss ``0.5 * mean((V(s) - value_target)^2)``.
        entropy_coeff: weight of the entropy bonus (subtracted from the loss).
        grad_clip: max global gradient norm (40), or ``None``.
        lr: Adam learning rate (1e-4).
    """

    trains_recurrent_models: ClassVar[bool] = True  # model.use_lstm: sequences with their stored initial states

    use_gae: bool = True
    lambda_: float = bounded(1.0, ge=0, le=1, meaning="1.0: Monte Carlo advantages, 0.0: one-step TD errors")
    vf_loss_coeff: float = bounded(0.5, ge=0, meaning="0 leaves the value head untrained")
    entropy_coeff: float = bounded(0.01, ge=0, meaning="0 turns the entropy bonus off")
    grad_clip: float | None = 40.0
    lr: float = 0.0001


class ActorCriticPolicy(Policy):
    """The advantage actor-critic policy of A2C and A3C.

    ``postprocess_trajectory`` adds ``advantages`` and ``value_targets`` to each trajectory piece
    (:func:`flowrl.postprocessing.add_advantages`): GAE over the sampled ``vf_preds`` (or discounted returns
    minus ``vf_preds`` when ``use_gae=False``). A terminated episode's last step has no future value; a truncated
    one, or a fragment cut mid-episode, bootstraps from ``V(new_obs)`` of its last row. ``loss`` is
    ``-mean(logp(a) * A) + vf_loss_coeff * 0.5 * mean((V(s) - target)^2) - entropy_coeff * mean(entropy)``;
    ``grad_clip`` clips the gradients.

    Args:
        observation_space / action_space: as for :class:`~flowrl.policy.Policy`.
        config: an :class:`ActorCriticConfig` (``A2CConfig``, ``A3CConfig``).

    Raises:
        TypeError: a config without the actor-critic loss settings.

    Examples:
        >>> policy = ActorCriticPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2),
        ...                            ActorCriticConfig(gamma=1.0, seed=0))
        >>> piece = SampleBatch({OBS: np.zeros((2, 4), np.float32), NEXT_OBS: np.zeros((2, 4), np.float32),
        ...                      ACTIONS: np.zeros(2, np.int64), REWARDS: np.ones(2, np.float32),
        ...                      VF_PREDS: np.full(2, 0.5, np.float32), TERMINATEDS: np.array([False, True]),
        ...                      TRUNCATEDS: np.zeros(2, bool)})
        >>> out = policy.postprocess_trajectory(piece)
        >>> out[ADVANTAGES].tolist(), out[VALUE_TARGETS].tolist()
        ([1.5, 0.5], [2.0, 1.0])
        >>> sorted(policy.learn_on_batch(out)["learner_stats"])
        ['entropy', 'grad_gnorm', 'loss', 'policy_loss', 'vf_loss']
    """

    config: ActorCriticConfig
    config_class = ActorCriticConfig

    postprocess_spans_episodes = True  # its postprocessing restarts at every episode boundary

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        cfg = self.config
        return self.add_advantages(batch, gamma=cfg.gamma, lambda_=cfg.lambda_, use_gae=cfg.use_gae)

    def to_tensors(self, batch: SampleBatch) -> TensorBatch:
        """All numeric columns; a recurrent model gets the loss's columns with the padded sequences of
        :meth:`~flowrl.policy.Policy.sequence_tensors`."""
        if self.is_recurrent:
            return self.sequence_tensors(batch, [ACTIONS, ADVANTAGES, VALUE_TARGETS])
        return super().to_tensors(batch)

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        dist_inputs, values = self.forward_rows(batch)
        dist = self.action_distribution(dist_inputs)
        policy_loss = -(dist.logp(batch[ACTIONS]) * batch[ADVANTAGES]).mean()
        vf_loss = 0.5 * (values - batch[VALUE_TARGETS]).pow(2).mean()
        entropy = dist.entropy().mean()
        total = policy_loss + self.config.vf_loss_coeff * vf_loss - self.config.entropy_coeff * entropy
        return total, {"policy_loss": float(policy_loss.detach()), "vf_loss": float(vf_loss.detach()),
                       "entropy": float(entropy.detach())}


def adapt_kl_coeff(kl_coeff: float, sampled_kl: float, kl_target: float) -> float:
    """RLlib's adaptive KL penalty: x1.5 above ``2 * kl_target``, x0.5 below ``kl_target / 2``.

    Examples:
        >>> adapt_kl_coeff(0.2, 0.05, 0.01), adapt_kl_coeff(0.2, 0.001, 0.01), adapt_kl_coeff(0.2, 0.01, 0.01)
        (0.30000000000000004, 0.1, 0.2)
    """
    if sampled_kl > 2.0 * kl_target:
        return kl_coeff * 1.5
    if sampled_kl < 0.5 * kl_target:
        return kl_coeff * 0.5
    return kl_coeff
