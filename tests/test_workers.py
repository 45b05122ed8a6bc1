"""RolloutWorker and WorkerSet on CartPole: fragments, determinism, weights, health and recreation."""

from __future__ import annotations

import dataclasses
import os
import signal
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray

from flowrl.iter import from_actors
from flowrl.sample_batch import (ACTIONS, AGENT_INDEX, ENV_ID, EPS_ID, LOGP, NEXT_OBS, OBS, RETURNS, REWARDS, T, TERMINATEDS, TRUNCATEDS,
                                 VF_PREDS, MultiAgentBatch, SampleBatch)
from flowrl.testing import TinyPGPolicy
from flowrl.workers import PolicySpec, RolloutConfig, RolloutWorker, WorkerSet

CFG = RolloutConfig(env="CartPole-v1", num_envs_per_worker=3, rollout_fragment_length=40, seed=11,
                    num_cpus_per_worker=0.5)


def worker(**overrides: Any) -> RolloutWorker:
    return RolloutWorker(policy_class=TinyPGPolicy, config=dataclasses.replace(CFG, **overrides))


def assert_same(a: SampleBatch, b: SampleBatch) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_truncated_fragments_have_exactly_fragment_times_envs_steps_per_trajectory() -> None:
    w = worker()
    batch = w.sample()
    assert batch.count == 120
    assert {OBS, ACTIONS, NEXT_OBS, TERMINATEDS, TRUNCATEDS, EPS_ID, ENV_ID, T, LOGP, VF_PREDS, RETURNS} <= set(batch)
    for piece in batch.split_by_episode():  # each episode piece is one env's consecutive steps
        assert len(set(piece[ENV_ID].tolist())) == 1
        assert np.array_equal(piece[T], piece[T][0] + np.arange(piece.count))
        assert not (piece[TERMINATEDS] | piece[TRUNCATEDS])[:-1].any()
        np.testing.assert_array_equal(piece[OBS][1:], piece[NEXT_OBS][:-1])  # no bogus autoreset transition
    episodes = w.get_metrics()
    assert sum(batch[TERMINATEDS] | batch[TRUNCATEDS]) == len(episodes) > 0
    assert w.get_metrics() == []
    assert w.sample().count == 120  # fragments continue where the last one stopped


def test_complete_episodes_end_on_boundaries() -> None:
    batch = worker(batch_mode="complete_episodes", rollout_fragment_length=10).sample()
    assert batch.count >= 30
    for piece in batch.split_by_episode():
        assert (piece[TERMINATEDS] | piece[TRUNCATEDS])[-1]
        assert piece[T][0] == 0


def test_a_seeded_worker_produces_the_same_batch_twice() -> None:
    assert_same(worker().sample(), worker().sample())
    other = worker(seed=12).sample()
    assert not np.array_equal(other[OBS], worker().sample()[OBS])


def test_seeded_remote_workers_agree_with_each_other_and_with_the_local_one() -> None:
    actor_cls = ray.remote(RolloutWorker).options(num_cpus=0)
    a, b = (actor_cls.remote(policy_class=TinyPGPolicy, config=CFG, worker_index=1) for _ in range(2))
    batch_a, batch_b = ray.get([a.sample.remote(), b.sample.remote()])
    assert_same(batch_a, batch_b)
    assert_same(batch_a, RolloutWorker(policy_class=TinyPGPolicy, config=CFG, worker_index=1).sample())
    for x in (a, b):
        ray.kill(x)


