"""MAML: model-agnostic meta-learning (Finn et al. 2017, https://arxiv.org/abs/1703.03400) with a PPO outer loss,
as RLlib Flow's showcase plan (https://arxiv.org/abs/2011.12719).

Dataflow: every remote worker plays its own task. Rounds of complete episodes come from all workers at a
barrier (``batch_across_shards``); a ``transform`` (``InnerAdaptation``) sends each of the first
``inner_adaptation_steps`` rounds back to its worker, whose ``learn_on_batch`` takes one plain gradient step of
the policy-gradient loss with ``inner_lr`` (the worker's policy adapts to its task before it samples again), and
after the last round emits every round as one meta batch. ``MetaUpdate`` then runs ``maml_optimizer_steps``
driver steps of the meta-loss: for each task, the same inner steps taken differentiably from the meta weights on
that task's pre-adaptation rounds, then PPO's clipped surrogate of the adapted policy on the post-adaptation
round (importance ratios against the adapted policy that sampled it), plus ``kl_coeff_s x KL`` between the
policy that sampled round ``s + 1`` and its differentiable re-adaptation (coefficients adapted towards
``kl_target``), plus the value loss. The meta weights go back to every worker, new tasks are drawn, and the
meta-update is one result (with ``episode_reward_mean_adapt_<r>`` and ``adaptation_delta``).

Examples:
    >>> config = MAMLConfig()
    >>> config.env, config.inner_adaptation_steps, config.maml_optimizer_steps, config.inner_lr
    ('flowrl/PointGoal-v0', 1, 5, 0.1)
    >>> MAMLConfig(batch_mode="truncate_episodes")
    Traceback (most recent call last):
    ...
    ValueError: batch_mode='truncate_episodes': MAML adapts on whole episodes of each task; use batch_mode='complete_episodes'
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

import torch
from torch.func import functional_call

from flowrl.algorithms import Algorithm
from flowrl.algorithms.actor_critic import adapt_kl_coeff
from flowrl.config import ModelConfig, TrainerConfig, num_workers_that_fit
from flowrl.envs import POINT_GOAL, EnvSpec
from flowrl.iter import LocalIterator, from_actors
from flowrl.ops.meta import (ADAPTATION_ROUND, TASK_INDEX, InnerAdaptation, MetaUpdate, check_task_env,
                             mean_episode_return, standardized_advantages)
from flowrl.ops.metrics import CollectMetrics
from flowrl.policy import NONFINITE_UPDATES_SKIPPED, Policy, TensorBatch
from flowrl.sample_batch import (ACTION_DIST_INPUTS, ACTIONS, ADVANTAGES, DEFAULT_POLICY_ID, LOGP, OBS, VALUE_TARGETS,
                                 SampleBatch)
from flowrl.validation import bounded
from flowrl.workers import RolloutWorker, WorkerSet

__all__ = ["MAMLConfig", "MAMLPolicy", "plan", "evaluate_adaptation", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class MAMLConfig(TrainerConfig):
    """MAML's config: RLlib's MAML defaults on the 2-D navigation task distribution.

    Attributes:
        env: ``flowrl/PointGoal-v0``; any env with ``sample_tasks(n)`` and ``set_task(task)``.
        num_workers: tasks per meta-update, one per remote worker (>= 1).
        num_envs_per_worker: 10 envs of the worker's task stepped together (10 x 2 episodes a round).
        rollout_fragment_length: 200 steps per env per round.
        batch_mode: ``"complete_episodes"`` (required).
        inner_adaptation_steps: inner steps per meta-iteration (1): that many rounds adapt, one more is scored.
        maml_optimizer_steps: driver steps of the meta-loss per meta-iteration (5).
        inner_lr: the inner step's plain gradient step size (0.1).
        lr: the meta optimizer's (Adam's) learning rate (1e-3).
        clip_param: the outer PPO clip (0.3).
        lambda_: GAE's lambda (1.0).
        vf_loss_coeff: the value loss's weight (0.5).
        kl_coeff: each inner step's initial KL coefficient (0.0005).
        kl_target: the inner KL the coefficients steer towards (0.01).
        model: a tanh MLP of (64, 64) with a free log-std.
    """

    env: EnvSpec = POINT_GOAL
    num_workers: int = bounded(default_factory=num_workers_that_fit(2, "MAMLConfig"), ge=1,
                               meaning="tasks per meta-update, one per worker")
    num_envs_per_worker: int = 10
    rollout_fragment_length: int = 200
    batch_mode: Literal["truncate_episodes", "complete_episodes"] = "complete_episodes"
    inner_adaptation_steps: int = bounded(1, ge=1, meaning="inner steps per meta-iteration")
    maml_optimizer_steps: int = bounded(5, ge=1, meaning="meta-loss steps per meta-iteration")
    inner_lr: float = bounded(0.1, gt=0, meaning="the inner step's size")
    lr: float = 1e-3
    lambda_: float = bounded(1.0, ge=0, le=1, meaning="GAE's lambda")
    clip_param: float = bounded(0.3, gt=0, meaning="the outer surrogate's clip")
    vf_loss_coeff: float = bounded(0.5, ge=0, meaning="weight of the value loss")
    kl_coeff: float = bounded(0.0005, ge=0, meaning="each inner step's initial KL coefficient")
    kl_target: float = bounded(0.01, gt=0, meaning="the inner KL the coefficients steer towards")
    model: ModelConfig = field(default_factory=lambda: ModelConfig(hidden_sizes=(64, 64)))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_mode != "complete_episodes":
            raise ValueError(f"batch_mode={self.batch_mode!r}: MAML adapts on whole episodes of each task; use "
                             f"batch_mode='complete_episodes'")
        if self.num_gpus > 1:
            raise ValueError(f"num_gpus={self.num_gpus}: MAML's meta-update runs on one device; use num_gpus <= 1")
        if self.policies is not None:
            raise ValueError("policies: MAML trains one policy; leave policies=None")
        if self.model.use_lstm:
            raise ValueError("model.use_lstm: MAML's inner steps here are for feed-forward policies; set "
                             "use_lstm=False")

    @property
    def steps_per_meta_iteration(self) -> int:
        """Env steps one meta-iteration (one result) samples: its rounds from every worker, whole episodes (at
        least ``rollout_fragment_length`` steps per env; exactly that when episodes divide it)."""
        return ((self.inner_adaptation_steps + 1) * self.num_workers * self.num_envs_per_worker
                * self.rollout_fragment_length)


def plan(workers: WorkerSet, config: MAMLConfig) -> LocalIterator[dict[str, Any]]:
    """MAML: rounds from every worker at a barrier -> inner adaptation on the workers -> meta-update -> result."""
    check_task_env(workers)
    workers.sync_weights()
    rounds = from_actors(workers.remote_workers()).batch_across_shards(timeout_s=config.sample_timeout_s)
    collect = CollectMetrics(workers, config.metrics_smoothing_episodes, config.collect_metrics_timeout,
                             config.keep_per_episode_custom_metrics)
    return (rounds
            .transform(InnerAdaptation(workers, config.inner_adaptation_steps))
            .for_each(MetaUpdate(workers, config.maml_optimizer_steps, collect)))


class MAMLPolicy(Policy):
    """MAML's Gaussian (or categorical) actor-critic.

    ``learn_on_batch`` of a batch without ``task_index`` (a worker's own round) is the inner step: one plain
    gradient step of ``-mean(logp(a) * A)`` with ``inner_lr`` (the advantages arrive standardised; a non-finite
    gradient is skipped and counted, as every learning path does). With
    ``task_index`` (the meta batch) it is one Adam step of the meta-loss (module docstring), reporting
    ``inner_kl_<s>`` per inner step. ``postprocess_trajectory``: GAE with ``lambda_``.
    """

    config: MAMLConfig
    config_class = MAMLConfig
    postprocess_spans_episodes = True  # GAE restarts at every episode boundary

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kl_coeffs = [self.config.kl_coeff] * self.config.inner_adaptation_steps

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        return self.add_advantages(batch, gamma=self.config.gamma, lambda_=self.config.lambda_)

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, Any]:
        if TASK_INDEX in batch:
            return super().learn_on_batch(batch)
        return self.inner_step(batch)

    def inner_step(self, batch: SampleBatch) -> dict[str, Any]:
        """One plain gradient step of the policy-gradient loss with ``inner_lr`` (the adaptation to a task)."""
        start = time.perf_counter()
        tensors = self.to_tensors(batch)
        params = [p for p in self.model.parameters()]
        loss = self._pg_loss(tensors, {n: p for n, p in self.model.named_parameters()})
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        if not all(g is None or bool(torch.isfinite(g).all()) for g in grads):
            self._skip_nonfinite_update()  # a NaN or inf step is never applied (counted; or it raises)
            return {"learner_stats": {"inner_loss": float(loss.detach()),
                                      NONFINITE_UPDATES_SKIPPED: self.num_nonfinite_updates_skipped}}
        with torch.no_grad():
            for p, g in zip(params, grads):
                if g is not None:
                    p.sub_(self.config.inner_lr * g)
        self.weights_version += 1
        return {"learner_stats": {"inner_loss": float(loss.detach()), "inner_step_s": time.perf_counter() - start}}

    def _pg_loss(self, t: TensorBatch, params: dict[str, torch.Tensor]) -> torch.Tensor:
        dist_inputs, _ = functional_call(self.model, params, (t[OBS],))
        return -(self.action_distribution(dist_inputs).logp(t[ACTIONS]) * t[ADVANTAGES]).mean()

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        steps = cfg.inner_adaptation_steps
        task, rnd = batch[TASK_INDEX], batch[ADAPTATION_ROUND]
        meta: dict[str, torch.Tensor] = {n: p for n, p in self.model.named_parameters()}
        outer: list[torch.Tensor] = []
        inner_kls: list[list[torch.Tensor]] = [[] for _ in range(steps)]
        for i in range(int(task.max()) + 1):
            params = meta
            for s in range(steps):
                rows = {k: v[(task == i) & (rnd == s)] for k, v in batch.items()}
                grads = torch.autograd.grad(self._pg_loss(rows, params), list(params.values()), create_graph=True,
                                            allow_unused=True)
                params = {n: w if g is None else w - cfg.inner_lr * g for (n, w), g in zip(params.items(), grads)}
                after = (task == i) & (rnd == s + 1)
                adapted = self.action_distribution(functional_call(self.model, params, (batch[OBS][after],))[0])
                inner_kls[s].append(self.action_distribution(batch[ACTION_DIST_INPUTS][after]).kl(adapted).mean())
            post = (task == i) & (rnd == steps)
            dist = self.action_distribution(functional_call(self.model, params, (batch[OBS][post],))[0])
            ratio = torch.exp(dist.logp(batch[ACTIONS][post]) - batch[LOGP][post])
            adv = batch[ADVANTAGES][post]
            outer.append(-torch.min(adv * ratio, adv * ratio.clamp(1 - cfg.clip_param, 1 + cfg.clip_param)).mean())
        kls = [torch.stack(k).mean() for k in inner_kls]
        policy_loss = torch.stack(outer).mean()
        values = self.model(batch[OBS])[1]
        vf_loss = 0.5 * (values - batch[VALUE_TARGETS]).pow(2).mean()
        total = policy_loss + cfg.vf_loss_coeff * vf_loss + sum(c * kl for c, kl in zip(self.kl_coeffs, kls))
        stats = {"policy_loss": float(policy_loss.detach()), "vf_loss": float(vf_loss.detach())}
        stats.update({f"inner_kl_{s}": float(kl.detach()) for s, kl in enumerate(kls)})
        return total, stats

    def update_kl(self, sampled_kl: float | Sequence[float]) -> None:
        """Adapts each inner step's KL coefficient towards ``kl_target`` from its sampled KL."""
        kls = [sampled_kl] if isinstance(sampled_kl, (int, float)) else list(sampled_kl)
        self.kl_coeffs = [adapt_kl_coeff(c, float(kl), self.config.kl_target) for c, kl in zip(self.kl_coeffs, kls)]

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "kl_coeffs": list(self.kl_coeffs)}

    def set_state(self, state: Any) -> None:
        super().set_state(state)
        if "kl_coeffs" in state:
            self.kl_coeffs = [float(c) for c in state["kl_coeffs"]]


