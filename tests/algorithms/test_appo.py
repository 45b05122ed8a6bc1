"""APPO: config, the clipped surrogate on target-policy V-trace targets, target updates counted
in learner updates (§6 item 54), the plan against fake workers (shape, line count, learner stopped on close), and
a seeded learning check on CartPole."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.algorithms import ALGORITHMS, get_algorithm
from flowrl.algorithms.appo import ALGORITHM, APPOConfig, APPOPolicy, plan
from flowrl.algorithms.impala import IMPALAConfig
from flowrl.algorithms.vtrace import vtrace
from flowrl.metrics import MetricsContext
from flowrl.ops.train import UpdateTargetAndKL
from flowrl.sample_batch import ACTIONS, EPS_ID, LOGP, NEXT_OBS, OBS, REWARDS, TERMINATEDS, TRUNCATEDS, T, SampleBatch
from flowrl.testing import make_fake_workers, plan_lines
from flowrl.trainer import Trainer

from .test_ppo import assert_plan_trains_gaussian_actions, pendulum_config

SPACES = (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))

# -- config -----------------------------------------------------------------------------------------


def test_config_has_appo_defaults_over_impala() -> None:
    c, i = APPOConfig(), IMPALAConfig()
    assert (c.clip_param, c.use_kl_loss, c.kl_coeff, c.kl_target, c.replay_buffer_num_slots) == (0.4, False, 1.0,
                                                                                                  0.01, 100)
    assert c.after_train_step is UpdateTargetAndKL
    assert (c.rollout_fragment_length, c.train_batch_size, c.lr, c.vf_loss_coeff, c.entropy_coeff, c.replay_proportion,
            c.num_sgd_iter, c.minibatch_buffer_size) == \
        (i.rollout_fragment_length, i.train_batch_size, i.lr, i.vf_loss_coeff, i.entropy_coeff, 0.0, 1, 1)
    assert c.target_update_period == 1
    assert APPOConfig(num_sgd_iter=3, minibatch_buffer_size=4).target_update_period == 12
    # with minibatches, a pass makes about train_batch_size / sgd_minibatch_size updates
    assert APPOConfig(train_batch_size=1024, sgd_minibatch_size=256, num_sgd_iter=4).target_update_period == 16
    assert APPOConfig(train_batch_size=500, sgd_minibatch_size=600).target_update_period == 1


@pytest.mark.parametrize("settings, error, message", [
    ({"clip_param": 0.0}, ValueError, "clip_param=0.0 must be a number > 0 (e.g. 0.4; the surrogate clips"),
    ({"kl_coeff": -1.0}, ValueError, "kl_coeff=-1.0 must be a number >= 0"),
    ({"kl_target": 0.0}, ValueError, "kl_target=0.0 must be a number > 0 (the KL that update_kl steers towards, "
                                       "e.g. 0.01)"),
    ({"use_kl_loss": 1}, TypeError, "use_kl_loss=1 must be a bool"),
    ({"after_train_step": None}, ValueError, "after_train_step=None: APPO's target network would never be refreshed"),
    ({"batch_mode": "complete_episodes"}, ValueError, "use batch_mode='truncate_episodes'"),  # IMPALA's own checks
    ({"num_sgd_iter": 0}, ValueError, "num_sgd_iter=0 must be an int >= 1"),
])
def test_config_validation_names_field_value_and_fix(settings: dict[str, Any], error: type[Exception],
                                                     message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        APPOConfig(**settings)


def test_registered_under_appo() -> None:
    assert "appo" in ALGORITHMS and get_algorithm("APPO") is ALGORITHM
    assert (ALGORITHM.config_class, ALGORITHM.policy_class, ALGORITHM.plan) == (APPOConfig, APPOPolicy, plan)


# -- the loss -------------------------------------------------------------------------------------------


def _episode(rng: np.random.Generator, n: int = 8) -> SampleBatch:
    """One terminated episode: a single V-trace piece, so a reference needs no layout."""
    return SampleBatch({OBS: rng.normal(size=(n, 4)).astype(np.float32),
                        NEXT_OBS: rng.normal(size=(n, 4)).astype(np.float32),
                        ACTIONS: rng.integers(0, 2, n), LOGP: np.log(rng.uniform(0.2, 0.8, n)).astype(np.float32),
                        REWARDS: rng.normal(size=n).astype(np.float32),
                        TERMINATEDS: np.arange(n) == n - 1, TRUNCATEDS: np.zeros(n, bool),
                        EPS_ID: np.zeros(n, np.int64), T: np.arange(n)})


def _perturb(policy: APPOPolicy, scale: float = 0.5, seed: int = 0) -> None:
    """Moves the learned network away from the target network."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


