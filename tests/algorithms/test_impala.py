"""IMPALA: config, the V-trace loss over a concatenated train batch, the plan against fake
workers (shape, line count, learner thread stopped on close), tree aggregation (fresh-step counting, per-group
gathering, weights to every worker, aggregators killed on close, validation), and learning checks on CartPole."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrl import executor
from flowrl.algorithms import get_algorithm, impala
from flowrl.algorithms.impala import ALGORITHM, IMPALAConfig, IMPALAPolicy, PieceMinibatches, plan, sequence_layout
from flowrl.algorithms.vtrace import vtrace
from flowrl.config import PolicySpec
from flowrl.envs import MultiAgentCartPole
from flowrl.metrics import AGENT_STEPS_SAMPLED_COUNTER, STEPS_SAMPLED_COUNTER
from flowrl.ops import BroadcastUpdateLearnerWeights, make_aggregators
from flowrl.sample_batch import (ACTIONS, DEFAULT_POLICY_ID, ENV_ID, EPS_ID, LOGP, NEXT_OBS, OBS, REWARDS,
                                 TERMINATEDS, TRUNCATEDS, T, AnyBatch, SampleBatch)
from flowrl.testing import SAMPLE_INDEX, WEIGHTS_VERSION, WORKER_INDEX, make_fake_workers, plan_lines
from flowrl.trainer import Trainer
from flowrl.workers import WorkerSet

from .test_ppo import assert_plan_trains_gaussian_actions, pendulum_config

pytestmark = pytest.mark.usefixtures("local_executor")  # plans, not Ray (conftest.py); learner-thread tests: on_ray

# -- config -----------------------------------------------------------------------------------------


def test_config_has_impala_defaults() -> None:
    c = IMPALAConfig()
    assert (c.rollout_fragment_length, c.train_batch_size, c.timesteps_per_iteration, c.min_iter_time_s,
            c.num_workers, c.num_gpus) == (50, 500, 1000, 0, 2, 0)
    assert (c.num_multi_gpu_tower_stacks, c.minibatch_buffer_size, c.num_sgd_iter, c.replay_proportion,
            c.replay_buffer_num_slots) == (1, 1, 1, 0.0, 0)
    assert (c.learner_queue_size, c.learner_queue_timeout, c.max_sample_requests_in_flight_per_worker,
            c.broadcast_interval, c.num_aggregation_workers, c.after_train_step) == (16, 300, 2, 1, 0, None)
    assert (c.vtrace_clip_rho_threshold, c.vtrace_clip_pg_rho_threshold, c.vf_loss_coeff, c.entropy_coeff,
            c.grad_clip, c.lr, c.vtrace_lambda) == (1.0, 1.0, 0.5, 0.01, 40.0, 5e-4, 1.0)
    assert c.batch_mode == "truncate_episodes" and c.use_simple_optimizer


@pytest.mark.parametrize("settings, message", [
    ({"batch_mode": "complete_episodes"}, "batch_mode='complete_episodes': V-trace learns from fragments; "
                                          "use batch_mode='truncate_episodes'"),
    ({"num_aggregation_workers": 3}, "num_aggregation_workers=3 exceeds num_workers=2"),
    ({"num_aggregation_workers": 1, "num_workers": 0}, "num_aggregation_workers=1 with num_workers=0: tree "
                                                       "aggregation gathers remote rollout workers and there are "
                                                       "none; set num_workers >= 1 or num_aggregation_workers=0"),
    ({"num_aggregation_workers": -1}, "num_aggregation_workers=-1 must be an int >= 0"),
    ({"replay_proportion": 0.5}, "replay_proportion=0.5 needs stored fragments, but replay_buffer_num_slots=0"),
    ({"replay_proportion": -1.0}, "replay_proportion=-1.0 must be a number >= 0 (expected replays per fragment)"),
    ({"learner_queue_size": 0}, "learner_queue_size=0 must be an int >= 1"),
    ({"max_sample_requests_in_flight_per_worker": 0}, "max_sample_requests_in_flight_per_worker=0 must be an "
                                                      "int >= 1 (sample requests outstanding per worker)"),
    ({"broadcast_interval": 0}, "broadcast_interval=0 must be an int >= 1"),
    ({"learner_queue_timeout": 0}, "learner_queue_timeout=0 must be a number > 0 (seconds"),
    ({"vtrace_clip_rho_threshold": 0.0}, "vtrace_clip_rho_threshold=0.0 must be a number > 0 (1.0 is the paper's "
                                         "choice)"),
    ({"entropy_coeff": -0.1}, "entropy_coeff=-0.1 must be a number >= 0"),
    ({"vtrace_lambda": 1.5}, "vtrace_lambda=1.5 must be a number in [0, 1] (1.0: the paper's V-trace, 0.95: "
                             "GAE-like traces)"),
    ({"sgd_minibatch_size": -1}, "sgd_minibatch_size=-1 must be an int >= 0 (0: each pass learns on the whole "
                                 "train batch)"),
    ({"sgd_minibatch_size": 64, "simple_optimizer": False}, "sgd_minibatch_size=64 cuts train batches in the "
                                                            "single-device learner, but num_gpus=0 with "
                                                            "simple_optimizer=False asks for the multi-device one; "
                                                            "set simple_optimizer=True or sgd_minibatch_size=0"),
    ({"sgd_minibatch_size": 64, "env": MultiAgentCartPole, "policies": {"a": PolicySpec()}},
     "sgd_minibatch_size=64 cuts single-policy train batches, and this config has policies=['a']; set "
     "sgd_minibatch_size=0"),
])
def test_config_validation_names_field_value_and_fix(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        IMPALAConfig(**settings)


def test_replay_and_a_larger_multi_gpu_buffer_are_accepted() -> None:
    assert IMPALAConfig(replay_proportion=0.5, replay_buffer_num_slots=10).replay_proportion == 0.5
    assert IMPALAConfig(num_workers=0).num_workers == 0  # sampling in the driver is allowed
    with pytest.warns(UserWarning, match="minibatch_buffer_size=4 exceeds num_multi_gpu_tower_stacks=2"):
        c = IMPALAConfig(simple_optimizer=False, minibatch_buffer_size=4, num_multi_gpu_tower_stacks=2)
    assert (c.minibatch_buffer_size, c.effective_minibatch_buffer_size) == (4, 2)


def test_registered_under_impala() -> None:
    assert get_algorithm("impala") is ALGORITHM
    assert (ALGORITHM.config_class, ALGORITHM.policy_class, ALGORITHM.plan) == (IMPALAConfig, IMPALAPolicy, plan)


# -- V-trace over a concatenated train batch ----------------------------------------------------------

def _piece(rng: np.random.Generator, eps_id: int, env_id: int, t0: int, n: int, terminated: bool = False,
           truncated: bool = False) -> SampleBatch:
    done = np.zeros(n, bool)
    return SampleBatch({OBS: rng.normal(size=(n, 4)).astype(np.float32),
                        NEXT_OBS: rng.normal(size=(n, 4)).astype(np.float32),
                        ACTIONS: rng.integers(0, 2, n), LOGP: np.log(rng.uniform(0.2, 0.8, n)).astype(np.float32),
                        REWARDS: rng.normal(size=n).astype(np.float32),
                        TERMINATEDS: np.concatenate([done[:-1], [terminated]]),
                        TRUNCATEDS: np.concatenate([done[:-1], [truncated]]),
                        EPS_ID: np.full(n, eps_id), ENV_ID: np.full(n, env_id), T: np.arange(t0, t0 + n)})


def _pieces(rng: np.random.Generator) -> list[SampleBatch]:
    """Fragments of two workers' envs as ConcatBatches joins them: episodes ending by termination, by
    truncation and by the fragment's cut; a same-episode continuation; and a replayed copy right after its
    original (same eps_id, but t jumps back)."""
    a = _piece(rng, 7, 0, 0, 5, terminated=True)
    return [a, _piece(rng, 10**9 + 3, 0, 12, 4), _piece(rng, 8, 0, 0, 6, truncated=True),
            _piece(rng, 10**9 + 3, 1, 16, 3), _piece(rng, 10**9 + 4, 1, 0, 2), a.copy(), _piece(rng, 9, 0, 0, 1)]


def test_sequence_layout_cuts_at_episode_env_and_time_boundaries() -> None:
    pieces = _pieces(np.random.default_rng(0))
    batch = SampleBatch.concat(pieces)
    tensors = {k: torch.as_tensor(v) for k, v in batch.items()}
    time_index, piece_index, last_rows, L, P = sequence_layout(tensors)
    lengths = [p.count for p in pieces]
    assert (L, P) == (max(lengths), len(pieces))
    assert last_rows.tolist() == (np.cumsum(lengths) - 1).tolist()
    assert piece_index.tolist() == [i for i, n in enumerate(lengths) for _ in range(n)]
    assert time_index.tolist() == [L - n + j for n in lengths for j in range(n)]  # left-padded: all end at L - 1


@pytest.mark.parametrize("lam", [1.0, 0.9])
def test_policy_targets_equal_vtrace_run_on_each_piece_alone(lam: float) -> None:
    rng = np.random.default_rng(1)
    policy = IMPALAPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2),
                          IMPALAConfig(seed=0, gamma=0.9, vtrace_clip_rho_threshold=0.8, vtrace_lambda=lam))
    pieces = _pieces(rng)
    tensors = policy.to_tensors(SampleBatch.concat(pieces))
    logp = torch.log(torch.as_tensor(rng.uniform(0.2, 0.8, tensors[REWARDS].shape[0]), dtype=torch.float32))
    values = torch.as_tensor(rng.normal(size=tensors[REWARDS].shape[0]), dtype=torch.float32)
    got = policy.vtrace_targets(tensors, logp, values)
    start = 0
    for piece in pieces:
        rows = slice(start, start + piece.count)
        start += piece.count
        p = {k: torch.as_tensor(v) for k, v in piece.items()}
        with torch.no_grad():
            bootstrap = policy.model(p[NEXT_OBS][-1:])[1]  # V(x') of the piece's last row
        discounts = 0.9 * (1.0 - p[TERMINATEDS].float())
        expected = vtrace(behaviour_logp=p[LOGP][:, None], target_logp=logp[rows, None], rewards=p[REWARDS][:, None],
                          values=values[rows, None], bootstrap_value=bootstrap, discounts=discounts[:, None],
                          clip_rho_threshold=0.8, clip_pg_rho_threshold=1.0, lambda_=lam)
        torch.testing.assert_close(got.vs[rows], expected.vs[:, 0])
        torch.testing.assert_close(got.pg_advantages[rows], expected.pg_advantages[:, 0])
    assert start == tensors[REWARDS].shape[0]


def test_normalize_advantages_standardises_the_policy_gradients_weights_only() -> None:
    batch = SampleBatch.concat(_pieces(np.random.default_rng(3)))
    losses = {}
    for normalize in (False, True):
        policy = IMPALAPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2),
                              IMPALAConfig(seed=0, normalize_advantages=normalize))
        tensors = policy.to_tensors(batch)
        dist_inputs, values = policy.forward_rows(tensors)
        logp = policy.action_distribution(dist_inputs).logp(tensors[ACTIONS]).detach()
        targets = policy.vtrace_targets(tensors, logp, values.detach())
        adv = policy.policy_advantages(targets)
        if normalize:
            raw = targets.pg_advantages
            torch.testing.assert_close(adv, (raw - raw.mean()) / (raw.std() + 1e-8))
            assert abs(float(adv.mean())) < 1e-5 and float(adv.std()) == pytest.approx(1.0, abs=1e-4)
        else:
            assert adv is targets.pg_advantages
        losses[normalize] = policy.loss(tensors)[1]
    assert losses[True]["vf_loss"] == pytest.approx(losses[False]["vf_loss"])  # the value targets are V-trace's
    assert losses[True]["policy_loss"] != pytest.approx(losses[False]["policy_loss"])
    with pytest.raises(TypeError, match="normalize_advantages=1 must be a bool"):
        IMPALAConfig(normalize_advantages=1)  # type: ignore[arg-type]


def test_policy_learns_on_a_concatenated_batch_and_needs_its_config() -> None:
    policy = IMPALAPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), IMPALAConfig(seed=0))
    stats = policy.learn_on_batch(SampleBatch.concat(_pieces(np.random.default_rng(2))))["learner_stats"]
    assert sorted(stats) == ["entropy", "grad_gnorm", "loss", "mean_rho", "policy_loss", "vf_loss"]
    assert all(np.isfinite(v) for v in stats.values())
    from flowrl.algorithms.a2c import A2CConfig
    with pytest.raises(TypeError, match="IMPALAPolicy needs an IMPALAConfig"):
        IMPALAPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), A2CConfig())


# -- minibatches of whole pieces ----------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=12), size=st.integers(1, 40),
       seed=st.integers(0, 2**16))
def test_piece_minibatches_keep_pieces_whole_and_learn_every_row_once(lengths: list[int], size: int,
                                                                       seed: int) -> None:
    total = sum(lengths)
    batch = SampleBatch({REWARDS: np.arange(total, dtype=np.float32),  # the row's number
                         EPS_ID: np.repeat(np.arange(len(lengths)), lengths),
                         T: np.concatenate([np.arange(n) for n in lengths])})
    parts = PieceMinibatches(size, seed=seed)(batch)
    rows = np.concatenate([p[REWARDS] for p in parts]).astype(int)
    assert sorted(rows.tolist()) == list(range(total))  # every row exactly once
    if total <= size:
        assert parts == [batch]
    for i, part in enumerate(parts):
        ids = part[EPS_ID]
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        assert len(starts) == len(set(ids.tolist()))  # a piece's rows sit together ...
        for start, eps in zip(starts, ids[starts]):
            n = lengths[eps]
            assert part[T][start:start + n].tolist() == list(range(n))  # ... whole and in time order
        if i < len(parts) - 1:  # pieces are taken until the minibatch holds at least `size` rows, no more
            assert part.count >= size and part.count - lengths[ids[-1]] < size


def test_piece_minibatches_draw_a_new_order_per_call_from_one_seed() -> None:
    batch = SampleBatch({REWARDS: np.zeros(10, np.float32), EPS_ID: np.arange(10), T: np.zeros(10, np.int64)})
    orders = [[p[EPS_ID].tolist() for p in PieceMinibatches(2, seed=5)(batch)] for _ in range(2)]
    assert orders[0] == orders[1]  # seeded
    cut = PieceMinibatches(2, seed=5)
    assert [p[EPS_ID].tolist() for p in cut(batch)] != [p[EPS_ID].tolist() for p in cut(batch)]
    with pytest.raises(TypeError, match="PieceMinibatches cuts a SampleBatch, got MultiAgentBatch"):
        cut(batch.as_multi_agent())
    with pytest.raises(ValueError, match="PieceMinibatches size"):
        PieceMinibatches(0)


def test_vtrace_targets_of_a_minibatch_equal_the_whole_batchs_at_its_rows() -> None:
    """Minibatches of whole pieces change nothing V-trace computes: each piece's targets are its own."""
    rng = np.random.default_rng(4)
    policy = IMPALAPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2),
                          IMPALAConfig(seed=0, gamma=0.9, vtrace_lambda=0.95))
    batch = SampleBatch.concat(_pieces(rng))
    full = policy.to_tensors(batch)
    logp = torch.log(torch.as_tensor(rng.uniform(0.2, 0.8, batch.count), dtype=torch.float32))
    values = torch.as_tensor(rng.normal(size=batch.count), dtype=torch.float32)
    expected = policy.vtrace_targets(full, logp, values)
    parts = PieceMinibatches(6, seed=1)(batch)
    assert len(parts) > 2
    for part in parts:
        rows = [int(np.flatnonzero((batch[OBS] == o).all(axis=1))[0]) for o in part[OBS]]
        got = policy.vtrace_targets(policy.to_tensors(part), logp[rows], values[rows])
        torch.testing.assert_close(got.vs, expected.vs[rows])
        torch.testing.assert_close(got.pg_advantages, expected.pg_advantages[rows])


