"""DQN: config and training-intensity weights, n-step postprocessing, the Q-loss, the target
network, epsilon-greedy acting, the plan's shape, the learning_starts gate, determinism and a seeded learning check."""

from __future__ import annotations

import dataclasses
import math
import re
import tempfile
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.algorithms import get_algorithm
from flowrl.algorithms.dqn import (ALGORITHM, NSTEP_DISCOUNTS, DQNConfig, DQNPolicy, make_owned_state,
                                   make_replay_buffer, plan)
from flowrl.algorithms.pg import PGConfig
from flowrl.config import ModelConfig
from flowrl.policy import NONFINITE_UPDATES_SKIPPED, Policy
from flowrl.replay_buffers import LocalReplayBuffer
from flowrl.sample_batch import (ACTIONS, NEXT_OBS, OBS, REWARDS, TD_ERROR, TERMINATEDS, TRUNCATEDS, WEIGHTS,
                                 SampleBatch)
from flowrl.trainer import Trainer
from flowrl.workers import WorkerSet

from .test_pg import comparable, first_results, plan_code_lines, train_until

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

BOX4 = gym.spaces.Box(-1, 1, (4,), np.float32)
TINY = ModelConfig(hidden_sizes=(8,))
# a small, fast, report-every-100-steps setting for plan tests
SMALL = DQNConfig(seed=0, learning_starts=64, timesteps_per_iteration=100, min_iter_time_s=0, model=TINY, hiddens=(8,))


def make_policy(**kwargs: Any) -> DQNPolicy:
    return DQNPolicy(BOX4, gym.spaces.Discrete(2), DQNConfig(**{"seed": 0, "model": TINY, "hiddens": (8,), **kwargs}))


# -- config -----------------------------------------------------------------------------------------

def test_config_has_dqn_defaults_and_is_frozen() -> None:
    c = DQNConfig()
    assert (c.num_workers, c.timesteps_per_iteration, c.min_iter_time_s, c.target_network_update_freq,
            c.buffer_size, c.learning_starts, c.rollout_fragment_length, c.train_batch_size) == \
        (0, 1000, 0, 500, 50000, 1000, 4, 32)
    assert (c.prioritized_replay, c.prioritized_replay_alpha, c.prioritized_replay_beta, c.prioritized_replay_eps,
            c.n_step, c.training_intensity, c.before_learn_on_batch, c.store_buffer_in_checkpoints) == \
        (True, 0.6, 0.4, 1e-6, 1, None, None, False)
    assert (c.double_q, c.dueling, c.lr, c.grad_clip, c.huber_delta, c.initial_epsilon, c.final_epsilon,
            c.epsilon_timesteps) == (True, True, 5e-4, 40, 1.0, 1.0, 0.02, 10000)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.n_step = 3  # type: ignore[misc]  # the point of the test


