"""SAC: config validation, the squashed-Gaussian actor and its log-probabilities, the critics' twin-Q target, the
entropy temperature, soft target updates, state round trips, the plan on Pendulum and seeded learning checks."""

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
from flowrl.algorithms.dqn import make_owned_state, plan
from flowrl.algorithms.off_policy import NSTEP_DISCOUNTS
from flowrl.algorithms.pg import PGConfig
from flowrl.algorithms.sac import ALGORITHM, SACConfig, SACPolicy, squashed_gaussian_sample
from flowrl.config import ModelConfig
from flowrl.policy import NONFINITE_UPDATES_SKIPPED
from flowrl.sample_batch import ACTIONS, NEXT_OBS, OBS, REWARDS, TD_ERROR, TERMINATEDS, WEIGHTS, SampleBatch
from flowrl.trainer import Trainer
from flowrl.workers import WorkerSet

from .test_pg import comparable, first_results, plan_code_lines, train_until

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

OBS3 = gym.spaces.Box(-8.0, 8.0, (3,), np.float32)
ACT2 = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
SMALL_NETS = {"actor_hiddens": (16,), "critic_hiddens": (16,)}
# a small, fast, report-every-100-steps setting for plan tests
SMALL = SACConfig(seed=0, learning_starts=64, train_batch_size=32, timesteps_per_iteration=100, **SMALL_NETS)


def make_policy(**kwargs: Any) -> SACPolicy:
    return SACPolicy(OBS3, ACT2, SACConfig(**{"seed": 0, **SMALL_NETS, **kwargs}))


def loss_batch(rng: np.random.Generator, size: int = 32, weights: bool = False) -> SampleBatch:
    columns = {OBS: rng.uniform(-1, 1, (size, 3)).astype(np.float32),
               NEXT_OBS: rng.uniform(-1, 1, (size, 3)).astype(np.float32),
               ACTIONS: rng.uniform(-1, 1, (size, 2)).astype(np.float32),
               REWARDS: rng.normal(0, 3, size).astype(np.float32), TERMINATEDS: rng.random(size) < 0.3}
    columns[NSTEP_DISCOUNTS] = np.where(columns[TERMINATEDS], 0.0, 0.9).astype(np.float32)
    if weights:
        columns[WEIGHTS] = rng.uniform(0.1, 1.0, size).astype(np.float32)
    return SampleBatch(columns)


# -- config -----------------------------------------------------------------------------------------

def test_config_has_sac_defaults_and_is_frozen() -> None:
    c = SACConfig()
    assert (c.env, c.actor_hiddens, c.critic_hiddens, c.activation, c.actor_lr, c.critic_lr, c.entropy_lr) == \
        ("Pendulum-v1", (256, 256), (256, 256), "relu", 3e-4, 3e-4, 3e-4)
    assert (c.tau, c.target_network_update_freq, c.twin_q, c.initial_alpha, c.target_entropy) == \
        (5e-3, 0, True, 1.0, "auto")
    assert (c.train_batch_size, c.rollout_fragment_length, c.n_step, c.prioritized_replay, c.num_workers,
            c.training_intensity, c.grad_clip, c.use_simple_optimizer) == (256, 1, 1, False, 0, None, None, True)
    assert c.buffer_size >= 30_000 and 1000 <= c.learning_starts <= 1500
    assert c.round_robin_weights == [1.0, 1.0]  # one stored step per replayed batch: one gradient step per env step
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.tau = 0.1  # type: ignore[misc]  # the point of the test


def test_the_benchmarks_settings_build() -> None:
    config = SACConfig(env="Pendulum-v1", seed=0, train_batch_size=256, actor_hiddens=(256, 256),
                       critic_hiddens=(256, 256), learning_starts=1000, rollout_fragment_length=1)
    assert config.round_robin_weights == [1.0, 1.0]


