"""DDPG: config validation, the policy's acting (bounds, noise, determinism), its losses (twin-Q minimum, target
smoothing, policy delay), soft target updates, state round trips, TD errors, the plan on Pendulum, a short
learning check and the slow Pendulum gate."""

from __future__ import annotations

import dataclasses
import re
import tempfile
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from flowrl.algorithms import get_algorithm
from flowrl.algorithms.ddpg import ALGORITHM, DDPGConfig, DDPGPolicy, make_owned_state, plan
from flowrl.algorithms.dqn import DQNConfig
from flowrl.algorithms.off_policy import NSTEP_DISCOUNTS
from flowrl.config import ModelConfig
from flowrl.envs import VectorEnv
from flowrl.evaluation import evaluate_policy
from flowrl.replay_buffers import LocalReplayBuffer
from flowrl.sample_batch import ACTIONS, NEXT_OBS, OBS, REWARDS, TD_ERROR, TERMINATEDS, SampleBatch
from flowrl.trainer import Trainer
from flowrl.workers import WorkerSet

from .test_pg import comparable, first_results, plan_code_lines

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

OBS3 = gym.spaces.Box(-8.0, 8.0, (3,), np.float32)
ACT2 = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
SMALL_NETS: dict[str, Any] = {"actor_hiddens": (16,), "critic_hiddens": (16,)}
# a small, fast, report-every-200-steps setting for plan tests
SMALL = DDPGConfig(seed=0, learning_starts=100, random_timesteps=100, timesteps_per_iteration=200,
                   train_batch_size=32, **SMALL_NETS)


def make_policy(config_class: type[DDPGConfig] = DDPGConfig, **kwargs: Any) -> DDPGPolicy:
    return DDPGPolicy(OBS3, ACT2, config_class(**{"seed": 0, **SMALL_NETS, "random_timesteps": 0, **kwargs}))


def loss_batch(rng: np.random.Generator, size: int = 32) -> SampleBatch:
    return SampleBatch({OBS: rng.normal(size=(size, 3)).astype(np.float32),
                        NEXT_OBS: rng.normal(size=(size, 3)).astype(np.float32),
                        ACTIONS: rng.uniform(-1, 1, (size, 2)).astype(np.float32),
                        REWARDS: rng.normal(size=size).astype(np.float32),
                        TERMINATEDS: rng.random(size) < 0.1,
                        NSTEP_DISCOUNTS: np.full(size, 0.9, np.float32)})