@pytest.mark.parametrize("size", [0, 40])
def test_plan_learns_on_minibatches_of_each_train_batch(size: int) -> None:
    config = IMPALAConfig(env="CartPole-v1", seed=0, num_workers=0, rollout_fragment_length=50,
                          train_batch_size=100, timesteps_per_iteration=0, num_sgd_iter=2, sgd_minibatch_size=size)
    workers = WorkerSet(policy_class=IMPALAPolicy, config=config)
    it = plan(workers, config)
    try:
        results = it.take(12)
    finally:
        it.close()
        workers.stop()
    info = results[-1]["info"]
    trained, updates = info["num_steps_trained"], info["num_learner_updates"]
    # without minibatches every update learns on a whole 100-row batch; with them, on 40-99 rows
    assert trained == 100 * updates if size == 0 else 40 * updates <= trained < 100 * updates
    assert np.isfinite(info["learner"][DEFAULT_POLICY_ID]["learner_stats"]["loss"])


# -- the plan -----------------------------------------------------------------------------------------

def _learner_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("flowrl-learner") and t.is_alive()]


@pytest.mark.on_ray
def test_plan_shape_and_the_learner_stops_when_the_plan_is_closed() -> None:
    workers = make_fake_workers(2, rollout_fragment_length=10)
    before = set(_learner_threads())
    try:
        it = plan(workers, IMPALAConfig(train_batch_size=20, timesteps_per_iteration=0, learner_queue_size=2))
        try:
            assert repr(it) == (
                "LocalIterator[Concurrently(async, output_indexes=[1])[LocalIterator[ParallelRollouts(async)"
                ".zip_with_source_actor().for_each(BroadcastUpdateLearnerWeights(1))"
                ".combine(MixInReplay(0, 0.0)).combine(ConcatBatches(20)).for_each(Enqueue(maxsize=2))], "
                "LocalIterator[Dequeue.for_each(RecordLearnerOutput)]].filter(ReportGate(0 steps, 0 s))"
                ".for_each(CollectMetrics).for_each()]")
            (learner,) = set(_learner_threads()) - before
            results = [next(it) for _ in range(5)]
            assert results[-1]["info"]["num_steps_trained"] == 100  # one report per learner update, from its queue
            assert results[-1]["info"]["num_learner_updates"] == 5
            assert "learner_queue" in results[-1]["info"] and "timing_breakdown" in results[-1]["info"]
        finally:
            it.close()
        assert not learner.is_alive()  # close() stopped and joined it
    finally:
        workers.stop()


