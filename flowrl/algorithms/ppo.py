"""PPO: proximal policy optimization as a plan (RLlib Flow, https://arxiv.org/abs/2011.12719; PPO,
https://arxiv.org/abs/1707.06347).

Dataflow: the workers sample in lockstep (``ParallelRollouts(bulk_sync)``), only the
trained policies' experiences are kept, the fragments are concatenated to ``train_batch_size`` steps and
their advantages standardized; the learner then runs ``num_sgd_iter`` epochs of minibatch SGD and broadcasts
the new weights (``TrainOneStep``, or ``MultiGPUTrainOneStep``), and the KL coefficient adapts to the sampled
KL (``UpdateKL``). Each report is followed by a warning-only check for badly scaled rewards.

The policy's loss is RLlib's: clipped surrogate, clipped value loss, entropy bonus and an adaptive KL penalty.

Examples:
    >>> config = PPOConfig(env="CartPole-v1", seed=0)
    >>> config.train_batch_size, config.sgd_minibatch_size, config.num_sgd_iter, config.lr, config.clip_param
    (4000, 128, 30, 5e-05, 0.3)
    >>> PPOConfig(train_batch_size=100)
    Traceback (most recent call last):
    ...
    ValueError: sgd_minibatch_size=128 exceeds train_batch_size=100; lower sgd_minibatch_size or raise train_batch_size
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import gymnasium as gym
import numpy as np
import torch

from flowrl.algorithms import Algorithm
from flowrl.algorithms.actor_critic import adapt_kl_coeff
from flowrl.config import PolicyConfig, TrainerConfig
from flowrl.iter import LocalIterator
from flowrl.ops import (ConcatBatches, ParallelRollouts, SelectExperiences, StandardizeFields, StandardMetricsReporting,
                        UpdateKL, WarnAboutBadRewardScales, train_one_step)
from flowrl.policy import Policy, TensorBatch, column_tensor
from flowrl.sample_batch import (ACTION_DIST_INPUTS, ACTIONS, ADVANTAGES, LOGP, NEXT_OBS, OBS,
                                 REWARDS, TERMINATEDS, TRUNCATEDS, VALUE_TARGETS, VF_PREDS, SampleBatch)
from flowrl.validation import bounded
from flowrl.workers import WorkerSet

__all__ = ["PPOConfig", "PPOPolicy", "adapt_kl_coeff", "plan", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class PPOConfig(TrainerConfig):
    """PPO's config: :class:`~flowrl.config.TrainerConfig` with RLlib's PPO defaults.

    Attributes:
        rollout_fragment_length: 200 steps per env per sample.
        train_batch_size: 4000 steps per train batch.
        sgd_minibatch_size: rows per SGD minibatch (128); at most ``train_batch_size``.
        num_sgd_iter: epochs over each train batch (30).
        shuffle_sequences: the multi-device learner permutes the rows of each batch before splitting it.
        lr: Adam learning rate (5e-5).
        use_gae: advantages by GAE(gamma, lambda_) (True) or as discounted returns minus ``V(s)`` (False).
        lambda_: GAE's bias-variance trade-off, in [0, 1] (1.0).
        kl_coeff: the initial coefficient of the KL penalty (0.2); 0 turns the penalty off.
        kl_target: the KL that ``update_kl`` steers towards (0.01): the coefficient is multiplied by 1.5
            when the sampled KL exceeds twice the target and by 0.5 when it is below half of it.
        clip_param: the surrogate's ratio clip ``epsilon`` (0.3).
        vf_clip_param: how far a value prediction may move from the sampled ``vf_preds`` before its loss is
            clipped (10.0); scale it with the returns; ``float('inf')`` turns value clipping off (the one float
            field that may be infinite).
        vf_loss_coeff: weight of the value loss (1.0).
        entropy_coeff: weight of the entropy bonus (0.0).
    """

    infinite_ok_fields: ClassVar[frozenset[str]] = frozenset({"vf_clip_param"})
    trains_recurrent_models: ClassVar[bool] = True  # model.use_lstm: sequences, minibatches of whole sequences

    train_batch_size: int = 4000
    sgd_minibatch_size: int = bounded(128, ge=1, meaning="rows per SGD minibatch")
    num_sgd_iter: int = bounded(30, ge=1, meaning="epochs per batch")
    shuffle_sequences: bool = True
    lr: float = 5e-5
    use_gae: bool = True
    lambda_: float = bounded(1.0, ge=0, le=1, meaning="1.0: Monte Carlo advantages, 0.0: one-step TD errors")
    kl_coeff: float = bounded(0.2, ge=0, meaning="0 turns the KL penalty off")
    kl_target: float = bounded(0.01, gt=0, meaning="the KL the penalty steers towards, e.g. 0.01")
    clip_param: float = bounded(0.3, gt=0, meaning="the surrogate's ratio clip, e.g. 0.2 or 0.3")
    vf_clip_param: float = bounded(10.0, gt=0, meaning="float('inf') turns value clipping off")
    vf_loss_coeff: float = bounded(1.0, ge=0, meaning="0 leaves the value head untrained")
    entropy_coeff: float = bounded(0.0, ge=0, meaning="0 turns the entropy bonus off")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_minibatch_size()

    def _check_minibatch_size(self) -> None:
        """A minibatch fits in the batch it is cut from (DD-PPO's batches are each worker's own)."""
        if self.sgd_minibatch_size > self.train_batch_size:
            raise ValueError(f"sgd_minibatch_size={self.sgd_minibatch_size} exceeds train_batch_size="
                             f"{self.train_batch_size}; lower sgd_minibatch_size or raise train_batch_size")


def plan(workers: WorkerSet, config: PPOConfig) -> LocalIterator[dict[str, Any]]:
    """PPO: sample in lockstep, keep trained policies, concat, standardize advantages,
    minibatch SGD + broadcast, adapt KL; report and check reward scales.

    Examples:
        >>> config = PPOConfig(seed=0, num_workers=0, train_batch_size=200, sgd_minibatch_size=50, num_sgd_iter=2)
        >>> it = plan(WorkerSet(policy_class=PPOPolicy, config=config), config)
        >>> for stage in repr(it).split("."):
        ...     print(stage)
        LocalIterator[ParallelRollouts(bulk_sync)
        for_each(SelectExperiences(['default_policy']))
        combine(ConcatBatches(200))
        for_each(StandardizeFields(['advantages']))
        for_each(TrainOneStep)
        for_each(UpdateKL)
        filter(ReportGate(0 steps, 0 s))
        for_each(CollectMetrics)
        for_each(WarnAboutBadRewardScales)]
        >>> next(it)["info"]["num_steps_trained"]
        200
    """
    rollouts = ParallelRollouts(workers, mode="bulk_sync")
    learn = train_one_step(workers, config, num_sgd_iter=config.num_sgd_iter,
                           sgd_minibatch_size=config.sgd_minibatch_size, shuffle_sequences=config.shuffle_sequences)
    train_op = (rollouts
                .for_each(SelectExperiences(workers.local_worker().policies_to_train))
                .combine(ConcatBatches(config.train_batch_size, config.count_steps_by))
                .for_each(StandardizeFields([ADVANTAGES]))
                .for_each(learn)
                .for_each(UpdateKL(workers)))  # reads the train op's (batch, learner_info) output
    return StandardMetricsReporting(train_op, workers, config).for_each(WarnAboutBadRewardScales(config))


# the columns PPO's loss reads; the learner converts only these to tensors
_LOSS_COLUMNS = (OBS, ACTIONS, LOGP, ACTION_DIST_INPUTS, VF_PREDS, ADVANTAGES, VALUE_TARGETS)


class PPOPolicy(Policy):
    """The PPO policy: GAE postprocessing and RLlib's PPO loss with an adaptive KL coefficient.

    ``postprocess_trajectory`` adds ``advantages`` and ``value_targets`` to each trajectory piece (one env,
    one episode): GAE over the sampled ``vf_preds``, where a terminated episode's last step has no future
    value and a truncated one, or a fragment cut mid-episode, bootstraps from ``V(new_obs)`` of its last row.

    ``loss`` is the mean over rows of ``-min(A r, A clip(r, 1 - eps, 1 + eps)) + kl_coeff KL(old || new)
    + vf_loss_coeff max((V - target)^2, (V_clipped - target)^2) - entropy_coeff H``, with ``r`` the
    probability ratio of the new and the sampling policy and ``V_clipped`` the prediction kept within
    ``vf_clip_param`` of ``vf_preds`` (RLlib's, after PPO2). :meth:`update_kl` adapts ``kl_coeff``, which
    is part of :meth:`get_state`.

    Args:
        observation_space / action_space: as for :class:`~flowrl.policy.Policy`.
        config: a :class:`PPOConfig`.

    Raises:
        TypeError: a config that is not a :class:`PPOConfig`.

    Examples:
        >>> policy = PPOPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), PPOConfig(gamma=1.0, seed=0))
        >>> piece = SampleBatch({OBS: np.zeros((2, 4), np.float32), NEXT_OBS: np.zeros((2, 4), np.float32),
        ...                      REWARDS: np.ones(2, np.float32), VF_PREDS: np.full(2, 0.5, np.float32),
        ...                      TERMINATEDS: np.array([False, True]), TRUNCATEDS: np.zeros(2, bool)})
        >>> out = policy.postprocess_trajectory(piece)
        >>> out[ADVANTAGES].tolist(), out[VALUE_TARGETS].tolist()
        ([1.5, 0.5], [2.0, 1.0])
        >>> policy.update_kl(0.05)  # above 2 x kl_target: 0.2 x 1.5
        >>> policy.update_kl(0.001)  # below kl_target / 2: then x 0.5
        >>> round(policy.kl_coeff, 6), policy.get_state()["kl_coeff"] == policy.kl_coeff
        (0.15, True)
    """

    config: PPOConfig
    config_class = PPOConfig

    postprocess_spans_episodes = True  # its postprocessing restarts at every episode boundary
    learns_in_groups = True  # its weights, optimizer and KL coefficient are all it learns

    def __init__(self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: PolicyConfig) -> None:
        super().__init__(observation_space, action_space, config)
        self.kl_coeff = float(self.config.kl_coeff)

    # -- postprocessing ---------------------------------------------------------------------------
    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        cfg = self.config
        return self.add_advantages(batch, gamma=cfg.gamma, lambda_=cfg.lambda_, use_gae=cfg.use_gae)

    # -- loss -------------------------------------------------------------------------------------
    def to_tensors(self, batch: SampleBatch) -> TensorBatch:
        """Only the columns the loss reads (fewer conversions per minibatch); all numeric ones otherwise. A
        recurrent model gets them with the padded sequences of :meth:`~flowrl.policy.Policy.sequence_tensors`."""
        if self.is_recurrent:
            return self.sequence_tensors(batch, [k for k in _LOSS_COLUMNS if k != OBS])
        if all(k in batch for k in _LOSS_COLUMNS):
            return {k: column_tensor(batch[k], self.device) for k in _LOSS_COLUMNS}
        return super().to_tensors(batch)

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        dist_inputs, values = self.forward_rows(batch)
        dist = self.dist_class(dist_inputs)
        ratio = torch.exp(dist.logp(batch[ACTIONS]) - batch[LOGP])
        adv = batch[ADVANTAGES]
        surrogate = torch.min(adv * ratio, adv * ratio.clamp(1.0 - cfg.clip_param, 1.0 + cfg.clip_param))
        policy_loss = -surrogate.mean()
        kl = self.dist_class(batch[ACTION_DIST_INPUTS]).kl(dist).mean()
        entropy = dist.entropy().mean()
        old_values, targets = batch[VF_PREDS], batch[VALUE_TARGETS]
        clipped = old_values + (values - old_values).clamp(-cfg.vf_clip_param, cfg.vf_clip_param)
        vf_loss = torch.max((values - targets).pow(2), (clipped - targets).pow(2)).mean()
        total = policy_loss + cfg.vf_loss_coeff * vf_loss - cfg.entropy_coeff * entropy
        if self.kl_coeff > 0:
            total = total + self.kl_coeff * kl
        parts = torch.stack([total, policy_loss, vf_loss, kl, entropy]).detach().tolist()  # one read-out
        stats = dict(zip(("total_loss", "policy_loss", "vf_loss", "kl", "entropy"), parts))
        stats["cur_kl_coeff"] = self.kl_coeff
        return total, stats

    def update_kl(self, sampled_kl: float) -> None:
        """Adapts ``kl_coeff`` as RLlib does (:func:`adapt_kl_coeff`)."""
        self.kl_coeff = adapt_kl_coeff(self.kl_coeff, sampled_kl, self.config.kl_target)

    # -- state ------------------------------------------------------------------------------------
    def learner_extras(self) -> dict[str, Any]:
        """The KL coefficient, which ``UpdateKL`` adapts in the driver."""
        return {"kl_coeff": self.kl_coeff}

    def set_learner_extras(self, extras: Mapping[str, Any]) -> None:
        self.kl_coeff = float(extras["kl_coeff"])

    def get_state(self) -> dict[str, Any]:
        """The base state plus the adapted ``kl_coeff``."""
        return {**super().get_state(), "kl_coeff": self.kl_coeff}

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        if "kl_coeff" not in state:
            raise ValueError(f"PPOPolicy.set_state: the state has no 'kl_coeff' (keys {sorted(state)}); restore "
                             f"a state saved by a PPOPolicy")
        self.kl_coeff = float(state["kl_coeff"])


ALGORITHM = Algorithm("ppo", PPOConfig, PPOPolicy, plan)