@pytest.mark.parametrize("kwargs, message", [
    ({"tau": 0.0}, "tau=0.0 must be a number in (0, 1] (the target critics' soft-update rate; 1: a copy)"),
    ({"tau": 1.5}, "tau=1.5 must be a number in (0, 1]"),
    ({"tau": -0.1}, "tau=-0.1 must be a number in (0, 1]"),
    ({"initial_alpha": 0.0}, "initial_alpha=0.0 must be a number > 0 (the entropy temperature at the start)"),
    ({"initial_alpha": -1.0}, "initial_alpha=-1.0 must be a number > 0"),
    ({"target_entropy": "max"}, "target_entropy='max'; use 'auto' (-action_dim) or a number such as -1.0"),
    ({"target_entropy": math.nan}, "target_entropy=nan must be a finite number; pass a finite value such as -1.0, or 'auto'"),
    ({"target_entropy": math.inf}, "target_entropy=inf must be a finite number; pass a finite value such as -1.0, or 'auto'"),
    ({"normalize_actions": False}, "normalize_actions=False: SAC's tanh-squashed actions lie in [-1, 1]"),
    ({"num_gpus": 2, "fake_gpus": True}, "asks for the multi-device learner, which has no three-network update"),
    ({"simple_optimizer": False}, "set num_gpus <= 1 and simple_optimizer=None"),
    ({"actor_hiddens": (0,)}, "actor_hiddens=(0,) must be one or more positive ints"),
    ({"critic_hiddens": ()}, "critic_hiddens=() must be one or more positive ints"),
    ({"model": ModelConfig(hidden_sizes=(32,))}, "are not read by SAC; set actor_hiddens, critic_hiddens and "
                                                 "activation instead"),
    ({"lr": 1e-3}, "lr=0.001 is not read by SAC, which has three learning rates; set actor_lr, critic_lr"),
    ({"actor_lr": 0.0}, "actor_lr=0.0 must be a number > 0"),
    ({"huber_threshold": 0.0}, "huber_threshold=0.0 must be a number > 0"),
    ({"n_step": 3}, "rollout_fragment_length=1 is shorter than n_step=3; raise rollout_fragment_length to at least 3"),
])
def test_config_validation_names_field_value_and_fix(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        SACConfig(**kwargs)


def test_registered_under_sac_running_dqns_plan() -> None:
    assert get_algorithm("sac") is ALGORITHM
    assert (ALGORITHM.config_class, ALGORITHM.policy_class, ALGORITHM.plan, ALGORITHM.make_owned_state) == \
        (SACConfig, SACPolicy, plan, make_owned_state)
    buf = make_owned_state(SACConfig(buffer_size=1000, learning_starts=50))["replay_buffer"]
    assert (buf.capacity, buf.learning_starts, buf.replay_batch_size, buf.prioritized) == (1000, 50, 256, False)


def test_policy_refuses_discrete_and_unbounded_action_spaces_and_other_configs() -> None:
    with pytest.raises(ValueError, match=re.escape("SAC needs a Box (continuous) action space, got Discrete(2); "
                                                   "use DQN or PPO for discrete actions")):
        SACPolicy(OBS3, gym.spaces.Discrete(2), SACConfig())
    with pytest.raises(ValueError, match=r"SAC needs finite action bounds, got Box\(-inf, inf, \(2,\), float32\)"):
        SACPolicy(OBS3, gym.spaces.Box(-np.inf, np.inf, (2,)), SACConfig())
    with pytest.raises(TypeError, match="SACPolicy needs a SACConfig"):
        SACPolicy(OBS3, ACT2, PGConfig())


def test_a_discrete_env_fails_when_the_workers_are_built() -> None:
    config = SACConfig(env="CartPole-v1", seed=0, **SMALL_NETS)
    with pytest.raises(ValueError, match=r"SAC needs a Box \(continuous\) action space, got Discrete\(2\)"):
        WorkerSet(policy_class=SACPolicy, config=config)


# -- policy: acting and log-probabilities ------------------------------------------------------------

def test_actions_lie_in_the_unit_box_and_evaluation_is_deterministic_tanh_mean() -> None:
    policy = make_policy()
    with torch.no_grad():  # a wide Gaussian, so that exploring actions reach the squashing's saturation
        policy.model.actor.head.bias[2:].fill_(1.5)
    obs = np.random.default_rng(0).uniform(-8, 8, (500, 3)).astype(np.float32)
    actions, extras = policy.compute_actions(obs)
    assert actions.shape == (500, 2) and actions.dtype == np.float32 and extras == {}
    assert np.all(np.abs(actions) <= 1.0) and np.abs(actions).max() > 0.99
    with torch.no_grad():
        mean = policy.model.actor(torch.as_tensor(obs))[:, :2].numpy()
    greedy = policy.compute_actions(obs, explore=False)[0]
    np.testing.assert_allclose(greedy, np.tanh(mean), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(policy.compute_actions(obs, explore=False)[0], greedy)
    assert not np.allclose(actions, greedy)
    env_actions = policy.env_actions(actions)  # mapped onto [-2, 2] x [0, 1]
    assert env_actions[:, 0].min() >= -2 and env_actions[:, 1].min() >= 0 and env_actions[:, 1].max() <= 1


def test_numpy_and_torch_acting_agree_and_the_mirror_follows_learning() -> None:
    mirrored, torch_only = make_policy(), make_policy(numpy_acting=False)
    assert mirrored.numpy_actor is not None and torch_only.numpy_actor is None
    obs = np.random.default_rng(1).uniform(-8, 8, (20, 3)).astype(np.float32)
    np.testing.assert_allclose(mirrored.compute_actions(obs, False)[0], torch_only.compute_actions(obs, False)[0],
                               rtol=1e-5, atol=1e-6)
    before = mirrored.compute_actions(obs, False)[0]
    version = mirrored.weights_version
    mirrored.learn_on_batch(loss_batch(np.random.default_rng(2)))  # a fused step: the mirror must re-read
    assert mirrored.weights_version == version + 1
    after = mirrored.compute_actions(obs, False)[0]
    assert not np.allclose(after, before)
    torch_only.set_weights(mirrored.get_weights())
    np.testing.assert_allclose(after, torch_only.compute_actions(obs, False)[0], rtol=1e-5, atol=1e-6)
    sampled = torch_only.compute_actions(obs)[0]  # the torch path explores too, within [-1, 1]
    assert np.all(np.abs(sampled) <= 1) and not np.allclose(sampled, after)


def test_log_probability_matches_torch_distributions_with_the_tanh_transform() -> None:
    rng = np.random.default_rng(3)
    mean = torch.as_tensor(rng.normal(0, 1.5, (64, 3)), dtype=torch.float64)
    log_std = torch.as_tensor(rng.uniform(-2, 1, (64, 3)), dtype=torch.float64)
    noise = torch.as_tensor(rng.normal(size=(64, 3)), dtype=torch.float64)
    actions, logp = squashed_gaussian_sample(torch.cat([mean, log_std], dim=1), noise)
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()), [torch.distributions.TanhTransform(cache_size=1)])
    u = mean + log_std.exp() * noise
    expected = dist.log_prob(dist.transforms[0](u)).sum(dim=1)  # the cached u: no atanh round trip
    np.testing.assert_allclose(actions.numpy(), torch.tanh(u).numpy(), rtol=1e-12)
    np.testing.assert_allclose(logp.numpy(), expected.numpy(), rtol=1e-6, atol=1e-6)
    _, far = squashed_gaussian_sample(torch.tensor([[30.0, 0.0]]), torch.zeros(1, 1))  # tanh(30) rounds to 1
    assert torch.isfinite(far).all()
    _, clamped = squashed_gaussian_sample(torch.tensor([[0.0, 50.0]]), torch.zeros(1, 1))  # log_std clamped to 2
    assert clamped.item() == pytest.approx(-2.0 - 0.5 * math.log(2 * math.pi))