def evaluate_adaptation(weights: Mapping[str, Any], config: MAMLConfig, tasks: Sequence[Any]
                        ) -> tuple[list[float], list[float]]:
    """The mean episode return on each task before and after ``inner_adaptation_steps`` inner steps taken from
    ``weights`` (a policy's :meth:`~flowrl.policy.Policy.get_weights`, MAML's or any policy's with the same model)
    on that task's own episodes, as MAML's workers take them: one round of ``num_envs_per_worker`` envs x
    ``rollout_fragment_length`` steps per step and one to score. Runs in this process."""
    worker = RolloutWorker(policy_class=MAMLPolicy, config=config)
    try:
        before, after = [], []
        for task in tasks:
            worker.set_weights({DEFAULT_POLICY_ID: dict(weights)})
            worker.set_task(task)
            for step in range(config.inner_adaptation_steps):
                batch = worker.sample()
                assert isinstance(batch, SampleBatch)  # one policy (MAMLConfig refuses policies)
                if step == 0:
                    before.append(mean_episode_return([batch]))
                worker.learn_on_batch(standardized_advantages(batch))
            scored = worker.sample()
            assert isinstance(scored, SampleBatch)
            after.append(mean_episode_return([scored]))
        return before, after
    finally:
        worker.env.close()


ALGORITHM = Algorithm("maml", MAMLConfig, MAMLPolicy, plan)