def params_of(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


# -- config -----------------------------------------------------------------------------------------

def test_config_defaults_learn_pendulum_and_are_frozen() -> None:
    c = DDPGConfig()
    assert (c.env, c.num_workers, c.rollout_fragment_length, c.train_batch_size, c.target_network_update_freq,
            c.tau, c.twin_q, c.policy_delay, c.smooth_target_policy, c.exploration_noise,
            c.exploration_noise_type, c.activation, c.prioritized_replay, c.normalize_actions) == \
        ("Pendulum-v1", 0, 1, 256, 0, 0.005, False, 1, False, 0.1, "gaussian", "relu", False, True)
    assert c.round_robin_weights == [1.0, 1.0]  # one store of one step, one replay: a gradient step per env step
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.tau = 0.1  # type: ignore[misc]  # the point of the test


@pytest.mark.parametrize("kwargs, message", [
    ({"tau": 0.0}, "tau=0.0 must be a number in (0, 1]"),
    ({"tau": 1.5}, "tau=1.5 must be a number in (0, 1]"),
    ({"tau": -0.1}, "tau=-0.1 must be a number in (0, 1]"),
    ({"exploration_noise": -0.1}, "exploration_noise=-0.1 must be a number >= 0 (std of the exploration noise"),
    ({"target_noise": -0.2}, "target_noise=-0.2 must be a number >= 0"),
    ({"target_noise_clip": -0.5}, "target_noise_clip=-0.5 must be a number >= 0"),
    ({"ou_sigma": -1.0}, "ou_sigma=-1.0 must be a number >= 0"),
    ({"policy_delay": 0}, "policy_delay=0 must be an int >= 1 (critic steps per actor step)"),
    ({"random_timesteps": -1}, "random_timesteps=-1 must be an int >= 0"),
    ({"actor_lr": 0.0}, "actor_lr=0.0 must be a number > 0, or None (None: lr)"),
    ({"critic_lr": -1e-3}, "critic_lr=-0.001 must be a number > 0, or None"),
    ({"huber_threshold": 0.0}, "huber_threshold=0.0 must be a number > 0"),
    ({"l2_reg": -1e-6}, "l2_reg=-1e-06 must be a number >= 0"),
    ({"actor_hiddens": ()}, "actor_hiddens=() must be a non-empty tuple of positive ints"),
    ({"critic_hiddens": (64, 0)}, "critic_hiddens=(64, 0) must be a non-empty tuple of positive ints"),
    ({"activation": "sigmoid"}, "activation='sigmoid'; use 'relu', 'tanh' or 'elu'"),
    ({"exploration_noise_type": "pink"}, "exploration_noise_type='pink'; use 'gaussian' or 'ou'"),
    ({"model": ModelConfig(hidden_sizes=(8,))}, "builds its networks from actor_hiddens, critic_hiddens and "
                                                "activation"),
    ({"normalize_actions": False}, "normalize_actions=False: DDPGConfig's actor emits tanh-squashed actions in "
                                   "[-1, 1] that must be mapped onto the action space's bounds; set "
                                   "normalize_actions=True"),
    ({"num_gpus": 2, "fake_gpus": True}, "num_gpus=2, simple_optimizer=None: DDPGConfig's learner takes a critic "
                                         "and an actor step on one device and has no multi-device path; use "
                                         "num_gpus=0 or 1"),
    ({"n_step": 3}, "rollout_fragment_length=1 is shorter than n_step=3; raise rollout_fragment_length to at least 3"),
])
def test_config_validation_names_field_value_and_fix(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        DDPGConfig(**kwargs)


def test_valid_variants_are_accepted() -> None:
    config = DDPGConfig(tau=1.0, exploration_noise=0.0, n_step=3, rollout_fragment_length=3, actor_lr=1e-4,
                        num_gpus=2, fake_gpus=True, simple_optimizer=True, model=ModelConfig(conv_filters=()))
    assert (config.tau, config.n_step, config.actor_lr) == (1.0, 3, 1e-4)
    assert config.network_config((8,)) == ModelConfig(hidden_sizes=(8,), activation="relu", conv_filters=())


def test_registered_under_ddpg_running_dqns_plan() -> None:
    assert get_algorithm("ddpg") is ALGORITHM
    assert (ALGORITHM.config_class, ALGORITHM.policy_class, ALGORITHM.plan, ALGORITHM.make_owned_state) == \
        (DDPGConfig, DDPGPolicy, plan, make_owned_state)
    assert plan is get_algorithm("dqn").plan
    buf = make_owned_state(DDPGConfig(buffer_size=500, learning_starts=50))["replay_buffer"]
    assert isinstance(buf, LocalReplayBuffer) and not buf.prioritized and buf.replay_batch_size == 256


# -- spaces -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("space, message", [
    (gym.spaces.Discrete(3), "DDPGPolicy needs a 1-D Box action space, got Discrete(3); DDPG and TD3 act in "
                             "continuous spaces: use DQN (or PPO) for discrete actions"),
    (gym.spaces.MultiDiscrete([2, 2]), "needs a 1-D Box action space, got MultiDiscrete([2 2])"),
    (gym.spaces.Box(-1, 1, (2, 2)), "needs a 1-D Box action space, got Box(-1.0, 1.0, (2, 2), float32)"),
    (gym.spaces.Box(-np.inf, np.inf, (2,)), "DDPGPolicy needs finite action bounds, got Box(-inf, inf, (2,), "
                                            "float32): its tanh actions in [-1, 1] are mapped onto the bounds"),
])
def test_policy_refuses_action_spaces_it_cannot_act_in(space: gym.Space[Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        DDPGPolicy(OBS3, space, DDPGConfig())


def test_policy_needs_a_ddpg_config() -> None:
    with pytest.raises(TypeError, match="DDPGPolicy needs a DDPGConfig"):
        DDPGPolicy(OBS3, ACT2, DQNConfig())


def test_a_discrete_env_is_refused_when_the_trainer_builds_the_plan() -> None:
    with pytest.raises(ValueError, match=r"needs a 1-D Box action space, got Discrete\(2\)"):
        Trainer("ddpg", DDPGConfig(env="CartPole-v1", seed=0))


# -- acting -----------------------------------------------------------------------------------------

def test_actions_stay_in_the_unit_box_and_reach_the_env_scaled_to_its_bounds() -> None:
    policy = make_policy(exploration_noise=5.0)  # noise far beyond the box: clipping must hold
    obs = np.random.default_rng(0).normal(size=(500, 3)).astype(np.float32)
    actions, extras = policy.compute_actions(obs)
    assert extras == {} and actions.shape == (500, 2) and actions.dtype == np.float32
    assert actions.min() >= -1.0 and actions.max() <= 1.0 and np.mean(np.abs(actions) == 1.0) > 0.5
    env_actions = policy.env_actions(actions)
    assert np.all((env_actions[:, 0] >= -2) & (env_actions[:, 0] <= 2))
    assert np.all((env_actions[:, 1] >= 0) & (env_actions[:, 1] <= 1))


def test_tanh_squashes_any_actor_output_into_the_unit_box() -> None:
    policy = make_policy()
    with torch.no_grad():
        policy.actor.head.bias.copy_(torch.tensor([100.0, -100.0]))
    actions = policy.compute_actions(np.zeros((4, 3), np.float32), explore=False)[0]
    np.testing.assert_allclose(actions, np.tile([1.0, -1.0], (4, 1)))


@pytest.mark.parametrize("numpy_acting", [True, False])
def test_evaluation_acts_with_the_deterministic_actor(numpy_acting: bool) -> None:
    policy = make_policy(numpy_acting=numpy_acting)
    assert (policy.numpy_actor is not None) == numpy_acting
    obs = np.random.default_rng(1).normal(size=(64, 3)).astype(np.float32)
    expected = torch.tanh(policy.actor(torch.as_tensor(obs))).detach().numpy()
    first = policy.compute_actions(obs, explore=False)[0]
    np.testing.assert_allclose(first, expected, atol=1e-6)
    np.testing.assert_array_equal(policy.compute_actions(obs, explore=False)[0], first)  # no noise, no state
    policy.learn_on_batch(loss_batch(np.random.default_rng(2)))  # the numpy mirror follows the fused step
    expected = torch.tanh(policy.actor(torch.as_tensor(obs))).detach().numpy()
    np.testing.assert_allclose(policy.compute_actions(obs, explore=False)[0], expected, atol=1e-6)


def test_exploration_noise_has_the_configured_std_times_noise_scale() -> None:
    policy = make_policy(exploration_noise=0.04)
    obs = np.zeros((20000, 3), np.float32)
    deterministic = policy.compute_actions(obs, explore=False)[0]
    assert np.abs(deterministic).max() < 0.8  # far enough from the bounds that clipping does not bias the std
    stds = {}
    for scale in (0.0, 1.0, 2.5):
        policy.noise_scale = scale
        stds[scale] = float(np.std(policy.compute_actions(obs)[0] - deterministic))
    assert stds[0.0] == 0.0
    assert stds[1.0] == pytest.approx(0.04, rel=0.05) and stds[2.5] == pytest.approx(0.1, rel=0.05)


def test_ornstein_uhlenbeck_noise_is_correlated_in_time_and_gaussian_noise_is_not() -> None:
    def lag_one_correlation(noise_type: str) -> float:
        policy = make_policy(exploration_noise=0.01, exploration_noise_type=noise_type)
        obs = np.zeros((1, 3), np.float32)
        base = policy.compute_actions(obs, explore=False)[0]
        noise = np.array([(policy.compute_actions(obs)[0] - base)[0, 0] for _ in range(3000)])
        return float(np.corrcoef(noise[:-1], noise[1:])[0, 1])

    assert lag_one_correlation("ou") > 0.7  # x_{t+1} = 0.85 x_t + 0.2 eps: lag-one correlation 0.85
    assert abs(lag_one_correlation("gaussian")) < 0.1


def test_the_first_random_timesteps_act_uniformly_then_the_actor_takes_over() -> None:
    policy = make_policy(random_timesteps=1000, exploration_noise=0.0)
    obs = np.zeros((500, 3), np.float32)
    deterministic = policy.compute_actions(obs, explore=False)[0]
    first = [policy.compute_actions(obs)[0] for _ in range(2)]  # 1000 steps: uniform over [-1, 1]
    assert all(np.std(a) > 0.5 and not np.allclose(a, deterministic) for a in first)
    np.testing.assert_array_equal(policy.compute_actions(obs)[0], deterministic)  # then noise 0: the actor
    late = make_policy(random_timesteps=1000, exploration_noise=0.0)
    late.on_global_var_update({"timestep": 1000})  # the broadcast global count ends the random phase too
    np.testing.assert_array_equal(late.compute_actions(obs)[0], deterministic)


# -- losses and updates -----------------------------------------------------------------------------

class ActionQ(nn.Module):
    """A critic ``Q(s, a) = a[:, 0] + offset`` (``[2, B]`` with two offsets): a window onto the bootstrap action."""

    def __init__(self, offsets: tuple[float, ...]) -> None:
        super().__init__()
        self.offsets = torch.tensor(offsets)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        q = actions[:, 0].unsqueeze(0) + self.offsets.unsqueeze(1)
        return q[0] if len(self.offsets) == 1 else q


def bootstrap(policy: DDPGPolicy, batch: SampleBatch) -> np.ndarray:
    """``(y - r) / d``: the target critic's value at the bootstrap action."""
    tensors = policy.to_tensors(batch)
    targets = policy._targets(tensors).numpy()
    return (targets - batch[REWARDS]) / batch[NSTEP_DISCOUNTS]  # type: ignore[no-any-return]


def no_terminal(batch: SampleBatch) -> SampleBatch:
    batch[TERMINATEDS] = np.zeros(batch.count, bool)
    return batch


def test_twin_q_bootstraps_from_the_minimum_of_the_two_target_critics() -> None:
    batch = no_terminal(loss_batch(np.random.default_rng(3)))
    single, twin = make_policy(), make_policy(twin_q=True)
    single.target_critic = ActionQ((0.0,))  # type: ignore[assignment]  # a probe critic
    twin.target_critic = ActionQ((0.0, -5.0))  # type: ignore[assignment]  # the second critic is 5 lower
    twin.target_actor.load_state_dict(single.target_actor.state_dict())
    np.testing.assert_allclose(bootstrap(twin, batch), bootstrap(single, batch) - 5.0, atol=1e-5)
    twin.target_critic = ActionQ((-3.0, 1.0))  # type: ignore[assignment]  # now the first is lower
    np.testing.assert_allclose(bootstrap(twin, batch), bootstrap(single, batch) - 3.0, atol=1e-5)
    assert tuple(twin.critic(torch.zeros(4, 3), torch.zeros(4, 2)).shape) == (2, 4)


def test_target_policy_smoothing_adds_clipped_noise_to_the_bootstrap_action() -> None:
    batch = no_terminal(loss_batch(np.random.default_rng(4), size=2000))
    plain = make_policy()
    plain.target_critic = ActionQ((0.0,))  # type: ignore[assignment]  # reads the bootstrap action's first entry
    mean_action = bootstrap(plain, batch)
    np.testing.assert_allclose(mean_action, np.tanh(plain.target_actor(torch.as_tensor(batch[NEXT_OBS]))
                                                    .detach().numpy()[:, 0]), atol=1e-5)
    clipped = make_policy(smooth_target_policy=True, target_noise=100.0, target_noise_clip=0.3)
    clipped.target_critic = ActionQ((0.0,))  # type: ignore[assignment]
    shift = bootstrap(clipped, batch) - mean_action  # +-0.3, unless the bound [-1, 1] cut it
    unbounded = np.abs(mean_action) < 0.69
    assert np.abs(shift).max() <= 0.3 + 1e-5  # never beyond the clip
    assert np.mean(np.isclose(np.abs(shift[unbounded]), 0.3, atol=1e-5)) > 0.98  # std 100: nearly always clipped
    assert 0.4 < np.mean(shift[unbounded] > 0) < 0.6
    gentle = make_policy(smooth_target_policy=True, target_noise=0.05, target_noise_clip=0.5)
    gentle.target_critic = ActionQ((0.0,))  # type: ignore[assignment]
    shift = bootstrap(gentle, batch) - mean_action
    assert np.std(shift[np.abs(mean_action) < 0.7]) == pytest.approx(0.05, rel=0.1)


def test_critic_loss_is_half_squared_td_error_on_the_target_and_td_error_matches() -> None:
    policy = make_policy()
    batch = loss_batch(np.random.default_rng(5))
    tensors = policy.to_tensors(batch)
    with torch.no_grad():
        q = policy.critic(tensors[OBS], tensors[ACTIONS])
        next_q = policy.target_critic(tensors[NEXT_OBS], torch.tanh(policy.target_actor(tensors[NEXT_OBS])))
    y = tensors[REWARDS] + tensors[NSTEP_DISCOUNTS] * next_q
    loss, td_error, _ = policy.critic_loss(tensors)
    assert float(loss.detach()) == pytest.approx(float((0.5 * (q - y) ** 2).mean()), rel=1e-5)
    np.testing.assert_allclose(td_error.numpy(), (q - y).numpy(), atol=1e-5)
    # a fresh policy's targets equal its online networks: td_error() and the learner's td_error agree
    worker_side = policy.td_error(batch)
    info = policy.learn_on_batch(batch)
    assert worker_side.shape == info[TD_ERROR].shape == (32,)
    np.testing.assert_allclose(worker_side, info[TD_ERROR], atol=1e-5)
    assert set(info["learner_stats"]) >= {"critic_loss", "actor_loss", "mean_q", "min_q", "max_q",
                                           "mean_abs_td_error", "num_actor_updates"}


def test_policy_delay_steps_the_actor_every_nth_critic_step() -> None:
    policy = make_policy(policy_delay=3)
    rng = np.random.default_rng(6)
    actor_changes, critic_changes = [], []
    for _ in range(7):
        actor, critic = params_of(policy.actor), params_of(policy.critic)
        policy.learn_on_batch(loss_batch(rng))
        actor_changes.append(not same(actor, params_of(policy.actor)))
        critic_changes.append(not same(critic, params_of(policy.critic)))
    assert actor_changes == [False, False, True, False, False, True, False]
    assert all(critic_changes) and (policy.num_critic_updates, policy.num_actor_updates) == (7, 2)
    assert policy.weights_version == 7  # one version per train step


def test_the_actor_step_leaves_the_critic_and_the_targets_alone() -> None:
    policy = make_policy()
    rng = np.random.default_rng(7)
    critic_before = params_of(policy.critic)
    targets_before = params_of(policy.target_model)
    loss = policy.actor_loss(policy.to_tensors(loss_batch(rng)))
    loss.backward()  # type: ignore[no-untyped-call]  # torch's backward is untyped
    policy.actor_optimizer.step()
    assert same(critic_before, params_of(policy.critic)) and same(targets_before, params_of(policy.target_model))


@pytest.mark.parametrize("tau", [0.25, 1.0])
def test_update_target_moves_tau_of_the_way_to_the_online_networks(tau: float) -> None:
    policy = make_policy(tau=tau, twin_q=True)
    policy.learn_on_batch(loss_batch(np.random.default_rng(8)))
    online, target = params_of(policy.model), params_of(policy.target_model)
    assert not same(online, target)
    policy.update_target()
    for o, t, new in zip(online, target, params_of(policy.target_model)):
        torch.testing.assert_close(new, (1 - tau) * t + tau * o)
    assert not any(p.requires_grad for p in policy.target_model.parameters())
    assert set(policy.get_weights()) == set(policy.model.state_dict())  # actor and critic, no targets
    assert {k.split(".")[0] for k in policy.get_weights()} == {"actor", "critic"}


def test_a_nonfinite_batch_is_skipped_once_per_call_and_priorities_stay_finite() -> None:
    policy = make_policy(twin_q=True)
    batch = loss_batch(np.random.default_rng(9))
    batch[OBS][2] = np.nan
    before = params_of(policy.model)
    info = policy.learn_on_batch(batch)
    assert same(before, params_of(policy.model)) and policy.weights_version == 0
    assert info["learner_stats"]["num_nonfinite_updates_skipped"] == 1 and np.isfinite(info[TD_ERROR]).all()
    with pytest.raises(NotImplementedError, match="has no gradient-passing path"):
        policy.compute_gradients(batch)


# -- state ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("noise_type", ["gaussian", "ou"])
def test_state_round_trips_networks_targets_optimizers_noise_and_rngs(noise_type: str) -> None:
    kwargs = {"twin_q": True, "policy_delay": 2, "smooth_target_policy": True, "exploration_noise_type": noise_type}
    policy = make_policy(**kwargs)
    rng = np.random.default_rng(10)
    obs = rng.normal(size=(4, 3)).astype(np.float32)
    for _ in range(3):
        policy.learn_on_batch(loss_batch(rng))
        policy.update_target()
        policy.compute_actions(obs)
    policy.noise_scale = 0.5
    state = policy.get_state()
    other = make_policy(**{**kwargs, "seed": 9})
    other.set_state(state)
    assert (other.noise_scale, other.num_critic_updates, other.num_actor_updates, other.weights_version) == \
        (0.5, 3, 1, 3)
    batches = [loss_batch(np.random.default_rng(11)) for _ in range(3)]
    for p in (policy, other):  # the next steps (actor steps and smoothing noise included) and actions agree
        for b in batches:
            p.learn_on_batch(b)
            p.update_target()
    for a, b in [(policy.model, other.model), (policy.target_model, other.target_model)]:
        assert same(params_of(a), params_of(b))
    np.testing.assert_array_equal(policy.compute_actions(obs)[0], other.compute_actions(obs)[0])
    with pytest.raises(ValueError, match=r"the state has no \['actor_optimizer'\]"):
        other.set_state({k: v for k, v in state.items() if k != "actor_optimizer"})


# -- plan -------------------------------------------------------------------------------------------

def test_plan_is_dqns_with_a_soft_target_update_after_every_train_step() -> None:
    assert plan_code_lines(plan) <= 25
    workers = WorkerSet(policy_class=DDPGPolicy, config=SMALL)
    results = plan(workers, SMALL)
    assert repr(results) == (
        "LocalIterator[Concurrently(round_robin, round_robin_weights=[1.0, 1.0], output_indexes=[1])"
        "[LocalIterator[ParallelRollouts(bulk_sync).for_each(StoreToReplayBuffer(local))], "
        "LocalIterator[Replay(local).for_each(TrainOneStep).for_each(UpdateTargetNetwork(0))]]"
        ".filter(ReportGate(200 steps, 0 s)).for_each(CollectMetrics)]")
    result = [next(results) for _ in range(2)][-1]
    info = result["info"]
    assert info["num_steps_sampled"] >= 400 and info["num_steps_trained"] == 32 * info["num_target_updates"]
    # one train step per env step from the one that fills the buffer to learning_starts on
    assert info["num_target_updates"] == info["num_steps_sampled"] - SMALL.learning_starts + 1
    stats = info["learner"]["default_policy"]["learner_stats"]
    assert np.isfinite(stats["critic_loss"]) and stats["num_actor_updates"] == info["num_target_updates"]
    policy = workers.local_worker().get_policy()
    assert isinstance(policy, DDPGPolicy) and policy.num_explore_steps == info["num_steps_sampled"]


def test_prioritized_replay_gets_the_learners_td_errors() -> None:
    config = dataclasses.replace(SMALL, prioritized_replay=True, n_step=2, rollout_fragment_length=2)
    buf = make_owned_state(config)["replay_buffer"]
    results = plan(WorkerSet(policy_class=DDPGPolicy, config=config), config, replay_buffer=buf)
    assert "UpdatePriorities" in repr(results)
    result = next(results)
    assert result["info"]["num_steps_trained"] > 0 and buf.replay_buffers["default_policy"].max_priority != 1.0


def test_same_seed_gives_identical_results() -> None:
    runs = [[comparable(r) for r in first_results(DDPGPolicy, SMALL, plan, 2)] for _ in range(2)]
    assert runs[0] == runs[1]
    other = [comparable(r) for r in first_results(DDPGPolicy, dataclasses.replace(SMALL, seed=1), plan, 2)]
    assert other != runs[0]


def test_remote_workers_sample_and_get_the_actor_and_the_timestep() -> None:
    config = dataclasses.replace(SMALL, num_workers=2, num_cpus_per_worker=0.5)
    workers = WorkerSet(policy_class=DDPGPolicy, config=config)
    try:
        result = next(plan(workers, config))
        assert result["num_healthy_workers"] == 2 and result["info"]["num_steps_sampled"] % 2 == 0
        local = workers.local_worker().get_policy().get_weights()
        remote = workers.foreach_worker(lambda w: (w.get_policy().global_timestep, w.get_policy().get_weights()))
        assert all(t > 0 for t, _ in remote[1:])
        assert all(np.array_equal(local[k], w[k]) for _, w in remote[1:] for k in local)
    finally:
        workers.stop()


def test_trainer_checkpoints_targets_and_both_optimizers() -> None:
    trainer = Trainer("ddpg", SMALL)
    try:
        trainer.train()
        policy = trainer.get_policy()
        assert isinstance(policy, DDPGPolicy)
        saved_targets = params_of(policy.target_model)
        saved_actor_moments = [s["exp_avg"].clone() for s in policy.actor_optimizer.state.values()]
        with tempfile.TemporaryDirectory() as tmp:
            path = trainer.save(tmp)
            trainer.train()
            assert not same(saved_targets, params_of(policy.target_model))
            trainer.restore(path)
        policy = trainer.get_policy()
        assert isinstance(policy, DDPGPolicy) and same(saved_targets, params_of(policy.target_model))
        assert same(saved_actor_moments, [s["exp_avg"] for s in policy.actor_optimizer.state.values()])
    finally:
        trainer.stop()


# -- learning ---------------------------------------------------------------------------------------

def greedy_return(policy: DDPGPolicy, episodes: int = 4) -> float:
    """The deterministic actor's mean return over a few Pendulum episodes (fixed env seeds)."""
    return evaluate_policy(policy, VectorEnv("Pendulum-v1", episodes, seed=12345), episodes=episodes).mean


def short_learning_check(name: str) -> tuple[float, float]:
    """5000 env steps of the algorithm's defaults on Pendulum (batch 64 for speed): the greedy actor's mean
    return before and after."""
    config = get_algorithm(name).config_class(seed=0, train_batch_size=64, timesteps_per_iteration=5000)
    trainer = Trainer(name, config)
    try:
        policy = trainer.get_policy()
        assert isinstance(policy, DDPGPolicy)
        before = greedy_return(policy)
        result = trainer.train()
        assert result["timesteps_total"] == 5000
        return before, greedy_return(policy)
    finally:
        trainer.stop()


def test_ddpg_short_learning_check() -> None:
    """Seeded: 4000 gradient steps (after 1000 random ones) turn an actor that scores about -1300 into one that
    swings the pole up and holds it (about -200 on seed 0; a wide margin)."""
    before, after = short_learning_check("ddpg")
    print(f"DDPG greedy return: {before:.0f} before, {after:.0f} after 5000 steps")
    assert after > before + 500 and after > -600


SEEDS = (101, 202, 303)
GATE, BUDGET = -320.0, 30_000


def pendulum_gate(name: str, seed: int) -> None:
    """RLlib's Pendulum gate: the mean return over the last 20 episodes reaches -320 within 30k env steps."""
    config = get_algorithm(name).config_class(seed=seed, metrics_smoothing_episodes=20)
    trainer = Trainer(name, config)
    start = time.perf_counter()
    try:
        result = trainer.train()
        while result["episode_reward_mean"] < GATE and result["timesteps_total"] < BUDGET:
            result = trainer.train()
    finally:
        trainer.stop()
    print(f"{name} seed {seed}: return {result['episode_reward_mean']:.1f} after {result['timesteps_total']} env "
          f"steps, {time.perf_counter() - start:.0f} s")
    assert result["episode_reward_mean"] >= GATE and result["timesteps_total"] <= BUDGET


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a gate on env steps; under load the wall time varies
@pytest.mark.parametrize("seed", SEEDS)
def test_ddpg_reaches_the_pendulum_gate(seed: int) -> None:
    pendulum_gate("ddpg", seed)

