"""A3C: asynchronous advantage actor-critic (RLlib Flow, https://arxiv.org/abs/2011.12719; A3C,
https://arxiv.org/abs/1602.01783).

Dataflow: every remote worker samples a short fragment and computes the gradients of
the actor-critic loss on it, with one request in flight per worker (``AsyncGradients``). The driver applies
each gradient to the local policy as it arrives and sends the new weights back to the worker that
produced it only (``ApplyGradients(update_all=False)``), which then samples its next fragment.
The policy is A2C's :class:`~flowrl.algorithms.actor_critic.ActorCriticPolicy`; only the dataflow differs.

Examples:
    >>> config = A3CConfig(env="CartPole-v1", num_workers=2)
    >>> config.rollout_fragment_length, config.timesteps_per_iteration, config.min_iter_time_s, config.lr
    (10, 1000, 0, 0.0001)
    >>> A3CConfig(num_workers=0)
    Traceback (most recent call last):
    ...
    ValueError: num_workers=0: A3C computes gradients on remote workers and needs num_workers >= 1; use a2c ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowrl.algorithms import Algorithm
from flowrl.algorithms.actor_critic import ActorCriticConfig, ActorCriticPolicy
from flowrl.config import TrainerConfig
from flowrl.iter import LocalIterator
from flowrl.ops.metrics import StandardMetricsReporting
from flowrl.ops.rollout import AsyncGradients
from flowrl.ops.train import ApplyGradients
from flowrl.workers import WorkerSet

__all__ = ["A3CConfig", "plan", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class A3CConfig(ActorCriticConfig):
    """A3C's config; the loss settings are :class:`ActorCriticConfig`'s.

    Attributes:
        num_workers: remote workers computing gradients; at least 1.
        rollout_fragment_length: 10 steps per env per gradient.
        timesteps_per_iteration: 1000; a report comes after that many new env steps (100 gradients of 10
            steps), with no wall-time gate.
    """

    rollout_fragment_length: int = 10
    timesteps_per_iteration: int = 1000

    @property
    def actual_train_batch_size(self) -> int | None:
        """``None``: each gradient is one worker's fragment (``sample_size`` steps); ``train_batch_size`` is unused."""
        return None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_workers < 1:
            raise ValueError(f"num_workers={self.num_workers}: A3C computes gradients on remote workers and needs "
                             f"num_workers >= 1; use a2c to train in the driver alone")


def plan(workers: WorkerSet, config: TrainerConfig) -> LocalIterator[dict[str, Any]]:
    """A3C: gradients from the workers as they come, each applied centrally and answered
    with fresh weights to its producer alone; report.

    It reads only the reporting settings of ``config``, so any policy with ``compute_gradients`` (PPO's,
    A2C's) trains under it unchanged. The worker set needs remote workers.

    Examples:
        >>> from flowrl.testing import make_fake_workers
        >>> workers = make_fake_workers(2)
        >>> plan(workers, A3CConfig(timesteps_per_iteration=0))
        LocalIterator[AsyncGradients.for_each(ApplyGradients(update_all=False)).filter(ReportGate(...)).for_each(...)]
        >>> workers.stop()
    """
    grads = AsyncGradients(workers)
    train_op = grads.for_each(ApplyGradients(workers, update_all=False))
    return StandardMetricsReporting(train_op, workers, config)


ALGORITHM = Algorithm("a3c", A3CConfig, ActorCriticPolicy, plan)
