"""DD-PPO: decentralized distributed PPO as a plan (Wijmans et al., https://arxiv.org/abs/1911.00357; the RLlib
Flow paper's DD-PPO, https://arxiv.org/abs/2011.12719).

Dataflow: there is no central learner. The remote workers form one ``torch.distributed`` process group when the
plan is built (gloo on CPUs, NCCL with one GPU per worker); then every worker samples its own fragment and, in
place (``ParallelRollouts(raw).for_each(AllReduceTrainOneStep)``), standardizes its advantages and runs
``num_sgd_iter`` epochs of ``sgd_minibatch_size`` minibatches, averaging each gradient over the group before the
step, so the weights stay identical on every worker. The driver only gathers each round's counts and learner
stats and keeps a copy of the weights (``RecordGroupTraining``) for evaluation, checkpoints and ``get_policy``.

A round trains on ``num_workers x rollout_fragment_length x num_envs_per_worker`` steps
(``actual_train_batch_size``; ``train_batch_size`` is not used). The loss is PPO's; a KL penalty
(``kl_coeff > 0``) adapts with the group's mean KL, so it stays equal everywhere.

Examples:
    >>> config = DDPPOConfig(env="CartPole-v1", seed=0)
    >>> config.num_workers, config.actual_train_batch_size, config.sgd_minibatch_size, config.num_sgd_iter
    (2, 1000, 50, 10)
    >>> DDPPOConfig(num_workers=1)
    Traceback (most recent call last):
    ...
    ValueError: DDPPOConfig num_workers=1: DD-PPO's workers learn together, each in its own process, so it needs at least 2; set num_workers=2 or more (or train PPO, which learns in the driver)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from flowrl.algorithms import Algorithm
from flowrl.algorithms.ppo import PPOConfig, PPOPolicy
from flowrl.collective import BACKENDS
from flowrl.config import num_workers_that_fit
from flowrl.iter import LocalIterator
from flowrl.ops import (AllReduceTrainOneStep, ParallelRollouts, RecordGroupTraining, StandardMetricsReporting,
                        WarnAboutBadRewardScales, form_process_group)
from flowrl.sample_batch import ADVANTAGES
from flowrl.validation import bounded
from flowrl.workers import WorkerSet

__all__ = ["DDPPOConfig", "plan", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class DDPPOConfig(PPOConfig):
    """DD-PPO's config: :class:`~flowrl.algorithms.ppo.PPOConfig` with RLlib's DD-PPO defaults.

    Attributes:
        num_workers: the workers that sample and learn together: 2 by default (capped at the CPUs available);
            at least 2.
        rollout_fragment_length: 100 steps per env per round. num_envs_per_worker: 5.
        sgd_minibatch_size: rows per minibatch of each worker's own batch (50); the group's minibatch is
            ``num_workers`` times as large. num_sgd_iter: 10 epochs per round.
        lr: 5e-4, ten times PPO's: a round takes only ``num_sgd_iter x rows / sgd_minibatch_size`` steps (100 with
            these defaults, against PPO's 937 on its 4000-row batches), and at PPO's 5e-5 it needed about twice PPO's
            env steps to reach CartPole's 450. kl_coeff: 0.0 (RLlib's DD-PPO has no KL penalty; here a positive one
            adapts with the group's mean KL).
        collective_backend: ``"gloo"`` (CPU tensors) or ``"nccl"`` (one GPU per worker:
            ``num_gpus_per_worker=1`` and ``device="cuda"``).
        collective_timeout_s: (:class:`~flowrl.config.TrainerConfig`'s) how long a worker waits for its peers,
            forming the group and in each all-reduce, before it fails (a dead peer fails the round, not hang it).
        keep_local_weights_in_sync: the first worker sends its weights to the driver every round (for
            evaluation, checkpoints and ``get_policy``); ``False`` saves that transfer for large models, and the
            driver's copy then holds the weights of the last checkpoint restore only.
    """

    trains_recurrent_models: ClassVar[bool] = False  # each worker's minibatch count must match its peers'

    num_workers: int = field(default_factory=num_workers_that_fit(2, "DDPPOConfig"))
    rollout_fragment_length: int = 100
    num_envs_per_worker: int = 5
    train_batch_size: int = bounded(1000, ge=1, meaning="not used: a round trains on every worker's fragment")
    sgd_minibatch_size: int = bounded(50, ge=1, meaning="rows per minibatch of each worker's batch")
    num_sgd_iter: int = bounded(10, ge=1, meaning="epochs per round")
    lr: float = 5e-4
    kl_coeff: float = bounded(0.0, ge=0, meaning="0 turns the KL penalty off")
    collective_backend: str = "gloo"
    keep_local_weights_in_sync: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        if self.num_workers < 2:
            raise ValueError(f"{name} num_workers={self.num_workers}: DD-PPO's workers learn together, each in "
                             f"its own process, so it needs at least 2; set num_workers=2 or more (or train PPO, "
                             f"which learns in the driver)")
        if self.executor == "local":
            raise ValueError(f"{name} executor='local': DD-PPO's workers form a process group, one process each, "
                             f"and the local executor runs them all in the driver; use executor='ray'")
        if self.batch_mode != "truncate_episodes":
            raise ValueError(f"{name} batch_mode={self.batch_mode!r}: every worker takes one all-reduced step per "
                             f"minibatch, so their batches must be equal; use batch_mode='truncate_episodes'")
        if self.policies is not None:
            raise ValueError(f"{name} policies={sorted(self.policies)}: DD-PPO trains one policy; the policies' "
                             f"batches would differ in size between workers; use PPO for multi-agent training")
        if self.collective_backend not in BACKENDS:
            raise ValueError(f"{name} collective_backend={self.collective_backend!r} is not one of {BACKENDS}; use "
                             f"'gloo' (CPU) or 'nccl' (one GPU per worker)")
        if self.collective_backend == "nccl" and (self.num_gpus_per_worker < 1 or not self.device.startswith("cuda")):
            raise ValueError(f"{name} collective_backend='nccl' all-reduces CUDA tensors, one GPU per worker, but "
                             f"num_gpus_per_worker={self.num_gpus_per_worker} and device={self.device!r}; set "
                             f"num_gpus_per_worker=1 and device='cuda', or use collective_backend='gloo'")
        if self.num_gpus or self.num_learners > 1:
            raise ValueError(f"{name} num_gpus={self.num_gpus:g}, num_learners={self.num_learners}: DD-PPO has no "
                             f"central learner to give GPUs or learners to; its workers learn: give each a GPU with "
                             f"num_gpus_per_worker=1 and device='cuda'")

    def _check_minibatch_size(self) -> None:
        if self.sgd_minibatch_size > self.sample_size:
            raise ValueError(f"{type(self).__name__} sgd_minibatch_size={self.sgd_minibatch_size} exceeds each "
                             f"worker's batch of rollout_fragment_length x num_envs_per_worker = {self.sample_size} "
                             f"rows; lower it or sample more per worker")

    @property
    def actual_train_batch_size(self) -> int | None:
        """Every worker's fragment: ``num_workers x rollout_fragment_length x num_envs_per_worker`` steps."""
        return self.sample_size * self.num_workers

    def train_batch_size_warning(self) -> str | None:
        """``None``: a round's size follows from the workers' fragments (``train_batch_size`` is not used)."""
        return None


def plan(workers: WorkerSet, config: DDPPOConfig) -> LocalIterator[dict[str, Any]]:
    """DD-PPO: every worker samples and learns in place, gradients all-reduced; the driver records; report.

    Examples:
        >>> from flowrl.plan_graph import stand_in_plan
        >>> with stand_in_plan(ALGORITHM, DDPPOConfig(num_workers=2)) as it:
        ...     for stage in repr(it).split("."):
        ...         print(stage)
        LocalIterator[ParallelIterator[ParallelRollouts(raw)
        for_each(AllReduceTrainOneStep)]
        batch_across_shards()
        for_each(RecordGroupTraining)
        filter(ReportGate(0 steps, 0 s))
        for_each(CollectMetrics)
        for_each(WarnAboutBadRewardScales)]
    """
    form_process_group(workers, backend=config.collective_backend, timeout_s=config.collective_timeout_s)
    train_op = (ParallelRollouts(workers, mode="raw")
                .for_each(AllReduceTrainOneStep(num_sgd_iter=config.num_sgd_iter,
                                                sgd_minibatch_size=config.sgd_minibatch_size,
                                                standardize_fields=[ADVANTAGES],
                                                send_weights=config.keep_local_weights_in_sync))
                .batch_across_shards(timeout_s=config.sample_timeout_s)
                .for_each(RecordGroupTraining(workers)))
    return StandardMetricsReporting(train_op, workers, config).for_each(WarnAboutBadRewardScales(config))


ALGORITHM = Algorithm("ddppo", DDPPOConfig, PPOPolicy, plan)