def test_plan_fits_in_40_lines() -> None:
    assert plan_lines(plan) <= 40, plan_lines(plan)


def test_after_train_step_sees_each_learner_output() -> None:
    seen: list[Any] = []

    def after_train_step(workers: Any, config: Any) -> Any:
        def stage(info: Any) -> Any:
            seen.append(info)
            return info
        return stage

    workers = make_fake_workers(1, rollout_fragment_length=10)
    it = plan(workers, IMPALAConfig(train_batch_size=10, timesteps_per_iteration=0, after_train_step=after_train_step))
    try:
        it.take(3)
        assert len(seen) == 3 and all("default_policy" in info for info in seen)
    finally:
        it.close()
        workers.stop()


@pytest.mark.on_ray
def test_trainer_runs_impala_and_stop_ends_the_learner() -> None:
    before = set(_learner_threads())
    trainer = Trainer("impala", IMPALAConfig(env="CartPole-v1", seed=0, num_workers=1, num_cpus_per_worker=0.5,
                                             timesteps_per_iteration=0, train_batch_size=100))
    try:
        result = trainer.train()
        assert result["info"]["num_steps_trained"] >= 100
        assert result["info"]["learner"]["default_policy"]["learner_stats"]["mean_rho"] > 0
        (learner,) = set(_learner_threads()) - before
    finally:
        trainer.stop()
    assert not learner.is_alive()


