"""Recurrent policies in multi-agent envs: each agent of each env carries its own state, from the initial state at
its first step, forgotten when its part of the episode ends; sequences never mix agents; the learner recomputes the
worker's logits; the worker's checkpoint keeps the states; evaluation carries them too."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from flowrl.algorithms.ppo import PPOConfig, PPOPolicy, plan
from flowrl.config import ModelConfig, PolicySpec
from flowrl.envs import MultiAgentCartPole
from flowrl.sample_batch import (ACTION_DIST_INPUTS, AGENT_INDEX, EPS_ID, STATE_IN, STATE_OUT, T, VF_PREDS,
                                 MultiAgentBatch)
from flowrl.sequences import batch_sequence_lengths, sequence_starts
from flowrl.workers import WorkerSet

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

LSTM = ModelConfig(hidden_sizes=(16,), use_lstm=True, lstm_cell_size=8, max_seq_len=6)


def config(**overrides: Any) -> PPOConfig:
    base = PPOConfig(env=MultiAgentCartPole, env_config={"num_agents": 3, "max_episode_steps": 15}, seed=2,
                     model=LSTM, num_workers=0, num_envs_per_worker=2, rollout_fragment_length=20,
                     train_batch_size=40, sgd_minibatch_size=20, num_sgd_iter=1,
                     policies={"a": PolicySpec(), "b": PolicySpec()},
                     policy_mapping_fn={"agent_0": "a", "agent_1": "b", "agent_2": "b"})
    return dataclasses.replace(base, **overrides)


def sampled() -> tuple[WorkerSet, MultiAgentBatch]:
    workers = WorkerSet(policy_class=PPOPolicy, config=config())
    worker = workers.local_worker()
    worker.sample()
    batch = worker.sample()
    assert isinstance(batch, MultiAgentBatch)
    return workers, batch


def test_each_agent_carries_its_own_state_restarted_with_its_episode() -> None:
    workers, batch = sampled()
    b = batch.policy_batches["b"]  # two agents share policy b: their states must not mix
    for env in range(2):
        for agent in (1, 2):
            rows = np.flatnonzero((b["env_id"] == env) & (b[AGENT_INDEX] == agent))
            eps, t = b[EPS_ID][rows], b[T][rows]
            state_in, state_out = b[STATE_IN.format(0)][rows], b[STATE_OUT.format(0)][rows]
            same = eps[1:] == eps[:-1]
            np.testing.assert_array_equal(state_in[1:][same], state_out[:-1][same])  # carried step to step
            assert (state_in[t == 0] == 0).all() and (t == 0).any()  # an episode's first step: the initial state
    workers.stop()


def test_sequences_never_mix_agents_and_the_learner_recomputes_the_workers_logits() -> None:
    workers, batch = sampled()
    policy = workers.local_worker().get_policy("b")
    b = batch.policy_batches["b"]
    lens = batch_sequence_lengths(b, LSTM.max_seq_len)
    for start, n in zip(sequence_starts(lens), lens):
        assert len(set(b[AGENT_INDEX][start:start + n].tolist())) == 1
    dist_inputs, values = policy.forward_rows(policy.to_tensors(b))
    np.testing.assert_allclose(dist_inputs.detach().numpy(), b[ACTION_DIST_INPUTS], atol=1e-5)
    np.testing.assert_allclose(values.detach().numpy(), b[VF_PREDS], atol=1e-5)
    workers.stop()


def test_a_restored_worker_goes_on_with_each_agents_state() -> None:
    one = WorkerSet(policy_class=PPOPolicy, config=config()).local_worker()
    one.sample()
    state = one.get_state()
    assert state["agent_states"]
    two = WorkerSet(policy_class=PPOPolicy, config=config()).local_worker()
    two.set_state(state)
    a, b = one.sample(), two.sample()
    assert isinstance(a, MultiAgentBatch) and isinstance(b, MultiAgentBatch)
    for pid in ("a", "b"):
        np.testing.assert_array_equal(a.policy_batches[pid][ACTION_DIST_INPUTS],
                                      b.policy_batches[pid][ACTION_DIST_INPUTS])


def test_multi_agent_ppo_with_memory_trains_and_evaluates() -> None:
    from flowrl.envs import MultiAgentVectorEnv, make_policy_mapping
    from flowrl.evaluation import evaluate_multi_agent

    cfg = config()
    workers = WorkerSet(policy_class=PPOPolicy, config=cfg)
    it = plan(workers, cfg)
    result = [next(it) for _ in range(2)][-1]
    assert set(result["info"]["learner"]) == {"a", "b"}
    policies = workers.local_worker().policy_map
    mapping = make_policy_mapping(cfg.policy_mapping_fn, ["a", "b"])
    runs = [evaluate_multi_agent(policies, MultiAgentVectorEnv(MultiAgentCartPole, 2, seed=3,
                                                               config=cfg.env_config), mapping, episodes=3)
            for _ in range(2)]
    assert len(runs[0].returns) == 3 and runs[0].returns == runs[1].returns
    workers.stop()


def test_previous_inputs_are_refused_in_multi_agent_envs() -> None:
    with pytest.raises(ValueError, match="multi-agent workers do not feed the previous action or reward yet"):
        WorkerSet(policy_class=PPOPolicy, config=config(model=dataclasses.replace(LSTM, lstm_use_prev_reward=True)))
