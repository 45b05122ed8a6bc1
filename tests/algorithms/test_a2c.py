"""A2C and the actor-critic policy it shares with A3C: config, GAE postprocessing and
bootstrapping, the loss, the plan's three variants, determinism and a seeded learning check."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.algorithms import get_algorithm
from flowrl.algorithms.a2c import ALGORITHM, A2CConfig, ActorCriticPolicy, plan
from flowrl.algorithms.pg import PGConfig
from flowrl.postprocessing import compute_gae, discounted_returns
from flowrl.sample_batch import (ACTIONS, ADVANTAGES, NEXT_OBS, OBS, REWARDS, TERMINATEDS, TRUNCATEDS,
                                 VALUE_TARGETS, VF_PREDS, SampleBatch)
from flowrl.workers import RolloutWorker, WorkerSet

from .test_pg import comparable, first_results, train_until
from .test_ppo import assert_plan_trains_gaussian_actions, pendulum_config

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

BOX4 = gym.spaces.Box(-1, 1, (4,), np.float32)


# -- config -----------------------------------------------------------------------------------------

def test_config_has_a2c_defaults() -> None:
    c = A2CConfig()
    assert (c.rollout_fragment_length, c.timesteps_per_iteration, c.min_iter_time_s, c.microbatch_size,
            c.microbatches_per_step) == (20, 1000, 0, None, 1)
    assert (c.use_gae, c.lambda_, c.vf_loss_coeff, c.entropy_coeff, c.grad_clip, c.lr) == \
        (True, 1.0, 0.5, 0.01, 40, 1e-4)
    assert A2CConfig(train_batch_size=50, microbatch_size=20).microbatches_per_step == 3  # ceil(50 / 20)


@pytest.mark.parametrize("kwargs, message", [
    ({"lambda_": 1.5}, "lambda_=1.5 must be a number in [0, 1] (1.0: Monte Carlo advantages"),
    ({"vf_loss_coeff": -1.0}, "vf_loss_coeff=-1.0 must be a number >= 0 (0 leaves the value head untrained)"),
    ({"entropy_coeff": -0.1}, "entropy_coeff=-0.1 must be a number >= 0 (0 turns the entropy bonus off)"),
    ({"microbatch_size": 0}, "microbatch_size=0 must be an int >= 1, or None (steps per microbatch"),
    ({"microbatch_size": 20, "num_gpus": 2, "fake_gpus": True}, "set microbatch_size=None or simple_optimizer=True"),
    ({"grad_clip": 0.0}, "grad_clip=0.0 must be a number > 0, or None"),
])
def test_config_validation_names_field_value_and_fix(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        A2CConfig(**kwargs)


def test_registered_under_a2c() -> None:
    assert get_algorithm("a2c") is ALGORITHM
    assert (ALGORITHM.config_class, ALGORITHM.policy_class, ALGORITHM.plan) == (A2CConfig, ActorCriticPolicy, plan)


# -- policy: postprocessing -------------------------------------------------------------------------

def make_policy(**kwargs: Any) -> ActorCriticPolicy:
    return ActorCriticPolicy(BOX4, gym.spaces.Discrete(2), A2CConfig(seed=0, **kwargs))


def test_policy_needs_the_actor_critic_settings() -> None:
    with pytest.raises(TypeError, match="needs an ActorCriticConfig.*got PGConfig"):
        ActorCriticPolicy(BOX4, gym.spaces.Discrete(2), PGConfig())


def episode_piece(policy: ActorCriticPolicy, n: int, end: str) -> SampleBatch:
    """``n`` steps of one episode that ends ``"terminated"``, ``"truncated"`` or is ``"cut"`` mid-episode."""
    obs = np.random.default_rng(n).uniform(-1, 1, (n + 1, 4)).astype(np.float32)
    last = np.eye(n, dtype=bool)[n - 1]
    return SampleBatch({OBS: obs[:-1], NEXT_OBS: obs[1:], ACTIONS: np.arange(n) % 2,
                        REWARDS: np.linspace(0.5, 1.5, n, dtype=np.float32), VF_PREDS: policy.value(obs[:-1]),
                        TERMINATEDS: last & (end == "terminated"), TRUNCATEDS: last & (end == "truncated")})


@pytest.mark.parametrize("end", ["terminated", "truncated", "cut"])
def test_gae_bootstraps_truncated_and_cut_episodes_but_not_terminated_ones(end: str) -> None:
    policy = make_policy(gamma=0.9, lambda_=0.8)
    batch = episode_piece(policy, 5, end)
    obs_and_last = np.concatenate([batch[OBS], batch[NEXT_OBS][-1:]])
    values = policy.value(obs_and_last)  # V(s_0) .. V(s_5)
    tail = 0.0 if end == "terminated" else values[-1]
    out = policy.postprocess_trajectory(batch.copy())
    expected_adv, expected_targets = compute_gae(
        rewards=batch[REWARDS], values=values[:-1], next_values=np.append(values[1:-1], tail),
        terminateds=batch[TERMINATEDS], truncateds=batch[TRUNCATEDS], gamma=0.9, lambda_=0.8)
    np.testing.assert_allclose(out[ADVANTAGES], expected_adv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[VALUE_TARGETS], expected_targets, rtol=1e-5, atol=1e-6)
    # the last step by hand: r + gamma * V(new_obs) unless terminated
    assert out[VALUE_TARGETS][-1] == pytest.approx(batch[REWARDS][-1] + 0.9 * tail, rel=1e-5)


def test_lambda_zero_gives_one_step_td_errors() -> None:
    policy = make_policy(gamma=0.9, lambda_=0.0)
    batch = episode_piece(policy, 4, "cut")
    next_values = policy.value(batch[NEXT_OBS])
    out = policy.postprocess_trajectory(batch.copy())
    np.testing.assert_allclose(out[ADVANTAGES], batch[REWARDS] + 0.9 * next_values - batch[VF_PREDS], rtol=1e-5)


def test_without_gae_advantages_are_bootstrapped_returns_minus_values() -> None:
    policy = make_policy(gamma=0.9, use_gae=False)
    batch = episode_piece(policy, 4, "truncated")
    out = policy.postprocess_trajectory(batch.copy())
    returns = discounted_returns(rewards=batch[REWARDS], terminateds=batch[TERMINATEDS], truncateds=batch[TRUNCATEDS],
                                 gamma=0.9, bootstrap=policy.value(batch[NEXT_OBS]))
    np.testing.assert_allclose(out[VALUE_TARGETS], returns, rtol=1e-6)
    np.testing.assert_allclose(out[ADVANTAGES], returns - batch[VF_PREDS], rtol=1e-6)


def test_sampled_fragments_get_advantages_consistent_with_their_value_predictions() -> None:
    config = A2CConfig(seed=1, num_workers=0, num_envs_per_worker=2, rollout_fragment_length=60)
    batch = RolloutWorker(policy_class=ActorCriticPolicy, config=config).sample()
    assert batch.count == 120
    np.testing.assert_allclose(batch[VALUE_TARGETS] - batch[ADVANTAGES], batch[VF_PREDS], atol=1e-5)
    assert batch[TERMINATEDS].any()  # CartPole episodes this short end inside the fragment


# -- policy: loss -----------------------------------------------------------------------------------

def test_loss_combines_policy_value_and_entropy_terms() -> None:
    policy = make_policy(vf_loss_coeff=0.25, entropy_coeff=0.1)
    tensors = policy.to_tensors(policy.postprocess_trajectory(episode_piece(policy, 6, "cut")))
    loss, stats = policy.loss(tensors)
    logits, values = policy.model(tensors[OBS])
    dist = torch.distributions.Categorical(logits=logits)
    pi = -(dist.log_prob(tensors[ACTIONS]) * tensors[ADVANTAGES]).mean()
    vf = 0.5 * ((values - tensors[VALUE_TARGETS]) ** 2).mean()
    torch.testing.assert_close(loss, pi + 0.25 * vf - 0.1 * dist.entropy().mean())
    assert stats["policy_loss"] == pytest.approx(pi.item(), rel=1e-5)
    assert stats["vf_loss"] == pytest.approx(vf.item(), rel=1e-5)
    assert stats["entropy"] == pytest.approx(dist.entropy().mean().item(), rel=1e-5)


def test_gradients_are_clipped_to_grad_clip() -> None:
    policy = make_policy(grad_clip=1e-3)
    batch = policy.postprocess_trajectory(episode_piece(policy, 6, "terminated"))
    grads, info = policy.compute_gradients(batch)
    assert info["learner_stats"]["grad_gnorm"] > 1e-3  # the unclipped norm is reported
    assert np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads)) <= 1e-3 * (1 + 1e-4)


# -- plan -------------------------------------------------------------------------------------------

SMALL = A2CConfig(seed=0, num_workers=0, train_batch_size=40, timesteps_per_iteration=0)
TAIL = ".filter(ReportGate(0 steps, 0 s)).for_each(CollectMetrics)]"


@pytest.mark.parametrize("kwargs, middle", [
    ({}, "combine(ConcatBatches(40)).for_each(TrainOneStep)"),
    ({"microbatch_size": 15}, "combine(ConcatBatches(15)).for_each(ComputeGradients).batch(3)"
                              ".for_each(AverageGradients).for_each(ApplyGradients)"),
    ({"num_gpus": 2, "fake_gpus": True}, "combine(ConcatBatches(40)).for_each(MultiGPUTrainOneStep(2 fake cpu))"),
])
def test_plan_variants_read_like_the_figure(kwargs: dict[str, Any], middle: str) -> None:
    config = dataclasses.replace(SMALL, **kwargs)
    results = plan(WorkerSet(policy_class=ActorCriticPolicy, config=config), config)
    assert repr(results) == f"LocalIterator[ParallelRollouts(bulk_sync).{middle}{TAIL}"
    result = next(results)
    assert result["info"]["num_steps_trained"] >= 40
    assert result["info"]["num_steps_trained"] == result["info"]["num_steps_sampled"]


def test_microbatches_average_to_the_full_batch_step() -> None:
    """Two microbatches of 20 whose gradients are averaged (a mean) update the weights as one
    batch of 40 does: the loss is a mean, so the mean of the halves' gradients is the whole batch's gradient."""
    weights = []
    for microbatch_size in (None, 20):
        config = dataclasses.replace(SMALL, microbatch_size=microbatch_size, grad_clip=None, lr=0.01)
        workers = WorkerSet(policy_class=ActorCriticPolicy, config=config)
        assert next(plan(workers, config))["info"]["num_steps_trained"] == 40
        weights.append(workers.local_worker().get_weights()["default_policy"])
    for name, value in weights[0].items():
        np.testing.assert_allclose(weights[1][name], value, atol=1e-6, err_msg=name)


def test_same_seed_gives_identical_results_with_remote_workers() -> None:
    config = A2CConfig(seed=5, num_workers=2, num_cpus_per_worker=0.5, train_batch_size=100, timesteps_per_iteration=0)
    first, second = ([comparable(r) for r in first_results(ActorCriticPolicy, config, plan, 3)] for _ in range(2))
    assert first == second
    assert "'num_healthy_workers': 2" in first[0] and "'timesteps_total': 120" in first[0]  # 2 x 20, concat to >= 100


# -- learning ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("hyperparameters", [
    pytest.param({"lr": 1e-3}, id="lr1e-3"),  # ~30k steps, seconds
    pytest.param({}, id="defaults", marks=pytest.mark.slow),  # lr 1e-4: ~140k steps
])
def test_a2c_learns_cartpole_within_500k_steps(hyperparameters: dict[str, Any]) -> None:
    config = A2CConfig(env="CartPole-v1", seed=0, num_workers=0, min_iter_time_s=0, timesteps_per_iteration=10_000,
                       **hyperparameters)
    result, seconds = train_until(ActorCriticPolicy, config, plan, target=150, max_steps=500_000)
    print(f"A2C {hyperparameters}: return {result['episode_reward_mean']:.1f} after {result['timesteps_total']} "
          f"steps, {seconds:.0f} s")
    assert result["episode_reward_mean"] >= 150


@pytest.mark.parametrize("free_log_std", [True, False])
def test_plan_trains_gaussian_actions_on_pendulum(free_log_std: bool) -> None:
    assert_plan_trains_gaussian_actions("a2c", pendulum_config(A2CConfig, free_log_std, rollout_fragment_length=20,
                                                               train_batch_size=40))