# -- policy: losses -----------------------------------------------------------------------------------

def perturb_targets(policy: SACPolicy, rng: np.random.Generator) -> None:
    with torch.no_grad():  # target critics that disagree with the online ones and with each other
        for p in policy.target_critics.parameters():
            p.add_(torch.as_tensor(rng.normal(0, 0.5, tuple(p.shape)), dtype=p.dtype))


def reference_losses(policy: SACPolicy, batch: SampleBatch, reduce: Any) -> tuple[float, float]:
    """The critics' and the actor's losses written out from the networks, with ``reduce`` (torch.min for twin Q)
    over the two critics, drawing the loss's noise from a copy of the policy's generator."""
    generator = torch.Generator().manual_seed(0)
    generator.set_state(policy.generator.get_state())
    size = batch.count
    with torch.no_grad():
        noise, next_noise = torch.randn(2 * size, 2, generator=generator).split(size)
        obs, next_obs = torch.as_tensor(batch[OBS]), torch.as_tensor(batch[NEXT_OBS])
        alpha = policy.model.log_alpha.exp()
        next_a, next_logp = squashed_gaussian_sample(policy.model.actor(next_obs), next_noise)
        next_q = reduce(policy.target_critics(next_obs, next_a), dim=0).values
        y = torch.as_tensor(batch[REWARDS]) + torch.as_tensor(batch[NSTEP_DISCOUNTS]) * (next_q - alpha * next_logp)
        q = policy.model.critics(obs, torch.as_tensor(batch[ACTIONS]))
        critic = sum(0.5 * ((q[k] - y) ** 2).mean() for k in range(2))
        pi_a, logp = squashed_gaussian_sample(policy.model.actor(obs), noise)
        actor = (alpha * logp - reduce(policy.model.critics(obs, pi_a), dim=0).values).mean()
    return float(critic), float(actor)


