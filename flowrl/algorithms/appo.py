"""APPO: asynchronous PPO on the IMPALA dataflow (RLlib Flow, https://arxiv.org/abs/2011.12719; PPO,
https://arxiv.org/abs/1707.06347; IMPALA, https://arxiv.org/abs/1802.01561).

Dataflow: exactly IMPALA's plan (:mod:`flowrl.algorithms.impala`) -- async rollouts, learner weights to each delivering
worker, replay mix-in, concat, a learner thread fed through a bounded queue, its output counted -- with one more
stage after each learner output: ``UpdateTargetAndKL`` refreshes the target network (and, with ``use_kl_loss``,
adapts the KL coefficient) every ``num_sgd_iter x minibatch_buffer_size`` learner updates (times the minibatches of a
pass with ``sgd_minibatch_size``), never by env steps.

The policy's loss is PPO's clipped surrogate on V-trace advantages whose importance ratios are taken against the
target network's policy, as RLlib's APPO: V-trace corrects the sampled (behaviour) actions towards the target
policy, and the surrogate's ratio ``pi / pi_target`` is clipped at ``1 +- clip_param``.

Examples:
    >>> config = APPOConfig(env="CartPole-v1")
    >>> config.clip_param, config.use_kl_loss, config.kl_coeff, config.replay_buffer_num_slots
    (0.4, False, 1.0, 100)
    >>> from dataclasses import replace
    >>> replace(config, num_sgd_iter=2, minibatch_buffer_size=3).target_update_period  # in learner updates
    6
    >>> APPOConfig(clip_param=0)
    Traceback (most recent call last):
    ...
    ValueError: clip_param=0 must be a number > 0 (e.g. 0.4; the surrogate clips pi / pi_target to [1 - clip, 1 + clip])
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import gymnasium as gym
import numpy as np
import torch

from flowrl.algorithms import Algorithm
from flowrl.algorithms import impala
from flowrl.algorithms.actor_critic import adapt_kl_coeff
from flowrl.algorithms.impala import IMPALAConfig, IMPALAPolicy
from flowrl.config import PolicyConfig
from flowrl.iter import LocalIterator
from flowrl.ops.train import UpdateTargetAndKL
from flowrl.policy import TensorBatch, load_module_weights, module_weights
from flowrl.sample_batch import ACTIONS, LOGP, OBS
from flowrl.validation import bounded
from flowrl.workers import WorkerSet

__all__ = ["APPOConfig", "APPOPolicy", "plan", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class APPOConfig(IMPALAConfig):
    """APPO's config: :class:`~flowrl.algorithms.impala.IMPALAConfig` with RLlib's APPO defaults.

    Attributes:
        replay_buffer_num_slots: fragments held for replay (100; mixed in only with ``replay_proportion > 0``).
        clip_param: the surrogate's clip ``epsilon`` of ``pi / pi_target`` (0.4).
        use_kl_loss: add ``kl_coeff * KL(pi_target || pi)`` to the loss and adapt ``kl_coeff`` (False).
        kl_coeff: the initial KL coefficient (1.0); used only with ``use_kl_loss``.
        kl_target: the KL that ``update_kl`` steers towards (0.01): x1.5 above twice it, x0.5 below half.
        after_train_step: the stage after each learner output: :class:`~flowrl.ops.train.UpdateTargetAndKL`,
            which refreshes the target network every :attr:`target_update_period` learner updates. A
            replacement takes over that job; ``None`` is rejected (the target would never move).
    """

    replay_buffer_num_slots: int = 100
    clip_param: float = bounded(
        0.4, gt=0, meaning="e.g. 0.4; the surrogate clips pi / pi_target to [1 - clip, 1 + clip]")
    use_kl_loss: bool = False
    kl_coeff: float = bounded(1.0, ge=0, meaning="it scales the KL loss; use_kl_loss=False turns it off")
    kl_target: float = bounded(0.01, gt=0, meaning="the KL that update_kl steers towards, e.g. 0.01")
    after_train_step: Callable[[WorkerSet, IMPALAConfig], Callable[[Any], Any]] | None = UpdateTargetAndKL

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.use_kl_loss, bool):
            raise TypeError(f"use_kl_loss={self.use_kl_loss!r} must be a bool")
        if self.after_train_step is None:
            raise ValueError("after_train_step=None: APPO's target network would never be refreshed; keep the "
                             "default UpdateTargetAndKL")

    @property
    def target_update_period(self) -> int:
        """Learner updates between target refreshes: ``num_sgd_iter x minibatch_buffer_size``, times the
        minibatches of a pass (:attr:`updates_per_pass`) with ``sgd_minibatch_size``."""
        return self.num_sgd_iter * self.minibatch_buffer_size * self.updates_per_pass


def plan(workers: WorkerSet, config: APPOConfig) -> LocalIterator[dict[str, Any]]:
    """APPO: IMPALA's plan, whose ``after_train_step`` -- ``UpdateTargetAndKL`` by default --
    refreshes the target network (and KL coefficient) every ``target_update_period`` learner updates.

    Examples:
        >>> config = APPOConfig(seed=0, num_workers=0, train_batch_size=100, timesteps_per_iteration=0)
        >>> it = plan(WorkerSet(policy_class=APPOPolicy, config=config), config)
        >>> repr(it).split("]]")[1]
        '.for_each(UpdateTargetAndKL(1)).filter(ReportGate(0 steps, 0 s)).for_each(CollectMetrics).for_each()]'
        >>> next(it)["info"]["num_target_updates"] >= 1
        True
        >>> it.close()
    """
    if not isinstance(config, APPOConfig):
        raise TypeError(f"APPO's plan needs an APPOConfig, got {type(config).__name__}")
    return impala.plan(workers, config)


class APPOPolicy(IMPALAPolicy):
    """The APPO policy: PPO's clipped surrogate on V-trace advantages, ratios against a target network.

    With ``mu`` the sampling policy (the batch's ``logp``), ``pi_t`` the target network's policy and ``pi`` the
    learned one, ``loss`` computes V-trace with ``pi_t`` as the target policy (values and bootstrap from the
    learned value function), then ``ratio = clamp(mu / pi_t, 0, 2) * pi / mu`` (``pi / pi_t`` wherever the clamp
    does not bind, as RLlib's APPO) and returns
    ``-mean(min(A ratio, A clip(ratio, 1 - eps, 1 + eps))) + vf_loss_coeff * 0.5 * mean((V - vs)^2)
    - entropy_coeff * mean(H)``, plus ``kl_coeff * mean(KL(pi_t || pi))`` with ``use_kl_loss``.

    :meth:`update_target` copies the learned network into the target one (done once at construction);
    :meth:`update_kl` adapts ``kl_coeff``. Both are part of :meth:`get_state`, not of the weights workers get.
    Target refreshes and learning steps exclude each other, as they run in different threads.

    Examples:
        >>> from flowrl.sample_batch import EPS_ID, NEXT_OBS, REWARDS, TERMINATEDS, TRUNCATEDS, SampleBatch
        >>> policy = APPOPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), APPOConfig(seed=0))
        >>> batch = SampleBatch({OBS: np.zeros((4, 4), np.float32), NEXT_OBS: np.zeros((4, 4), np.float32),
        ...                      ACTIONS: np.zeros(4, np.int64), LOGP: np.full(4, np.log(0.5), np.float32),
        ...                      REWARDS: np.ones(4, np.float32), TERMINATEDS: np.array([False, True, False, False]),
        ...                      TRUNCATEDS: np.zeros(4, bool), EPS_ID: np.array([0, 0, 1, 1])})
        >>> sorted(policy.learn_on_batch(batch)["learner_stats"])
        ['cur_kl_coeff', 'entropy', 'grad_gnorm', 'kl', 'loss', 'mean_is_ratio', 'mean_rho', 'policy_loss',
         'vf_loss']
        >>> policy.update_kl(0.05)  # above 2 x kl_target: 1.0 x 1.5
        >>> policy.kl_coeff, policy.get_state()["kl_coeff"]
        (1.5, 1.5)
    """

    config: APPOConfig
    config_class = APPOConfig
    learns_in_groups = False  # its target network is updated by the driver (UpdateTargetAndKL)

    def __init__(self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: PolicyConfig) -> None:
        super().__init__(observation_space, action_space, config)
        self.target_model = copy.deepcopy(self.model).requires_grad_(False)
        self.kl_coeff = float(self.config.kl_coeff)
        self._target_lock = threading.Lock()  # the learner thread learns while the driver refreshes the target

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        dist_inputs, values = self.forward_rows(batch)
        dist = self.action_distribution(dist_inputs)
        logp = dist.logp(batch[ACTIONS])
        with torch.no_grad():
            target_dist = self.action_distribution(self.forward_rows(batch, self.target_model)[0])
            target_logp = target_dist.logp(batch[ACTIONS])
        targets = self.vtrace_targets(batch, target_logp, values.detach())
        is_ratio = torch.exp(batch[LOGP] - target_logp).clamp(0.0, 2.0)  # mu / pi_t, clipped as RLlib's
        ratio = is_ratio * torch.exp(logp - batch[LOGP])  # = pi / pi_t wherever mu / pi_t is within [0, 2]
        adv = self.policy_advantages(targets)
        surrogate = torch.min(adv * ratio, adv * ratio.clamp(1.0 - cfg.clip_param, 1.0 + cfg.clip_param))
        policy_loss = -surrogate.mean()
        vf_loss = 0.5 * (values - targets.vs).pow(2).mean()
        entropy = dist.entropy().mean()
        kl = target_dist.kl(dist).mean()
        total = policy_loss + cfg.vf_loss_coeff * vf_loss - cfg.entropy_coeff * entropy
        if cfg.use_kl_loss:
            total = total + self.kl_coeff * kl
        parts = torch.stack([policy_loss, vf_loss, entropy, kl, targets.clipped_rhos.mean(), is_ratio.mean()])
        stats = dict(zip(("policy_loss", "vf_loss", "entropy", "kl", "mean_rho", "mean_is_ratio"),
                         parts.detach().tolist()))
        stats["cur_kl_coeff"] = self.kl_coeff
        return total, stats

    def learn_on_tensors(self, tensors: TensorBatch) -> dict[str, Any]:
        with self._target_lock:
            return super().learn_on_tensors(tensors)

    def update_target(self) -> None:
        """Copies the learned network into the target network."""
        with self._target_lock:
            self.target_model.load_state_dict(self.model.state_dict())

    def update_kl(self, sampled_kl: float) -> None:
        """Adapts ``kl_coeff`` as RLlib does (:func:`adapt_kl_coeff`)."""
        self.kl_coeff = adapt_kl_coeff(self.kl_coeff, sampled_kl, self.config.kl_target)

    def get_state(self) -> dict[str, Any]:
        """The base state plus the target network's weights and the adapted ``kl_coeff``."""
        target = module_weights(self.target_model)
        return {**super().get_state(), "target_weights": target, "kl_coeff": self.kl_coeff}

    def set_state(self, state: Mapping[str, Any]) -> None:
        missing = sorted({"target_weights", "kl_coeff"} - set(state))
        if missing:
            raise ValueError(f"APPOPolicy.set_state: the state has no {missing} (keys {sorted(state)}); restore a "
                             f"state saved by an APPOPolicy")
        super().set_state(state)
        load_module_weights(self.target_model, state["target_weights"], self.device)
        self.kl_coeff = float(state["kl_coeff"])


ALGORITHM = Algorithm("appo", APPOConfig, APPOPolicy, plan)