def _logp(policy: APPOPolicy, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return policy.action_distribution(model(batch[OBS])[0]).logp(batch[ACTIONS])


def test_loss_is_the_clipped_surrogate_on_target_policy_vtrace() -> None:
    """A straightforward reference: V-trace with the TARGET network as the target policy, then PPO-clip on
    ``clamp(mu / pi_t, 0, 2) * pi / mu`` (RLlib's APPO: ``pi / pi_t`` wherever the clamp does not bind), value loss to vs, entropy and the KL to the target policy."""
    config = APPOConfig(seed=0, gamma=0.9, clip_param=0.1, use_kl_loss=True, kl_coeff=0.5, entropy_coeff=0.02)
    policy = APPOPolicy(*SPACES, config)
    _perturb(policy)
    batch = policy.to_tensors(_episode(np.random.default_rng(0)))
    total, stats = policy.loss(batch)

    with torch.no_grad():
        dist_inputs, values = policy.model(batch[OBS])
        dist, target_dist = policy.action_distribution(dist_inputs), \
            policy.action_distribution(policy.target_model(batch[OBS])[0])
        logp, target_logp, mu = dist.logp(batch[ACTIONS]), target_dist.logp(batch[ACTIONS]), batch[LOGP]
        bootstrap = policy.model(batch[NEXT_OBS][-1:])[1]
        ref = vtrace(behaviour_logp=mu[:, None], target_logp=target_logp[:, None], rewards=batch[REWARDS][:, None],
                     values=values[:, None], bootstrap_value=bootstrap,
                     discounts=(0.9 * (1.0 - batch[TERMINATEDS].float()))[:, None])
        adv, vs = ref.pg_advantages[:, 0], ref.vs[:, 0]
        ratio = torch.exp(mu - target_logp).clamp(0, 2) * torch.exp(logp - mu)
        assert ((ratio < 0.9) | (ratio > 1.1)).any(), "the check needs rows that the clip changes"
        policy_loss = -torch.min(adv * ratio, adv * ratio.clamp(0.9, 1.1)).mean()
        vf_loss = 0.5 * (values - vs).pow(2).mean()
        kl = target_dist.kl(dist).mean()
        expected = policy_loss + 0.5 * vf_loss - 0.02 * dist.entropy().mean() + 0.5 * kl
    assert stats["policy_loss"] == pytest.approx(float(policy_loss), rel=1e-5)
    assert stats["vf_loss"] == pytest.approx(float(vf_loss), rel=1e-5)
    assert stats["kl"] == pytest.approx(float(kl), rel=1e-5) and stats["kl"] > 0
    assert float(total.detach()) == pytest.approx(float(expected), rel=1e-5)
    unclipped = replace(config, clip_param=1e6)
    policy.config = unclipped
    assert policy.loss(batch)[1]["policy_loss"] != pytest.approx(stats["policy_loss"], rel=1e-3)  # the clip mattered


def test_importance_ratios_are_taken_against_the_target_network_until_it_is_updated() -> None:
    policy = APPOPolicy(*SPACES, APPOConfig(seed=0, vtrace_clip_rho_threshold=10.0))
    batch = policy.to_tensors(_episode(np.random.default_rng(1)))
    with torch.no_grad():
        target_rho = torch.exp(_logp(policy, policy.target_model, batch) - batch[LOGP]).mean()
    assert policy.loss(batch)[1]["kl"] == pytest.approx(0.0, abs=1e-7)  # the target starts as a copy
    _perturb(policy)
    stats = policy.loss(batch)[1]
    with torch.no_grad():
        current_rho = torch.exp(_logp(policy, policy.model, batch) - batch[LOGP]).mean()
    assert stats["mean_rho"] == pytest.approx(float(target_rho), rel=1e-5)  # V-trace's rho: pi_target / mu
    assert stats["mean_rho"] != pytest.approx(float(current_rho), rel=1e-3)
    assert stats["kl"] > 0
    policy.update_target()
    stats = policy.loss(batch)[1]
    assert stats["mean_rho"] == pytest.approx(float(current_rho), rel=1e-5)
    assert stats["kl"] == pytest.approx(0, abs=1e-7)


def test_kl_term_only_with_use_kl_loss_and_kl_coeff_adapts() -> None:
    batch_np = _episode(np.random.default_rng(2))
    losses = []
    for use_kl in (False, True):
        policy = APPOPolicy(*SPACES, APPOConfig(seed=0, use_kl_loss=use_kl, kl_coeff=2.0))
        _perturb(policy)
        total, stats = policy.loss(policy.to_tensors(batch_np))
        losses.append((float(total.detach()), stats["kl"]))
    (off, kl), (on, _) = losses
    assert on == pytest.approx(off + 2.0 * kl, rel=1e-5)
    policy.update_kl(1.0)  # > 2 x kl_target
    policy.update_kl(0.01)  # within [kl_target / 2, 2 x kl_target]: unchanged
    assert policy.kl_coeff == 3.0
    policy.update_kl(0.001)
    assert policy.kl_coeff == 1.5


def test_state_holds_target_network_and_kl_coeff() -> None:
    a, b = APPOPolicy(*SPACES, APPOConfig(seed=0)), APPOPolicy(*SPACES, APPOConfig(seed=1))
    _perturb(a)
    a.update_kl(1.0)
    state = a.get_state()
    b.set_state(state)
    assert b.kl_coeff == 1.5
    for x, y in zip(a.target_model.state_dict().values(), b.target_model.state_dict().values()):
        torch.testing.assert_close(x, y)
    assert not torch.equal(next(b.target_model.parameters()), next(b.model.parameters()))  # restored, not copied
    assert set(b.get_weights()) == set(a.get_weights())  # workers get the learned network only
    with pytest.raises(ValueError, match=re.escape("the state has no ['target_weights']")):
        b.set_state({k: v for k, v in state.items() if k != "target_weights"})
    with pytest.raises(TypeError, match="APPOPolicy needs an APPOConfig"):
        APPOPolicy(*SPACES, IMPALAConfig())


def test_learns_on_a_batch_with_finite_stats() -> None:
    policy = APPOPolicy(*SPACES, APPOConfig(seed=0, use_kl_loss=True))
    stats = policy.learn_on_batch(SampleBatch.concat([_episode(np.random.default_rng(i), 5 + i) for i in range(3)]))
    assert all(np.isfinite(v) for v in stats["learner_stats"].values())


# -- target updates, counted in learner updates (§6 item 54) ----------------------------------------------


def test_update_target_and_kl_counts_learner_updates_not_env_steps() -> None:
    workers = make_fake_workers(0)
    op = UpdateTargetAndKL(workers, APPOConfig(num_sgd_iter=2, minibatch_buffer_size=3, use_kl_loss=True))
    op.bind(metrics := MetricsContext())
    policy = workers.local_worker().get_policy()
    info = {"default_policy": {"learner_stats": {"kl": 0.5}}}
    fired = []
    for update in range(1, 14):
        metrics.counters["num_learner_updates"] = update
        metrics.counters["num_steps_sampled"] += 10_000 * update  # lots of sampling: irrelevant
        assert op(info) is info
        fired.append(policy.target_updates)
    assert fired == [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2]  # at 6 and 12 learner updates
    assert policy.kl_updates == [0.5, 0.5] and metrics.counters["num_target_updates"] == 2
    assert metrics.counters["last_target_update_ts"] == 12
    with pytest.raises(ValueError, match="have no 'kl'"):
        metrics.counters["num_learner_updates"] = 18
        op({"default_policy": {"learner_stats": {}}})
    with pytest.raises(TypeError, match="needs a config with target_update_period"):
        UpdateTargetAndKL(workers, IMPALAConfig())


def _learner_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("flowrl-learner") and t.is_alive()]