def test_critic_and_actor_losses_use_the_smaller_of_the_twin_critics() -> None:
    rng = np.random.default_rng(4)
    policy = make_policy(initial_alpha=0.3)
    perturb_targets(policy, rng)
    batch = loss_batch(rng)
    critic_min, actor_min = reference_losses(policy, batch, torch.min)
    critic_max, actor_max = reference_losses(policy, batch, torch.max)
    assert abs(critic_min - critic_max) > 1e-3 and abs(actor_min - actor_max) > 1e-3  # the choice matters here
    stats = policy.learn_on_batch(batch)["learner_stats"]
    assert stats["critic_loss"] == pytest.approx(critic_min, rel=1e-5)
    assert stats["actor_loss"] == pytest.approx(actor_min, rel=1e-5)
    assert stats["alpha"] == pytest.approx(0.3)
    assert {"alpha_loss", "entropy", "mean_q", "min_q", "max_q", "mean_abs_td_error", "loss"} <= set(stats)


def test_each_network_gets_only_its_own_losss_gradient() -> None:
    """The critics' parameters move by the critic loss alone: the same step with the actor's learning rate at
    (almost) zero leaves them where the full step puts them."""
    rng = np.random.default_rng(5)
    batch = loss_batch(rng)
    full, critic_only = make_policy(), make_policy(actor_lr=1e-30, entropy_lr=1e-30)
    full.learn_on_batch(batch)
    critic_only.learn_on_batch(batch)
    for a, b in zip(full.model.critics.parameters(), critic_only.model.critics.parameters()):
        torch.testing.assert_close(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(full.model.actor.parameters(),
                                                     critic_only.model.actor.parameters()))


@pytest.mark.parametrize("target_entropy, direction", [(-10.0, -1), (10.0, 1)])
def test_alpha_falls_when_the_entropy_exceeds_the_target_and_rises_below_it(target_entropy: float,
                                                                          direction: int) -> None:
    policy = make_policy(target_entropy=target_entropy, entropy_lr=1e-2)
    alphas = [policy.alpha]
    for i in range(5):
        stats = policy.learn_on_batch(loss_batch(np.random.default_rng(i)))["learner_stats"]
        alphas.append(policy.alpha)
    assert -10 < -stats["entropy"] < 10  # the policy's entropy lies between the two targets
    assert all(direction * (b - a) > 0 for a, b in zip(alphas, alphas[1:])), alphas


def test_target_entropy_auto_is_minus_the_action_dimension() -> None:
    assert make_policy().target_entropy == -2.0 and make_policy(target_entropy=-0.5).target_entropy == -0.5


def test_prioritized_replay_gets_per_row_td_errors_and_weights_scale_the_critic_loss() -> None:
    rng = np.random.default_rng(6)
    batch = loss_batch(rng, weights=True)
    assert TD_ERROR not in make_policy().learn_on_batch(batch)
    info = make_policy(prioritized_replay=True).learn_on_batch(batch)
    assert info[TD_ERROR].shape == (32,) and np.all(info[TD_ERROR] >= 0)
    assert info[TD_ERROR].mean() == pytest.approx(info["learner_stats"]["mean_abs_td_error"], rel=1e-5)
    unweighted = make_policy().learn_on_batch(SampleBatch({k: v for k, v in batch.items() if k != WEIGHTS}))
    weighted = make_policy().learn_on_batch(batch)
    assert weighted["learner_stats"]["critic_loss"] < unweighted["learner_stats"]["critic_loss"]  # weights < 1


