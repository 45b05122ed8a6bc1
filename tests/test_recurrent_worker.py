"""A rollout worker with a recurrent policy: one state per env, carried across steps and fragments, back to the
initial state after every terminated or truncated step, stored per row (state_in / state_out), kept by get_state /
set_state; and the learner's recomputation over the stored sequences gives the worker's logits (1e-5)."""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.algorithms.pg import PGConfig, PGPolicy
from flowrl.envs import STATELESS_CARTPOLE
from flowrl.models import RecurrentActorCritic
from flowrl.policy import PolicyConfig
from flowrl.sample_batch import ACTION_DIST_INPUTS, EPS_ID, OBS, STATE_IN, STATE_OUT, T, TERMINATEDS, TRUNCATEDS
from flowrl.sequences import pad, sequence_lengths, sequence_mask, sequence_starts
from flowrl.workers import RolloutConfig, RolloutWorker

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

CELL = 6


class RecurrentPG(PGPolicy):
    """PG's policy with a small LSTM actor-critic (acting only: these tests do not train it)."""

    def __init__(self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: PolicyConfig) -> None:
        super().__init__(observation_space, action_space, config)
        torch.manual_seed(0)
        self.model = RecurrentActorCritic(observation_space, 2, config.model, cell_size=CELL)
        self.numpy_acting = None


def recurrent_worker(**overrides: Any) -> RolloutWorker:
    config = PGConfig(env=STATELESS_CARTPOLE, num_envs_per_worker=3, rollout_fragment_length=40, seed=3,
                      env_config={"max_episode_steps": 15})  # short episodes: ends by time limit and by failure
    return RolloutWorker(policy_class=RecurrentPG, config=dataclasses.replace(config, **overrides))


def test_a_feed_forward_policy_has_no_state_and_its_batches_no_state_columns() -> None:
    worker = RolloutWorker(policy_class=PGPolicy, config=PGConfig(env="CartPole-v1", seed=0))
    assert worker.get_policy().initial_state(3) == () and not worker.get_policy().is_recurrent
    assert not any(k.startswith("state_") for k in worker.sample())
    with pytest.raises(TypeError, match="carries no state; use compute_actions"):
        worker.get_policy().compute_actions_with_state(np.zeros((1, 4), np.float32), ())


def test_state_is_carried_within_episodes_and_restarts_at_every_end() -> None:
    worker = recurrent_worker()
    batch = worker.sample()
    for k in range(2):  # an LSTM: h and c
        assert batch[STATE_IN.format(k)].shape == (batch.count, CELL)
    for env_rows in [np.flatnonzero(batch["env_id"] == i) for i in range(3)]:
        rows = batch.rows(env_rows)
        ended = rows[TERMINATEDS] | rows[TRUNCATEDS]
        assert ended.any() and rows[TRUNCATEDS].any()  # both kinds of end happen in 40 steps of 15-step episodes
        for k in range(2):
            state_in, state_out = rows[STATE_IN.format(k)], rows[STATE_OUT.format(k)]
            starts = np.flatnonzero(rows[T] == 0)
            assert np.all(state_in[starts] == 0)  # every episode starts from zeros
            inside = np.flatnonzero(~ended[:-1])  # a row whose episode goes on: the next row starts where it ended
            np.testing.assert_array_equal(state_in[inside + 1], state_out[inside])
            assert np.abs(state_out).sum() > 0


def test_state_goes_on_across_fragments_and_survives_get_state_and_set_state() -> None:
    worker, twin = recurrent_worker(), recurrent_worker()
    first = worker.sample()
    twin.set_state(worker.get_state())
    second, twin_second = worker.sample(), twin.sample()
    for k in range(2):
        np.testing.assert_array_equal(second[STATE_IN.format(k)], twin_second[STATE_IN.format(k)])
    for i in range(3):  # each env's first row of fragment 2 starts from its last state of fragment 1
        last, nxt = np.flatnonzero(first["env_id"] == i)[-1], np.flatnonzero(second["env_id"] == i)[0]
        if not (first[TERMINATEDS][last] or first[TRUNCATEDS][last]):
            np.testing.assert_array_equal(second[STATE_IN.format(0)][nxt], first[STATE_OUT.format(0)][last])


def test_a_state_of_another_shape_is_refused_on_restore() -> None:
    state = recurrent_worker().get_state()
    with pytest.raises(ValueError, match="recurrent policy state of shapes"):
        recurrent_worker(num_envs_per_worker=2).set_state({**state, "env": recurrent_worker(
            num_envs_per_worker=2).get_state()["env"], "eps_id": np.zeros(2, np.int64), "ep_t": np.zeros(2, np.int64),
            "pending": [[], []]})


def test_the_learners_recomputation_over_stored_sequences_gives_the_workers_logits() -> None:
    """The memory-preserving check: padded sequences started from the stored state_in give, step by step, the
    action_dist_inputs the worker acted with."""
    worker = recurrent_worker()
    worker.sample()
    batch = worker.sample()  # mid-run: sequences start from non-zero states too
    lens = sequence_lengths(batch[EPS_ID], batch[T], max_seq_len=7)
    starts = sequence_starts(lens)
    model = worker.get_policy().model
    with torch.no_grad():
        state = tuple(torch.as_tensor(batch[STATE_IN.format(k)][starts]) for k in range(2))
        logits, _, _ = model(torch.as_tensor(pad(batch[OBS], lens, 7)), state)
    mask = sequence_mask(lens, 7)
    np.testing.assert_allclose(logits.numpy()[mask], batch[ACTION_DIST_INPUTS], atol=1e-5, rtol=1e-5)
    assert np.abs(batch[STATE_IN.format(0)][starts]).sum() > 0


def test_a_recurrent_policy_asked_to_act_without_a_state_says_how() -> None:
    policy = recurrent_worker().get_policy()
    with pytest.raises(TypeError, match=r"act with compute_actions_with_state\(obs, state\)"):
        policy.compute_actions(np.zeros((2, 2), np.float32))
    actions, extras, state = policy.compute_actions_with_state(np.zeros((2, 2), np.float32), policy.initial_state(2),
                                                               explore=False)
    assert actions.shape == (2,) and [s.shape for s in state] == [(2, CELL), (2, CELL)]
    assert np.all(extras[STATE_IN.format(1)] == 0) and np.any(extras[STATE_OUT.format(1)] != 0)
