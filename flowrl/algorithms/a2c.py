"""A2C: synchronous advantage actor-critic (RLlib Flow, https://arxiv.org/abs/2011.12719; A3C's synchronous
variant, https://arxiv.org/abs/1602.01783).

Dataflow: the workers sample short fragments in lockstep (``ParallelRollouts(bulk_sync)``),
the fragments are concatenated to ``train_batch_size`` steps, and each batch takes one gradient step that is
then broadcast to every worker (``TrainOneStep``, or ``MultiGPUTrainOneStep`` for the multi-device learner).
With ``microbatch_size`` the batch is cut into microbatches whose gradients are computed one at a time,
averaged over ``k = ceil(train_batch_size / microbatch_size)`` and applied once (``ApplyGradients``).

The policy is the actor-critic one that A2C and A3C share
(:class:`~flowrl.algorithms.actor_critic.ActorCriticPolicy`): GAE advantages, and the loss
``policy gradient + vf_loss_coeff * value loss - entropy_coeff * entropy``, with gradients clipped to
``grad_clip``.

Examples:
    >>> config = A2CConfig(env="CartPole-v1", train_batch_size=40, microbatch_size=20)
    >>> config.rollout_fragment_length, config.timesteps_per_iteration, config.microbatches_per_step
    (20, 1000, 2)
    >>> A2CConfig(entropy_coeff=-0.1)
    Traceback (most recent call last):
    ...
    ValueError: entropy_coeff=-0.1 must be a number >= 0 (0 turns the entropy bonus off)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from flowrl.algorithms import Algorithm
from flowrl.algorithms.actor_critic import ActorCriticConfig, ActorCriticPolicy
from flowrl.iter import LocalIterator
from flowrl.ops.metrics import StandardMetricsReporting
from flowrl.ops.rollout import ConcatBatches, ParallelRollouts
from flowrl.ops.train import ApplyGradients, AverageGradients, ComputeGradients, train_one_step
from flowrl.validation import bounded
from flowrl.workers import WorkerSet

__all__ = ["ActorCriticConfig", "ActorCriticPolicy", "A2CConfig", "plan", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class A2CConfig(ActorCriticConfig):
    """A2C's config.

    Attributes:
        rollout_fragment_length: 20 steps per env per sample.
        timesteps_per_iteration: 1000; a report comes at the first train step after that many new env steps
            (no wall-time gate: ``min_iter_time_s`` is 0, as in :class:`~flowrl.config.TrainerConfig`).
        microbatch_size: ``None`` trains on whole batches; an int computes gradients on microbatches of
            that many steps and applies their mean once per :attr:`microbatches_per_step` microbatches.
    """

    rollout_fragment_length: int = 20
    timesteps_per_iteration: int = 1000
    microbatch_size: int | None = bounded(None, ge=1, meaning="steps per microbatch; None trains on whole batches")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.microbatch_size is not None and not self.use_simple_optimizer:
            raise ValueError(f"microbatch_size={self.microbatch_size} computes gradients on the local worker and "
                             f"cannot use the multi-GPU learner (num_gpus={self.num_gpus}, simple_optimizer="
                             f"{self.simple_optimizer}); set microbatch_size=None or simple_optimizer=True")

    @property
    def actual_train_batch_size(self) -> int | None:
        """As :class:`~flowrl.config.TrainerConfig`'s; with microbatches, :attr:`microbatches_per_step` microbatches
        of ``microbatch_size`` steps, each rounded up to whole samples."""
        if self.microbatch_size is None or self.batch_mode != "truncate_episodes" \
                or self.count_steps_by != "env_steps":
            return super().actual_train_batch_size
        item = self.sample_item_size
        return self.microbatches_per_step * -(-self.microbatch_size // item) * item

    def train_batch_size_warning(self) -> str | None:
        """As :class:`~flowrl.config.TrainerConfig`'s; with microbatches, about ``microbatch_size``."""
        actual = self.actual_train_batch_size
        if self.microbatch_size is None or actual is None or actual == self.train_batch_size:
            return super().train_batch_size_warning()
        item, k = self.sample_item_size, self.microbatches_per_step
        return (f"microbatch_size={self.microbatch_size} cannot be met: each microbatch will hold "
                f"{actual // k} steps (whole samples of {item} steps), so each update averages {k} of them, {actual} "
                f"steps instead of train_batch_size={self.train_batch_size}; make microbatch_size a multiple of "
                f"{item} that divides train_batch_size")

    @property
    def microbatches_per_step(self) -> int:
        """k = ceil(train_batch_size / microbatch_size): microbatch gradients averaged per update (1 without)."""
        return 1 if self.microbatch_size is None else math.ceil(self.train_batch_size / self.microbatch_size)


def plan(workers: WorkerSet, config: A2CConfig) -> LocalIterator[dict[str, Any]]:
    """A2C: sample in lockstep, concat, then train + broadcast, or average microbatch
    gradients and apply them; report.

    Examples:
        >>> config = A2CConfig(seed=0, num_workers=0, train_batch_size=40, microbatch_size=20,
        ...                    timesteps_per_iteration=0)
        >>> it = plan(WorkerSet(policy_class=ActorCriticPolicy, config=config), config)
        >>> repr(it).startswith("LocalIterator[ParallelRollouts(bulk_sync).combine(ConcatBatches(20))"
        ...                     ".for_each(ComputeGradients).batch(2).for_each(AverageGradients)"
        ...                     ".for_each(ApplyGradients)")
        True
        >>> next(it)["info"]["num_steps_trained"]
        40
    """
    rollouts = ParallelRollouts(workers, mode="bulk_sync")
    if config.microbatch_size is not None:
        train_op = (rollouts
                    .combine(ConcatBatches(config.microbatch_size, config.count_steps_by))
                    .for_each(ComputeGradients(workers))
                    .batch(config.microbatches_per_step)
                    .for_each(AverageGradients())
                    .for_each(ApplyGradients(workers)))
    else:
        train_op = (rollouts
                    .combine(ConcatBatches(config.train_batch_size, config.count_steps_by))
                    .for_each(train_one_step(workers, config)))
    return StandardMetricsReporting(train_op, workers, config)


ALGORITHM = Algorithm("a2c", A2CConfig, ActorCriticPolicy, plan)
