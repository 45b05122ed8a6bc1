"""Train operators against fake workers."""

from __future__ import annotations

import logging
import threading
import types
from typing import Any, Callable, Iterator

import numpy as np
import pytest
from flowrl import executor
import torch

from flowrl.config import PolicySpec
from flowrl.iter import get_metrics
from flowrl.metrics import (AGENT_STEPS_TRAINED_COUNTER, APPLY_GRADS_TIMER, COMPUTE_GRADS_TIMER, LAST_TARGET_UPDATE_TS,
                            LEARN_ON_BATCH_TIMER, LEARNER_INFO, LEARNER_STATS_KEY, LOAD_BATCH_TIMER,
                            NUM_TARGET_UPDATES, NUM_WEIGHT_BROADCASTS, NUM_WEIGHT_SYNCS, STEPS_SAMPLED_COUNTER,
                            STEPS_TRAINED_COUNTER, STEPS_TRAINED_THIS_ITER_COUNTER, TARGET_NET_UPDATE_TIMER,
                            WORKER_UPDATE_TIMER, MetricsContext)
from flowrl.ops.rollout import AsyncGradients, ParallelRollouts
from flowrl.ops.train import (ApplyGradients, AverageGradients, BroadcastUpdateLearnerWeights, BroadcastWeights,
                              ComputeGradients, LearnOnBatch, MultiGPUTrainOneStep, TrainOneStep, UpdateKL,
                              UpdateTargetNetwork, UpdateWorkerWeights)
from flowrl.sample_batch import DEFAULT_POLICY_ID, OBS, MultiAgentBatch, SampleBatch
from flowrl.testing import WEIGHTS_VERSION, WORKER_INDEX, TinyPGPolicy, fake_batch, iter_list, make_fake_workers
from flowrl.workers import RolloutConfig, WorkerSet

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

DP = DEFAULT_POLICY_ID
TWO_POLICIES = {"policies": {"a": PolicySpec(), "b": PolicySpec()}, "env": lambda ctx: None,
                "policy_mapping_fn": {"agent_a": "a", "agent_b": "b"}}


# -- fixtures and helpers ---------------------------------------------------------------------------

@pytest.fixture
def fake_workers() -> Iterator[Callable[..., WorkerSet]]:
    """``make_fake_workers`` whose remote actors are stopped after the test."""
    made: list[WorkerSet] = []

    def make(num_workers: int = 2, **config: Any) -> WorkerSet:
        made.append(make_fake_workers(num_workers, **config))
        return made[-1]

    yield make
    for ws in made:
        ws.stop()


