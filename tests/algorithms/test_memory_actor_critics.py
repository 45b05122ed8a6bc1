"""A2C, A3C, IMPALA and APPO with a recurrent model (model.use_lstm), on their own plans: the learner recomputes
the worker's logits over the stored sequences, GAE and V-trace bootstrap from the state the worker reached the
last observation with, short runs of each plan train, and the IMPALA preset on CartPole without velocities learns
(the R2-4 gate, slow tier)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from flowrl.algorithms import get_algorithm
from flowrl.algorithms.a2c import A2CConfig
from flowrl.algorithms.a3c import A3CConfig
from flowrl.algorithms.appo import APPOConfig, APPOPolicy
from flowrl.algorithms.impala import IMPALAConfig, IMPALAPolicy
from flowrl.algorithms.impala import plan as impala_plan
from flowrl.config import ModelConfig, TrainerConfig
from flowrl.envs import STATELESS_CARTPOLE
from flowrl.policy import Policy
from flowrl.sample_batch import (ACTION_DIST_INPUTS, NEXT_OBS, STATE_OUT, TERMINATEDS, VF_PREDS, SampleBatch)
from flowrl.workers import WorkerSet

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

LSTM = ModelConfig(hidden_sizes=(32,), use_lstm=True, lstm_cell_size=16, max_seq_len=8)
COMMON: dict[str, Any] = dict(env=STATELESS_CARTPOLE, seed=4, model=LSTM, num_workers=0, num_envs_per_worker=2,
                              rollout_fragment_length=25, train_batch_size=100, timesteps_per_iteration=0)
CONFIGS: dict[str, TrainerConfig] = {
    "a2c": A2CConfig(**COMMON),
    "a3c": A3CConfig(**{**COMMON, "num_workers": 1}),
    "impala": IMPALAConfig(**COMMON),
    "appo": APPOConfig(**COMMON),
}


def sampled(name: str) -> tuple[WorkerSet, Policy, SampleBatch]:
    config = dataclasses.replace(CONFIGS[name], num_workers=0)
    workers = WorkerSet(policy_class=get_algorithm(name).policy_class, config=config)
    worker = workers.local_worker()
    worker.sample()
    return workers, worker.get_policy(), worker.sample()  # mid-run: most sequences start from a non-zero state


@pytest.mark.parametrize("name", ["a2c", "impala", "appo"])
def test_the_learner_recomputes_the_workers_logits_and_values_over_stored_sequences(name: str) -> None:
    workers, policy, batch = sampled(name)
    assert policy.is_recurrent
    tensors = policy.to_tensors(batch)
    dist_inputs, values = policy.forward_rows(tensors)
    np.testing.assert_allclose(dist_inputs.detach().numpy(), batch[ACTION_DIST_INPUTS], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(values.detach().numpy(), batch[VF_PREDS], atol=1e-5, rtol=1e-5)
    if isinstance(policy, APPOPolicy):  # the target network goes over the same sequences
        target_inputs, _ = policy.forward_rows(tensors, policy.target_model)
        np.testing.assert_allclose(target_inputs.numpy(), batch[ACTION_DIST_INPUTS], atol=1e-5, rtol=1e-5)
    workers.stop()


@pytest.mark.parametrize("name", ["impala", "appo"])
def test_vtrace_bootstraps_each_piece_from_the_state_the_worker_reached_its_last_observation_with(name: str) -> None:
    workers, policy, batch = sampled(name)
    tensors = policy.to_tensors(batch)
    cut = np.array([np.flatnonzero(batch["env_id"] == i)[-1] for i in range(2)])
    cut = cut[~batch[TERMINATEDS][cut]]
    assert len(cut)
    got = policy.next_values(tensors, torch.as_tensor(cut)).detach().numpy()
    states = tuple(batch[STATE_OUT.format(k)][cut] for k in range(policy.num_state_tensors))
    np.testing.assert_allclose(got, policy.value_with_state(batch[NEXT_OBS][cut], states), atol=1e-6)
    zeros = policy.value_with_state(batch[NEXT_OBS][cut], policy.initial_state(len(cut)))
    assert not np.allclose(got, zeros, atol=1e-4)  # the carried state matters: a restart from zeros differs
    workers.stop()


def test_a2c_bootstraps_gae_from_the_carried_state() -> None:
    workers, policy, _ = sampled("a2c")
    calls: list[tuple[np.ndarray, ...]] = []
    value_with_state = policy.value_with_state
    policy.value_with_state = lambda obs, state: (calls.append(state),  # type: ignore[method-assign]
                                                   value_with_state(obs, state))[1]
    workers.local_worker().sample()
    assert calls and all(len(state) == 2 for state in calls)  # h and c of the rows cut mid-episode
    workers.stop()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_plan_trains_a_recurrent_model(name: str) -> None:
    algorithm = get_algorithm(name)
    config = CONFIGS[name]
    workers = WorkerSet(policy_class=algorithm.policy_class, config=config)
    model = workers.local_worker().get_policy().model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    it = algorithm.plan(workers, config)
    try:
        results = [next(it) for _ in range(3)]
        assert results[-1]["info"]["num_steps_trained"] >= 100
        stats = results[-1]["info"]["learner"]["default_policy"]["learner_stats"]
        assert stats and all(np.isfinite(v) for v in stats.values() if isinstance(v, float))
        moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
        assert "rnn.weight_hh_l0" in moved and "pi_head.weight" in moved  # the recurrent weights learn too
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
        workers.stop()


def test_the_multi_device_learner_is_refused_for_every_recurrent_algorithm() -> None:
    for config_class in (A2CConfig, IMPALAConfig, APPOConfig):
        with pytest.raises(ValueError, match="keep sequences whole: num_gpus=2"):
            config_class(model=LSTM, num_gpus=2, fake_gpus=True)


# -- learning (the stateless CartPole preset: `flowrl train impala --env flowrl/StatelessCartPole-v1 --tuned`) ---
def preset_config(seed: int) -> IMPALAConfig:
    from flowrl._cli_config import build_config
    from flowrl.presets import find_preset

    preset = find_preset("impala", STATELESS_CARTPOLE)
    assert preset is not None
    config: IMPALAConfig = build_config(IMPALAConfig, preset.items([f"seed={seed}", f"env={STATELESS_CARTPOLE}"]))
    return config


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", [101, 202, 303])
def test_impala_with_memory_reaches_150_within_500k_steps(seed: int) -> None:
    """The R2-4 gate on CartPole without velocities: the preset's IMPALA+LSTM reaches a smoothed return of 150
    within 500k env steps (seeds 1-4, used to choose the preset, took 154k-274k)."""
    from .test_pg import train_until

    result, seconds = train_until(IMPALAPolicy, preset_config(seed), impala_plan, target=150, max_steps=500_000)
    print(f"IMPALA+LSTM seed {seed}: return {result['episode_reward_mean']:.1f} after {result['timesteps_total']} "
          f"steps, {seconds:.0f} s")
    assert result["episode_reward_mean"] >= 150 and result["timesteps_total"] <= 500_000