def test_huber_and_grad_clip_change_the_step_and_report_each_networks_norm() -> None:
    batch = loss_batch(np.random.default_rng(7))
    plain = make_policy().learn_on_batch(batch)["learner_stats"]
    huber = make_policy(use_huber=True, huber_threshold=0.5).learn_on_batch(batch)["learner_stats"]
    assert huber["critic_loss"] < plain["critic_loss"]  # rewards with std 3: many errors beyond the threshold
    clipped = make_policy(grad_clip=0.1)
    stats = clipped.learn_on_batch(batch)["learner_stats"]
    assert {"actor_grad_gnorm", "critic_grad_gnorm", "alpha_grad_gnorm"} <= set(stats)
    assert all(float(torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])) <= 0.1 + 1e-6
               for params in clipped._groups)


def test_a_non_finite_batch_skips_the_whole_step() -> None:
    policy = make_policy()
    batch = loss_batch(np.random.default_rng(8))
    batch[REWARDS][3] = np.nan
    before = {k: v.copy() for k, v in policy.get_weights().items()}
    info = policy.learn_on_batch(batch)
    assert info["learner_stats"][NONFINITE_UPDATES_SKIPPED] == 1 and policy.weights_version == 0
    assert all(np.array_equal(before[k], v) for k, v in policy.get_weights().items())


# -- policy: target critics and state ------------------------------------------------------------------

def test_update_target_is_a_soft_update_by_tau() -> None:
    policy = make_policy(tau=0.25)
    perturb_targets(policy, np.random.default_rng(9))
    online = [p.detach().clone() for p in policy.model.critics.parameters()]
    target = [p.detach().clone() for p in policy.target_critics.parameters()]
    policy.update_target()
    for o, t, new in zip(online, target, policy.target_critics.parameters()):
        torch.testing.assert_close(new, 0.75 * t + 0.25 * o)
    assert not any(p.requires_grad for p in policy.target_critics.parameters())
    copied = make_policy(tau=1.0)
    perturb_targets(copied, np.random.default_rng(9))
    copied.update_target()
    assert all(torch.equal(a, b) for a, b in zip(copied.target_critics.parameters(),
                                                 copied.model.critics.parameters()))


