"""CQL: conservative Q-learning (Kumar et al., NeurIPS 2020, https://arxiv.org/abs/2006.04779) for continuous
actions: SAC whose critics are pushed down on actions the data does not hold.

Dataflow: SAC's (DQN's two sub-flows, :func:`flowrl.algorithms.dqn.plan`). With ``input=DIR`` (the usual case)
``ParallelRollouts`` reads a recorded dataset (:mod:`flowrl.offline`), each episode postprocessed into n-step
rows, and (1) stores the rows in the replay buffer; (2) ``Replay`` draws ``train_batch_size`` rows and the learner
takes one step on the critics, the actor and the temperature (``TrainOneStep``), the target critics following
softly. A run that reads a dataset has no training episodes: the default config evaluates in the env every report.

The critics' loss is SAC's plus ``min_q_weight`` times, per critic, ``T * logsumexp(Q(s, a~) / T) - Q(s, a)`` with
``a`` the recorded action and ``a~`` ``num_actions`` actions each drawn uniformly, from the policy at ``s`` and from
the policy at ``s'`` (each less its log-density: CQL(H) with importance sampling, as the paper and RLlib do). For
the first ``bc_iters`` steps the actor clones the recorded actions (``alpha log pi(a~|s) - log pi(a|s)``), then
takes SAC's step. Discrete actions: :mod:`flowrl.algorithms.cql_dqn`.

Examples:
    >>> config = CQLConfig(seed=0)
    >>> config.min_q_weight, config.num_actions, config.bc_iters, config.evaluation_interval
    (5.0, 10, 1000, 1)
    >>> CQLConfig(num_actions=0)
    Traceback (most recent call last):
    ...
    ValueError: num_actions=0 must be an int >= 1 (actions drawn from each proposal per row)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch

from flowrl.algorithms import Algorithm
from flowrl.algorithms.dqn import make_owned_state, plan
from flowrl.algorithms.sac import SACConfig, SACPolicy, squashed_gaussian_logp, squashed_gaussian_sample
from flowrl.config import PolicyConfig
from flowrl.policy import TensorBatch
from flowrl.sample_batch import ACTIONS, NEXT_OBS, OBS
from flowrl.validation import bounded

__all__ = ["CQLConfig", "CQLPolicy", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class CQLConfig(SACConfig):
    """CQL's config: :class:`~flowrl.algorithms.sac.SACConfig` with RLlib's CQL defaults.

    Attributes:
        min_q_weight: the conservative penalty's weight (5.0).
        temperature: the log-sum-exp's temperature ``T`` (1.0).
        num_actions: actions drawn from each of the three proposals per row (10).
        bc_iters: gradient steps in which the actor clones the recorded actions before it takes SAC's steps (1000;
            RLlib's 20,000 would spend a 2-core laptop's first 12 minutes cloning; on 50k Pendulum steps of a SAC
            policy returning -574 the default returned -332 after 3,000 gradient steps, seed 0).
        timesteps_per_iteration: a report every 1,000 rows read (1,000 gradient steps with the defaults).
        evaluation_interval / evaluation_duration: evaluate in the env every report, 10 episodes, with the
            deterministic actions: with a dataset as input the evaluation is the only measure of the policy.
    """

    min_q_weight: float = bounded(5.0, ge=0, meaning="the conservative penalty's weight")
    temperature: float = bounded(1.0, gt=0, meaning="the log-sum-exp's temperature")
    num_actions: int = bounded(10, ge=1, meaning="actions drawn from each proposal per row")
    bc_iters: int = bounded(1000, ge=0, meaning="steps in which the actor clones the recorded actions")
    timesteps_per_iteration: int = 1000
    evaluation_interval: int = 1
    evaluation_duration: int = 10


class CQLPolicy(SACPolicy):
    """SAC's policy with CQL's conservative critics and a behaviour-cloning start for the actor (see the module).

    Examples:
        >>> import numpy as np
        >>> config = CQLConfig(seed=0, actor_hiddens=(8,), critic_hiddens=(8,), num_actions=2)
        >>> policy = CQLPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (1,)), config)
        >>> batch = {OBS: torch.zeros(4, 3), NEXT_OBS: torch.ones(4, 3), ACTIONS: torch.zeros(4, 1),
        ...          "rewards": torch.ones(4), "terminateds": torch.zeros(4, dtype=torch.bool)}
        >>> loss, stats = policy.loss(batch)
        >>> sorted(k for k in stats if k.startswith("cql"))
        ['cql_penalty', 'cql_q_data', 'cql_q_drawn']
    """

    config: CQLConfig
    config_class = CQLConfig

    def __init__(self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: PolicyConfig) -> None:
        if not isinstance(action_space, gym.spaces.Box):
            raise ValueError(f"CQL (flowrl train cql) is for Box (continuous) action spaces, got {action_space}; use "
                             f"cql_dqn for discrete actions")
        super().__init__(observation_space, action_space, config)

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        cfg, model = self.config, self.model
        sac = self.losses(batch)
        obs, next_obs = batch[OBS], batch[NEXT_OBS]
        size, n, dim = len(obs), cfg.num_actions, self.action_dim
        data_actions = batch[ACTIONS].reshape(size, -1).float()
        actor_loss = sac.actor
        if self.weights_version < cfg.bc_iters:  # the actor clones the recorded actions first
            data_logp = squashed_gaussian_logp(model.actor(obs), data_actions)
            actor_loss = (sac.alpha_value * sac.logp - data_logp).mean()
        obs_rep = obs.repeat_interleave(n, dim=0)
        with torch.no_grad():  # the proposals: actions only, the penalty trains the critics alone
            noise = torch.randn(2 * size * n, dim, generator=self.generator, device=self.device)
            drawn, drawn_logp = squashed_gaussian_sample(model.actor(torch.cat([obs_rep, next_obs.repeat_interleave(
                n, dim=0)])), noise)
            uniform = torch.rand(size * n, dim, generator=self.generator, device=self.device) * 2 - 1
        actions = torch.cat([uniform, drawn])  # [3 B n, A]: uniform at s, the policy's at s, the policy's at s'
        densities = torch.cat([torch.full((size * n,), dim * math.log(0.5), device=self.device), drawn_logp])
        q_KX = model.critics(obs_rep.repeat(3, 1), actions).view(-1, 3 * size * n) - densities
        q_KBX = q_KX.view(-1, 3, size, n).permute(0, 2, 1, 3).reshape(-1, size, 3 * n)
        drawn_term_K = torch.logsumexp(q_KBX / cfg.temperature, dim=2).mean(dim=1) * cfg.temperature
        data_term_K = sac.q_KB.mean(dim=1)
        penalty = cfg.min_q_weight * (drawn_term_K - data_term_K).sum()
        stats = {**sac.stats, "actor_loss": float(actor_loss.detach()), "cql_penalty": float(penalty.detach()),
                 "cql_q_drawn": float(drawn_term_K.detach().mean()), "cql_q_data": float(data_term_K.detach().mean())}
        return sac.critic + penalty + actor_loss + sac.alpha, stats

    def _sac_backward(self, tensors: TensorBatch) -> dict[str, float]:
        stats = super()._sac_backward(tensors)
        stats["loss"] = stats["actor_loss"] + stats["critic_loss"] + stats["cql_penalty"] + stats["alpha_loss"]
        return stats


ALGORITHM = Algorithm("cql", CQLConfig, CQLPolicy, plan, make_owned_state=make_owned_state)
