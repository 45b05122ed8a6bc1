"""The two-policy composition: PPO and DQN train different agents of one
MultiAgentCartPole from one duplicated rollout stream."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from flowrl import executor

from flowrl.algorithms import get_algorithm
from flowrl.algorithms.dqn import DQNConfig, DQNPolicy
from flowrl.algorithms.multiagent import (ALGORITHM, DQN_POLICY, PPO_POLICY, MultiAgentConfig, alternate_policies,
                                          plan)
from flowrl.algorithms.ppo import PPOConfig, PPOPolicy
from flowrl.config import ModelConfig, PolicySpec
from flowrl.metrics import DQN_AGENT_STEPS_TRAINED_COUNTER, PPO_AGENT_STEPS_TRAINED_COUNTER
from flowrl.policy import Policy
from flowrl.sample_batch import AGENT_INDEX, SampleBatch
from flowrl.testing import plan_lines
from flowrl.trainer import Trainer
from flowrl.workers import WorkerSet

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

SMALL_MODEL = ModelConfig(hidden_sizes=(16,))
# a few iterations' worth: DQN replays from 200 stored agent steps on, PPO trains every 100 env steps
SMALL = MultiAgentConfig(seed=0, timesteps_per_iteration=200, min_iter_time_s=0,
                         ppo=PPOConfig(train_batch_size=100, sgd_minibatch_size=64, num_sgd_iter=2, model=SMALL_MODEL),
                         dqn=DQNConfig(learning_starts=200, model=SMALL_MODEL, hiddens=(16,), training_intensity=2.0))


# -- config -----------------------------------------------------------------------------------------

def test_defaults_build_both_policies_from_their_sub_configs() -> None:
    config = MultiAgentConfig(seed=3, num_envs_per_worker=2)
    assert (config.num_workers, config.rollout_fragment_length, dict(config.env_config)) == (0, 50, {"num_agents": 4})
    assert set(config.policies or {}) == {PPO_POLICY, DQN_POLICY}
    ppo_spec, dqn_spec = (config.policies or {})[PPO_POLICY], (config.policies or {})[DQN_POLICY]
    assert (ppo_spec.policy_class, ppo_spec.config) == (PPOPolicy, config.ppo)
    assert (dqn_spec.policy_class, dqn_spec.config) == (DQNPolicy, config.dqn)
    for sub in (config.ppo, config.dqn):  # the rollout settings are the composition's
        assert (sub.env, sub.num_envs_per_worker, sub.rollout_fragment_length) == (config.env, 2, 50)
    assert (config.ppo.seed, config.dqn.seed) == (3, 4)
    assert MultiAgentConfig(seed=3, dqn=DQNConfig(seed=11)).dqn.seed == 11  # a sub-config's own seed is kept
    assert MultiAgentConfig(dqn=DQNConfig(gamma=0.9)).dqn.gamma == 0.9  # learning settings are the sub-config's
    assert config.policy_mapping_fn is alternate_policies
    assert get_algorithm("multiagent") is ALGORITHM


def test_dqn_training_intensity_counts_trained_rows_per_sampled_env_step() -> None:
    # 50 env steps per store item; 32-row replays; intensity 8 -> 400 rows, 12.5 replays per store
    assert MultiAgentConfig(dqn=DQNConfig(training_intensity=8.0)).dqn_round_robin_weights == [1.0, 12.5]
    assert MultiAgentConfig(num_workers=2, dqn=DQNConfig(training_intensity=8.0)).dqn_round_robin_weights == \
        [1.0, 25.0]
    assert MultiAgentConfig(dqn=DQNConfig()).dqn_round_robin_weights == [1.0, 1.0]


@pytest.mark.parametrize("kwargs, message", [
    ({"ppo": DQNConfig()}, "MultiAgentConfig.ppo=.* must be a PPOConfig"),
    ({"policies": {"a": PolicySpec(), "b": PolicySpec()}}, r"ids \['a', 'b'\]; the composition trains exactly"),
    ({"rollout_fragment_length": 2, "dqn": DQNConfig(n_step=3)}, "rollout_fragment_length=2 is shorter than n_step=3"),
    ({"policy_mapping_fn": {"agent_0": "ghost"}}, "not among the known policy ids"),
])
def test_invalid_settings_are_named(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MultiAgentConfig(**kwargs)


def test_alternate_policies_names_an_agent_id_without_an_index() -> None:
    assert [alternate_policies(a) for a in ("pursuer_0", "agent_11", "x2")] == [PPO_POLICY, DQN_POLICY, PPO_POLICY]
    with pytest.raises(ValueError, match="'referee' does not end in an index.*policy_mapping_fn"):
        alternate_policies("referee")


# -- plan -------------------------------------------------------------------------------------------

def test_plan_fits_40_lines_and_reads_like_the_paper() -> None:
    assert plan_lines(plan) <= 40, plan_lines(plan)
    workers = WorkerSet(policy_class=PPOPolicy, config=SMALL)
    try:
        it = plan(workers, SMALL)
        text = repr(it)
        for stage in ("Concurrently(async", "Concurrently(round_robin", "SelectExperiences(['dqn_policy'])",
                      "StoreToReplayBuffer(local)", "Replay(local)", "UpdatePriorities", "UpdateTargetNetwork(500)",
                      "SelectExperiences(['ppo_policy'])", "ConcatBatches(100)", "StandardizeFields(['advantages'])",
                      "UpdateKL", "ReportGate(200 steps"):
            assert stage in text, (stage, text)
        it.close()
    finally:
        workers.stop()


class _Recorder:
    """Wraps a policy's ``learn_on_batch`` to record the agent indexes of every batch it learns on."""

    def __init__(self, policy: Policy) -> None:
        self.agents: set[int] = set()
        self.rows = 0
        self.inner = policy.learn_on_batch

    def __call__(self, batch: SampleBatch) -> dict[str, Any]:
        self.agents.update(np.asarray(batch[AGENT_INDEX]).tolist())
        self.rows += batch.count
        return self.inner(batch)


