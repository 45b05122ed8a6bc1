"""Observation filters: the running statistics' parallel merge, the worker-side normalization, the sync across
remote workers with the weights, checkpoints, evaluation and inference applying the trained filter."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from flowrl import executor
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from flowrl.algorithms.ppo import PPOConfig
from flowrl.envs import VectorEnv
from flowrl.evaluation import evaluate_checkpoint, evaluate_policy
from flowrl.filters import CLIP, MeanStdFilter, RunningStat, make_filter
from flowrl.inference import load
from flowrl.sample_batch import ACTIONS, ENV_ID, NEXT_OBS, OBS, TERMINATEDS, TRUNCATEDS, SampleBatch
from flowrl.testing import TinyPGPolicy
from flowrl.trainer import Trainer
from flowrl.workers import OBS_FILTER_KEY, RolloutConfig, RolloutWorker, WorkerSet

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

CFG = RolloutConfig(env="CartPole-v1", num_envs_per_worker=3, rollout_fragment_length=40, seed=11,
                    num_cpus_per_worker=0.5, observation_filter="MeanStdFilter")


class ByteObs(gym.Env[np.ndarray, int]):
    """Observes bytes: no observation filter for it."""

    observation_space = gym.spaces.Box(0, 255, (4,), np.uint8)
    action_space = gym.spaces.Discrete(2)

    @staticmethod
    def make(ctx: Any) -> ByteObs:
        return ByteObs()


def worker(**overrides: Any) -> RolloutWorker:
    return RolloutWorker(policy_class=TinyPGPolicy, config=dataclasses.replace(CFG, **overrides))


def per_env(batch: SampleBatch, key: str, env: int) -> np.ndarray:
    return batch[key][batch[ENV_ID] == env]  # one env's rows, in time order


def replay_raw(config: RolloutConfig, batch: SampleBatch) -> tuple[list[np.ndarray], list[np.ndarray], list[Any]]:
    """The env's raw observations for the batch's actions: per env, obs and next obs, and the reset/final order in
    which a worker sees them (the reset obs first, then each step's final obs and, after an episode end, the reset)."""
    n = config.num_envs_per_worker
    env = VectorEnv(config.env, n, seed=config.seed, worker_index=0, config=config.env_config,
                    backend=config.vector_backend)
    obs, raw_obs, raw_next, seen = env.reset(), [], [], []
    seen.append(obs.copy())
    for t in range(config.rollout_fragment_length):
        actions = np.stack([per_env(batch, ACTIONS, i)[t] for i in range(n)])
        step = env.step(actions)
        raw_obs.append(obs.copy())
        raw_next.append(step.final_obs.copy())
        seen.append(step.final_obs.copy())
        done = step.terminateds | step.truncateds
        if done.any():
            seen.append(step.obs[done].copy())
        obs = step.obs
    env.close()
    return raw_obs, raw_next, seen


# -- the running statistics ---------------------------------------------------------------------------

rows = arrays(np.float64, st.tuples(st.integers(0, 30), st.just(3)),
              elements=st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False))


@settings(max_examples=60, deadline=None)
@given(parts=st.lists(rows, min_size=1, max_size=4))
def test_merged_statistics_equal_those_of_the_concatenation(parts: list[np.ndarray]) -> None:
    stats = []
    for part in parts:
        stat = RunningStat((3,))
        stat.push(part)
        stats.append(stat)
    merged = stats[0].copy()
    for stat in stats[1:]:
        merged.merge(stat)
    whole = np.concatenate(parts)
    assert merged.count == len(whole)
    if len(whole):
        np.testing.assert_allclose(merged.mean, whole.mean(axis=0), rtol=1e-9, atol=1e-9)
    if len(whole) > 1:
        np.testing.assert_allclose(merged.var, whole.var(axis=0, ddof=1), rtol=1e-7, atol=1e-7)


def test_filter_normalizes_clips_and_freezes() -> None:
    f = MeanStdFilter((2,))
    data = np.array([[0.0, 0.0], [0.0, 2.0], [0.0, 4.0]])
    f(data)
    np.testing.assert_allclose(f.running.mean, [0.0, 2.0])
    out = f(np.array([[1e6, 2.0]]), update=False)
    assert out.dtype == np.float32 and out[0, 0] == CLIP and out[0, 1] == 0.0  # clipped; the mean maps to 0
    assert f.running.count == 3  # frozen: not pushed
    with pytest.raises(ValueError, match=re.escape("fit observations of shape (2,)")):
        RunningStat.from_array((2,), np.zeros(4))


def test_bad_observation_filter_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=re.escape("observation_filter='MeanStd'; use one of ['NoFilter', "
                                                   "'MeanStdFilter']")):
        RolloutConfig(observation_filter="MeanStd")  # type: ignore[arg-type]  # the point of the test
    with pytest.raises(ValueError, match="observation_filter='Mean'"):
        make_filter("Mean", (2,))
    with pytest.raises(ValueError, match="normalizes float Box observations"):
        RolloutWorker(policy_class=TinyPGPolicy, config=RolloutConfig(env=ByteObs.make, observation_filter="MeanStdFilter"))


# -- the worker -----------------------------------------------------------------------------------------

def test_no_filter_batches_hold_the_raw_observations_bit_for_bit() -> None:
    w = worker(observation_filter="NoFilter")
    batch = w.sample()
    raw_obs, raw_next, _ = replay_raw(w.config, batch)
    for i in range(w.config.num_envs_per_worker):
        assert np.array_equal(per_env(batch, OBS, i), np.stack([o[i] for o in raw_obs]))
        assert np.array_equal(per_env(batch, NEXT_OBS, i), np.stack([o[i] for o in raw_next]))
    assert w.obs_filter is None and OBS_FILTER_KEY not in w.get_weights()["default_policy"]
    assert "obs_filter" not in w.get_state()