@pytest.fixture
def puts(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every value passed to ``executor.put`` (``ray.put`` on Ray) from now on."""
    calls: list[Any] = []
    real_put = executor.put

    def counting_put(value: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(value)
        return real_put(value, *args, **kwargs)

    monkeypatch.setattr(executor, "put", counting_put)
    return calls


def record(actor: Any) -> dict[str, Any]:
    return executor.get(actor.get_record.remote())  # type: ignore[no-any-return]


def bound(op: Any, metrics: MetricsContext | None = None) -> Any:
    op.bind(metrics if metrics is not None else MetricsContext())
    return op


def spy_learn(ws: WorkerSet) -> list[Any]:
    """Records every batch the local worker's ``learn_on_batch`` receives."""
    local, seen = ws.local_worker(), []
    real = local.learn_on_batch

    def learn(batch: Any) -> Any:
        seen.append(batch)
        return real(batch)

    local.learn_on_batch = learn
    return seen


def count_sampled(batch: SampleBatch) -> SampleBatch:
    get_metrics().counters[STEPS_SAMPLED_COUNTER] += batch.count
    return batch


def two_policy_batch(n: int = 4) -> MultiAgentBatch:
    return MultiAgentBatch({"a": fake_batch(n), "b": fake_batch(n, start=100)}, n)


# -- TrainOneStep, LearnOnBatch, BroadcastWeights (§6.36) -------------------------------------------

def test_train_one_step_returns_batch_and_info_and_counts_steps() -> None:
    ws = make_fake_workers(0, learn_delay_s=0.001)
    metrics = MetricsContext()
    op = bound(TrainOneStep(ws), metrics)
    batch = fake_batch(10)
    out_batch, info = op(batch)
    assert out_batch is batch
    assert info[DP][LEARNER_STATS_KEY] == {"loss": 4.5, "kl": 0.01}
    assert metrics.info[LEARNER_INFO] is info
    assert metrics.counters[STEPS_TRAINED_COUNTER] == 10
    assert metrics.counters[AGENT_STEPS_TRAINED_COUNTER] == 10
    assert metrics.counters[STEPS_TRAINED_THIS_ITER_COUNTER] == 10
    timer = metrics.timers[LEARN_ON_BATCH_TIMER]
    assert timer.mean_units_processed == 10 and timer.mean_throughput > 0
    op(fake_batch(5))
    assert metrics.counters[STEPS_TRAINED_COUNTER] == 15
    assert ws.local_worker().learn_calls == [10, 5]


def test_the_train_family_imports_from_ops_train_whichever_module_holds_it() -> None:
    from flowrl.ops import learner_sync, train, train_step

    for module in (train_step, learner_sync):
        for name in module.__all__:
            assert getattr(train, name) is getattr(module, name) and name in train.__all__
            assert getattr(module, name).__module__ == module.__name__


def test_train_one_step_puts_once_and_sends_to_every_worker_with_the_timestep(
        fake_workers: Callable[..., WorkerSet], puts: list[Any]) -> None:
    ws = fake_workers(2)
    metrics = MetricsContext()
    metrics.counters[STEPS_SAMPLED_COUNTER] = 123
    op = bound(TrainOneStep(ws), metrics)
    puts.clear()
    op(fake_batch(10))
    assert len(puts) == 1
    for actor in ws.remote_workers():
        calls = record(actor)["set_weights_calls"]
        assert len(calls) == 2  # the WorkerSet's initial sync, then ours
        assert calls[-1] == ({DP: 1}, {"timestep": 123})
    assert ws.local_worker().global_vars == [{"timestep": 123}]
    assert metrics.timers[WORKER_UPDATE_TIMER].mean > 0


def test_train_one_step_without_remote_workers_puts_nothing_but_sets_local_global_vars(puts: list[Any]) -> None:
    ws = make_fake_workers(0)
    metrics = MetricsContext()
    metrics.counters[STEPS_SAMPLED_COUNTER] = 7
    bound(TrainOneStep(ws), metrics)(fake_batch(3))
    assert puts == []
    assert ws.local_worker().global_vars == [{"timestep": 7}]


def test_only_the_trained_policies_learn_and_have_their_weights_sent(
        fake_workers: Callable[..., WorkerSet], puts: list[Any]) -> None:
    ws = fake_workers(2, policies_to_train=("a",), **TWO_POLICIES)
    metrics = MetricsContext()
    op = bound(TrainOneStep(ws), metrics)
    puts.clear()
    _, info = op(two_policy_batch(4))
    assert set(info) == {"a"}
    assert ws.local_worker().versions == {"a": 1, "b": 0}
    assert [set(p) for p in puts] == [{"a"}]
    for actor in ws.remote_workers():
        assert record(actor)["set_weights_calls"][-1][0] == {"a": 1}
    assert metrics.counters[STEPS_TRAINED_COUNTER] == 4
    assert metrics.counters[AGENT_STEPS_TRAINED_COUNTER] == 8


def test_an_explicit_policy_list_restricts_learning_to_those_policies() -> None:
    ws = make_fake_workers(0, **TWO_POLICIES)
    seen = spy_learn(ws)
    _, info = bound(TrainOneStep(ws, policies=["b"]))(two_policy_batch(4))
    assert set(info) == {"b"}
    assert [sorted(b.policy_batches) for b in seen] == [["b"]]
    assert ws.local_worker().versions == {"a": 0, "b": 1}


@pytest.mark.parametrize("num_sgd_iter, sgd_minibatch_size, learn_counts", [
    (1, 0, [10]),  # plain path: one learn_on_batch on the batch itself
    (2, 0, [10, 10]),  # minibatch path: each epoch is one minibatch of the whole batch
    (1, 4, [4, 4, 2]),  # consecutive minibatches with a final partial one
    (3, 4, [4, 4, 2] * 3),
    (1, 10, [10]),  # a size >= the batch gives one minibatch
    (1, 50, [10]),
])
def test_the_minibatch_path_is_used_iff_several_epochs_or_a_minibatch_size(
        num_sgd_iter: int, sgd_minibatch_size: int, learn_counts: list[int]) -> None:
    ws = make_fake_workers(0, seed=3)
    seen = spy_learn(ws)
    batch = fake_batch(10)
    bound(TrainOneStep(ws, num_sgd_iter=num_sgd_iter, sgd_minibatch_size=sgd_minibatch_size))(batch)
    assert [b.count for b in seen] == learn_counts
    minibatch_path = num_sgd_iter > 1 or sgd_minibatch_size > 0
    assert (seen[0] is batch) is not minibatch_path
    if minibatch_path:  # every epoch visits every row once, permuted
        rows = np.concatenate([b[OBS] for b in seen]).reshape(num_sgd_iter, 10)
        assert all(sorted(r) == list(range(10)) for r in rows.tolist())
        assert any(r != list(range(10)) for r in rows.tolist())


def test_minibatch_stats_are_the_mean_over_the_final_epoch_and_the_order_is_seeded() -> None:
    def run() -> tuple[list[float], dict[str, Any]]:
        ws = make_fake_workers(0, seed=7)
        seen = spy_learn(ws)
        _, info = bound(TrainOneStep(ws, num_sgd_iter=3, sgd_minibatch_size=4))(fake_batch(10))
        return np.concatenate([b[OBS] for b in seen]).tolist(), info

    order, info = run()
    # The fake policy has no np_random: the operator's generator, seeded with config.seed, permutes.
    rng = np.random.default_rng(7)
    perms = [rng.permutation(10).astype(np.float32) for _ in range(3)]
    assert order == np.concatenate(perms).tolist()
    final = perms[-1]
    expected_loss = np.mean([final[0:4].mean(), final[4:8].mean(), final[8:10].mean()])
    assert info[DP][LEARNER_STATS_KEY]["loss"] == pytest.approx(expected_loss)
    assert expected_loss != pytest.approx(4.5)  # unweighted: differs from the full-batch mean
    assert info[DP][LEARNER_STATS_KEY]["kl"] == pytest.approx(0.01)
    assert run() == (order, info)


def test_minibatch_sgd_trains_each_policy_on_its_own_sub_batches() -> None:
    ws = make_fake_workers(0, **TWO_POLICIES)
    seen = spy_learn(ws)
    _, info = bound(TrainOneStep(ws, sgd_minibatch_size=2))(two_policy_batch(4))
    assert [list(b.policy_batches) for b in seen] == [["a"], ["a"], ["b"], ["b"]]
    assert all(isinstance(b, MultiAgentBatch) and b.count == 2 for b in seen)
    assert set(info) == {"a", "b"}
    assert info["b"][LEARNER_STATS_KEY]["loss"] == pytest.approx(101.5)
    assert ws.local_worker().versions == {"a": 2, "b": 2}


def test_broadcast_false_then_broadcast_weights_is_observably_identical(
        fake_workers: Callable[..., WorkerSet], puts: list[Any]) -> None:
    def run(split: bool) -> tuple[Any, ...]:
        ws = fake_workers(2)
        it = iter_list([fake_batch(5), fake_batch(5, start=5)]).for_each(count_sampled)
        it = it.for_each(TrainOneStep(ws, broadcast=False)).for_each(BroadcastWeights(ws)) if split else \
            it.for_each(TrainOneStep(ws))
        puts.clear()
        outputs = [(b[OBS].tolist(), info[DP][LEARNER_STATS_KEY]) for b, info in it]
        records = [{k: record(a)[k] for k in ("set_weights_calls", "global_vars", "versions")}
                   for a in ws.remote_workers()]
        return outputs, dict(it.metrics.counters), len(puts), records, ws.local_worker().global_vars

    joined, split = run(split=False), run(split=True)
    assert joined == split
    assert joined[2] == 2
    assert joined[3][0]["set_weights_calls"][1:] == [({DP: 1}, {"timestep": 5}), ({DP: 2}, {"timestep": 10})]


def test_train_one_step_without_broadcast_sends_nothing(
        fake_workers: Callable[..., WorkerSet], puts: list[Any]) -> None:
    ws = fake_workers(1)
    op = bound(TrainOneStep(ws, broadcast=False))
    puts.clear()
    op(fake_batch(4))
    assert puts == []
    assert len(record(ws.remote_workers()[0])["set_weights_calls"]) == 1  # only the initial sync
    assert ws.local_worker().global_vars == []


@pytest.mark.parametrize("source", ["iter_list", "bulk_sync", "async"])
def test_train_one_step_counts_what_it_trains_under_every_source(
        fake_workers: Callable[..., WorkerSet], source: str) -> None:
    ws = fake_workers(0 if source == "iter_list" else 2, rollout_fragment_length=50)
    it = iter_list([fake_batch(50)] * 3) if source == "iter_list" else ParallelRollouts(ws, mode=source)
    train = TrainOneStep(ws)
    it = it.for_each(train)
    outputs = it.take(3)
    assert train.learn.metrics is it.metrics  # the core binds both halves to the one context
    counters = it.metrics.counters
    assert counters[STEPS_TRAINED_COUNTER] == sum(b.count for b, _ in outputs)
    assert it.metrics.info[LEARNER_INFO] is outputs[-1][1]
    if source != "iter_list":
        assert counters[STEPS_TRAINED_COUNTER] == counters[STEPS_SAMPLED_COUNTER]
    assert repr(it).endswith(".for_each(TrainOneStep)]")


def test_on_policy_ordering_every_fragment_carries_the_weights_broadcast_after_the_previous_round(
        fake_workers: Callable[..., WorkerSet]) -> None:  # §6.32
    ws = fake_workers(2, rollout_fragment_length=20)
    it = ParallelRollouts(ws, mode="bulk_sync").for_each(TrainOneStep(ws))
    for n, (batch, _) in enumerate(it.take(4)):
        assert batch.count == 40
        assert set(batch[WORKER_INDEX].tolist()) == {1, 2}
        assert set(batch[WEIGHTS_VERSION].tolist()) == {n}


def test_train_ops_reject_bad_arguments_and_inputs() -> None:
    ws = make_fake_workers(0, policies_to_train=("a",), **TWO_POLICIES)
    with pytest.raises(ValueError, match="num_sgd_iter=0"):
        TrainOneStep(ws, num_sgd_iter=0)
    with pytest.raises(ValueError, match="sgd_minibatch_size=-1"):
        TrainOneStep(ws, sgd_minibatch_size=-1)
    with pytest.raises(ValueError, match="list of policy ids"):
        TrainOneStep(ws, policies="a")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\['b'\].*policies_to_train=\['a'\]"):
        TrainOneStep(ws, policies=["b"])
    with pytest.raises(TypeError, match="needs a WorkerSet"):
        TrainOneStep([ws])  # type: ignore[arg-type]
    op = bound(TrainOneStep(ws))
    with pytest.raises(ValueError, match="consumes SampleBatch or MultiAgentBatch items, got list"):
        op([fake_batch(2)])
    with pytest.raises(ValueError, match="already bound to another"):
        op.bind(MetricsContext())


def test_reprs() -> None:
    ws = make_fake_workers(0)
    assert [repr(op) for op in (TrainOneStep(ws), LearnOnBatch(ws), BroadcastWeights(ws), UpdateKL(ws),
                                ComputeGradients(ws), ApplyGradients(ws), ApplyGradients(ws, update_all=False),
                                AverageGradients(), UpdateTargetNetwork(ws, 500))] == [
        "TrainOneStep", "LearnOnBatch", "BroadcastWeights", "UpdateKL", "ComputeGradients", "ApplyGradients",
        "ApplyGradients(update_all=False)", "AverageGradients", "UpdateTargetNetwork(500)"]
    it = iter_list([]).for_each(TrainOneStep(ws, broadcast=False)).for_each(BroadcastWeights(ws))
    assert repr(it) == "LocalIterator[iter_list.for_each(TrainOneStep).for_each(BroadcastWeights)]"


# -- UpdateKL -----------------------------------------------------------------------------------------

def test_update_kl_after_train_one_step_updates_each_trained_policy_and_passes_through() -> None:
    ws = make_fake_workers(0)
    outputs = iter_list([fake_batch(4), fake_batch(4)]).for_each(TrainOneStep(ws)).for_each(UpdateKL(ws)).take(2)
    assert ws.local_worker().get_policy().kl_updates == [0.01, 0.01]
    item = (fake_batch(1), {DP: {LEARNER_STATS_KEY: {"kl": 0.5}}})
    assert UpdateKL(ws)(item) is item
    assert ws.local_worker().get_policy().kl_updates[-1] == 0.5
    assert len(outputs) == 2 and isinstance(outputs[0][0], SampleBatch)


def test_update_kl_rejects_non_train_output_and_a_missing_kl() -> None:
    ws = make_fake_workers(0)
    with pytest.raises(ValueError, match="consumes the \\(batch, learner_info\\) output"):
        UpdateKL(ws)(fake_batch(2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no 'kl'"):
        UpdateKL(ws)((fake_batch(2), {DP: {LEARNER_STATS_KEY: {"loss": 1.0}}}))


def test_update_kl_skips_an_absent_trainable_policy_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    ws = make_fake_workers(0, **TWO_POLICIES)
    with caplog.at_level(logging.WARNING, logger="flowrl.ops.train"):
        UpdateKL(ws)((fake_batch(2), {"a": {LEARNER_STATS_KEY: {"kl": 0.3}}}))
    local = ws.local_worker()
    assert local.get_policy("a").kl_updates == [0.3] and local.get_policy("b").kl_updates == []
    assert any("'b'" in r.getMessage() for r in caplog.records)


def test_update_kl_with_policies_updates_only_those(caplog: pytest.LogCaptureFixture) -> None:
    """The two-policy plan: UpdateKL(policies=["a"]) after a branch that trains only "a" warns about nothing."""
    ws = make_fake_workers(0, **TWO_POLICIES)
    with caplog.at_level(logging.WARNING, logger="flowrl.ops.train"):
        UpdateKL(ws, policies=["a"])((fake_batch(2), {"a": {LEARNER_STATS_KEY: {"kl": 0.3}}}))
    local = ws.local_worker()
    assert local.get_policy("a").kl_updates == [0.3] and local.get_policy("b").kl_updates == []
    assert not caplog.records
    with pytest.raises(ValueError, match=r"UpdateKL policies=\['ghost'\] names \['ghost'\]"):
        UpdateKL(ws, policies=["ghost"])


# -- gradients (§6.33, §6.37) -------------------------------------------------------------------------

def test_compute_gradients_then_average_of_four_is_the_elementwise_mean() -> None:  # §6.37
    ws = make_fake_workers(0)
    batches = [fake_batch(100, start=100 * k) for k in range(5)]
    it = iter_list(batches).for_each(ComputeGradients(ws)).batch(4).for_each(AverageGradients())
    (grads, count), (last_grads, last_count) = it.take(2)
    assert count == 400
    np.testing.assert_array_equal(grads[DP][0], np.full(2, 199.5))  # mean of the per-batch means
    np.testing.assert_array_equal(grads[DP][1], np.full(3, 100.0))  # a sum would give 400
    assert last_count == 100  # the final partial batch averages over its one item
    np.testing.assert_array_equal(last_grads[DP][0], np.full(2, 449.5))
    assert it.metrics.timers[COMPUTE_GRADS_TIMER].mean_units_processed == 100
    assert it.metrics.info[LEARNER_INFO] == {DP: {LEARNER_STATS_KEY: {"grad_count": 100}}}


def test_average_gradients_maps_nested_structures_of_arrays_and_tensors() -> None:
    def grads(x: float) -> dict[str, Any]:
        return {"p": [np.full(2, x), (torch.full((3,), x), np.float64(x))], "q": {"w": np.array([[x]])}}

    mean, count = AverageGradients()([(grads(1.0), 1), (grads(2.0), 2), (grads(6.0), 3)])
    assert count == 6
    np.testing.assert_array_equal(mean["p"][0], np.full(2, 3.0))
    assert isinstance(mean["p"][1], tuple) and torch.equal(mean["p"][1][0], torch.full((3,), 3.0))
    assert mean["p"][1][1] == 3.0
    np.testing.assert_array_equal(mean["q"]["w"], [[3.0]])


def test_average_gradients_rejects_bad_input() -> None:
    op = AverageGradients()
    with pytest.raises(ValueError, match="non-empty list"):
        op([])
    with pytest.raises(ValueError, match="non-empty list"):
        op(({"p": np.ones(1)}, 1))  # type: ignore[arg-type]  # a pair, not a list of pairs
    with pytest.raises(ValueError, match="2-tuples"):
        op([np.ones(2)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="differ in structure"):
        op([({"p": np.ones(1)}, 1), ({"q": np.ones(1)}, 1)])


def test_apply_gradients_update_all_puts_once_and_reaches_every_worker(
        fake_workers: Callable[..., WorkerSet], puts: list[Any]) -> None:
    ws = fake_workers(2)
    metrics = MetricsContext()
    metrics.counters[STEPS_SAMPLED_COUNTER] = 40
    op = bound(ApplyGradients(ws), metrics)
    grads, _ = ws.local_worker().compute_gradients(fake_batch(4))
    puts.clear()
    assert op((grads, 40)) is None
    assert len(puts) == 1
    for actor in ws.remote_workers():
        assert record(actor)["set_weights_calls"][-1] == ({DP: 1}, {"timestep": 40})
    assert ws.local_worker().global_vars == [{"timestep": 40}]
    assert metrics.counters[STEPS_TRAINED_COUNTER] == metrics.counters[STEPS_TRAINED_THIS_ITER_COUNTER] == 40
    assert metrics.timers[APPLY_GRADS_TIMER].mean_units_processed == 40


def test_apply_gradients_to_the_current_actor_only(fake_workers: Callable[..., WorkerSet],
                                                   puts: list[Any]) -> None:
    ws = fake_workers(2)
    first, second = ws.remote_workers()
    metrics = MetricsContext()
    op = bound(ApplyGradients(ws, update_all=False), metrics)
    grads, _ = ws.local_worker().compute_gradients(fake_batch(4))
    metrics.current_actor = second
    puts.clear()
    op((grads, 4))
    assert len(puts) == 1
    assert len(record(first)["set_weights_calls"]) == 1  # the initial sync only
    assert record(second)["set_weights_calls"][-1][0] == {DP: 1}


def test_apply_gradients_rejects_bad_input_before_applying() -> None:
    ws = make_fake_workers(0)
    op = bound(ApplyGradients(ws, update_all=False))
    with pytest.raises(ValueError, match="current_actor is None"):
        op(({DP: [np.ones(2)]}, 4))
    with pytest.raises(ValueError, match="2-tuples"):
        op([{DP: [np.ones(2)]}])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="2-tuples"):
        bound(ApplyGradients(ws))(fake_batch(3))  # type: ignore[arg-type]
    assert ws.local_worker().applied_gradients == []


def test_async_gradients_then_apply_gradients_sends_weights_to_the_producer_only(
        fake_workers: Callable[..., WorkerSet]) -> None:  # §6.33
    ws = fake_workers(2, rollout_fragment_length=30)
    it = AsyncGradients(ws).for_each(ApplyGradients(ws, update_all=False))
    actors = ws.remote_workers()
    sends = [len(record(a)["set_weights_calls"]) for a in actors]  # initial sync + AsyncGradients' sync
    assert sends == [2, 2]
    producers = []
    for k in range(1, 5):
        assert next(it) is None
        producer = it.metrics.current_actor
        producers.append(producer)
        now = [len(record(a)["set_weights_calls"]) for a in actors]
        assert [n - s for n, s in zip(now, sends)] == [int(a == producer) for a in actors]
        sends = now
        assert it.metrics.counters[STEPS_SAMPLED_COUNTER] == it.metrics.counters[STEPS_TRAINED_COUNTER] == 30 * k
    assert set(producers) == set(actors)
    assert ws.local_worker().versions[DP] == 4  # every gradient was applied once


def test_async_gradients_then_apply_gradients_to_all(fake_workers: Callable[..., WorkerSet]) -> None:
    ws = fake_workers(2, rollout_fragment_length=30)
    it = AsyncGradients(ws).for_each(ApplyGradients(ws))
    it.take(3)
    for actor in ws.remote_workers():
        calls = record(actor)["set_weights_calls"]
        assert [c[0][DP] for c in calls[2:]] == [1, 2, 3]


# -- UpdateTargetNetwork (§6.38) ----------------------------------------------------------------------

def test_update_target_network_fires_exactly_at_the_threshold_and_passes_through() -> None:
    ws = make_fake_workers(0)
    metrics = MetricsContext()
    op = bound(UpdateTargetNetwork(ws, target_update_freq=100), metrics)
    policy = ws.local_worker().get_policy()
    fired = []
    for sampled in (99, 100, 150, 199, 200, 300):
        metrics.counters[STEPS_SAMPLED_COUNTER] = sampled
        item = object()
        assert op(item) is item
        fired.append(policy.target_updates)
    assert fired == [0, 1, 1, 1, 2, 3]
    assert metrics.counters[NUM_TARGET_UPDATES] == 3
    assert metrics.counters[LAST_TARGET_UPDATE_TS] == 300
    assert metrics.timers[TARGET_NET_UPDATE_TIMER].mean > 0


def test_update_target_network_by_steps_trained_reads_the_trained_counter() -> None:
    ws = make_fake_workers(0)
    metrics = MetricsContext()
    op = bound(UpdateTargetNetwork(ws, 100, by_steps_trained=True), metrics)
    metrics.counters[STEPS_SAMPLED_COUNTER] = 1000
    metrics.counters[STEPS_TRAINED_COUNTER] = 99
    op(None)
    assert metrics.counters[NUM_TARGET_UPDATES] == 0
    metrics.counters[STEPS_TRAINED_COUNTER] = 100
    op(None)
    assert metrics.counters[NUM_TARGET_UPDATES] == 1 and metrics.counters[LAST_TARGET_UPDATE_TS] == 100


def test_update_target_network_copies_under_the_learner_threads_weights_lock() -> None:
    ws = make_fake_workers(0)
    learner = types.SimpleNamespace(weights_updated=False, weights_lock=threading.Lock())
    policy = ws.local_worker().get_policy()
    held: list[bool] = []
    policy.update_target = lambda: held.append(learner.weights_lock.locked())  # type: ignore[method-assign]
    op = bound(UpdateTargetNetwork(ws, 0, learner_thread=learner), MetricsContext())
    op(None)
    assert held == [True] and not learner.weights_lock.locked()
    bound(UpdateTargetNetwork(ws, 0), MetricsContext())(None)  # no learner thread: no lock
    assert held == [True, False]
    with pytest.raises(TypeError, match="weights_lock"):
        UpdateTargetNetwork(ws, 0, learner_thread=object())


def test_update_target_network_bookkeeping_is_shared_and_freq_zero_fires_every_call() -> None:
    ws = make_fake_workers(0, **TWO_POLICIES)
    metrics = MetricsContext()
    first = bound(UpdateTargetNetwork(ws, 100, policies=["a"]), metrics)
    second = bound(UpdateTargetNetwork(ws, 100, policies=["b"]), metrics)
    metrics.counters[STEPS_SAMPLED_COUNTER] = 100
    first(None)
    second(None)  # last_target_update_ts = 100 now: not due
    local = ws.local_worker()
    assert (local.get_policy("a").target_updates, local.get_policy("b").target_updates) == (1, 0)
    every = bound(UpdateTargetNetwork(ws, 0), metrics)
    every(None)
    every(None)
    assert (local.get_policy("a").target_updates, local.get_policy("b").target_updates) == (3, 2)
    assert metrics.counters[NUM_TARGET_UPDATES] == 3


def test_update_target_network_in_an_iterator_and_rejects_untrained_policies() -> None:
    ws = make_fake_workers(0, policies_to_train=("a",), **TWO_POLICIES)
    it = iter_list([fake_batch(60)] * 4).for_each(count_sampled).for_each(UpdateTargetNetwork(ws, 100))
    assert len(it.take(4)) == 4
    assert ws.local_worker().get_policy("a").target_updates == 2  # at 120 and 240 sampled steps
    assert ws.local_worker().get_policy("b").target_updates == 0
    with pytest.raises(ValueError, match="does not train"):
        UpdateTargetNetwork(ws, 100, policies=["b"])


# -- weight sync with a learner thread ----------------------------------------------------------------

def stand_in_learner(weights_updated: bool = False) -> types.SimpleNamespace:
    return types.SimpleNamespace(weights_updated=weights_updated, weights_lock=threading.Lock())


def spy_lock(ws: WorkerSet, learner: types.SimpleNamespace) -> list[bool]:
    """Records, for each local get_weights call, whether the learner's lock was held."""
    local, held = ws.local_worker(), []
    real = local.get_weights

    def get_weights(*args: Any, **kwargs: Any) -> Any:
        held.append(learner.weights_lock.locked())
        return real(*args, **kwargs)

    local.get_weights = get_weights
    return held


def test_update_worker_weights_syncs_one_actor_when_its_steps_reach_the_delay(
        fake_workers: Callable[..., WorkerSet], puts: list[Any]) -> None:
    ws = fake_workers(2)
    first, second = ws.remote_workers()
    learner = stand_in_learner()
    held = spy_lock(ws, learner)
    metrics = MetricsContext()
    metrics.counters[STEPS_SAMPLED_COUNTER] = 55
    op = bound(UpdateWorkerWeights(learner, ws, max_weight_sync_delay=200), metrics)
    puts.clear()
    item = (first, fake_batch(100))
    assert op(item) is item
    assert metrics.counters[NUM_WEIGHT_SYNCS] == 0
    op((first, fake_batch(100)))  # first reaches 200: a put (nothing cached yet), sent to it only
    assert (metrics.counters[NUM_WEIGHT_SYNCS], len(puts)) == (1, 1)
    assert record(first)["set_weights_calls"][-1] == ({DP: 0}, {"timestep": 55})
    assert len(record(second)["set_weights_calls"]) == 1
    op((second, fake_batch(250)))  # the cached reference is reused: no new put
    assert (metrics.counters[NUM_WEIGHT_SYNCS], len(puts)) == (2, 1)
    ws.local_worker().versions[DP] = 9
    learner.weights_updated = True
    op((first, fake_batch(100)))  # first's total restarted at 0 after its sync
    assert (metrics.counters[NUM_WEIGHT_SYNCS], len(puts)) == (2, 1)
    op((first, fake_batch(100)))
    assert (metrics.counters[NUM_WEIGHT_SYNCS], len(puts)) == (3, 2)
    assert learner.weights_updated is False
    assert record(first)["set_weights_calls"][-1][0] == {DP: 9}
    assert record(second)["set_weights_calls"][-1][0] == {DP: 0}
    assert held == [True, True]
    assert ws.local_worker().global_vars == [{"timestep": 55}] * 3


def test_update_worker_weights_rejects_bad_arguments() -> None:
    ws = make_fake_workers(0)
    with pytest.raises(TypeError, match="weights_lock"):
        UpdateWorkerWeights(object(), ws, 100)
    with pytest.raises(ValueError, match="max_weight_sync_delay=0"):
        UpdateWorkerWeights(stand_in_learner(), ws, 0)
    with pytest.raises(ValueError, match=r"\(actor, batch\) pairs"):
        bound(UpdateWorkerWeights(stand_in_learner(), ws, 100))(fake_batch(3))


def test_broadcast_update_learner_weights_refreshes_every_interval_and_skips_actors_holding_the_ref(
        fake_workers: Callable[..., WorkerSet], puts: list[Any]) -> None:
    ws = fake_workers(2)
    first, second = ws.remote_workers()
    learner = stand_in_learner()
    held = spy_lock(ws, learner)
    metrics = MetricsContext()
    op = bound(BroadcastUpdateLearnerWeights(learner, ws, broadcast_interval=2), metrics)
    puts.clear()
    batch = fake_batch(5)
    assert op((first, batch)) is batch  # nothing cached: put, then send
    assert len(puts) == 1 and len(record(first)["set_weights_calls"]) == 2
    op((first, fake_batch(5)))  # calls = 2 but no new weights; first holds this ref: no send
    assert len(puts) == 1 and len(record(first)["set_weights_calls"]) == 2
    op((second, fake_batch(5)))  # second never got this ref
    assert len(record(second)["set_weights_calls"]) == 2
    ws.local_worker().versions[DP] = 4
    learner.weights_updated = True
    op((second, fake_batch(5)))  # calls = 4 >= 2 and updated: re-put, count reset, sent
    assert len(puts) == 2 and learner.weights_updated is False
    assert metrics.counters[NUM_WEIGHT_BROADCASTS] == 1
    assert record(second)["set_weights_calls"][-1][0] == {DP: 4}
    learner.weights_updated = True
    op((first, fake_batch(5)))  # 1 call since the refresh: below the interval, but first gets the new ref
    assert len(puts) == 2 and metrics.counters[NUM_WEIGHT_BROADCASTS] == 1
    assert record(first)["set_weights_calls"][-1][0] == {DP: 4}
    op((first, fake_batch(5)))
    assert len(puts) == 3 and metrics.counters[NUM_WEIGHT_BROADCASTS] == 2
    assert held == [True, True, True]
    assert len(ws.local_worker().global_vars) == 6  # every call sets the local global vars


def test_broadcast_update_learner_weights_in_an_async_stream(fake_workers: Callable[..., WorkerSet]) -> None:
    ws = fake_workers(2, rollout_fragment_length=10)
    learner = stand_in_learner()
    op = BroadcastUpdateLearnerWeights(learner, ws, broadcast_interval=1)
    sources: list[Any] = []  # which worker produced each fragment: async order depends on the machine's load
    it = (ParallelRollouts(ws, mode="async").zip_with_source_actor()
          .for_each(lambda pair: sources.append(pair[0]) or pair).for_each(op))
    assert [b.count for b in it.take(4)] == [10] * 4
    assert it.metrics.counters[STEPS_SAMPLED_COUNTER] == 40
    for actor in ws.remote_workers():  # 2 syncs, and 1 send once it produced a fragment, however many it produced
        assert len(record(actor)["set_weights_calls"]) == 2 + (actor in sources), sources.count(actor)


# -- MultiGPUTrainOneStep -----------------------------------------------------------------------------

def tiny_pg_workers(fragment: int = 32, **overrides: Any) -> WorkerSet:
    cfg = RolloutConfig(env="CartPole-v1", rollout_fragment_length=fragment, seed=0, **overrides)
    return WorkerSet(policy_class=TinyPGPolicy, config=cfg)


def spy_loss(ws: WorkerSet) -> list[int]:
    """Records the rows of every loss evaluation of the local default policy."""
    policy, rows = ws.local_worker().get_policy(), []
    real = policy.loss

    def loss(batch: Any) -> Any:
        rows.append(int(batch[OBS].shape[0]))
        return real(batch)

    policy.loss = loss
    return rows


def test_multi_gpu_fake_towers_split_each_minibatch_across_devices() -> None:
    ws = tiny_pg_workers(32)
    rows = spy_loss(ws)
    metrics = MetricsContext()
    metrics.counters[STEPS_SAMPLED_COUNTER] = 32
    op = bound(MultiGPUTrainOneStep(ws, sgd_minibatch_size=8, num_sgd_iter=2, num_gpus=2, fake_gpus=True), metrics)
    before = ws.local_worker().get_weights()
    batch = ws.local_worker().sample()
    out, info = op(batch)
    assert out is batch
    # 16 rows per tower, 4 per tower minibatch: 4 steps per epoch, 2 towers each, 2 epochs.
    assert rows == [4] * 16
    assert sorted(info[DP][LEARNER_STATS_KEY]) == ["entropy", "loss"]
    assert metrics.counters[STEPS_TRAINED_COUNTER] == metrics.counters[STEPS_TRAINED_THIS_ITER_COUNTER] == 32
    assert metrics.timers[LOAD_BATCH_TIMER].mean_units_processed == 32
    assert metrics.timers[LEARN_ON_BATCH_TIMER].mean_units_processed == 32
    after = ws.local_worker().get_weights()
    assert any(not np.array_equal(before[DP][k], after[DP][k]) for k in before[DP])
    assert ws.local_worker().get_policy().global_timestep == 32  # the broadcast's local global vars


def test_multi_gpu_averages_tower_gradients_and_applies_them_once() -> None:
    ws, twin = tiny_pg_workers(32), tiny_pg_workers(32)
    batch = ws.local_worker().sample()
    op = bound(MultiGPUTrainOneStep(ws, sgd_minibatch_size=32, num_sgd_iter=1, num_gpus=2, fake_gpus=True,
                                    shuffle_sequences=False))
    _, info = op(batch)
    policy = twin.local_worker().get_policy()
    (g0, i0), (g1, i1) = policy.compute_gradients(batch[0:16]), policy.compute_gradients(batch[16:32])
    policy.apply_gradients([(a + b) / 2 for a, b in zip(g0, g1)])
    expected = policy.get_weights()
    for key, value in ws.local_worker().get_weights()[DP].items():
        np.testing.assert_allclose(value, expected[key], rtol=1e-6, atol=1e-7, err_msg=key)
    loss = (i0[LEARNER_STATS_KEY]["loss"] + i1[LEARNER_STATS_KEY]["loss"]) / 2
    assert info[DP][LEARNER_STATS_KEY]["loss"] == pytest.approx(loss)


def test_multi_gpu_one_device_loads_once_and_is_seeded() -> None:
    def run() -> tuple[list[int], int, dict[str, np.ndarray]]:
        ws = tiny_pg_workers(32)
        rows = spy_loss(ws)
        policy = ws.local_worker().get_policy()
        loads = []
        real = policy.to_tensors
        policy.to_tensors = lambda b: loads.append(b.count) or real(b)  # type: ignore[method-assign]
        op = bound(MultiGPUTrainOneStep(ws, sgd_minibatch_size=8, num_sgd_iter=3, num_gpus=0))
        op(ws.local_worker().sample())
        return rows, len(loads), ws.local_worker().get_weights()[DP]

    rows, loads, weights = run()
    assert rows == [8] * 12 and loads == 1
    _, _, again = run()
    assert all(np.array_equal(weights[k], again[k]) for k in weights)


def test_multi_gpu_drops_the_remainder_but_counts_the_full_batch() -> None:
    ws = tiny_pg_workers(33)
    rows = spy_loss(ws)
    metrics = MetricsContext()
    op = bound(MultiGPUTrainOneStep(ws, sgd_minibatch_size=64, num_sgd_iter=1, num_gpus=2, fake_gpus=True), metrics)
    op(ws.local_worker().sample())
    assert rows == [16, 16]  # 33 // 2 rows per tower; fewer than a minibatch: one step
    assert metrics.counters[STEPS_TRAINED_COUNTER] == 33


def test_multi_gpu_rejects_bad_settings() -> None:
    ws = tiny_pg_workers(8)
    with pytest.raises(ValueError, match="< 1 row per device"):
        MultiGPUTrainOneStep(ws, sgd_minibatch_size=1, num_sgd_iter=1, num_gpus=2, fake_gpus=True)
    with pytest.raises(ValueError, match="num_gpus=-1"):
        MultiGPUTrainOneStep(ws, sgd_minibatch_size=8, num_sgd_iter=1, num_gpus=-1)
    with pytest.raises(ValueError, match="num_sgd_iter=0"):
        MultiGPUTrainOneStep(ws, sgd_minibatch_size=8, num_sgd_iter=0, num_gpus=0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees 0 CUDA"):
            MultiGPUTrainOneStep(ws, sgd_minibatch_size=8, num_sgd_iter=1, num_gpus=1)
    with pytest.raises(ValueError, match="torch policies"):
        MultiGPUTrainOneStep(make_fake_workers(0), sgd_minibatch_size=8, num_sgd_iter=1, num_gpus=0)
    with pytest.raises(ValueError, match="consumes SampleBatch"):
        bound(MultiGPUTrainOneStep(ws, sgd_minibatch_size=8, num_sgd_iter=1, num_gpus=0))("batch")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_multi_gpu_trains_on_one_cuda_device() -> None:
    ws = tiny_pg_workers(32, device="cuda")
    before = ws.local_worker().get_weights()
    _, info = bound(MultiGPUTrainOneStep(ws, sgd_minibatch_size=8, num_sgd_iter=2, num_gpus=1))(
        ws.local_worker().sample())
    after = ws.local_worker().get_weights()
    assert np.isfinite(info[DP][LEARNER_STATS_KEY]["loss"])
    assert any(not np.array_equal(before[DP][k], after[DP][k]) for k in before[DP])
    with pytest.raises(ValueError, match="lives on cuda"):
        MultiGPUTrainOneStep(ws, sgd_minibatch_size=8, num_sgd_iter=1, num_gpus=0)
