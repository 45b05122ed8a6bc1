"""ES and ARS: the noise table, the perturbed forward pass, the operators, both plans, what crosses the wire,
checkpoints, and the errors a bad config gets at build time. Their learning gates are in
tests/algorithms/test_defaults_learn.py (slow tier)."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from flowrl.algorithms.ars import ARSConfig, ARSGradient, ARSPolicy
from flowrl.algorithms.ars import plan as ars_plan
from flowrl.algorithms.es import ESConfig, ESPolicy, es_gradient
from flowrl.algorithms.es import plan as es_plan
from flowrl.config import ModelConfig, PolicySpec
from flowrl.envs import MultiAgentCartPole
from flowrl.evolution import Evaluations, NoiseTable, PerturbationWorker, PerturbedMLP
from flowrl.testing import iter_list
from flowrl.models import ActorModel
from flowrl.ops.evolution import CollectEvaluations, centered_ranks
from flowrl.testing import plan_lines
from flowrl.trainer import Trainer
from flowrl.workers import WorkerSet

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

SMALL = {"noise_size": 100_000, "seed": 0}


# -- the noise table ------------------------------------------------------------------------------

def test_the_table_is_seeded_and_a_slice_is_a_view() -> None:
    a, b = NoiseTable(1000, seed=3), NoiseTable(1000, seed=3)
    np.testing.assert_array_equal(a.noise, b.noise)
    assert not np.array_equal(a.noise, NoiseTable(1000, seed=4).noise)
    assert a.get(5, 10).base is a.noise and a.noise.dtype == np.float32
    rng = np.random.default_rng(0)
    assert all(0 <= a.sample_index(rng, 990) <= 10 for _ in range(100))


@pytest.mark.on_ray
def test_a_pickled_table_is_a_reference_not_its_draws() -> None:
    table = NoiseTable(1_000_000, seed=0)
    payload = pickle.dumps(table)
    assert len(payload) < 10_000 < table.noise.nbytes  # the 4 MB of draws went to the object store once
    copy = pickle.loads(payload)
    np.testing.assert_array_equal(copy.get(123, 50), table.get(123, 50))
    assert len(pickle.dumps(table)) == len(payload)  # put once, not per pickling


def test_the_weighted_sum_equals_the_sum_of_slices() -> None:
    table = NoiseTable(5000, seed=1)
    indices = np.arange(0, 1200, 1)
    weights = np.linspace(-1, 1, len(indices))
    expected = sum(w * table.get(int(i), 7).astype(np.float64) for w, i in zip(weights, indices))
    np.testing.assert_allclose(table.weighted_sum(weights, indices, 7), expected, rtol=1e-9, atol=1e-9)


# -- the perturbed forward pass -------------------------------------------------------------------

@pytest.mark.parametrize("hidden,activation", [((), "tanh"), ((8,), "relu"), ((16, 8), "tanh"), ((4, 4), "elu")])
def test_each_row_acts_with_its_own_parameters_as_the_torch_model_would(hidden: tuple[int, ...],
                                                                       activation: str) -> None:
    torch.manual_seed(0)
    model = ActorModel(gym.spaces.Box(-1, 1, (5,)), 3, ModelConfig(hidden_sizes=hidden, activation=activation))
    forward = PerturbedMLP(model)
    theta = nn.utils.parameters_to_vector(model.parameters()).detach().numpy()
    assert forward.num_params == len(theta)
    rng = np.random.default_rng(0)
    params = np.stack([theta + 0.1 * rng.standard_normal(len(theta)).astype(np.float32) for _ in range(4)])
    obs = rng.standard_normal((4, 5)).astype(np.float32)
    out = forward.forward(obs, params)
    for row in range(4):
        nn.utils.vector_to_parameters(torch.as_tensor(params[row]), model.parameters())
        np.testing.assert_allclose(out[row], model(torch.as_tensor(obs[row:row + 1]))[0].detach().numpy(),
                                   rtol=1e-5, atol=1e-5)


# -- the operators --------------------------------------------------------------------------------

@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=40))
def test_centred_ranks_keep_the_order_span_minus_half_to_half_and_sum_to_zero(values: list[float]) -> None:
    x = np.array(values)
    ranks = centered_ranks(x)
    assert ranks.min() == -0.5 and ranks.max() == 0.5
    assert abs(ranks.sum()) < 1e-9
    order = np.argsort(x, kind="stable")
    assert np.all(np.diff(ranks[order]) > 0)


def test_collect_emits_once_both_minimums_are_held_in_arrival_order() -> None:
    rounds = [Evaluations(np.array([i, i + 100]), np.full((2, 2), float(i)), np.ones((2, 2), np.int64), 10 * (i + 1), 0)
              for i in range(6)]
    out = list(iter_list(rounds).combine(CollectEvaluations(min_episodes=4, min_steps=50)))
    # rounds hold 4 episodes and 10, 20, ... 60 steps: 10 + 20 + 30 reach 50 steps, then 40 + 50, then 60 alone
    assert [e.noise_indices.tolist() for e in out] == [[0, 100, 1, 101, 2, 102], [3, 103, 4, 104], [5, 105]]
    assert [e.num_steps for e in out] == [60, 90, 60]


def test_ars_uses_the_best_directions_by_their_better_return() -> None:
    table = NoiseTable(100, seed=0)
    returns = np.array([[1.0, 9.0], [3.0, 2.0], [0.0, 0.5], [8.0, 1.0]])
    evals = Evaluations(np.array([0, 10, 20, 30]), returns, np.ones((4, 2), np.int64), 8, 0)
    g, stats = ARSGradient(2)(evals, table, np.zeros(4, np.float32))
    used = returns[[0, 3]]  # max 9 and 8
    expected = -((1.0 - 9.0) * table.get(0, 4) + (8.0 - 1.0) * table.get(30, 4)) / (2 * used.std())
    np.testing.assert_allclose(g, expected, rtol=1e-5)
    assert stats["return_std"] == pytest.approx(used.std())


def test_es_moves_theta_towards_the_better_perturbation() -> None:
    table = NoiseTable(1000, seed=0)
    evals = Evaluations(np.array([7]), np.array([[10.0, 0.0]]), np.ones((1, 2), np.int64), 2, 0)
    g, _ = es_gradient(evals, table, np.zeros(6, np.float32))
    assert float(-g @ table.get(7, 6)) > 0  # the step (-g) points along +eps, whose return was higher


# -- plans, workers and the wire ------------------------------------------------------------------

@pytest.mark.parametrize("name,config", [("es", ESConfig(num_workers=2, episodes_per_batch=8, train_batch_size=50,
                                                          **SMALL)),
                                         ("ars", ARSConfig(num_workers=2, num_rollouts=4, rollouts_used=2, **SMALL))])
def test_both_plans_train_report_and_count_their_env_steps(name: str, config: ESConfig | ARSConfig) -> None:
    trainer = Trainer(name, config)
    try:
        before = trainer.get_policy().flat_weights()  # type: ignore[attr-defined]
        first, second = trainer.train(), trainer.train()
        stats = second["info"]["learner"]["default_policy"]["learner_stats"]
        assert second["timesteps_total"] > first["timesteps_total"] >= 1000  # a report spans 1000 env steps
        assert stats["num_pairs"] >= config.pairs_per_iteration and stats["update_ratio"] > 0
        assert not np.array_equal(before, trainer.get_policy().flat_weights())  # type: ignore[attr-defined]
        assert second["info"]["num_steps_trained"] == second["timesteps_total"]  # every evaluated step is used
        assert "episode_reward_mean" in second  # unperturbed episodes
        assert "ParallelEvaluations" in repr(trainer.plan)
    finally:
        trainer.stop()


@pytest.mark.on_ray
def test_ray_workers_read_the_drivers_table_from_the_object_store() -> None:
    trainer = Trainer("es", ESConfig(num_workers=2, episodes_per_batch=4, train_batch_size=20, noise_size=100_000,
                                     seed=0))
    try:
        result = trainer.train()
        assert result["info"]["learner"]["default_policy"]["learner_stats"]["num_pairs"] >= 2
        first = trainer.workers.remote_workers()[0]
        from flowrl import executor
        sums = executor.get(first.apply.remote(lambda w: float(w.noise.noise[:1000].sum())))
        assert sums == pytest.approx(float(trainer.owned_state["noise"].noise[:1000].sum()))
    finally:
        trainer.stop()


def test_the_plans_read_like_the_paper_and_fit_their_limit() -> None:
    workers = WorkerSet(policy_class=ESPolicy, config=ESConfig(num_workers=0, **SMALL), worker_class=PerturbationWorker)
    try:
        it = es_plan(workers, ESConfig(num_workers=0, **SMALL), NoiseTable(100_000, 0))
        assert repr(it).startswith("LocalIterator[ParallelEvaluations.combine(CollectEvaluations(50 episodes, 1000 "
                                   "steps)).for_each(ApplyEvolutionUpdate(es_gradient))")
    finally:
        workers.stop()
    assert plan_lines(es_plan) <= 25 and plan_lines(ars_plan) <= 25


def test_a_round_sends_offsets_and_returns_whose_size_does_not_grow_with_the_model() -> None:
    sizes = []
    for hidden in ((8,), (256, 256)):
        config = ESConfig(num_workers=0, model=ModelConfig(hidden_sizes=hidden), **SMALL)
        worker = PerturbationWorker(policy_class=ESPolicy, config=config)
        worker.set_noise(NoiseTable(100_000, 0))
        evaluations = worker.evaluate(num_pairs=4)
        assert evaluations.count == 4 and evaluations.returns.shape == (4, 2) and (evaluations.lengths > 0).all()
        assert evaluations.num_steps >= evaluations.lengths.sum()
        sizes.append(len(pickle.dumps(evaluations)))
    assert sizes[0] == sizes[1] < 1000  # 58 parameters or 67,586: the same bytes


def test_each_pair_runs_plus_and_minus_its_own_slice_and_free_envs_run_theta(monkeypatch: pytest.MonkeyPatch) -> None:
    config = ESConfig(num_workers=0, num_envs_per_worker=3, eval_prob=0.2, noise_stdev=0.5, **SMALL)
    worker = PerturbationWorker(policy_class=ESPolicy, config=config)
    worker.set_noise(NoiseTable(100_000, 0))
    seen: list[np.ndarray] = []
    forward = worker.perturbed.forward
    monkeypatch.setattr(worker.perturbed, "forward", lambda obs, params: (seen.append(params.copy()), forward(obs, params))[1])
    evaluations = worker.evaluate(num_pairs=5)
    theta = worker.policy.flat_weights()
    eps = [worker.noise.get(int(i), len(theta)) for i in evaluations.noise_indices]  # type: ignore[union-attr]
    used = {(k, sign) for params in seen for row in params for k in range(5) for sign in (1, -1)
            if np.allclose(row, theta + sign * 0.5 * eps[k], atol=1e-6)}
    assert used == {(k, sign) for k in range(5) for sign in (1, -1)}  # every pair, both signs
    rows = [row for params in seen for row in params]
    assert all(np.allclose(row, theta, atol=1e-6) or any(np.allclose(row, theta + s * 0.5 * e, atol=1e-6)
                                                         for e in eps for s in (1, -1)) for row in rows)


def test_unperturbed_episodes_are_the_workers_episode_statistics_and_every_step_counts() -> None:
    config = ESConfig(num_workers=0, eval_prob=0.5, **SMALL)  # one env: no episode is left unfinished
    worker = PerturbationWorker(policy_class=ESPolicy, config=config)
    worker.set_noise(NoiseTable(100_000, 0))
    evaluations = worker.evaluate(num_pairs=6)
    episodes = worker.get_metrics()
    assert episodes and all(ep.episode_length > 0 for ep in episodes)  # about 6 with eval_prob 0.5
    assert evaluations.num_steps == evaluations.lengths.sum() + sum(ep.episode_length for ep in episodes)
    with pytest.raises(ValueError, match="eval_prob=1.0 must be"):
        ESConfig(eval_prob=1.0)  # no perturbation would ever be handed out


def test_a_nan_update_is_skipped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    policy = ARSPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), ARSConfig(seed=0))
    before = policy.flat_weights()
    with caplog.at_level(logging.WARNING, logger="flowrl.policy"):
        policy.apply_flat_gradient(np.full(policy.num_params, np.nan, np.float32))
    np.testing.assert_array_equal(policy.flat_weights(), before)
    assert policy.num_nonfinite_updates_skipped == 1 and policy.weights_version == 0
    policy.apply_flat_gradient(np.ones(policy.num_params, np.float32))
    assert policy.weights_version == 1 and np.all(policy.flat_weights() < before)


# -- checkpoints ----------------------------------------------------------------------------------

def test_a_checkpoint_restores_theta_the_optimizer_and_the_filter(tmp_path: Path) -> None:
    config = ESConfig(num_workers=1, episodes_per_batch=4, train_batch_size=20, **SMALL)
    trainer = Trainer("es", config)
    try:
        trainer.train()
        path = trainer.save(tmp_path)
        state = trainer.get_policy().get_state()
        theta = trainer.get_policy().flat_weights()  # type: ignore[attr-defined]
        trainer.train()
    finally:
        trainer.stop()
    restored = Trainer.from_checkpoint(path)
    try:
        policy = restored.get_policy()
        np.testing.assert_array_equal(policy.flat_weights(), theta)  # type: ignore[attr-defined]
        assert policy.optimizer.state_dict()["state"][0]["step"] == state["optimizer"]["state"][0]["step"] > 0
        result = restored.train()
        assert result["training_iteration"] == 2
    finally:
        restored.stop()


# -- errors at build time -------------------------------------------------------------------------

def test_a_noise_table_smaller_than_the_model_is_refused_when_the_trainer_is_built() -> None:
    with pytest.raises(ValueError, match=r"ESConfig noise_size=1000 is smaller than the policy's 4610 parameters.*"
                                         r"set noise_size to at least 46100"):
        Trainer("es", ESConfig(num_workers=0, noise_size=1000, seed=0))


def test_image_models_and_multi_agent_configs_are_refused() -> None:
    with pytest.raises(ValueError, match="model: ES and ARS perturb MLP policies"):
        ESConfig(model=ModelConfig(conv_filters=((16, 4, 2),)))
    with pytest.raises(ValueError, match="policies: ES and ARS train one policy"):
        ARSConfig(env=MultiAgentCartPole, policies={"a": PolicySpec()})
    with pytest.raises(ValueError, match="rollouts_used=9 must be <= num_rollouts=8"):
        ARSConfig(num_rollouts=8, rollouts_used=9)
    with pytest.raises(ValueError, match="EvolutionPolicy needs a Box observation space|ESPolicy needs a Box"):
        ESPolicy(gym.spaces.Discrete(3), gym.spaces.Discrete(2), ESConfig())


def test_evaluation_during_training_runs_the_deterministic_policy() -> None:
    config = ARSConfig(num_workers=0, num_rollouts=2, rollouts_used=1, evaluation_interval=1, evaluation_duration=2,
                       **SMALL)
    trainer = Trainer("ars", config)
    try:
        result = trainer.train()
        assert result["evaluation"]["episodes_this_iter"] == 2
    finally:
        trainer.stop()
