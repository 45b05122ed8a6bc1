"""MAML: the task env, the worker's tasks, the inner step, the meta-loss, the plan's barrier/transform shape, its
results, checkpoints, build-time errors, and (slow tier) the adaptation gate against PPO on the task mixture."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.algorithms.maml import MAMLConfig, MAMLPolicy, evaluate_adaptation, plan
from flowrl.algorithms.ppo import PPOConfig
from flowrl.envs import POINT_GOAL, PointGoal, VectorEnv
from flowrl.ops.meta import ADAPTATION_ROUND, TASK_INDEX, standardized_advantages
from flowrl.sample_batch import ACTIONS, ADVANTAGES, OBS, SampleBatch
from flowrl.testing import plan_lines
from flowrl.trainer import Trainer
from flowrl.workers import RolloutWorker

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

SMALL = {"num_envs_per_worker": 2, "rollout_fragment_length": 100, "seed": 0}


def test_point_goal_rewards_minus_the_distance_to_its_hidden_goal_and_draws_tasks_from_its_seed() -> None:
    env = gym.make(POINT_GOAL)
    env.unwrapped.set_task(np.array([0.2, -0.1]))  # type: ignore[attr-defined]
    obs, _ = env.reset(seed=3)
    assert obs.tolist() == [0.0, 0.0]
    _, reward, terminated, truncated, _ = env.step(np.array([0.5, 0.0], np.float32))  # clipped to 0.1
    assert reward == pytest.approx(-np.hypot(0.1, 0.1)) and not terminated and not truncated
    lengths = sum(1 for _ in iter(lambda: env.step(np.zeros(2, np.float32))[3], True))
    assert lengths == 98  # 100 steps, then truncated
    a, b = PointGoal(), PointGoal()
    a.reset(seed=5), b.reset(seed=5)
    assert np.array_equal(np.stack(a.sample_tasks(4)), np.stack(b.sample_tasks(4)))
    with pytest.raises(ValueError, match="a task is a goal"):
        a.set_task([1.0, 2.0, 3.0])


def test_a_worker_set_to_a_task_restarts_every_env_on_it() -> None:
    worker = RolloutWorker(policy_class=MAMLPolicy, config=MAMLConfig(**SMALL))
    worker.sample()
    worker.set_task(np.array([0.4, 0.4]))
    assert [goal.tolist() for goal in worker.env.call("get_task")] == [[0.4, 0.4], [0.4, 0.4]]  # type: ignore[union-attr]
    batch = worker.sample()
    assert batch.count == 200 and np.all(batch["t"][[0, 100]] == 0)  # two whole new episodes, from step 0
    assert len(worker.sample_tasks(3)) == 3


def test_the_inner_step_is_one_plain_gradient_step_of_the_policy_gradient_loss() -> None:
    policy = MAMLPolicy(gym.spaces.Box(-np.inf, np.inf, (2,)), gym.spaces.Box(-0.1, 0.1, (2,)), MAMLConfig(seed=0))
    rng = np.random.default_rng(0)
    batch = SampleBatch({OBS: rng.normal(size=(8, 2)).astype(np.float32),
                         ACTIONS: rng.normal(size=(8, 2)).astype(np.float32),
                         ADVANTAGES: rng.normal(size=8).astype(np.float32)})
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    t = policy.to_tensors(batch)
    loss = -(policy.action_distribution(policy.model(t[OBS])[0]).logp(t[ACTIONS]) * t[ADVANTAGES]).mean()
    grads = dict(zip(before, torch.autograd.grad(loss, list(policy.model.parameters()), allow_unused=True)))
    policy.learn_on_batch(batch)
    for name, p in policy.model.named_parameters():
        expected = before[name] if grads[name] is None else before[name] - 0.1 * grads[name]
        torch.testing.assert_close(p.detach(), expected)


def test_a_nan_inner_step_is_skipped_and_counted() -> None:
    policy = MAMLPolicy(gym.spaces.Box(-np.inf, np.inf, (2,)), gym.spaces.Box(-0.1, 0.1, (2,)), MAMLConfig(seed=0))
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    batch = SampleBatch({OBS: np.zeros((4, 2), np.float32), ACTIONS: np.zeros((4, 2), np.float32),
                         ADVANTAGES: np.array([1.0, np.nan, 0.0, 2.0], np.float32)})
    policy.learn_on_batch(batch)
    assert policy.num_nonfinite_updates_skipped == 1 and policy.weights_version == 0
    for name, p in policy.model.named_parameters():
        torch.testing.assert_close(p.detach(), before[name])


def test_the_meta_loss_differentiates_through_the_inner_step() -> None:
    config = MAMLConfig(**SMALL, num_workers=1)
    workers = [RolloutWorker(policy_class=MAMLPolicy, config=config) for _ in range(2)]  # same seed: same weights
    pieces = []
    for task, w in enumerate(workers):
        w.set_task(np.array([0.3 * task, -0.2]))
        for r in range(2):
            b = standardized_advantages(w.sample())
            if r == 0:
                w.learn_on_batch(b)  # the worker adapts before it samples round 1
            b[TASK_INDEX], b[ADAPTATION_ROUND] = np.full(b.count, task), np.full(b.count, r)
            pieces.append(b)
    meta = SampleBatch.concat(pieces)
    policy = RolloutWorker(policy_class=MAMLPolicy, config=config).get_policy()  # the weights that sampled round 0
    total, stats = policy.loss(policy.to_tensors(meta))
    # re-adapting differentiably from those weights on round 0 gives the policy that sampled round 1: KL ~ 0
    assert stats["inner_kl_0"] == pytest.approx(0.0, abs=1e-5)
    total.backward()
    first = next(policy.model.parameters())
    assert first.grad is not None and torch.isfinite(first.grad).all() and first.grad.abs().sum() > 0
    info = policy.learn_on_batch(meta)["learner_stats"]
    assert {"policy_loss", "vf_loss", "inner_kl_0", "loss"} <= set(info) and policy.weights_version == 1


def test_the_plan_is_a_barrier_a_transform_and_a_meta_update_and_fits_40_lines() -> None:
    trainer = Trainer("maml", MAMLConfig(num_workers=2, **SMALL))
    try:
        assert repr(trainer.plan) == ("LocalIterator[ParallelIterator[from_actors[shards=2]].batch_across_shards()"
                                      ".transform(InnerAdaptation(1 steps)).for_each(MetaUpdate(5 steps))]")
        first, second = trainer.train(), trainer.train()
        assert second["timesteps_total"] == 2 * first["timesteps_total"] == 2 * 2 * 2 * 200  # 2 rounds x 2 workers
        assert {"episode_reward_mean_adapt_0", "episode_reward_mean_adapt_1", "adaptation_delta"} <= set(second)
        assert second["adaptation_delta"] == pytest.approx(second["episode_reward_mean_adapt_1"]
                                                           - second["episode_reward_mean_adapt_0"])
        stats = second["info"]["learner"]["default_policy"]["learner_stats"]
        assert "inner_kl_0" in stats and second["info"]["num_steps_trained"] == second["timesteps_total"]
    finally:
        trainer.stop()
    assert plan_lines(plan) <= 40


def test_each_worker_plays_its_own_task_and_tasks_change_every_meta_iteration() -> None:
    trainer = Trainer("maml", MAMLConfig(num_workers=2, **SMALL))
    try:
        from flowrl import executor

        def goals() -> list[list[float]]:
            return [executor.get(w.apply.remote(lambda wk: wk.env.call("get_task")[0].tolist()))
                    for w in trainer.workers.remote_workers()]

        trainer.train()
        first = goals()
        trainer.train()
        second = goals()
        assert first[0] != first[1] and first != second
    finally:
        trainer.stop()


def test_a_checkpoint_keeps_the_meta_weights_and_the_kl_coefficients(tmp_path: Path) -> None:
    trainer = Trainer("maml", MAMLConfig(num_workers=1, **SMALL))
    try:
        trainer.train()
        policy = trainer.get_policy()
        policy.kl_coeffs = [0.123]  # type: ignore[attr-defined]
        path = trainer.save(tmp_path)
        weights = policy.get_weights()
    finally:
        trainer.stop()
    restored = Trainer.from_checkpoint(path)
    try:
        assert restored.get_policy().kl_coeffs == [0.123]  # type: ignore[attr-defined]
        for name, value in restored.get_policy().get_weights().items():
            np.testing.assert_array_equal(value, weights[name])
        assert restored.train()["training_iteration"] == 2
    finally:
        restored.stop()


def test_bad_configs_and_an_env_without_tasks_are_refused_at_build_time() -> None:
    with pytest.raises(ValueError, match="batch_mode='truncate_episodes': MAML adapts on whole episodes"):
        MAMLConfig(batch_mode="truncate_episodes")
    with pytest.raises(ValueError, match="num_workers=0 must be an int >= 1"):
        MAMLConfig(num_workers=0)
    with pytest.raises(ValueError, match="env 'CartPole-v1' is not a task distribution: MAML needs envs with "
                                         "sample_tasks"):
        Trainer("maml", MAMLConfig(env="CartPole-v1", num_workers=1, **SMALL))


def test_vector_env_call_names_a_missing_method_and_refuses_native_backends() -> None:
    with pytest.raises(ValueError, match="env 0 .* has no method 'set_task'"):
        VectorEnv("CartPole-v1", 2, seed=0, backend="loop").call("set_task", 1)
    with pytest.raises(ValueError, match="does not run gymnasium envs"):
        VectorEnv("CartPole-v1", 8, seed=0, backend="gymnasium").call("set_task", 1)


# -- the gate (slow tier) -------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("seed", (101, 202, 303))
def test_maml_adapts_and_beats_ppo_on_the_task_mixture_after_one_inner_step(seed: int) -> None:
    rng = np.random.default_rng(12345)
    tasks = [rng.uniform(-0.5, 0.5, 2) for _ in range(20)]
    # 8 tasks per meta-update (8 light workers on the test's CPUs); the 2-worker default adapts too, more noisily
    config = MAMLConfig(seed=seed, num_workers=8, num_envs_per_worker=5, num_cpus_per_worker=0.25)
    trainer = Trainer("maml", config)
    try:
        deltas = [trainer.train()["adaptation_delta"] for _ in range(100)]
        steps = trainer.train()["timesteps_total"]
        maml_pre, maml_post = evaluate_adaptation(trainer.get_policy().get_weights(), config, tasks)
    finally:
        trainer.stop()
    ppo = Trainer("ppo", PPOConfig(env=POINT_GOAL, env_config={"resample_on_reset": True}, seed=seed, num_workers=2,
                                   num_envs_per_worker=10, rollout_fragment_length=200, train_batch_size=4000,
                                   sgd_minibatch_size=500, num_sgd_iter=10))
    try:
        while ppo.train()["timesteps_total"] < steps:
            pass
        ppo_pre, ppo_post = evaluate_adaptation(ppo.get_policy().get_weights(), config, tasks)
    finally:
        ppo.stop()
    early, late = float(np.mean(deltas[:10])), float(np.mean(deltas[-10:]))
    print(f"maml seed {seed}: adaptation_delta {early:.2f} (meta-iterations 1-10) -> {late:.2f} (91-100); on 20 tasks "
          f"{np.mean(maml_pre):.2f} -> {np.mean(maml_post):.2f}; PPO on the mixture ({steps} steps) "
          f"{np.mean(ppo_pre):.2f} -> {np.mean(ppo_post):.2f}")
    assert late > early + 1.5  # measured on seeds 0-1 (8 tasks): 5.5 -> 9.5; PPO's own delta: about 1
    assert np.mean(maml_post) > np.mean(maml_pre) + 4.0  # measured: +10.6
    assert np.mean(maml_post) > np.mean(ppo_post) + 3.0  # measured: -30.2 against -38.2