# -- tree aggregation ----------------------------------------------------------------------------------

AGG_FRAGMENT, AGG_BATCH = 10, 20


def _alive(actor: Any) -> bool:
    try:
        executor.get(actor.ping.remote(), timeout=30)
        return True
    except ray.exceptions.RayActorError:
        return False


def _dies(actor: Any, timeout_s: float = 30.0) -> bool:
    """Whether ``actor`` is dead or dies within ``timeout_s`` (``ray.kill`` takes effect asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(actor):
            return True
    return False


def _record_aggregation(monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[Any, AnyBatch]], list[Any]]:
    """Patches the plan's module: the aggregators it starts are recorded, and so is every ``(aggregator,
    train_batch)`` that reaches the (real) BroadcastUpdateLearnerWeights, i.e. right after CountFreshSteps."""
    seen: list[tuple[Any, AnyBatch]] = []
    made: list[Any] = []

    class RecordingBroadcast(BroadcastUpdateLearnerWeights):
        def __call__(self, item: tuple[Any, AnyBatch]) -> AnyBatch:
            seen.append(item)
            return super().__call__(item)

    def recording_make_aggregators(*args: Any, **kwargs: Any) -> list[Any]:
        made.extend(make_aggregators(*args, **kwargs))
        return list(made)

    monkeypatch.setattr(impala, "BroadcastUpdateLearnerWeights", RecordingBroadcast)
    monkeypatch.setattr(impala, "make_aggregators", recording_make_aggregators)
    return seen, made


def test_tree_aggregation_counts_fresh_steps_keeps_groups_apart_and_syncs_every_worker(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen, made = _record_aggregation(monkeypatch)
    workers = make_fake_workers(4, rollout_fragment_length=AGG_FRAGMENT)
    # replay_proportion=1: exactly one replayed fragment per fresh one, so each train batch is half replayed
    config = IMPALAConfig(num_workers=4, num_aggregation_workers=2, train_batch_size=AGG_BATCH,
                          timesteps_per_iteration=0, replay_proportion=1.0, replay_buffer_num_slots=4,
                          broadcast_interval=4, seed=0)
    remotes = workers.remote_workers()
    try:
        it = plan(workers, config)
        try:
            assert repr(it) == (
                "LocalIterator[Concurrently(async, output_indexes=[1])[LocalIterator[ParallelIterator[Aggregators[2]]"
                ".gather_async().zip_with_source_actor().for_each(CountFreshSteps)"
                ".for_each(BroadcastUpdateLearnerWeights(4)).for_each(Enqueue(maxsize=16))], "
                "LocalIterator[Dequeue.for_each(RecordLearnerOutput)]].filter(ReportGate(0 steps, 0 s))"
                ".for_each(CollectMetrics).for_each()]")
            assert len(made) == 2
            for _ in range(100):  # until every worker got learned weights from its aggregator and sampled with them
                result = next(it)
                records = executor.get([w.get_record.remote() for w in remotes])
                pushed = [[sent[DEFAULT_POLICY_ID] for sent, global_vars in r["set_weights_calls"]
                           if global_vars is not None] for r in records]  # the initial syncs carry no global vars
                sampled_with_new = {int(w) for _, b in seen for w, v in zip(b[WORKER_INDEX], b[WEIGHTS_VERSION])
                                    if v >= 1}
                if all(p and p[-1] >= 1 for p in pushed) and sampled_with_new == {1, 2, 3, 4}:
                    break
            counters, info = it.metrics.counters, result["info"]
            # sampled = the fresh fragments' steps; each replayed fragment repeats one (worker, sample) pair
            fresh = {(int(w), int(k)) for _, b in seen for w, k in zip(b[WORKER_INDEX], b[SAMPLE_INDEX])}
            assert counters[STEPS_SAMPLED_COUNTER] == counters[AGENT_STEPS_SAMPLED_COUNTER] == AGG_FRAGMENT * len(fresh)
            assert sum(b.count for _, b in seen) == 2 * counters[STEPS_SAMPLED_COUNTER]  # replayed steps not sampled
            # trained steps come from the learner's out-queue
            assert info["num_steps_trained"] == AGG_BATCH * info["num_learner_updates"] > 0
            assert info["num_steps_trained"] <= sum(workers.local_worker().learn_calls)
            # aggregator g gathers only the workers i = g (mod 2): remote i has worker_index i + 1
            groups: dict[Any, set[int]] = {}
            for aggregator, b in seen:
                groups.setdefault(aggregator, set()).update(int(w) for w in b[WORKER_INDEX])
            assert set(groups) == set(made) and sorted(sorted(g) for g in groups.values()) == [[1, 3], [2, 4]]
            # every worker got the learner's weights from its aggregator, each version once, in order
            for versions in pushed:
                assert versions and versions[-1] >= 1 and versions == sorted(set(versions)), pushed
            assert sampled_with_new == {1, 2, 3, 4}
        finally:
            it.close()
        assert all(_dies(a) for a in made)
    finally:
        workers.stop()


@pytest.mark.on_ray
def test_closing_the_plan_kills_its_aggregators_and_stops_the_learner(monkeypatch: pytest.MonkeyPatch) -> None:
    _, made = _record_aggregation(monkeypatch)
    workers = make_fake_workers(2, rollout_fragment_length=AGG_FRAGMENT)
    before = set(_learner_threads())
    try:
        it = plan(workers, IMPALAConfig(num_workers=2, num_aggregation_workers=1, train_batch_size=AGG_BATCH,
                                        timesteps_per_iteration=0))
        (learner,) = set(_learner_threads()) - before
        assert len(made) == 1 and _alive(made[0])  # started by the plan call, before any pull
        it.close()
        assert not learner.is_alive() and _dies(made[0])
    finally:
        workers.stop()


def test_tree_aggregation_warns_when_aggregators_exceed_half_the_workers(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="flowrl.algorithms.impala"):
        IMPALAConfig(num_workers=4, num_aggregation_workers=2)
        assert not caplog.records
        IMPALAConfig(num_workers=4, num_aggregation_workers=3)
    (record,) = caplog.records
    assert "num_aggregation_workers=3 is more than half of num_workers=4" in record.getMessage()
    assert "use num_aggregation_workers <= 2" in record.getMessage()


@pytest.mark.parametrize("num_remote, message", [
    (0, "num_aggregation_workers=2 needs remote workers, but the WorkerSet has none; build it with num_workers >= 1 "
        "or set num_aggregation_workers=0"),
    (1, "num_aggregators=2 exceeds the 1 rollout workers of ParallelIterator[ParallelRollouts(raw)]; each "
        "aggregator needs at least one worker"),
])
def test_tree_aggregation_plan_rejects_too_few_remote_workers(num_remote: int, message: str) -> None:
    workers = make_fake_workers(num_remote, rollout_fragment_length=AGG_FRAGMENT)
    before = set(_learner_threads())
    try:
        with pytest.raises(ValueError, match=re.escape(message)):
            plan(workers, IMPALAConfig(num_workers=4, num_aggregation_workers=2))
        assert set(_learner_threads()) == before  # nothing was started
    finally:
        workers.stop()


# -- learning ------------------------------------------------------------------------------------------

def test_impala_learns_cartpole_within_500k_steps() -> None:
    # Under this module's local executor the async plan is deterministic: seed 0 reaches 150 after 70k steps in
    # ~3 s on 2 cores (on Ray, which fragment lands in which batch varies run to run); 500k is the bound.
    config = IMPALAConfig(env="CartPole-v1", seed=0, num_workers=2, num_cpus_per_worker=0.5, min_iter_time_s=0,
                          timesteps_per_iteration=10_000)
    workers = WorkerSet(policy_class=IMPALAPolicy, config=config)
    start = time.perf_counter()
    try:
        it = plan(workers, config)
        try:
            for result in it:
                print(f"{result['timesteps_total']:>8} steps  return {result['episode_reward_mean']:6.1f}  "
                      f"{time.perf_counter() - start:5.1f} s")
                if result["episode_reward_mean"] >= 150 or result["timesteps_total"] >= 500_000:
                    break
        finally:
            it.close()
    finally:
        workers.stop()
    print(f"IMPALA: return {result['episode_reward_mean']:.1f} after {result['timesteps_total']} steps, "
          f"{time.perf_counter() - start:.0f} s")
    assert result["episode_reward_mean"] >= 150


@pytest.mark.slow  # the default tier keeps one learning check per family (PPO, PG, A2C, IMPALA); ~10 min budget
def test_impala_with_tree_aggregation_learns_cartpole() -> None:
    # One aggregator over two real workers. Seed 0 goes from ~23 to 80+ within ~50k steps, ~15 s after a ~10 s
    # start (the aggregator imports torch) on 2 cores; 150k steps is the bound.
    config = IMPALAConfig(env="CartPole-v1", seed=0, num_workers=2, num_aggregation_workers=1,
                          num_cpus_per_worker=0.5, min_iter_time_s=0, timesteps_per_iteration=5_000)
    workers = WorkerSet(policy_class=IMPALAPolicy, config=config)
    start = time.perf_counter()
    try:
        it = plan(workers, config)
        try:
            results = []
            for result in it:
                results.append(result)
                print(f"{result['timesteps_total']:>8} steps  return {result['episode_reward_mean']:6.1f}  "
                      f"{time.perf_counter() - start:5.1f} s")
                if result["episode_reward_mean"] >= 80 or result["timesteps_total"] >= 150_000:
                    break
        finally:
            it.close()
    finally:
        workers.stop()
    first, last = results[0], results[-1]
    assert last["episode_reward_mean"] >= 80 and last["episode_reward_mean"] >= 2 * first["episode_reward_mean"]


@pytest.mark.parametrize("free_log_std", [True, False])
def test_plan_trains_gaussian_actions_on_pendulum(free_log_std: bool) -> None:
    """V-trace over Box actions: the log-probabilities of the behaviour and target Gaussians."""
    config = pendulum_config(IMPALAConfig, free_log_std, timesteps_per_iteration=0)
    assert_plan_trains_gaussian_actions("impala", config, iterations=3)


def test_tree_aggregation_refuses_an_observation_filter() -> None:
    """Aggregators send the weights (and so the merged filter) on but do not gather the workers' statistics."""
    with pytest.raises(ValueError, match=re.escape("observation_filter='MeanStdFilter' with num_aggregation_workers=1"
                                                   ": the aggregators")):
        IMPALAConfig(num_workers=2, num_aggregation_workers=1, observation_filter="MeanStdFilter")