def test_worker_set_syncs_weights_with_one_put_and_recreates_a_killed_worker() -> None:
    workers = WorkerSet(policy_class=TinyPGPolicy, config=dataclasses.replace(CFG, num_workers=2))
    try:
        local = workers.local_worker()
        local.learn_on_batch(local.sample())
        workers.sync_weights(global_vars={"timestep": 123})
        weights = local.get_weights()
        for remote in ray.get([w.get_weights.remote() for w in workers.remote_workers()]):
            for key, value in weights["default_policy"].items():
                np.testing.assert_array_equal(remote["default_policy"][key], value)
        timesteps = workers.foreach_worker(lambda w: w.get_policy().global_timestep)
        assert timesteps == [123, 123, 123]
        assert [b.count for b in from_actors(workers.remote_workers()).gather_sync().take(2)] == [120, 120]

        pid = ray.get(workers.remote_workers()[1].apply.remote(lambda w: os.getpid()))
        os.kill(pid, signal.SIGKILL)
        assert workers.check_health(timeout_s=20) == [1]
        local.learn_on_batch(local.sample())  # the replacement must get these newer weights
        workers.recreate_workers([1])
        assert workers.check_health() == []
        fresh = ray.get(workers.remote_workers()[1].get_weights.remote())
        for key, value in local.get_weights()["default_policy"].items():
            np.testing.assert_array_equal(fresh["default_policy"][key], value)
        assert ray.get(workers.remote_workers()[1].apply.remote(lambda w: w.worker_index)) == 2
    finally:
        workers.stop()


def test_worker_state_round_trips_policy_and_env_rngs() -> None:
    a = worker()
    a.learn_on_batch(a.sample())
    b = worker(seed=99)
    b.set_state(a.get_state())
    obs = np.zeros((5, 4), np.float32)
    assert np.array_equal(a.get_policy().compute_actions(obs)[0], b.get_policy().compute_actions(obs)[0])
    assert a.env.get_state() == b.env.get_state()
    b.env.reset()  # env RNGs continue identically after the restore
    a.env.reset()
    assert a.env.get_state() == b.env.get_state()


@pytest.mark.parametrize("batch_mode", ["truncate_episodes", "complete_episodes"])
def test_a_restored_worker_samples_on_exactly_as_the_original(batch_mode: str) -> None:
    a = worker(batch_mode=batch_mode, rollout_fragment_length=30)
    a.sample()  # mid-episode, with complete_episodes carry-over pending
    b = worker(batch_mode=batch_mode, rollout_fragment_length=30, seed=99)
    b.set_state(a.get_state())
    for _ in range(2):
        assert_same(a.sample(), b.sample())


def test_bad_rollout_settings_are_named() -> None:
    with pytest.raises(ValueError, match="rollout_fragment_length=0"):
        RolloutConfig(rollout_fragment_length=0)
    with pytest.raises(ValueError, match="num_workers=-1"):
        RolloutConfig(num_workers=-1)
    with pytest.raises(ValueError, match="CartPol-v1"):
        worker(env="CartPol-v1")
    with pytest.raises(ValueError, match="num_workers=50"):
        WorkerSet(policy_class=TinyPGPolicy, config=dataclasses.replace(CFG, num_workers=50, num_cpus_per_worker=1))


class DictObsEnv(gym.Env[Any, int]):
    observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (2,))})
    action_space = gym.spaces.Discrete(2)


def test_an_observation_space_the_model_cannot_handle_is_named() -> None:
    with pytest.raises(ValueError, match="Dict"):
        worker(env=lambda ctx: DictObsEnv())


def multi_agent_config(**overrides: Any) -> RolloutConfig:
    from flowrl.envs import MultiAgentCartPole

    base = dict(env=MultiAgentCartPole.from_context, env_config={"num_agents": 4}, num_envs_per_worker=2,
                rollout_fragment_length=30, seed=5,
                policies={"ppo_policy": PolicySpec(), "dqn_policy": PolicySpec()},
                policy_mapping_fn=lambda aid: "ppo_policy" if int(aid[-1]) % 2 == 0 else "dqn_policy")
    return RolloutConfig(**{**base, **overrides})  # type: ignore[arg-type]


