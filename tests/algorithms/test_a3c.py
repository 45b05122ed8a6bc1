"""A3C: config, the plan against fake workers (each gradient answered with weights to its
producer alone), a seeded learning check, and plans being swappable (another algorithm's policy, untouched,
trains under the A3C plan)."""

from __future__ import annotations

import re
from typing import Any
import pytest
from flowrl import executor

from flowrl.algorithms import get_algorithm
from flowrl.algorithms.a2c import ActorCriticPolicy
from flowrl.algorithms.a3c import ALGORITHM, A3CConfig, plan
from flowrl.algorithms.pg import PGConfig
from flowrl.testing import make_fake_workers

from .test_pg import train_until

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py


def test_config_has_a3c_defaults() -> None:
    c = A3CConfig()
    assert (c.rollout_fragment_length, c.timesteps_per_iteration, c.min_iter_time_s, c.grad_clip, c.lr,
            c.num_workers) == (10, 1000, 0, 40, 1e-4, 2)
    assert (c.use_gae, c.lambda_, c.vf_loss_coeff, c.entropy_coeff) == (True, 1.0, 0.5, 0.01)


def test_config_needs_remote_workers() -> None:
    with pytest.raises(ValueError, match=re.escape("num_workers=0: A3C computes gradients on remote workers and "
                                                   "needs num_workers >= 1; use a2c")):
        A3CConfig(num_workers=0)
    assert A3CConfig(num_workers=1).num_workers == 1


def test_registered_under_a3c_with_the_shared_actor_critic_policy() -> None:
    assert get_algorithm("a3c") is ALGORITHM
    assert (ALGORITHM.config_class, ALGORITHM.policy_class, ALGORITHM.plan) == (A3CConfig, ActorCriticPolicy, plan)
    assert get_algorithm("a2c").policy_class is ActorCriticPolicy


def test_each_gradient_is_applied_once_and_answered_to_its_producer_alone() -> None:
    workers = make_fake_workers(2, rollout_fragment_length=10)
    try:
        results = plan(workers, A3CConfig(timesteps_per_iteration=0))
        assert repr(results) == ("LocalIterator[AsyncGradients.for_each(ApplyGradients(update_all=False))"
                                 ".filter(ReportGate(0 steps, 0 s)).for_each(CollectMetrics)]")
        last = [next(results) for _ in range(12)][-1]  # no gate: one report per applied gradient
        assert (last["info"]["num_steps_trained"], last["info"]["num_steps_sampled"]) == (120, 120)
        assert len(workers.local_worker().applied_gradients) == 12
        records = executor.get([w.get_record.remote() for w in workers.remote_workers()])
        # two initial syncs per worker (WorkerSet, AsyncGradients), then the version after each applied gradient
        answers = [[versions["default_policy"] for versions, _ in r["set_weights_calls"][2:]] for r in records]
        assert sorted(v for a in answers for v in a) == list(range(1, 13))
        for record, answered in zip(records, answers):
            assert answered == sorted(answered)
            assert record["sample_calls"] - len(answered) in (0, 1)  # one request in flight per worker
    finally:
        workers.stop()


def test_needs_remote_workers() -> None:
    with pytest.raises(ValueError, match="AsyncGradients needs remote workers"):
        plan(make_fake_workers(0), PGConfig())


@pytest.mark.parametrize("hyperparameters", [
    pytest.param({"lr": 1e-3, "rollout_fragment_length": 50}, id="lr1e-3-fragment50",  # ~20-25k steps, ~10 s
                 marks=pytest.mark.slow),  # the default tier keeps one learning check per family (PPO, PG, A2C, IMPALA)
    pytest.param({}, id="defaults", marks=pytest.mark.slow),  # lr 1e-4, fragments of 10: ~40k steps, ~1 minute
])
def test_a3c_learns_cartpole_within_200k_steps(hyperparameters: dict[str, Any]) -> None:
    config = A3CConfig(env="CartPole-v1", seed=0, num_workers=2, num_cpus_per_worker=0.5, min_iter_time_s=0,
                       timesteps_per_iteration=5000, **hyperparameters)  # async: gradient order varies run to run
    result, seconds = train_until(ActorCriticPolicy, config, plan, target=150, max_steps=200_000)
    print(f"A3C {hyperparameters}: return {result['episode_reward_mean']:.1f} after {result['timesteps_total']} "
          f"steps, {seconds:.0f} s")
    assert result["episode_reward_mean"] >= 150


@pytest.mark.parametrize("name, settings, stat", [
    ("ppo", {"lr": 1e-3}, "kl"),  # PPO's clipped surrogate, one gradient per 200-step fragment
    ("pg", {"lr": 1e-3, "batch_mode": "complete_episodes"}, "entropy"),  # REINFORCE over whole episodes
])
def test_plans_are_swappable_another_policy_trains_under_the_a3c_plan(name: str, settings: dict[str, Any],
                                                                     stat: str) -> None:
    """Another algorithm's config class and policy, untouched, under A3C's dataflow: its gradients are computed
    on the workers and applied asynchronously (~20-30k steps to return 100 observed)."""
    algorithm = get_algorithm(name)
    config = algorithm.config_class(env="CartPole-v1", seed=0, num_workers=2, num_cpus_per_worker=0.5,
                                    timesteps_per_iteration=5000, **settings)
    result, seconds = train_until(algorithm.policy_class, config, plan, target=100, max_steps=60_000)
    print(f"{name} policy under the A3C plan: return {result['episode_reward_mean']:.1f} after "
          f"{result['timesteps_total']} steps, {seconds:.0f} s")
    assert result["episode_reward_mean"] >= 100
    assert stat in result["info"]["learner"]["default_policy"]["learner_stats"]  # the policy's own loss ran