def test_both_branches_progress_and_each_policy_learns_only_on_its_own_agents() -> None:
    workers = WorkerSet(policy_class=PPOPolicy, config=SMALL)
    local = workers.local_worker()
    recorders = {pid: _Recorder(local.get_policy(pid)) for pid in (PPO_POLICY, DQN_POLICY)}
    for pid, recorder in recorders.items():
        local.get_policy(pid).learn_on_batch = recorder  # type: ignore[method-assign]  # a spy
    before = {pid: local.get_policy(pid).get_weights() for pid in recorders}
    try:
        it = plan(workers, SMALL)
        counts = []
        for _ in range(4):
            info = next(it)["info"]
            counts.append((info[PPO_AGENT_STEPS_TRAINED_COUNTER], info[DQN_AGENT_STEPS_TRAINED_COUNTER]))
        it.close()
    finally:
        workers.stop()
    # both branches' own counters advance over the run (PPO trains from its first concat, DQN once replay starts)
    for earlier, later in zip(counts, counts[1:]):
        assert later[0] > earlier[0] and later[1] > earlier[1], counts
    assert recorders[PPO_POLICY].agents == {0, 2} and recorders[DQN_POLICY].agents == {1, 3}
    # what each policy learned on is what its branch counted: PPO 2 epochs over its batches, DQN each replay once
    assert recorders[PPO_POLICY].rows == 2 * counts[-1][0] and recorders[DQN_POLICY].rows == counts[-1][1]
    for pid in recorders:
        after = local.get_policy(pid).get_weights()
        assert any(not np.array_equal(after[k], before[pid][k]) for k in after), f"{pid} did not learn"


def test_remote_workers_get_each_trained_policys_weights() -> None:
    config = dataclasses.replace(SMALL, num_workers=1)
    workers = WorkerSet(policy_class=PPOPolicy, config=config)
    try:
        it = plan(workers, config)
        for _ in range(2):
            next(it)
        it.close()
        local = workers.local_worker().get_weights()
        remote = executor.get(workers.remote_workers()[0].get_weights.remote())
        assert set(remote) == {PPO_POLICY, DQN_POLICY}
        for pid in (PPO_POLICY, DQN_POLICY):
            assert all(np.array_equal(local[pid][k], remote[pid][k]) for k in local[pid]), pid
    finally:
        workers.stop()


def test_trainer_checkpoints_both_policies_and_the_counters(tmp_path: Any) -> None:
    trainer = Trainer("multiagent", SMALL)
    try:
        result = trainer.train()
        path = trainer.save(tmp_path)
        weights = {pid: trainer.get_policy(pid).get_weights() for pid in (PPO_POLICY, DQN_POLICY)}
    finally:
        trainer.stop()
    restored = Trainer("multiagent", SMALL)
    try:
        restored.restore(path)
        for pid, saved in weights.items():
            now = restored.get_policy(pid).get_weights()
            assert all(np.array_equal(now[k], saved[k]) for k in saved), pid
        again = restored.train()
        assert again["timesteps_total"] > result["timesteps_total"]
        assert again["info"][DQN_AGENT_STEPS_TRAINED_COUNTER] > result["info"][DQN_AGENT_STEPS_TRAINED_COUNTER]
    finally:
        restored.stop()


# -- learning ---------------------------------------------------------------------------------------

def train_both_until(target: float, max_steps: int) -> tuple[dict[str, Any], dict[str, float]]:
    """Trains the default composition (seed 0) until each policy's mean agent return reaches ``target`` or
    ``max_steps`` env steps; the last result and its per-policy returns."""
    config = MultiAgentConfig(seed=0, min_iter_time_s=0, timesteps_per_iteration=2000)
    workers = WorkerSet(policy_class=PPOPolicy, config=config)
    try:
        it = plan(workers, config)
        for result in it:
            returns = {pid: result["policy_reward_mean"].get(pid, 0.0) for pid in (PPO_POLICY, DQN_POLICY)}
            print(f"{result['timesteps_total']:>7} env steps  PPO {returns[PPO_POLICY]:6.1f}  "
                  f"DQN {returns[DQN_POLICY]:6.1f}")
            if min(returns.values()) >= target or result["timesteps_total"] >= max_steps:
                break
        it.close()
    finally:
        workers.stop()
    return result, returns


@pytest.mark.slow  # the default tier keeps one learning check per family (PPO, PG, A2C, IMPALA); ~10 min budget
def test_both_policies_start_learning_multi_agent_cartpole() -> None:
    """The default tier's check: both policies well above a random policy's ~22 (seed 0: ~12k env steps, ~20 s)."""
    result, returns = train_both_until(75, max_steps=30_000)
    assert min(returns.values()) >= 75, (result["timesteps_total"], returns)


@pytest.mark.slow
def test_both_policies_learn_multi_agent_cartpole() -> None:
    """Seeded: each policy's mean agent return passes 150 on MultiAgentCartPole(4) within 60k env steps (seeds 0, 1,
    2 reached it at ~34k, ~24k and ~28k; ~50 s)."""
    result, returns = train_both_until(150, max_steps=60_000)
    assert min(returns.values()) >= 150, (result["timesteps_total"], returns)