def test_multi_agent_worker_samples_one_batch_per_policy() -> None:
    w = RolloutWorker(policy_class=TinyPGPolicy, config=multi_agent_config())
    batch = w.sample()
    assert isinstance(batch, MultiAgentBatch)
    assert batch.count == 60 and set(batch.policy_batches) == {"ppo_policy", "dqn_policy"}
    for pid, agents in (("ppo_policy", {0, 2}), ("dqn_policy", {1, 3})):
        assert set(batch.policy_batches[pid][AGENT_INDEX].tolist()) == agents
        assert RETURNS in batch.policy_batches[pid]
    assert batch.agent_steps() <= 4 * 60
    assert set(w.learn_on_batch(batch)) == {"ppo_policy", "dqn_policy"}
    again = RolloutWorker(policy_class=TinyPGPolicy, config=multi_agent_config()).sample()
    assert_same(again.policy_batches["ppo_policy"], batch.policy_batches["ppo_policy"])


def test_multi_agent_policy_returns_are_the_mean_return_of_each_policys_agents() -> None:
    """As RLlib's policy_reward_mean: an average over agents, so it is comparable to a single-agent return."""
    w = RolloutWorker(policy_class=TinyPGPolicy,
                      config=multi_agent_config(env_config={"num_agents": 4, "max_episode_steps": 12}))
    w.sample()
    episodes = w.get_metrics()
    assert episodes
    for ep in episodes:
        assert sorted(ep.agent_returns) == [f"agent_{i}" for i in range(4)]
        for pid, agents in (("ppo_policy", ("agent_0", "agent_2")), ("dqn_policy", ("agent_1", "agent_3"))):
            assert ep.policy_returns[pid] == pytest.approx(sum(ep.agent_returns[a] for a in agents) / 2)
        assert ep.episode_return == pytest.approx(sum(ep.agent_returns.values()))


def test_multi_agent_mapping_to_unknown_policies_is_named() -> None:
    with pytest.raises(ValueError, match="not among the known policy ids"):
        multi_agent_config(policy_mapping_fn={"agent_0": "nope"})
    with pytest.raises(ValueError, match="'other'"):
        RolloutWorker(policy_class=TinyPGPolicy,
                      config=multi_agent_config(policy_mapping_fn=lambda aid: "other"))
    with pytest.raises(ValueError, match="policies_to_train"):
        multi_agent_config(policies_to_train=("ghost",))


class PerEpisodePG(TinyPGPolicy):
    """TinyPG whose hook must see one episode per call (the default for a hook that does not declare
    ``postprocess_spans_episodes``); it records what it was given."""

    postprocess_spans_episodes = False
    seen: list[int] = []

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        ends = batch[TERMINATEDS] | batch[TRUNCATEDS]
        assert len(set(batch[EPS_ID].tolist())) == 1 and not ends[:-1].any()
        PerEpisodePG.seen.append(batch.count)
        return super().postprocess_trajectory(batch)


@pytest.mark.parametrize("batch_mode", ["truncate_episodes", "complete_episodes"])
def test_postprocessing_whole_env_trajectories_equals_postprocessing_each_episode(batch_mode: str) -> None:
    cfg = dataclasses.replace(CFG, batch_mode=batch_mode)
    PerEpisodePG.seen.clear()
    per_episode = RolloutWorker(policy_class=PerEpisodePG, config=cfg)
    spanning = RolloutWorker(policy_class=TinyPGPolicy, config=cfg)
    for _ in range(3):
        a, b = per_episode.sample(), spanning.sample()
        assert_same(a, b)
        assert len(PerEpisodePG.seen) == len(a.split_by_episode())  # one call per episode piece
        PerEpisodePG.seen.clear()


def test_the_ppo_hook_spans_episodes_with_the_same_advantages() -> None:
    from flowrl.algorithms.ppo import PPOConfig, PPOPolicy

    class PerEpisodePPO(PPOPolicy):
        postprocess_spans_episodes = False

    cfg = PPOConfig(num_envs_per_worker=3, rollout_fragment_length=60, seed=5)
    a = RolloutWorker(policy_class=PerEpisodePPO, config=cfg).sample()
    b = RolloutWorker(policy_class=PPOPolicy, config=cfg).sample()
    assert a.keys() == b.keys() and len(a.split_by_episode()) > 3  # several episodes per env trajectory
    for key in a:  # V(new_obs) runs batched over an env's cut rows instead of per piece: float rounding only
        np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-5, err_msg=key)