@pytest.mark.parametrize("train_batch_size", [10, 40])
def test_plan_updates_the_target_every_sgd_iter_x_buffer_learner_updates(train_batch_size: int) -> None:
    """The same number of target updates per learner update, whatever the env steps per update."""
    workers = make_fake_workers(2, rollout_fragment_length=10)
    config = APPOConfig(train_batch_size=train_batch_size, timesteps_per_iteration=0, learner_queue_size=2,
                        num_sgd_iter=2, minibatch_buffer_size=2, use_kl_loss=False)
    before = set(_learner_threads())
    try:
        it = plan(workers, config)
        try:
            (learner,) = set(_learner_threads()) - before
            for result in it.take(13):
                info = result["info"]
                assert info.get("num_target_updates", 0) == info["num_learner_updates"] // 4
            assert info["num_learner_updates"] == 13 and info["num_target_updates"] == 3
            assert info["num_steps_sampled"] >= 13 * train_batch_size // config.num_sgd_iter
            assert workers.local_worker().get_policy().target_updates == 3
        finally:
            it.close()
        assert not learner.is_alive()  # close() stopped and joined the learner thread
    finally:
        workers.stop()


def test_plan_shape() -> None:
    workers = make_fake_workers(2, rollout_fragment_length=10)
    try:
        it = plan(workers, APPOConfig(train_batch_size=20, timesteps_per_iteration=0, learner_queue_size=2,
                                      num_sgd_iter=3))
        try:
            assert repr(it) == (
                "LocalIterator[Concurrently(async, output_indexes=[1])[LocalIterator[ParallelRollouts(async)"
                ".zip_with_source_actor().for_each(BroadcastUpdateLearnerWeights(1))"
                ".combine(MixInReplay(100, 0.0)).combine(ConcatBatches(20)).for_each(Enqueue(maxsize=2))], "
                "LocalIterator[Dequeue.for_each(RecordLearnerOutput)]].for_each(UpdateTargetAndKL(3))"
                ".filter(ReportGate(0 steps, 0 s)).for_each(CollectMetrics).for_each()]")
        finally:
            it.close()
        with pytest.raises(TypeError, match="APPO's plan needs an APPOConfig"):
            plan(workers, IMPALAConfig())  # type: ignore[arg-type]
    finally:
        workers.stop()


