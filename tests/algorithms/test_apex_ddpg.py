"""Ape-X DDPG: the config (Ape-X's settings over DDPG's), per-worker noise scales, worker-side priorities, Ape-X's
plan over DDPG's policy with zero and two workers, the trainer, and the seeded Pendulum gate (slow)."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from flowrl import executor

from flowrl.algorithms import apex, get_algorithm
from flowrl.algorithms.apex import ApexSettings, ExploresPerWorker, make_replay_shards, per_worker_epsilon
from flowrl.algorithms.apex_ddpg import ALGORITHM, ApexDDPGConfig, ApexDDPGPolicy, make_owned_state, plan
from flowrl.algorithms.ddpg import DDPGConfig
from flowrl.algorithms.off_policy import NSTEP_DISCOUNTS
from flowrl.config import available_cpus
from flowrl.sample_batch import ACTIONS, NEXT_OBS, OBS, PRIORITIES, REWARDS, TERMINATEDS, TRUNCATEDS, SampleBatch
from flowrl.trainer import Trainer
from flowrl.workers import WorkerSet

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

# a small plan setting: one shard, tiny networks, reports every 100 sampled steps
SMALL = ApexDDPGConfig(seed=0, num_workers=0, num_replay_buffer_shards=1, learning_starts=100, buffer_size=2000,
                       train_batch_size=32, rollout_fragment_length=10, random_timesteps=50,
                       timesteps_per_iteration=100, min_iter_time_s=0, actor_hiddens=(8,), critic_hiddens=(8,))
OBS_SPACE, ACTION_SPACE = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-2, 2, (1,), np.float32)


def _noise_scale(worker: Any) -> float:
    policy = worker.get_policy()
    assert isinstance(policy, ApexDDPGPolicy)
    return policy.noise_scale


def _set_noise_scale(worker: Any) -> None:
    worker.get_policy().noise_scale = 1.0  # what a recreated worker starts from before the plan sets it


# -- config -----------------------------------------------------------------------------------------

def test_config_is_apex_settings_over_ddpg_with_laptop_defaults() -> None:
    c = ApexDDPGConfig()
    assert isinstance(c, ApexSettings) and isinstance(c, DDPGConfig)
    assert (c.env, c.num_workers, c.num_replay_buffer_shards, c.n_step, c.buffer_size, c.learning_starts,
            c.train_batch_size, c.rollout_fragment_length, c.prioritized_replay, c.training_intensity,
            c.target_network_update_freq, c.exploration_noise) == \
        ("Pendulum-v1", min(2, available_cpus()), 2, 3, 100_000, 2000, 256, 50, True, 32.0, 0, 0.25)
    assert (c.max_weight_sync_delay, c.worker_side_prioritization, c.learner_queue_size,
            c.replay_buffer_shards_colocated_with_driver) == (400, True, 16, True)  # Ape-X's
    # every other DDPG field keeps DDPG's default: the mixin adds fields and never resets the second base's
    ddpg = DDPGConfig()
    overridden = {"num_workers", "num_replay_buffer_shards", "n_step", "buffer_size", "learning_starts",
                  "train_batch_size", "rollout_fragment_length", "prioritized_replay", "training_intensity",
                  "exploration_noise"}
    for f in dataclasses.fields(DDPGConfig):
        if f.name not in overridden:
            assert getattr(c, f.name) == getattr(ddpg, f.name), f.name
    assert c.round_robin_weights == [1.0, 32 / (256 / 50)]  # one store item is one worker's fragment of 50
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.tau = 0.1  # type: ignore[misc]  # the point of the test


@pytest.mark.parametrize("kwargs, message", [
    ({"num_gpus": 2}, "num_gpus=2: Ape-X trains on one learner device; use num_gpus=0 (CPU) or num_gpus=1"),
    ({"num_replay_buffer_shards": 0}, "num_replay_buffer_shards=0 must be an int >= 1 (replay shard actors)"),
    ({"max_weight_sync_delay": 0}, "max_weight_sync_delay=0 must be an int >= 1"),
    ({"learner_queue_size": 0}, "learner_queue_size=0 must be an int >= 1"),
    ({"tau": 0}, "tau=0 must be a number in (0, 1]"),
    ({"exploration_noise": -0.1}, "exploration_noise=-0.1 must be a number >= 0"),
    ({"training_intensity": 0}, "training_intensity=0 must be a number > 0, or None"),
    ({"n_step": 60}, "rollout_fragment_length=50 is shorter than n_step=60; raise rollout_fragment_length"),
    ({"normalize_actions": False}, "normalize_actions=False: ApexDDPGConfig's actor emits tanh-squashed"),
])
def test_config_validation_names_field_value_and_fix(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ApexDDPGConfig(**kwargs)


def test_discrete_actions_and_other_configs_are_refused() -> None:
    with pytest.raises(ValueError, match="needs a 1-D Box action space, got Discrete"):
        ApexDDPGPolicy(OBS_SPACE, gym.spaces.Discrete(2), SMALL)
    with pytest.raises(TypeError, match="ApexDDPGConfig"):
        ApexDDPGPolicy(OBS_SPACE, ACTION_SPACE, DDPGConfig())


def test_registered_under_apex_ddpg_running_ape_x_plan_and_shards() -> None:
    assert get_algorithm("apex_ddpg") is ALGORITHM
    assert (ALGORITHM.config_class, ALGORITHM.policy_class) == (ApexDDPGConfig, ApexDDPGPolicy)
    assert ALGORITHM.plan is plan is apex.plan and ALGORITHM.make_owned_state is make_owned_state is \
        apex.make_owned_state


# -- per-worker exploration ----------------------------------------------------------------------------

def test_noise_scale_multiplies_the_exploration_noise() -> None:
    policy = ApexDDPGPolicy(OBS_SPACE, ACTION_SPACE, dataclasses.replace(SMALL, random_timesteps=0))
    assert isinstance(policy, ExploresPerWorker) and policy.noise_scale == 0.4
    obs = np.random.default_rng(0).uniform(-1, 1, (500, 3)).astype(np.float32)
    greedy = policy.compute_actions(obs, explore=False)[0]
    policy.set_worker_exploration(0.0)
    assert np.array_equal(policy.compute_actions(obs)[0], greedy)
    for scale in (0.4, 0.016):
        policy.set_worker_exploration(scale)
        noise = policy.compute_actions(obs)[0] - greedy
        inside = np.abs(greedy) < 0.5  # away from the clip at +-1
        assert np.std(noise[inside]) == pytest.approx(scale * SMALL.exploration_noise, rel=0.2)


def test_each_worker_gets_its_noise_scale_and_keeps_it_through_broadcasts_and_plan_rebuilds() -> None:
    config = dataclasses.replace(SMALL, num_workers=2, num_cpus_per_worker=0.5)
    workers = WorkerSet(policy_class=ApexDDPGPolicy, config=config)
    shards = make_replay_shards(config)
    try:
        assert workers.foreach_worker(_noise_scale) == [0.4, 0.4, 0.4]  # before the plan
        expected = [0.0, per_worker_epsilon(0, 2), per_worker_epsilon(1, 2)]  # the local worker never samples
        assert expected == pytest.approx([0.0, 0.4, 0.4 ** 8])
        plan(workers, config, replay_actors=shards).close()
        workers.sync_weights(global_vars={"timestep": 10**6})
        assert workers.foreach_worker(_noise_scale) == pytest.approx(expected)
        workers.foreach_worker(_set_noise_scale)  # as if the workers had been recreated
        it = plan(workers, config, replay_actors=shards)  # the trainer rebuilds the plan
        it.close()
        assert workers.foreach_worker(_noise_scale) == pytest.approx(expected)
    finally:
        workers.stop()
        for shard in shards:
            executor.kill(shard)
    alone = WorkerSet(policy_class=ApexDDPGPolicy, config=SMALL)  # zero remote workers: the driver samples
    shards = make_replay_shards(SMALL)
    try:
        alone.foreach_worker(_set_noise_scale)
        plan(alone, SMALL, replay_actors=shards).close()
        assert _noise_scale(alone.local_worker()) == 0.4
    finally:
        for shard in shards:
            executor.kill(shard)


def test_policy_state_round_trips_its_noise_scale() -> None:
    policy = ApexDDPGPolicy(OBS_SPACE, ACTION_SPACE, SMALL)
    policy.set_worker_exploration(0.016)
    other = ApexDDPGPolicy(OBS_SPACE, ACTION_SPACE, SMALL)
    other.set_state(policy.get_state())
    assert other.noise_scale == 0.016


# -- worker-side priorities ---------------------------------------------------------------------------

def _piece() -> SampleBatch:
    rng = np.random.default_rng(0)
    return SampleBatch({OBS: rng.normal(size=(4, 3)).astype(np.float32),
                        NEXT_OBS: rng.normal(size=(4, 3)).astype(np.float32),
                        ACTIONS: rng.uniform(-1, 1, (4, 1)).astype(np.float32),
                        REWARDS: rng.normal(size=4).astype(np.float32),
                        TERMINATEDS: np.array([False, False, False, True]), TRUNCATEDS: np.zeros(4, bool)})


def test_worker_side_prioritization_writes_td_error_priorities() -> None:
    config = dataclasses.replace(SMALL, n_step=2, gamma=0.5)
    policy = ApexDDPGPolicy(OBS_SPACE, ACTION_SPACE, config)
    out = policy.postprocess_trajectory(_piece())
    q = policy.q_values(out[OBS], out[ACTIONS])
    target = out[REWARDS] + out[NSTEP_DISCOUNTS] * policy.q_values(out[NEXT_OBS], policy.deterministic_actions(
        out[NEXT_OBS]))
    assert out[NSTEP_DISCOUNTS][-1] == 0 and out[NSTEP_DISCOUNTS][0] == 0.25  # n-step windows, no bootstrap at the end
    assert np.allclose(out[PRIORITIES], np.abs(q - target) + config.prioritized_replay_eps, atol=1e-5)
    assert out[PRIORITIES].dtype == np.float32 and np.all(out[PRIORITIES] > 0)
    for off in ({"worker_side_prioritization": False}, {"prioritized_replay": False}):
        plain = ApexDDPGPolicy(OBS_SPACE, ACTION_SPACE, dataclasses.replace(config, **off))
        assert PRIORITIES not in plain.postprocess_trajectory(_piece())


# -- plan ---------------------------------------------------------------------------------------------

STORE = "LocalIterator[ParallelRollouts(async).for_each(StoreToReplayBuffer(actors=1))"
REPLAY = "LocalIterator[Replay(actors=1).zip_with_source_actor().for_each(Enqueue(maxsize=16))]"
UPDATE = ("LocalIterator[Dequeue.for_each(UpdateReplayShardPriorities).for_each(RecordLearnerOutput)"
          ".for_each(UpdateTargetNetwork(0))]")
REPORT = (".filter(ReportGate(100 steps, 0 s)).for_each(CollectMetrics).for_each()"
          ".for_each(AddReplayShardStats(replay_shard_0))]")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_ape_x_plan_runs_ddpg_with_zero_and_two_workers(num_workers: int) -> None:
    config = dataclasses.replace(SMALL, num_workers=num_workers, num_cpus_per_worker=0.5, max_weight_sync_delay=50)
    workers = WorkerSet(policy_class=ApexDDPGPolicy, config=config)
    shards = make_replay_shards(config)
    it = plan(workers, config, replay_actors=shards)
    try:
        weights = [1.0, config.training_intensity * config.rollout_fragment_length / config.train_batch_size, "*"]
        head = f"Concurrently(round_robin, round_robin_weights={weights}, output_indexes=[2])"
        tail = ".zip_with_source_actor().for_each(UpdateWorkerWeights(50))]" if num_workers else "]"
        assert repr(it) == f"LocalIterator[{head}[{STORE}{tail}, {REPLAY}, {UPDATE}]{REPORT}"
        policy = workers.local_worker().get_policy()
        assert isinstance(policy, ApexDDPGPolicy)
        target_before = policy.get_state()["target_weights"]
        info = [next(it) for _ in range(3)][-1]["info"]
        assert info["num_steps_sampled"] >= 300 and info["num_steps_trained"] == 32 * info["num_learner_updates"] > 0
        assert info["num_target_updates"] == info["num_learner_updates"]  # a soft update per trained batch
        assert policy.num_critic_updates >= info["num_learner_updates"]
        target_after = policy.get_state()["target_weights"]
        assert any(not np.array_equal(target_before[k], target_after[k]) for k in target_before)
        assert "critic_loss" in info["learner"]["default_policy"]["learner_stats"]
        if num_workers:
            assert info["num_weight_syncs"] > 0
        deadline = time.monotonic() + 30  # worker-side priorities and the learner's new ones reach the shard
        while executor.get(shards[0].stats.remote())["policy_default_policy"]["max_priority"] == 1.0:
            assert time.monotonic() < deadline, "no td-error priority reached the shard"
            time.sleep(0.05)
    finally:
        it.close()
        workers.stop()
        for shard in shards:
            executor.kill(shard)


def test_trainer_runs_apex_ddpg_and_checkpoints_its_shards() -> None:
    config = dataclasses.replace(SMALL, store_buffer_in_checkpoints=True)
    trainer = Trainer("apex_ddpg", config)
    try:
        result = trainer.train()
        assert result["info"]["num_steps_trained"] > 0 and result["timesteps_total"] >= 100
        shards = trainer.owned_state["replay_actors"]
        with tempfile.TemporaryDirectory() as tmp:
            path = trainer.save(tmp)
            saved_added = executor.get(shards[0].stats.remote())["num_added"]
            trainer.train()
            trainer.restore(path)
        assert executor.get(shards[0].stats.remote())["num_added"] == saved_added > 0
        # The learner thread trains on between save and restore, so the weights are not compared here (the
        # policy's state round trip is DDPG's, tested there). Nor is training after the restore: the live plan's
        # queued batches still carry pre-restore shard indexes, whose priority updates the restored (smaller)
        # shard refuses -- as with Ape-X DQN, whose test stops at the restore too.
    finally:
        trainer.stop()


# -- learning (slow) -------------------------------------------------------------------------------

def _train_to(config: ApexDDPGConfig, *, target: float, max_steps: int) -> dict[str, Any]:
    """Runs the plan until the mean return of the last ``metrics_smoothing_episodes`` episodes (a full window)
    reaches ``target`` or ``max_steps`` env steps were sampled; the last report."""
    workers = WorkerSet(policy_class=ApexDDPGPolicy, config=config)
    it = plan(workers, config)
    start = time.perf_counter()
    try:
        for result in it:
            window = len(result.get("hist_stats", {}).get("episode_reward", []))
            print(f"{result['timesteps_total']:>7} steps  trained {result['info']['num_steps_trained']:>8}  "
                  f"return {result.get('episode_reward_mean', float('nan')):7.1f} over {window:>2} episodes  "
                  f"{time.perf_counter() - start:5.1f} s")
            if window >= config.metrics_smoothing_episodes and result["episode_reward_mean"] >= target:
                return result
            if result["timesteps_total"] >= max_steps:
                return result
        raise AssertionError("the plan ended")
    finally:
        it.close()
        workers.stop()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a gate on env steps; async and under load, the wall time varies (4-5 min on 2 cores)
@pytest.mark.parametrize("seed", [101, 202, 303])
def test_apex_ddpg_defaults_learn_pendulum_within_100k_steps(seed: int) -> None:
    """The issue's gate (RLlib's): mean return over the last 20 episodes >= -320 within 100k env steps, 2 workers,
    the default config. Tuned on seeds 0 and 1 (about 43k steps on a loaded 2-core machine); async, so the step
    count varies from run to run."""
    config = ApexDDPGConfig(seed=seed, num_workers=2, metrics_smoothing_episodes=20)
    result = _train_to(config, target=-320, max_steps=100_000)
    print(f"Ape-X DDPG seed {seed}: return {result['episode_reward_mean']:.1f} after {result['timesteps_total']} "
          f"steps")
    assert result["episode_reward_mean"] >= -320 and result["timesteps_total"] <= 100_000