def test_fragment_logp_computed_after_the_steps_equals_the_policy_distribution() -> None:
    import torch

    for env, policy_class in (("CartPole-v1", TinyPGPolicy), ("Pendulum-v1", TinyPGPolicy)):
        w = worker(env=env)
        policy = w.get_policy()
        assert policy.numpy_acting is not None  # the deferred-logp path is the one under test
        batch = w.sample()
        dist = policy.dist_class(torch.as_tensor(batch["action_dist_inputs"]))
        ref = dist.logp(torch.as_tensor(batch[ACTIONS])).numpy()
        assert batch[LOGP].dtype == np.float32 and batch[LOGP].shape == (batch.count,)
        np.testing.assert_allclose(batch[LOGP], ref, rtol=1e-5, atol=1e-5)



@pytest.mark.parametrize("flush, before", [(True, False), (True, True), (False, False)])
def test_learning_flushes_denormals_and_leaves_the_thread_as_it_was(flush: bool, before: bool) -> None:
    """With flush_denormal, a worker learns with denormals flushed to zero, and the thread's mode is as it was
    after (a process whose own code flushes keeps flushing); run in a fresh thread, as the mode is a thread's."""
    import threading

    import torch

    from flowrl.policy import denormals_flushed_now

    seen: dict[str, bool] = {}

    def run() -> None:
        torch.set_flush_denormal(before)
        w = worker(flush_denormal=flush)
        policy = w.get_policy()
        learn = policy.learn_on_batch
        policy.learn_on_batch = lambda b: (seen.__setitem__("learning", denormals_flushed_now()),  # type: ignore
                                           learn(b))[1]
        w.learn_on_batch(w.sample())
        seen["after"] = denormals_flushed_now()
        torch.set_flush_denormal(False)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == {"learning": flush or before, "after": before}


def _tripled_cartpole(ctx: Any) -> gym.Env[Any, Any]:
    """CartPole paying 3 a step: its clipped rewards differ from its own."""
    return gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda r: 3.0 * r)


def test_clip_rewards_clips_the_batch_and_the_episode_statistics_keep_the_env_rewards() -> None:
    config = RolloutConfig(env=_tripled_cartpole, seed=0, num_envs_per_worker=2, rollout_fragment_length=100)
    clipped = RolloutWorker(policy_class=TinyPGPolicy, config=dataclasses.replace(config, clip_rewards=1.0))
    plain = RolloutWorker(policy_class=TinyPGPolicy, config=config)
    a, b = clipped.sample(), plain.sample()
    assert np.all(a[REWARDS] == 1.0) and np.all(b[REWARDS] == 3.0)
    assert np.array_equal(a[ACTIONS], b[ACTIONS])  # the same run otherwise
    episodes = clipped.get_metrics()
    assert episodes and all(ep.episode_return == 3.0 * ep.episode_length for ep in episodes)  # the game's score
    with pytest.raises(ValueError, match="clip_rewards=0"):
        RolloutConfig(clip_rewards=0.0)


def test_clip_rewards_clips_each_agents_rewards_too() -> None:
    worker = RolloutWorker(policy_class=TinyPGPolicy, config=multi_agent_config(clip_rewards=0.3))
    batch = worker.sample()
    assert all(np.allclose(b[REWARDS], 0.3) for b in batch.policy_batches.values())
    returns = [r for ep in worker.get_metrics() for r in ep.agent_returns.values()]
    assert returns and all(r == int(r) > 0 for r in returns), returns  # 1 a step, unclipped (0.3 a step would show)