def test_state_round_trips_networks_targets_optimizer_alpha_and_rngs() -> None:
    policy = make_policy(entropy_lr=1e-2)
    rng = np.random.default_rng(10)
    perturb_targets(policy, rng)
    for _ in range(3):
        policy.learn_on_batch(loss_batch(rng))
        policy.update_target()
    policy.compute_actions(np.zeros((2, 3), np.float32))
    state = policy.get_state()
    assert len(state["optimizer"]["param_groups"]) == 3 and "target_weights" in state
    other = make_policy(seed=9, entropy_lr=1e-2)
    other.set_state(state)
    assert other.alpha == policy.alpha != 1.0
    batch, obs = loss_batch(rng), np.ones((4, 3), np.float32)
    for p in (policy, other):  # the same next step: same Adam moments, same loss noise, same acting noise
        p.learn_on_batch(batch)
        p.update_target()
    for a, b in zip(policy.get_weights().values(), other.get_weights().values()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(policy.target_critics.parameters(), other.target_critics.parameters()):
        assert torch.equal(a, b)
    np.testing.assert_array_equal(policy.compute_actions(obs)[0], other.compute_actions(obs)[0])
    with pytest.raises(ValueError, match="no 'target_weights'"):
        other.set_state({k: v for k, v in state.items() if k != "target_weights"})


# -- plan ---------------------------------------------------------------------------------------------

def test_plan_runs_on_pendulum_with_a_soft_target_update_after_every_train_step() -> None:
    assert plan_code_lines(plan) <= 25
    workers = WorkerSet(policy_class=SACPolicy, config=SMALL)
    results = plan(workers, SMALL)
    assert repr(results) == (
        "LocalIterator[Concurrently(round_robin, round_robin_weights=[1.0, 1.0], output_indexes=[1])"
        "[LocalIterator[ParallelRollouts(bulk_sync).for_each(StoreToReplayBuffer(local))], "
        "LocalIterator[Replay(local).for_each(TrainOneStep).for_each(UpdateTargetNetwork(0))]]"
        ".filter(ReportGate(100 steps, 0 s)).for_each(CollectMetrics)]")
    result = [next(results) for _ in range(3)][-1]
    info = result["info"]
    assert info["num_steps_trained"] == 32 * info["num_target_updates"]  # one soft update per train step
    assert info["num_steps_trained"] == 32 * (info["num_steps_sampled"] - 64 + 1)  # one train step per env step
    stats = info["learner"]["default_policy"]["learner_stats"]
    assert {"actor_loss", "critic_loss", "alpha_loss", "alpha", "entropy", "mean_q"} <= set(stats)
    assert workers.local_worker().get_policy().weights_version == info["num_target_updates"]


def test_prioritized_replay_updates_the_replayed_rows_priorities() -> None:
    config = dataclasses.replace(SMALL, prioritized_replay=True)
    buf = make_owned_state(config)["replay_buffer"]
    results = plan(WorkerSet(policy_class=SACPolicy, config=config), config, replay_buffer=buf)
    assert "UpdatePriorities" in repr(results)
    next(results)
    assert buf.replay_buffers["default_policy"].max_priority != 1.0


def test_same_seed_gives_identical_results() -> None:
    runs = [[comparable(r) for r in first_results(SACPolicy, SMALL, plan, 2)] for _ in range(2)]
    assert runs[0] == runs[1]
    other = [comparable(r) for r in first_results(SACPolicy, dataclasses.replace(SMALL, seed=1), plan, 2)]
    assert other != runs[0]


def test_trainer_checkpoints_and_restores_the_target_critics_and_alpha() -> None:
    trainer = Trainer("sac", SMALL)
    try:
        trainer.train()
        with tempfile.TemporaryDirectory() as tmp:
            path = trainer.save(tmp)
            policy = trainer.get_policy()
            saved = [p.detach().clone() for p in policy.target_critics.parameters()]
            alpha = policy.alpha
            trainer.train()
            assert policy.alpha != alpha
            trainer.restore(path)
        restored = trainer.get_policy()
        assert restored.alpha == alpha
        assert all(torch.equal(a, b) for a, b in zip(saved, restored.target_critics.parameters()))
    finally:
        trainer.stop()


# -- learning -----------------------------------------------------------------------------------------

def test_sac_improves_pendulum_within_a_few_thousand_steps() -> None:
    """Seeded and short: small networks and batches. Random actions score about -1300 on Pendulum-v1; seed 0
    passes -700 at about 4000 steps (-570 there) and keeps 2000 steps of margin."""
    config = SACConfig(seed=0, actor_hiddens=(64, 64), critic_hiddens=(64, 64), train_batch_size=64,
                       learning_starts=500, timesteps_per_iteration=500, metrics_smoothing_episodes=5,
                       actor_lr=1e-3, critic_lr=1e-3, entropy_lr=1e-3)
    result, seconds = train_until(SACPolicy, config, plan, target=-700, max_steps=6000)
    print(f"SAC (short): return {result['episode_reward_mean']:.1f} after {result['timesteps_total']} steps, "
          f"{seconds:.0f} s")
    assert result["episode_reward_mean"] >= -700


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 7 to 22 minutes a seed measured on a loaded 2-core machine
@pytest.mark.parametrize("seed", [101, 202, 303])
def test_sac_reaches_rllibs_pendulum_gate_within_30k_steps(seed: int) -> None:
    """RLlib's SAC gate: a mean return of -150 over the last 20 episodes within 30k env steps, with the defaults
    (the SAC paper's and RLlib's settings, not tuned on these seeds). Seeds 101, 202 and 303 passed at 15k, 14k
    and 8k env steps (-129, -137, -130); 7 to 22 minutes each on a loaded 2-core machine."""
    config = SACConfig(seed=seed, metrics_smoothing_episodes=20)
    result, seconds = train_until(SACPolicy, config, plan, target=-150, max_steps=30_000)
    print(f"SAC seed {seed}: return {result['episode_reward_mean']:.1f} after {result['timesteps_total']} steps, "
          f"{seconds:.0f} s")
    assert result["episode_reward_mean"] >= -150 and result["timesteps_total"] <= 30_000