def test_mean_std_filter_normalizes_every_observation_once_in_the_order_seen() -> None:
    w = worker()
    batch = w.sample()
    raw_obs, raw_next, seen = replay_raw(w.config, batch)
    expected = MeanStdFilter((4,))
    expected(seen[0])  # the first reset
    want_obs = [expected(seen[0], update=False)]
    want_next = []
    k = 1
    for t in range(w.config.rollout_fragment_length):
        final = expected(seen[k])
        k += 1
        want_next.append(final)
        new = final.copy()
        done = np.flatnonzero([bool(per_env(batch, TERMINATEDS, i)[t] or per_env(batch, TRUNCATEDS, i)[t])
                               for i in range(3)])
        if len(done):
            new[done] = expected(seen[k])
            k += 1
        want_obs.append(new)
    for i in range(3):
        np.testing.assert_array_equal(per_env(batch, OBS, i), np.stack([o[i] for o in want_obs[:-1]]))
        np.testing.assert_array_equal(per_env(batch, NEXT_OBS, i), np.stack([o[i] for o in want_next]))
    assert w.obs_filter is not None and w.obs_filter.running.count == sum(len(s) for s in seen)
    np.testing.assert_allclose(w.obs_filter.running.mean, np.concatenate(seen).astype(np.float64).mean(axis=0))
    assert not np.array_equal(batch[OBS], np.concatenate(raw_obs))


def test_checkpoint_state_round_trips_the_filter() -> None:
    a = worker()
    a.sample()
    b = worker(seed=99)
    b.set_state(a.get_state())
    assert a.obs_filter is not None and b.obs_filter is not None
    np.testing.assert_array_equal(a.obs_filter.running.to_array(), b.obs_filter.running.to_array())
    np.testing.assert_array_equal(a.obs_filter.buffer.to_array(), b.obs_filter.buffer.to_array())
    first, again = a.sample(), b.sample()
    for key in first:
        np.testing.assert_array_equal(first[key], again[key], err_msg=key)
    state = a.get_state()
    del state["obs_filter"]
    with pytest.raises(ValueError, match="the state has no 'obs_filter'"):
        b.set_state(state)


def test_sync_makes_every_worker_hold_the_merged_statistics() -> None:
    workers = WorkerSet(policy_class=TinyPGPolicy, config=dataclasses.replace(CFG, num_workers=2))
    try:
        remotes = workers.remote_workers()
        batches = executor.get([w.sample.remote() for w in remotes])
        workers.sync_weights()  # merges what arrived, sends it and asks each worker for its new statistics
        executor.get([w.ping.remote() for w in remotes])  # ... which they have answered now
        workers.sync_weights()
        executor.get([w.ping.remote() for w in remotes])
        stats = workers.foreach_worker(lambda w: w.obs_filter.running.to_array())
        n = CFG.num_envs_per_worker
        dones = [int((b[TERMINATEDS] | b[TRUNCATEDS]).sum()) for b in batches]
        # every worker's first reset, and each remote worker's steps and resets
        assert stats[0][0] == 3 * n + sum(n * CFG.rollout_fragment_length + d for d in dones)
        for other in stats[1:]:
            np.testing.assert_allclose(other, stats[0], rtol=1e-12)
        local = workers.local_worker()
        assert isinstance(local, RolloutWorker) and local.obs_filter is not None
        assert local.obs_filter.buffer.count == n  # its own first reset: it never sampled
    finally:
        workers.stop()


# -- evaluation and inference ---------------------------------------------------------------------------

def test_inference_and_evaluation_apply_the_trained_filter(tmp_path: Any) -> None:
    config = PPOConfig(env="Pendulum-v1", seed=0, num_workers=0, num_envs_per_worker=2, rollout_fragment_length=50,
                       train_batch_size=100, sgd_minibatch_size=50, num_sgd_iter=1, observation_filter="MeanStdFilter")
    trainer = Trainer("ppo", config)
    try:
        trainer.train()
        path = trainer.save(str(tmp_path / "checkpoints"))
        local = trainer.workers.local_worker()
        assert isinstance(local, RolloutWorker) and local.obs_filter is not None
        trained = local.obs_filter.running.to_array()
    finally:
        trainer.stop()
    policy = load(path)
    assert policy.obs_filter is not None
    np.testing.assert_array_equal(policy.obs_filter.running.to_array(), trained)
    obs = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 8.0]], np.float32)
    normalized = policy.obs_filter(obs, update=False)
    expected = policy.policy.env_actions(policy.policy.compute_actions(normalized, explore=False)[0])
    np.testing.assert_array_equal(policy.compute_actions(obs), expected)
    assert not np.array_equal(policy.compute_actions(obs),
                              policy.policy.env_actions(policy.policy.compute_actions(obs, explore=False)[0]))
    np.testing.assert_array_equal(policy.obs_filter.running.to_array(), trained)  # frozen
    result = evaluate_checkpoint(path, episodes=2, seed=3)
    env = VectorEnv("Pendulum-v1", 2, seed=3)
    by_hand = evaluate_policy(policy.policy, env, episodes=2, obs_filter=policy.obs_filter)
    assert result.returns == by_hand.returns
    np.testing.assert_array_equal(policy.obs_filter.running.to_array(), trained)