@pytest.mark.parametrize("kwargs, message", [
    ({"n_step": 0}, "n_step=0 must be an int >= 1"),
    ({"n_step": 5}, "rollout_fragment_length=4 is shorter than n_step=5; raise rollout_fragment_length to at least 5"),
    ({"buffer_size": 0}, "buffer_size=0 must be an int >= 1"),
    ({"learning_starts": -1}, "learning_starts=-1 must be an int >= 0"),
    ({"target_network_update_freq": 2.5}, "target_network_update_freq=2.5 must be an int >= 0"),
    ({"training_intensity": 0}, "training_intensity=0 must be a number > 0, or None (trained steps per sampled step"),
    ({"training_intensity": -2.0}, "training_intensity=-2.0 must be a number > 0, or None"),
    ({"training_intensity": math.inf}, "training_intensity=inf must be a finite number, or None"),
    ({"final_epsilon": 1.5}, "final_epsilon=1.5 must be a number in [0, 1] (the exploration probability"),
    ({"prioritized_replay_alpha": 0.0}, "prioritized_replay_alpha=0.0 must be > 0 with prioritized_replay=True; "
                                        "raise it (e.g. 0.6) or set prioritized_replay=False"),
    ({"prioritized_replay_beta": -0.1}, "prioritized_replay_beta=-0.1 must be a number >= 0 (0: no importance "
                                        "weighting)"),
    ({"replay_mode": "lockstep"}, "set prioritized_replay=False or replay_mode='independent'"),
    ({"num_gpus": 2, "fake_gpus": True}, "set prioritized_replay=False or simple_optimizer=True"),
    ({"hiddens": (0,)}, "hiddens=(0,) must be positive ints"),
    ({"huber_delta": 0.0}, "huber_delta=0.0 must be a number > 0"),
])
def test_config_validation_names_field_value_and_fix(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        DQNConfig(**kwargs)


def test_uniform_replay_accepts_alpha_zero_and_lockstep() -> None:
    config = DQNConfig(prioritized_replay=False, prioritized_replay_alpha=0.0, replay_mode="lockstep")
    assert not make_replay_buffer(config).prioritized


@pytest.mark.parametrize("kwargs, weights", [
    ({}, [1.0, 1.0]),
    ({"training_intensity": 8}, [1.0, 1.0]),  # native ratio 32 / 4: one replay per store is 8 trained per sampled
    ({"training_intensity": 64}, [1.0, 8.0]),
    ({"training_intensity": 4}, [1.0, 0.5]),  # fractional: honoured in expectation
    ({"training_intensity": 64, "num_workers": 2, "num_envs_per_worker": 3}, [1.0, 48.0]),  # 24 steps per store
])
def test_round_robin_weights_follow_training_intensity(kwargs: dict[str, Any], weights: list[float]) -> None:
    assert DQNConfig(**kwargs).round_robin_weights == weights


def test_round_robin_weights_are_finite_with_zero_remote_workers() -> None:
    """With num_workers=0 the local worker samples one fragment per store item."""
    weights = DQNConfig(num_workers=0, training_intensity=10).round_robin_weights
    assert all(math.isfinite(w) and w > 0 for w in weights)
    assert weights == DQNConfig(num_workers=1, training_intensity=10).round_robin_weights == [1.0, 1.25]


def test_registered_under_dqn_with_a_trainer_owned_buffer() -> None:
    assert get_algorithm("dqn") is ALGORITHM
    assert (ALGORITHM.config_class, ALGORITHM.policy_class, ALGORITHM.plan, ALGORITHM.make_owned_state) == \
        (DQNConfig, DQNPolicy, plan, make_owned_state)
    buf = make_owned_state(DQNConfig(buffer_size=1000, learning_starts=50, train_batch_size=16))["replay_buffer"]
    assert isinstance(buf, LocalReplayBuffer) and buf.prioritized
    assert (buf.capacity, buf.learning_starts, buf.replay_batch_size, buf.prioritized_replay_alpha) == \
        (1000, 50, 16, 0.6)
    assert not make_replay_buffer(DQNConfig(prioritized_replay=False)).prioritized  # alpha 0: uniform buffers


# -- policy: acting and exploration -----------------------------------------------------------------

def test_epsilon_anneals_linearly_then_stays() -> None:
    config = DQNConfig(initial_epsilon=1.0, final_epsilon=0.1, epsilon_timesteps=1000)
    assert [round(config.epsilon_at(t), 6) for t in (0, 250, 500, 1000, 10**6)] == [1.0, 0.775, 0.55, 0.1, 0.1]
    assert DQNConfig(epsilon_timesteps=0).epsilon_at(0) == 0.02
    policy = make_policy(initial_epsilon=1.0, final_epsilon=0.1, epsilon_timesteps=1000)
    assert policy.epsilon == 1.0
    policy.on_global_var_update({"timestep": 500})
    assert round(policy.epsilon, 6) == 0.55


def test_compute_actions_is_vectorised_epsilon_greedy() -> None:
    policy = make_policy(initial_epsilon=0.0, final_epsilon=0.0)
    assert policy.numpy_acting is None  # the base class's actor-critic fast path must not act for DQN
    obs = np.random.default_rng(0).uniform(-1, 1, (2000, 4)).astype(np.float32)
    greedy = policy.q_values(obs).argmax(axis=1)
    actions, extras = policy.compute_actions(obs)
    assert actions.shape == (2000,) and extras == {}
    np.testing.assert_array_equal(actions, greedy)  # epsilon 0: greedy
    random_policy = make_policy(initial_epsilon=1.0, final_epsilon=1.0)
    random_policy.set_weights(policy.get_weights())
    actions, _ = random_policy.compute_actions(obs)
    assert 0.4 < np.mean(actions != greedy) < 0.6  # epsilon 1: uniform over 2 actions, half differ from greedy
    np.testing.assert_array_equal(random_policy.compute_actions(obs, explore=False)[0], greedy)


@pytest.mark.parametrize("model, hiddens, dueling", [
    (TINY, (8,), True), (ModelConfig(hidden_sizes=(16, 8), activation="relu"), (6, 5), True),
    (ModelConfig(hidden_sizes=(), activation="elu"), (), True), (TINY, (), True), (TINY, (8,), False)])
def test_numpy_q_mirrors_the_q_model_through_learning_and_set_weights(
        model: ModelConfig, hiddens: tuple[int, ...], dueling: bool) -> None:
    policy = make_policy(model=model, hiddens=hiddens, dueling=dueling, lr=0.05)
    fast = policy.numpy_q
    assert fast is not None
    obs = np.random.default_rng(0).uniform(-2, 2, (6, 4)).astype(np.float32)

    def assert_mirrors() -> None:
        with torch.no_grad():
            expected = policy.model(torch.as_tensor(obs)).numpy()
        np.testing.assert_allclose(policy.q_values(obs), expected, rtol=1e-5, atol=1e-5)

    assert_mirrors()
    assert policy.optimizer.defaults["fused"]  # whose steps leave the parameters' version counters alone
    before = policy.q_values(obs)
    policy.learn_on_batch(loss_batch(np.random.default_rng(1)))  # the mirror must see the in-place step
    assert not np.allclose(policy.q_values(obs), before)
    assert_mirrors()
    policy.apply_gradients(policy.compute_gradients(loss_batch(np.random.default_rng(2)))[0])
    assert_mirrors()
    policy.set_weights(make_policy(model=model, hiddens=hiddens, dueling=dueling, seed=9).get_weights())
    assert_mirrors()


def test_numpy_q_is_optional_and_only_for_plain_mlp_q_models() -> None:
    assert make_policy(numpy_acting=False).numpy_q is None
    image = gym.spaces.Box(0, 255, (12, 12, 3), np.uint8)
    conv = DQNPolicy(image, gym.spaces.Discrete(2), DQNConfig(seed=0, hiddens=(8,), model=ModelConfig(
        hidden_sizes=(8,), conv_filters=((4, 3, 2),))))
    assert conv.numpy_q is None  # a CNN acts through torch
    torch_only, mirrored = make_policy(numpy_acting=False), make_policy()
    obs = np.random.default_rng(3).uniform(-1, 1, (50, 4)).astype(np.float32)
    np.testing.assert_allclose(mirrored.q_values(obs), torch_only.q_values(obs), rtol=1e-5, atol=1e-5)
    greedy_torch, greedy_numpy = torch_only.compute_actions(obs, False)[0], mirrored.compute_actions(obs, False)[0]
    np.testing.assert_array_equal(greedy_numpy, greedy_torch)


def test_epsilon_follows_the_broadcast_timestep_in_a_plan() -> None:
    config = dataclasses.replace(SMALL, epsilon_timesteps=1000)
    workers = WorkerSet(policy_class=DQNPolicy, config=config)
    result = next(plan(workers, config))
    policy = workers.local_worker().get_policy()
    assert policy.global_timestep == result["info"]["num_steps_sampled"] > 0
    assert policy.epsilon < 1.0
    stats = result["info"]["learner"]["default_policy"]["learner_stats"]
    assert {"loss", "mean_q", "cur_epsilon", "grad_gnorm"} <= set(stats)


# -- policy: n-step postprocessing ------------------------------------------------------------------

def piece(end: str) -> SampleBatch:
    """Three steps of one episode whose last step terminates or is truncated (time limit)."""
    return SampleBatch({OBS: np.zeros((3, 4), np.float32),
                        NEXT_OBS: np.arange(1, 4, dtype=np.float32)[:, None].repeat(4, axis=1),
                        REWARDS: np.array([1.0, 2.0, 3.0], np.float32),
                        TERMINATEDS: np.array([False, False, end == "terminated"]),
                        TRUNCATEDS: np.array([False, False, end == "truncated"])})


@pytest.mark.parametrize("end, discounts, terminated", [
    ("terminated", [0.25, 0.0, 0.0], [False, True, True]),  # windows reaching the terminal state do not bootstrap
    ("truncated", [0.25, 0.25, 0.5], [False, False, False]),  # a time limit bootstraps from the final observation
])
def test_nstep_postprocessing_bootstraps_on_truncation_not_termination(
        end: str, discounts: list[float], terminated: list[bool]) -> None:
    out = make_policy(gamma=0.5, n_step=2).postprocess_trajectory(piece(end))
    np.testing.assert_allclose(out[REWARDS], [1 + 0.5 * 2, 2 + 0.5 * 3, 3])  # windows stop at the episode's end
    np.testing.assert_allclose(out[NSTEP_DISCOUNTS], discounts)
    assert out[TERMINATEDS].tolist() == terminated
    assert out[NEXT_OBS][:, 0].tolist() == [2.0, 3.0, 3.0]  # the observation after each window


def test_one_step_postprocessing_keeps_rewards_and_discounts_by_gamma() -> None:
    out = make_policy(gamma=0.9).postprocess_trajectory(piece("terminated"))
    np.testing.assert_allclose(out[REWARDS], [1, 2, 3])
    np.testing.assert_allclose(out[NSTEP_DISCOUNTS], [0.9, 0.9, 0.0])
    assert out[NEXT_OBS][:, 0].tolist() == [1.0, 2.0, 3.0]


def test_sampled_fragments_carry_nstep_columns() -> None:
    config = DQNConfig(seed=0, n_step=3, rollout_fragment_length=20, gamma=0.5, model=TINY, hiddens=(8,))
    batch = WorkerSet(policy_class=DQNPolicy, config=config).local_worker().sample()
    assert batch.count == 20
    assert set(np.unique(batch[NSTEP_DISCOUNTS])) <= {0.0, 0.5, 0.25, 0.125}
    assert batch[NSTEP_DISCOUNTS][-1] == 0.5  # the fragment's last row: cut mid-episode, a one-step window


# -- policy: loss -----------------------------------------------------------------------------------

def loss_batch(rng: np.random.Generator, size: int = 16, weights: bool = False) -> SampleBatch:
    columns = {OBS: rng.uniform(-1, 1, (size, 4)).astype(np.float32),
               NEXT_OBS: rng.uniform(-1, 1, (size, 4)).astype(np.float32),
               ACTIONS: rng.integers(2, size=size), REWARDS: rng.normal(0, 3, size).astype(np.float32),
               TERMINATEDS: rng.random(size) < 0.3}
    columns[NSTEP_DISCOUNTS] = np.where(columns[TERMINATEDS], 0.0, 0.9).astype(np.float32)
    if weights:
        columns[WEIGHTS] = rng.uniform(0.1, 1.0, size).astype(np.float32)
    return SampleBatch(columns)


def reference_loss(policy: DQNPolicy, batch: SampleBatch, double_q: bool) -> tuple[float, np.ndarray]:
    """The Q-loss written out row by row in numpy."""
    q, q_next_online = policy.q_values(batch[OBS]), policy.q_values(batch[NEXT_OBS])
    with torch.no_grad():
        q_next_target = policy.target_model(torch.as_tensor(batch[NEXT_OBS])).numpy()
    losses, td = [], []
    for i in range(batch.count):
        a_next = int(np.argmax(q_next_online[i] if double_q else q_next_target[i]))
        y = batch[REWARDS][i] + batch[NSTEP_DISCOUNTS][i] * q_next_target[i, a_next]
        x = q[i, batch[ACTIONS][i]] - y
        huber = 0.5 * x * x if abs(x) <= 1.0 else abs(x) - 0.5
        losses.append((batch[WEIGHTS][i] if WEIGHTS in batch else 1.0) * huber)
        td.append(x)
    return float(np.mean(losses)), np.array(td)


@pytest.mark.parametrize("double_q", [True, False])
@pytest.mark.parametrize("weights", [True, False])
def test_loss_is_weighted_huber_on_the_double_q_target(double_q: bool, weights: bool) -> None:
    rng = np.random.default_rng(1)
    policy = make_policy(double_q=double_q, dueling=True)
    with torch.no_grad():  # a target network that disagrees with the online one
        for p in policy.target_model.parameters():
            p.add_(torch.as_tensor(rng.normal(0, 0.5, tuple(p.shape)), dtype=p.dtype))
    batch = loss_batch(rng, weights=weights)
    expected_loss, expected_td = reference_loss(policy, batch, double_q)
    assert np.abs(expected_td).max() > 1.0 > np.abs(expected_td).min()  # both Huber branches are exercised
    info = policy.learn_on_batch(batch)
    assert info["learner_stats"]["loss"] == pytest.approx(expected_loss, rel=1e-5)
    np.testing.assert_allclose(info[TD_ERROR], expected_td, rtol=1e-5, atol=1e-6)


def test_double_q_changes_the_target() -> None:
    rng = np.random.default_rng(2)
    policy = make_policy()
    with torch.no_grad():
        for p in policy.target_model.parameters():
            p.add_(torch.as_tensor(rng.normal(0, 0.5, tuple(p.shape)), dtype=p.dtype))
    batch = loss_batch(rng, size=64)
    assert not np.allclose(reference_loss(policy, batch, True)[1], reference_loss(policy, batch, False)[1])


def reference_step(policy: DQNPolicy, batch: SampleBatch) -> dict[str, Any]:
    """One train step through the base class's path: Policy.learn_on_tensors (clip_grad_norm_, per-gradient
    finiteness check, optimizer.step)."""
    return Policy.learn_on_tensors(policy, policy.to_tensors(batch))


@pytest.mark.parametrize("settings", [{}, {"double_q": False, "dueling": False}, {"grad_clip": 0.05},
                                      {"grad_clip": None}], ids=["defaults", "plain", "clipping", "no-clip"])
def test_train_step_equals_the_base_policy_step_bit_for_bit(settings: dict[str, Any]) -> None:
    lean, base = make_policy(lr=0.01, **settings), make_policy(lr=0.01, **settings)
    rng = np.random.default_rng(5)
    for _ in range(4):
        batch = loss_batch(rng, weights=True)
        ours, theirs = lean.learn_on_batch(batch)["learner_stats"], reference_step(base, batch)["learner_stats"]
        assert (ours["loss"], ours.get("grad_gnorm")) == (theirs["loss"], theirs.get("grad_gnorm"))
        assert ours.keys() == theirs.keys()
    for name, value in base.model.state_dict().items():
        assert torch.equal(lean.model.state_dict()[name], value), name
    assert lean.optimizer.state_dict()["state"][0]["step"] == base.optimizer.state_dict()["state"][0]["step"] == 4


def test_a_nonfinite_gradient_is_skipped_as_by_the_base_policy() -> None:
    lean, base = make_policy(), make_policy()
    batch = loss_batch(np.random.default_rng(6))
    batch[REWARDS][3] = np.nan
    before = {k: v.clone() for k, v in lean.model.state_dict().items()}
    info = lean.learn_on_batch(batch)
    reference_step(base, batch)
    assert lean.num_nonfinite_updates_skipped == base.num_nonfinite_updates_skipped == 1
    assert info["learner_stats"][NONFINITE_UPDATES_SKIPPED] == 1 and info[TD_ERROR][3] == 0.0
    assert all(torch.equal(before[k], v) for k, v in lean.model.state_dict().items())  # not applied
    lean.learn_on_batch(loss_batch(np.random.default_rng(7)))  # a finite step after it is applied
    assert lean.weights_version == 1 and lean.num_nonfinite_updates_skipped == 1


def test_compute_gradients_reports_td_errors_too() -> None:
    grads, info = make_policy().compute_gradients(loss_batch(np.random.default_rng(3), size=8))
    assert len(grads) == len(list(make_policy().model.parameters())) and info[TD_ERROR].shape == (8,)


# -- policy: target network and state ---------------------------------------------------------------

def test_update_target_copies_the_online_weights_and_state_carries_the_target() -> None:
    policy = make_policy(lr=0.01)
    policy.learn_on_batch(loss_batch(np.random.default_rng(4)))
    online = {k: v.clone() for k, v in policy.model.state_dict().items()}
    target = policy.target_model.state_dict()
    assert any(not torch.equal(online[k], target[k]) for k in online)  # training moved only the online network
    policy.update_target()
    assert all(torch.equal(online[k], v) for k, v in policy.target_model.state_dict().items())
    assert not any(p.requires_grad for p in policy.target_model.parameters())
    state = policy.get_state()
    policy.learn_on_batch(loss_batch(np.random.default_rng(5)))
    other = make_policy(seed=9)
    other.set_state(state)
    assert all(torch.equal(online[k], v) for k, v in other.target_model.state_dict().items())
    assert set(other.get_weights()) == set(policy.get_weights())  # workers receive the online network only
    with pytest.raises(ValueError, match="no 'target_weights'"):
        other.set_state({k: v for k, v in state.items() if k != "target_weights"})


def test_policy_needs_a_dqn_config_and_discrete_actions() -> None:
    with pytest.raises(TypeError, match="DQNPolicy needs a DQNConfig"):
        DQNPolicy(BOX4, gym.spaces.Discrete(2), PGConfig())
    with pytest.raises(ValueError, match="DQN needs a Discrete action space"):
        DQNPolicy(BOX4, gym.spaces.Box(-1, 1, (2,)), DQNConfig())


# -- plan -------------------------------------------------------------------------------------------

def test_plan_reads_like_the_figure_and_fits_on_one_screen() -> None:
    assert plan_code_lines(plan) <= 25
    results = plan(WorkerSet(policy_class=DQNPolicy, config=SMALL), SMALL)
    assert repr(results) == (
        "LocalIterator[Concurrently(round_robin, round_robin_weights=[1.0, 1.0], output_indexes=[1])"
        "[LocalIterator[ParallelRollouts(bulk_sync).for_each(StoreToReplayBuffer(local))], "
        "LocalIterator[Replay(local).for_each(TrainOneStep).for_each(UpdatePriorities)"
        ".for_each(UpdateTargetNetwork(500))]].filter(ReportGate(100 steps, 0 s)).for_each(CollectMetrics)]")
    uniform = dataclasses.replace(SMALL, prioritized_replay=False, training_intensity=16)
    text = repr(plan(WorkerSet(policy_class=DQNPolicy, config=uniform), uniform))
    assert "round_robin_weights=[1.0, 2.0]" in text and "UpdatePriorities" not in text


def test_no_result_before_learning_starts_then_training_intensity_sets_the_ratio() -> None:
    config = dataclasses.replace(SMALL, learning_starts=300, training_intensity=16)  # weights [1, 2]
    buf = make_replay_buffer(config)
    results = plan(WorkerSet(policy_class=DQNPolicy, config=config), config, replay_buffer=buf)
    first = next(results)
    assert first["info"]["num_steps_sampled"] >= 300 and first["info"]["num_steps_trained"] > 0
    assert buf.num_added == first["info"]["num_steps_sampled"]  # the plan stores into the buffer it was given
    last = [next(results) for _ in range(5)][-1]
    trained, sampled = last["info"]["num_steps_trained"], last["info"]["num_steps_sampled"]
    assert trained / (sampled - 300) == pytest.approx(16, rel=0.05)  # 2 replays of 32 per 4 steps stored
    # the replayed rows' priorities were updated from the learner's TD errors
    assert buf.replay_buffers["default_policy"].max_priority != 1.0


def test_before_learn_on_batch_hook_sees_every_replayed_batch() -> None:
    seen: list[int] = []

    def hook(batch: Any, workers: WorkerSet, config: DQNConfig) -> Any:
        seen.append(batch.count)
        return batch

    config = dataclasses.replace(SMALL, before_learn_on_batch=hook)
    result = next(plan(WorkerSet(policy_class=DQNPolicy, config=config), config))
    assert seen and set(seen) == {32} and 32 * len(seen) == result["info"]["num_steps_trained"]


def test_target_network_updates_every_freq_sampled_steps() -> None:
    config = dataclasses.replace(SMALL, target_network_update_freq=200)
    workers = WorkerSet(policy_class=DQNPolicy, config=config)
    results = plan(workers, config)
    result = [next(results) for _ in range(4)][-1]
    assert result["info"]["num_target_updates"] == result["info"]["num_steps_sampled"] // 200
    policy = workers.local_worker().get_policy()
    assert result["info"]["last_target_update_ts"] > 0 and policy.target_model is not policy.model


def test_same_seed_gives_identical_results() -> None:
    runs = [[comparable(r) for r in first_results(DQNPolicy, SMALL, plan, 3)] for _ in range(2)]
    assert runs[0] == runs[1]
    other = [comparable(r) for r in first_results(DQNPolicy, dataclasses.replace(SMALL, seed=1), plan, 3)]
    assert other != runs[0]


def test_remote_workers_store_in_lockstep_and_receive_the_timestep() -> None:
    config = dataclasses.replace(SMALL, num_workers=2, num_cpus_per_worker=0.5)
    workers = WorkerSet(policy_class=DQNPolicy, config=config)
    try:
        result = next(plan(workers, config))
        assert result["num_healthy_workers"] == 2 and result["info"]["num_steps_sampled"] % 8 == 0  # 2 x 4 per store
        epsilons = workers.foreach_worker(lambda w: w.get_policy().epsilon)
        assert len(epsilons) == 3 and all(e < 1.0 for e in epsilons)  # the broadcast carries the timestep
    finally:
        workers.stop()


def test_trainer_owns_the_buffer_and_checkpoints_the_target_network() -> None:
    config = dataclasses.replace(SMALL, store_buffer_in_checkpoints=True)
    trainer = Trainer("dqn", config)
    try:
        buf = trainer.owned_state["replay_buffer"]
        result = trainer.train()
        assert buf.num_added == result["info"]["num_steps_sampled"] > 0
        with tempfile.TemporaryDirectory() as tmp:
            path = trainer.save(tmp)
            policy = trainer.get_policy()
            saved = {k: v.clone() for k, v in policy.target_model.state_dict().items()}
            policy.model.apply(lambda m: torch.nn.init.zeros_(m.weight) if isinstance(m, torch.nn.Linear) else None)
            policy.update_target()
            trainer.restore(path)
        assert all(torch.equal(saved[k], v) for k, v in trainer.get_policy().target_model.state_dict().items())
    finally:
        trainer.stop()


# -- learning ---------------------------------------------------------------------------------------

@pytest.mark.slow  # the default tier keeps one learning check per family (PPO, PG, A2C, IMPALA); ~10 min budget
def test_dqn_learns_cartpole_within_50k_steps() -> None:
    """Seeded: RLlib's DQN defaults (double Q, dueling, prioritized replay, 1-step) reach 150 in ~20k steps, ~40 s."""
    config = DQNConfig(env="CartPole-v1", seed=0, min_iter_time_s=0, timesteps_per_iteration=2000)
    result, seconds = train_until(DQNPolicy, config, plan, target=150, max_steps=50_000)
    print(f"DQN: return {result['episode_reward_mean']:.1f} after {result['timesteps_total']} steps, {seconds:.0f} s")
    assert result["episode_reward_mean"] >= 150
