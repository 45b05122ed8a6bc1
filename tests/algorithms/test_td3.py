"""TD3: DDPG's plan and policy with the paper's tricks on: its defaults, validation, twin critics, delayed actor
steps, target smoothing in the learner, the plan on Pendulum, a short learning check and the slow Pendulum gate."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch

from flowrl.algorithms import get_algorithm
from flowrl.algorithms.ddpg import DDPGConfig, DDPGPolicy
from flowrl.algorithms.td3 import ALGORITHM, TD3Config, make_owned_state, plan
from flowrl.workers import WorkerSet

from .test_ddpg import (SEEDS, SMALL_NETS, ActionQ, bootstrap, loss_batch, make_policy, no_terminal, params_of,
                        pendulum_gate, same, short_learning_check)

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py


def test_defaults_are_tds_and_the_rest_is_ddpgs() -> None:
    c = TD3Config()
    assert (c.twin_q, c.policy_delay, c.smooth_target_policy, c.target_noise, c.target_noise_clip,
            c.exploration_noise, c.exploration_noise_type, c.tau, c.l2_reg) == \
        (True, 2, True, 0.2, 0.5, 0.1, "gaussian", 0.005, 0.0)
    ddpg = DDPGConfig()
    assert (c.env, c.train_batch_size, c.learning_starts, c.random_timesteps, c.actor_hiddens, c.lr) == \
        (ddpg.env, ddpg.train_batch_size, ddpg.learning_starts, ddpg.random_timesteps, ddpg.actor_hiddens, ddpg.lr)


def test_registered_under_td3_with_ddpgs_plan_and_policy() -> None:
    assert get_algorithm("td3") is ALGORITHM
    ddpg = get_algorithm("ddpg")
    assert (ALGORITHM.config_class, ALGORITHM.policy_class, ALGORITHM.plan, ALGORITHM.make_owned_state) == \
        (TD3Config, DDPGPolicy, ddpg.plan, ddpg.make_owned_state)
    assert make_owned_state(TD3Config())["replay_buffer"].capacity == TD3Config().buffer_size


@pytest.mark.parametrize("kwargs, message", [
    ({"tau": 0.0}, "tau=0.0 must be a number in (0, 1]"),
    ({"tau": 2.0}, "tau=2.0 must be a number in (0, 1]"),
    ({"exploration_noise": -0.1}, "exploration_noise=-0.1 must be a number >= 0"),
    ({"target_noise": -0.2}, "target_noise=-0.2 must be a number >= 0"),
    ({"target_noise_clip": -1.0}, "target_noise_clip=-1.0 must be a number >= 0"),
    ({"policy_delay": 0}, "policy_delay=0 must be an int >= 1 (critic steps per actor step)"),  # limits kept
    ({"normalize_actions": False}, "normalize_actions=False: TD3Config's actor emits tanh-squashed actions"),
    ({"num_gpus": 2, "fake_gpus": True}, "TD3Config's learner takes a critic and an actor step on one device"),
])
def test_config_validation_names_field_value_and_fix(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        TD3Config(**kwargs)


def test_a_discrete_env_is_refused_naming_the_space() -> None:
    config = TD3Config(env="CartPole-v1", seed=0)
    with pytest.raises(ValueError, match=r"DDPGPolicy needs a 1-D Box action space, got Discrete\(2\); DDPG and TD3"):
        WorkerSet(policy_class=DDPGPolicy, config=config)


def test_the_policy_has_twin_critics_and_steps_the_actor_every_other_call() -> None:
    policy = make_policy(TD3Config)
    assert policy.critic.num_q == 2 and policy.target_critic.num_q == 2
    rng = np.random.default_rng(0)
    changed = []
    for _ in range(4):
        actor = params_of(policy.actor)
        info = policy.learn_on_batch(loss_batch(rng))
        changed.append(not same(actor, params_of(policy.actor)))
    assert changed == [False, True, False, True] and info["learner_stats"]["num_actor_updates"] == 2


def test_the_learner_bootstraps_from_smoothed_actions_and_the_lower_critic() -> None:
    batch = no_terminal(loss_batch(np.random.default_rng(1), size=2000))
    td3 = make_policy(TD3Config, target_noise=100.0, target_noise_clip=0.25)
    td3.target_critic = ActionQ((0.0, -2.0))  # type: ignore[assignment]  # the second critic is 2 lower
    mean_action = np.tanh(td3.target_actor(torch.as_tensor(batch["new_obs"])).detach().numpy()[:, 0])
    shift = bootstrap(td3, batch) + 2.0 - mean_action
    assert np.abs(shift).max() <= 0.25 + 1e-5 and np.std(shift) > 0.15  # smoothed and clipped
    assert np.mean(np.isclose(np.abs(shift[np.abs(mean_action) < 0.7]), 0.25, atol=1e-5)) > 0.98


def test_plan_runs_on_pendulum_and_reports_learner_stats() -> None:
    config = TD3Config(seed=0, learning_starts=100, random_timesteps=100, timesteps_per_iteration=200,
                       train_batch_size=32, **SMALL_NETS)
    workers = WorkerSet(policy_class=DDPGPolicy, config=config)
    results = plan(workers, config)
    assert "UpdateTargetNetwork(0)" in repr(results)
    info = [next(results) for _ in range(2)][-1]["info"]
    stats = info["learner"]["default_policy"]["learner_stats"]
    updates = info["num_target_updates"]
    assert stats["num_actor_updates"] == updates // 2 and np.isfinite(stats["actor_loss"])


def test_td3_short_learning_check() -> None:
    """Seeded: 4000 gradient steps (after 1000 random ones) with TD3's defaults: the greedy actor goes from about
    -1300 to a swing-up (a wide margin)."""
    before, after = short_learning_check("td3")
    print(f"TD3 greedy return: {before:.0f} before, {after:.0f} after 5000 steps")
    assert after > before + 500 and after > -600


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a gate on env steps; under load the wall time varies
@pytest.mark.parametrize("seed", SEEDS)
def test_td3_reaches_the_pendulum_gate(seed: int) -> None:
    pendulum_gate("td3", seed)
