"""A recurrent model that reads the previous action and reward (model.lstm_use_prev_action / lstm_use_prev_reward):
the worker feeds them (zeros at each episode's first step) and stores what it fed; the learner recomputes the
worker's logits over stored sequences with them; GAE and V-trace bootstrap with each row's own action and reward;
the worker's checkpoint keeps them; evaluation and flowrl.load feed them too."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from flowrl.algorithms.impala import IMPALAConfig, IMPALAPolicy
from flowrl.algorithms.ppo import PPOConfig, PPOPolicy, plan
from flowrl.algorithms.r2d2 import R2D2Config
from flowrl.config import ModelConfig
from flowrl.envs import STATELESS_CARTPOLE
from flowrl.sample_batch import (ACTION_DIST_INPUTS, ACTIONS, EPS_ID, NEXT_OBS, PREV_ACTIONS, PREV_REWARDS, REWARDS,
                                 STATE_OUT, TERMINATEDS, VF_PREDS, SampleBatch, T)
from flowrl.workers import WorkerSet

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

MODEL = ModelConfig(hidden_sizes=(16,), use_lstm=True, lstm_cell_size=8, max_seq_len=6, lstm_use_prev_action=True,
                    lstm_use_prev_reward=True)


def ppo_config(**overrides: Any) -> PPOConfig:
    base = PPOConfig(env=STATELESS_CARTPOLE, seed=6, model=MODEL, num_workers=0, num_envs_per_worker=2,
                     rollout_fragment_length=30, train_batch_size=60, sgd_minibatch_size=30, num_sgd_iter=1)
    return dataclasses.replace(base, **overrides)


def test_previous_inputs_need_a_recurrent_model_and_r2d2_refuses_them() -> None:
    with pytest.raises(ValueError, match="ModelConfig.lstm_use_prev_reward=True feeds the recurrent cell, and "
                                         "use_lstm=False has none"):
        ModelConfig(lstm_use_prev_reward=True)
    with pytest.raises(ValueError, match="R2D2's Q-network does not read the previous action or reward yet"):
        R2D2Config(model=dataclasses.replace(R2D2Config().model, lstm_use_prev_action=True))


def test_the_worker_feeds_and_stores_the_previous_action_and_reward_zeros_at_each_episode_start() -> None:
    worker = WorkerSet(policy_class=PPOPolicy, config=ppo_config()).local_worker()
    first, second = worker.sample(), worker.sample()
    batch = SampleBatch.concat([first, second])
    for env in range(2):
        rows = np.flatnonzero(batch["env_id"] == env)  # time order: this env's rows of both fragments
        eps, t = batch[EPS_ID][rows], batch[T][rows]
        starts = t == 0
        assert starts.any() and (~starts).any()
        assert (batch[PREV_ACTIONS][rows][starts] == 0).all() and (batch[PREV_REWARDS][rows][starts] == 0).all()
        same = (eps[1:] == eps[:-1])  # a row after another of its episode (across the fragments' cut too)
        assert np.array_equal(batch[PREV_ACTIONS][rows][1:][same], batch[ACTIONS][rows][:-1][same])
        assert np.array_equal(batch[PREV_REWARDS][rows][1:][same], batch[REWARDS][rows][:-1][same])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("prev", [(True, True), (True, False), (False, True)])
def test_the_learner_recomputes_the_workers_logits_with_the_stored_previous_inputs(cell: str,
                                                                                  prev: tuple[bool, bool]) -> None:
    model = dataclasses.replace(MODEL, lstm_cell=cell, lstm_use_prev_action=prev[0], lstm_use_prev_reward=prev[1])
    worker = WorkerSet(policy_class=PPOPolicy, config=ppo_config(model=model)).local_worker()
    worker.sample()
    batch = worker.sample()
    policy = worker.get_policy()
    dist_inputs, values = policy.forward_rows(policy.to_tensors(batch))
    np.testing.assert_allclose(dist_inputs.detach().numpy(), batch[ACTION_DIST_INPUTS], atol=1e-5)
    np.testing.assert_allclose(values.detach().numpy(), batch[VF_PREDS], atol=1e-5)
    without = {k: v for k, v in policy.to_tensors(batch).items() if not k.startswith("_seq_prev")}
    with pytest.raises(ValueError):  # the inputs matter: the model refuses to run without them
        policy.forward_rows(without)


def test_gae_and_vtrace_bootstrap_with_each_rows_own_action_and_reward() -> None:
    worker = WorkerSet(policy_class=PPOPolicy, config=ppo_config()).local_worker()
    policy = worker.get_policy()
    calls: list[Any] = []
    value_with_state = policy.value_with_state
    policy.value_with_state = lambda obs, state, prev=None: (calls.append((obs, prev)),  # type: ignore[method-assign]
                                                             value_with_state(obs, state, prev))[1]
    batch = worker.sample()
    cut = [int(np.flatnonzero(batch["env_id"] == i)[-1]) for i in range(2)]
    cut = [i for i in cut if not batch[TERMINATEDS][i]]
    assert cut and calls
    obs = np.concatenate([c[0] for c in calls])
    actions = np.concatenate([c[1][0] for c in calls])
    rewards = np.concatenate([c[1][1] for c in calls])
    for row in cut:
        match = np.flatnonzero((obs == batch[NEXT_OBS][row]).all(axis=1))[0]
        assert actions[match] == batch[ACTIONS][row] and rewards[match] == batch[REWARDS][row]

    impala = IMPALAConfig(env=STATELESS_CARTPOLE, seed=6, model=MODEL, num_workers=0, num_envs_per_worker=2,
                          rollout_fragment_length=30, train_batch_size=60)
    iworker = WorkerSet(policy_class=IMPALAPolicy, config=impala).local_worker()
    ipolicy = iworker.get_policy()
    sample = iworker.sample()
    rows = np.array([int(np.flatnonzero(sample["env_id"] == i)[-1]) for i in range(2)])
    got = ipolicy.next_values(ipolicy.to_tensors(sample), torch.as_tensor(rows)).detach().numpy()
    states = tuple(sample[STATE_OUT.format(k)][rows] for k in range(2))
    expected = ipolicy.value_with_state(sample[NEXT_OBS][rows], states,
                                        prev=(sample[ACTIONS][rows], sample[REWARDS][rows]))
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_a_restored_worker_goes_on_with_the_same_previous_inputs() -> None:
    config = ppo_config()
    one = WorkerSet(policy_class=PPOPolicy, config=config).local_worker()
    one.sample()
    state = one.get_state()
    assert "prev_inputs" in state and np.abs(state["prev_inputs"][1]).sum() > 0
    two = WorkerSet(policy_class=PPOPolicy, config=config).local_worker()
    two.set_state(state)
    a, b = one.sample(), two.sample()
    for key in (ACTIONS, PREV_ACTIONS, PREV_REWARDS, ACTION_DIST_INPUTS):
        np.testing.assert_array_equal(a[key], b[key])
    del state["prev_inputs"]
    with pytest.raises(ValueError, match="reads the previous action and reward, but the state has no 'prev_inputs'"):
        two.set_state(state)


def test_a_short_run_trains_evaluates_and_loads_with_previous_inputs(tmp_path: Path) -> None:
    from flowrl.envs import VectorEnv
    from flowrl.evaluation import evaluate_policy
    from flowrl.inference import load
    from flowrl.trainer import Trainer

    trainer = Trainer("ppo", ppo_config())
    for _ in range(2):
        result = trainer.train()
    assert result["info"]["num_steps_trained"] == 120
    policy = trainer.get_policy()
    runs = [evaluate_policy(policy, VectorEnv(STATELESS_CARTPOLE, 2, seed=1), episodes=3) for _ in range(2)]
    assert len(runs[0].returns) == 3 and runs[0].returns == runs[1].returns
    trainer.save(tmp_path)
    trainer.stop()
    loaded = load(tmp_path)
    loaded.reset(batch_size=2)
    loaded.compute_actions(np.zeros((2, 2), np.float32))  # the first step: no previous reward needed
    with pytest.raises(ValueError, match="reads the previous reward: pass prev_rewards"):
        loaded.compute_actions(np.zeros((2, 2), np.float32))
    assert loaded.compute_actions(np.zeros((2, 2), np.float32), prev_rewards=[1.0, 1.0]).shape == (2,)


def test_ppo_with_previous_inputs_runs_its_plan() -> None:
    config = ppo_config()
    workers = WorkerSet(policy_class=PPOPolicy, config=config)
    it = plan(workers, config)
    stats = [next(it) for _ in range(2)][-1]["info"]["learner"]["default_policy"]["learner_stats"]
    assert all(np.isfinite(stats[k]) for k in ("total_loss", "policy_loss", "vf_loss"))
    workers.stop()
