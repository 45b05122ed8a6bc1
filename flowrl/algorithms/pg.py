"""PG: vanilla policy gradient (REINFORCE), the simplest plan (RLlib Flow, https://arxiv.org/abs/2011.12719).

Dataflow: the workers sample in lockstep (``ParallelRollouts(bulk_sync)``; with
``num_workers=0`` the driver samples), the fragments are concatenated into train batches of
``train_batch_size`` steps, and each batch takes one gradient step on the local policy whose weights
are then broadcast to every worker (``TrainOneStep``). Reports come from ``StandardMetricsReporting``.
The policy is REINFORCE: ``loss = -mean(logp(a_t) * G_t)`` with discounted returns-to-go ``G_t``.

Examples:
    >>> config = PGConfig(env="CartPole-v1", train_batch_size=400, seed=0)
    >>> config.num_workers, config.lr
    (0, 0.0004)
    >>> PGConfig(train_batch_size=0)
    Traceback (most recent call last):
    ...
    ValueError: train_batch_size=0 must be an int >= 1 (steps per train batch)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from flowrl.algorithms import Algorithm
from flowrl.config import TrainerConfig
from flowrl.iter import LocalIterator
from flowrl.ops.metrics import StandardMetricsReporting
from flowrl.ops.rollout import ConcatBatches, ParallelRollouts
from flowrl.ops.train import train_one_step
from flowrl.policy import Policy, TensorBatch
from flowrl.postprocessing import discounted_returns
from flowrl.sample_batch import ACTIONS, OBS, RETURNS, REWARDS, TERMINATEDS, TRUNCATEDS, SampleBatch
from flowrl.workers import WorkerSet

__all__ = ["PGConfig", "PGPolicy", "plan", "train_step", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class PGConfig(TrainerConfig):
    """PG's config: :class:`~flowrl.config.TrainerConfig` with RLlib's PG defaults.

    Attributes:
        num_workers: 0, so the driver samples and learns.
        lr: Adam learning rate, 4e-4 (RLlib's PG default).
        timesteps_per_iteration: 1000; a report comes at the first train step after that many new env steps.
    """

    num_workers: int = 0
    lr: float = 0.0004
    timesteps_per_iteration: int = 1000


def plan(workers: WorkerSet, config: TrainerConfig) -> LocalIterator[dict[str, Any]]:
    """PG: sample in lockstep, concat to ``train_batch_size``, train + broadcast, report.

    Any :class:`~flowrl.config.TrainerConfig` works, so another algorithm's policy can run under this plan.

    Examples:
        >>> workers = WorkerSet(policy_class=PGPolicy, config=PGConfig(seed=0))
        >>> it = plan(workers, PGConfig(seed=0))
        >>> repr(it).startswith("LocalIterator[ParallelRollouts(bulk_sync).combine(ConcatBatches(200))"
        ...                     ".for_each(TrainOneStep)")
        True
        >>> next(it)["timesteps_total"]  # a report covers timesteps_per_iteration=1000 env steps: 5 batches
        1000
    """
    rollouts = ParallelRollouts(workers, mode="bulk_sync")
    train_op = (rollouts
                .combine(ConcatBatches(config.train_batch_size, config.count_steps_by))
                .for_each(train_one_step(workers, config)))
    return StandardMetricsReporting(train_op, workers, config)


#: the name this stage had before it became :func:`flowrl.ops.train_one_step` (kept for existing imports)
train_step = train_one_step


class PGPolicy(Policy):
    """REINFORCE: each step's discounted return-to-go weights the log-likelihood of its action.

    ``postprocess_trajectory`` adds the ``returns`` column (``discounted_returns`` with ``config.gamma``,
    restarting at episode ends; a fragment cut mid-episode counts its cut as zero-valued), and
    ``loss`` is ``-mean(logp(a_t | s_t) * G_t)``. The value head is unused.

    Examples:
        >>> import gymnasium as gym, numpy as np
        >>> policy = PGPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), PGConfig(gamma=0.5, seed=0))
        >>> piece = SampleBatch({OBS: np.zeros((3, 4), np.float32), ACTIONS: np.zeros(3, np.int64),
        ...                      REWARDS: np.ones(3, np.float32), TERMINATEDS: np.array([False, False, True]),
        ...                      TRUNCATEDS: np.zeros(3, bool)})
        >>> policy.postprocess_trajectory(piece)[RETURNS].tolist()
        [1.75, 1.5, 1.0]
        >>> sorted(policy.learn_on_batch(piece)["learner_stats"])
        ['entropy', 'loss']
    """

    postprocess_spans_episodes = True  # its postprocessing restarts at every episode boundary
    learns_in_groups = True  # a loss over rows, and nothing learned beyond the weights and the optimizer

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        batch[RETURNS] = discounted_returns(rewards=batch[REWARDS], terminateds=batch[TERMINATEDS],
                                            truncateds=batch[TRUNCATEDS], gamma=self.config.gamma)
        return batch

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        dist = self.action_distribution(self.model(batch[OBS])[0])
        policy_loss = -(dist.logp(batch[ACTIONS]) * batch[RETURNS]).mean()
        return policy_loss, {"entropy": float(dist.entropy().detach().mean())}


ALGORITHM = Algorithm("pg", PGConfig, PGPolicy, plan)