def test_plan_fits_in_25_lines() -> None:
    assert plan_lines(plan) <= 25, plan_lines(plan)


# -- learning ------------------------------------------------------------------------------------------


def _learn_cartpole(max_steps: int) -> tuple[float, int]:
    """Trains APPO on CartPole-v1 (seed 0, 2 remote workers) until a mean return of 150 or ``max_steps``."""
    before = set(_learner_threads())
    trainer = Trainer("appo", APPOConfig(env="CartPole-v1", seed=0, num_workers=2, num_cpus_per_worker=0.5,
                                         min_iter_time_s=0, timesteps_per_iteration=10_000))
    start = time.perf_counter()
    try:
        while True:
            result = trainer.train()
            print(f"{result['timesteps_total']:>8} steps  return {result['episode_reward_mean']:6.1f}  "
                  f"target updates {result['info']['num_target_updates']}  {time.perf_counter() - start:5.1f} s")
            if result["episode_reward_mean"] >= 150 or result["timesteps_total"] >= max_steps:
                break
        (learner,) = set(_learner_threads()) - before
    finally:
        trainer.stop()
    assert not learner.is_alive()
    print(f"APPO: return {result['episode_reward_mean']:.1f} after {result['timesteps_total']} steps, "
          f"{time.perf_counter() - start:.0f} s")
    return result["episode_reward_mean"], result["timesteps_total"]


@pytest.mark.slow  # the default tier keeps one learning check per family (PPO, PG, A2C, IMPALA); ~10 min budget
def test_appo_learns_cartpole_within_200k_steps() -> None:
    mean_return, _ = _learn_cartpole(200_000)
    assert mean_return >= 150


@pytest.mark.parametrize("free_log_std", [True, False])
def test_plan_trains_gaussian_actions_on_pendulum(free_log_std: bool) -> None:
    """V-trace over Box actions: the log-probabilities of the behaviour and target Gaussians."""
    config = pendulum_config(APPOConfig, free_log_std, timesteps_per_iteration=0)
    assert_plan_trains_gaussian_actions("appo", config, iterations=3)
