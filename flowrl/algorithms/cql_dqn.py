"""CQL for discrete actions (Kumar et al., NeurIPS 2020, https://arxiv.org/abs/2006.04779, its CQL(H) on DQN):
DQN whose Q-values are pushed down on every action and up on the recorded one.

Dataflow: DQN's two sub-flows (:func:`flowrl.algorithms.dqn.plan`). With ``input=DIR`` (the usual case)
``ParallelRollouts`` reads a recorded dataset (:mod:`flowrl.offline`), each episode postprocessed into n-step
rows, and (1) stores the rows in the replay buffer; (2) ``Replay`` draws ``train_batch_size`` rows for one learner
step, and the target network is copied every ``target_network_update_freq`` rows read. The default config
evaluates in the env every report (a run that reads a dataset has no training episodes).

The loss is DQN's plus ``min_q_weight * mean(logsumexp_a Q(s, a) - Q(s, a_data))``. Continuous actions:
:mod:`flowrl.algorithms.cql`.

Examples:
    >>> config = CQLDQNConfig(seed=0)
    >>> config.min_q_weight, config.evaluation_interval
    (1.0, 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch

from flowrl.algorithms import Algorithm
from flowrl.algorithms.dqn import DQNConfig, DQNPolicy, make_owned_state, plan
from flowrl.config import PolicyConfig
from flowrl.policy import TensorBatch
from flowrl.sample_batch import ACTIONS, OBS
from flowrl.validation import bounded

__all__ = ["CQLDQNConfig", "CQLDQNPolicy", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class CQLDQNConfig(DQNConfig):
    """Discrete CQL's config: :class:`~flowrl.algorithms.dqn.DQNConfig` with the conservative penalty.

    Attributes:
        min_q_weight: the penalty's weight (1.0, the paper's discrete setting).
        timesteps_per_iteration: a report every 10,000 rows read.
        evaluation_interval / evaluation_duration: evaluate in the env every report, 10 episodes, greedy.
    """

    min_q_weight: float = bounded(1.0, ge=0, meaning="the conservative penalty's weight")
    timesteps_per_iteration: int = 10_000
    evaluation_interval: int = 1
    evaluation_duration: int = 10


class CQLDQNPolicy(DQNPolicy):
    """DQN's policy with the CQL(H) penalty on its Q-values.

    Examples:
        >>> config = CQLDQNConfig(seed=0, hiddens=(8,))
        >>> policy = CQLDQNPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), config)
        >>> batch = {OBS: torch.zeros(3, 4), "new_obs": torch.ones(3, 4), ACTIONS: torch.tensor([0, 1, 1]),
        ...          "rewards": torch.ones(3), "terminateds": torch.zeros(3, dtype=torch.bool)}
        >>> loss, stats = policy.loss(batch)
        >>> stats["cql_penalty"] > 0  # logsumexp over actions exceeds any one action's Q
        True
    """

    config: CQLDQNConfig
    config_class = CQLDQNConfig

    def __init__(self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: PolicyConfig) -> None:
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"cql_dqn is for Discrete action spaces, got {action_space}; use cql (flowrl train cql) "
                             f"for continuous actions")
        super().__init__(observation_space, action_space, config)

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        loss, stats = super().loss(batch)
        q_BA = self.model(batch[OBS])
        data_q_B = q_BA.gather(1, batch[ACTIONS].long().unsqueeze(1)).squeeze(1)
        penalty = (torch.logsumexp(q_BA, dim=1) - data_q_B).mean()
        stats["cql_penalty"] = float(penalty.detach())
        return loss + self.config.min_q_weight * penalty, stats


ALGORITHM = Algorithm("cql_dqn", CQLDQNConfig, CQLDQNPolicy, plan, make_owned_state=make_owned_state)
