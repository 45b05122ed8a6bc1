"""Per-operator profiling (flowrl.profiling): exact item counts, the in-op / waiting split, gauges, staleness of
trained data (weights versions stamped at sample time), the profile in the trainer's result, and the `flowrl plan
show` / `flowrl profile` commands. Profiling off must leave the built stages exactly as they were."""

from __future__ import annotations

import dataclasses
import queue
import time
from typing import Any, Iterator

import numpy as np
import pytest
from flowrl import executor
from click.testing import CliRunner, Result

from flowrl import plan_graph, profiling
from flowrl.algorithms.apex import ApexConfig, make_replay_shards, plan as apex_plan
from flowrl.algorithms.pg import PGConfig
from flowrl.cli import main
from flowrl.iter import LocalIterator
from flowrl.iter import profiling as iter_profiling
from flowrl.ops import Concurrently, Dequeue, Enqueue
from flowrl.sample_batch import WEIGHTS_VERSION
from flowrl.testing import TinyPGPolicy, iter_list, make_fake_workers
from flowrl.trainer import Trainer
from flowrl.workers import RolloutConfig, RolloutWorker

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py


def invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def counts(it: LocalIterator[Any]) -> dict[str, tuple[int | None, int | None]]:
    return {label: (node["items_in"], node["items_out"]) for label, node in profiling.profile_data(it)["nodes"].items()}


def built_stages(puller: Any) -> Iterator[Any]:
    """The built pullers of a chain, output first (through wrappers and single-upstream stages)."""
    while puller is not None:
        yield puller
        puller = getattr(puller, "inner", None) or getattr(puller, "up", None)


# -- counts, times, labels -----------------------------------------------------------------------------------

def test_counts_in_and_out_are_exact_over_plain_lists() -> None:
    it = profiling.enable(iter_list(range(10)).filter(lambda x: x % 2 == 0).for_each(lambda x: x * 10).batch(2))
    assert list(it) == [[0, 20], [40, 60], [80]]
    assert counts(it) == {"iter_list": (None, 10), "filter()": (10, 5), "for_each()": (5, 5), "batch(2)": (5, 3)}


def test_duplicate_children_and_unions_count_what_their_inputs_emitted() -> None:
    a, b = iter_list([1, -2, 3]).duplicate(2)
    it = profiling.enable(a.for_each(abs).union(b, deterministic=True))
    assert it.take(10) == [1, 1, 2, -2, 3, 3]
    assert counts(it) == {"iter_list": (None, 3), "duplicate[0]": (3, 3), "for_each()": (3, 3),
                          "duplicate[1]": (3, 3), "LocalUnion(round_robin)": (6, 6)}
    buffered = profiling.profile_data(it)["nodes"]["duplicate[1]"]["buffered"]
    assert buffered["limit"] == 1 and buffered["samples"] >= 1 and 0 <= buffered["max"] <= 1


def test_repeated_labels_get_a_suffix_and_the_table_lines_up_with_describe() -> None:
    it = profiling.enable(iter_list([1, 2]).union(iter_list([3]), deterministic=True).for_each(abs))
    it.take(5)
    assert list(profiling.profile_data(it)["nodes"]) == ["iter_list", "iter_list #2", "LocalUnion(round_robin)",
                                                         "for_each()"]
    lines = it.profile().splitlines()
    described = it.describe().splitlines()
    assert lines[1].startswith("named: ") and "inside pulls is in operators and backoffs" in lines[1]
    rows = [line.split("|")[1].rstrip()[1:] for line in lines[4:4 + len(described)]]
    assert rows == described
    assert [line.split("|")[1].strip() for line in lines[4 + len(described):7 + len(described)]] == [
        "(backoff: nothing ready)", "(between pulls)", "(unaccounted)"]
    assert lines[7 + len(described)].startswith("(backoff: the plan's sleeps inside a pull that found no item ready")
    assert max(len(line) for line in lines) <= profiling.TABLE_WIDTH


def test_time_in_the_op_and_waiting_for_upstream_are_split() -> None:
    def slow_items() -> Iterator[int]:
        for i in range(5):
            time.sleep(0.04)  # simulated work: the source takes 40 ms per item
            yield i

    def slow_op(x: int) -> int:
        time.sleep(0.01)  # simulated work: 10 ms per item
        return x

    it = profiling.enable(LocalIterator.from_iterable(slow_items, name="slow").for_each(slow_op))
    assert it.take(10) == [0, 1, 2, 3, 4]
    nodes = profiling.profile_data(it)["nodes"]
    source, op = nodes["slow"], nodes["for_each()"]
    assert source["time_in_op_s"] >= 0.2 and source["time_waiting_s"] == 0
    assert op["time_waiting_s"] >= 0.2 and 0.05 <= op["time_in_op_s"] < 0.15  # >= 0.25 if the source's leaked in
    assert op["time_waiting_s"] == pytest.approx(source["time_in_op_s"], abs=0.01)
    assert sum(n["share_of_wall"] for n in nodes.values()) <= 1.0


def test_a_queue_between_enqueue_and_dequeue_reports_its_depth_and_traffic() -> None:
    q: queue.Queue[int] = queue.Queue(maxsize=2)
    it = profiling.enable(Concurrently([iter_list(range(6)).for_each(Enqueue(q)), Dequeue(q)], mode="async",
                                       output_indexes=[1]))
    assert it.take(6) == list(range(6))
    node = profiling.profile_data(it)["nodes"]["queue(maxsize=2)"]
    assert (node["items_in"], node["items_out"]) == (6, 6)
    depth = node["queue_depth"]
    assert depth["limit"] == 2 and depth["samples"] >= 1 and 0 <= depth["max"] <= 2


# -- off means off ---------------------------------------------------------------------------------------

def test_profiling_off_leaves_the_plan_stages_unwrapped() -> None:
    def make() -> LocalIterator[int]:
        return iter_list(range(4)).for_each(abs).filter(lambda x: x > 0).union(iter_list([7]))

    off, on = make(), profiling.enable(make())
    assert off.take(2) == on.take(2) == [1, 7]
    assert off._cell.flow.profiler is None
    first_input = off._chain.active[0][0]  # the union's first input, as built: filter <- for_each <- source
    assert [type(p).__name__ for p in built_stages(first_input)] == ["Filter", "ForEach", "IterSource"]
    assert isinstance(on._chain, iter_profiling._Profiled)
    wrapped = [type(p).__name__ for p in built_stages(on._chain.inner.active[0][0])]
    assert wrapped == ["_Profiled", "Filter", "_Profiled", "ForEach", "_Profiled", "IterSource"]


def test_enable_refuses_a_pulled_plan_and_profile_needs_profiling_on() -> None:
    it = iter_list([1, 2]).for_each(abs)
    with pytest.raises(ValueError, match="profiling is off"):
        it.profile()
    next(it)
    with pytest.raises(ValueError, match="already been pulled"):
        profiling.enable(it)
    with pytest.raises(TypeError, match="LocalIterator"):
        profiling.enable([1, 2])  # type: ignore[arg-type]  # the point of the test


# -- staleness: weights versions ---------------------------------------------------------------------------

def test_rollout_workers_stamp_and_send_weights_versions_only_when_profiling() -> None:
    config = RolloutConfig(env="CartPole-v1", rollout_fragment_length=16, seed=0, profile=True)
    learner, sampler = (RolloutWorker(policy_class=TinyPGPolicy, config=config, worker_index=i) for i in (0, 1))
    batch = learner.sample()
    assert batch[WEIGHTS_VERSION].tolist() == [0] * 16
    learner.learn_on_batch(batch)
    learner.learn_on_batch(batch)
    assert learner.weights_version() == 2
    sampler.set_weights(learner.get_weights())
    assert sampler.weights_version() == 2 and set(sampler.sample()[WEIGHTS_VERSION].tolist()) == {2}
    plain = RolloutWorker(policy_class=TinyPGPolicy, config=dataclasses.replace(config, profile=False))
    assert WEIGHTS_VERSION not in plain.sample() and WEIGHTS_VERSION not in plain.get_weights()["default_policy"]
    plain.set_weights(learner.get_weights())  # a versioned sender: the version is adopted, the weights load
    assert plain.weights_version() == 2


def test_a_profiled_apex_run_shows_its_three_sub_flows_and_the_staleness_it_trains_on() -> None:
    config = ApexConfig(seed=0, num_workers=2, num_replay_buffer_shards=1, learning_starts=100, buffer_size=2000,
                        train_batch_size=20, rollout_fragment_length=10, target_network_update_freq=200,
                        timesteps_per_iteration=100, min_iter_time_s=0, max_weight_sync_delay=30)
    workers = make_fake_workers(2, rollout_fragment_length=10)
    shards = make_replay_shards(config)
    it = profiling.enable(apex_plan(workers, config, replay_actors=shards))
    try:
        results = [next(it) for _ in range(6)]
        table = it.profile()
        print(table)
        nodes = profiling.profile_data(it)["nodes"]
    finally:
        it.close()
        workers.stop()
        for shard in shards:
            executor.kill(shard)
    assert results[-1]["info"]["num_learner_updates"] > 0
    # (1) store, (2) replay into the learner, (3) update: each sub-flow of Concurrently moved items
    for row in ("[0] for_each(UpdateWorkerWeights(30))", "[1] for_each(Enqueue(maxsize=16))",
                "[2] for_each(UpdateTargetNetwork(200))"):
        assert row in table
    sub_flows = [nodes[label]["items_out"] for label in ("for_each(UpdateWorkerWeights(30))",
                                                         "for_each(Enqueue(maxsize=16))",
                                                         "for_each(UpdateTargetNetwork(200))")]
    assert all(n > 0 for n in sub_flows)
    assert nodes["Concurrently(async, output_indexes=[2])"]["items_in"] == sum(sub_flows)
    learner = nodes["ApexLearnerThread"]
    assert learner["items_in"] == nodes["for_each(Enqueue(maxsize=16))"]["items_out"]
    assert learner["staleness"]["count"] > 0 and learner["staleness"]["min"] >= 0 and learner["staleness"]["max"] > 0
    assert learner["in_queue_depth"]["limit"] == 16
    assert "staleness" in table and "in-queue" in table
    rollouts = nodes["gather_async(num_async=2)"]["in_flight_per_shard"]
    assert rollouts["limit"] == 2 and len(rollouts["max"]) == 2 and all(0 <= m <= 2 for m in rollouts["max"])


def test_the_trainer_result_carries_the_profile_only_when_enabled() -> None:
    base = PGConfig(num_workers=0, rollout_fragment_length=50, train_batch_size=100, timesteps_per_iteration=0,
                    seed=0)
    off, on = Trainer("pg", base), Trainer("pg", dataclasses.replace(base, profile=True))
    try:
        assert "profile" not in off.train() and off.plan._cell.flow.profiler is None
        assert WEIGHTS_VERSION not in off.workers.local_worker().sample()
        on.train()
        profile = on.train()["profile"]
        train = profile["nodes"]["for_each(TrainOneStep)"]
        assert train["items_out"] == 2 and profile["wall_s"] > 0
        assert train["staleness"] == {"count": 200, "mean": 0.0, "min": 0.0, "max": 0.0}  # sync: on-policy
        assert set(profile["nodes"]) == {n.label for n in plan_graph.build(on.plan).nodes}
        assert np.isfinite(train["time_in_op_s"]) and train["share_of_wall"] > 0
    finally:
        off.stop()
        on.stop()


# -- the command line -------------------------------------------------------------------------------------

def test_plan_show_prints_the_plan_graph_without_training() -> None:
    result = invoke("plan", "show", "ppo", "--env", "CartPole-v1")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[:5] == ["for_each(WarnAboutBadRewardScales)", "for_each(CollectMetrics)",
                                              "filter(ReportGate(0 steps, 0 s))", "for_each(UpdateKL)",
                                              "for_each(TrainOneStep)"]
    assert "batch_across_shards()" in result.stdout  # the config's remote workers: a barrier over them
    assert "(2 shards)" in result.stdout and not result.stderr  # every worker the config asks for
    dot = invoke("plan", "show", "pg", "--config", "num_workers=0", "--format", "dot")
    assert dot.exit_code == 0 and dot.stdout.startswith("digraph plan {") and "TrainOneStep" in dot.stdout
    mermaid = invoke("plan", "show", "pg", "--config", "num_workers=0", "--format", "mermaid")
    assert mermaid.exit_code == 0 and mermaid.stdout.startswith("flowchart LR")


@pytest.mark.parametrize("args, named", [
    (["plan", "show", "ppo", "--format", "svg"], ["'--format'", "svg"]),
    (["plan", "show", "ppx"], ["'ALGO'", "'ppx'"]),
    (["plan", "show", "ppo", "--config", "lr=-1"], ["'--config'", "lr=-1"]),
    (["profile", "pg", "--iters", "0"], ["'--iters'", "0"]),
    (["profile", "pg", "--config", "lrr=0.1"], ["'--config'", "lrr"]),
])
def test_bad_plan_show_and_profile_invocations_are_usage_errors(args: list[str], named: list[str]) -> None:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for text in named:
        assert text in result.output


def test_profile_trains_n_iterations_and_prints_the_table() -> None:
    result = invoke("profile", "pg", "--env", "CartPole-v1", "--config", "num_workers=0", "--config",
                    "train_batch_size=100", "--config", "rollout_fragment_length=50", "--config",
                    "timesteps_per_iteration=0", "--iters", 2)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines[:2]] == [["iter", "1"], ["iter", "2"]]
    assert lines[2].startswith("profile: ") and lines[3].startswith("named: ")
    assert lines[4].split("|")[1].strip() == "operator"
    train_row = next(line for line in lines if line.startswith("| for_each(TrainOneStep)"))
    assert [cell.strip() for cell in train_row.split("|")[2:4]] == ["2", "2"]
    assert "  for_each(TrainOneStep): staleness 0.0 (max 0)" in lines[lines.index("notes:"):]


def test_the_table_of_a_wide_plan_fits_100_columns_and_explains_the_remainder() -> None:
    config = ApexConfig(seed=0, num_workers=2, num_replay_buffer_shards=1, learning_starts=100, buffer_size=2000,
                        train_batch_size=20, rollout_fragment_length=10, target_network_update_freq=200,
                        timesteps_per_iteration=100, min_iter_time_s=0)
    workers = make_fake_workers(2, rollout_fragment_length=10)
    shards = make_replay_shards(config)
    it = profiling.enable(apex_plan(workers, config, replay_actors=shards))
    try:
        it.take(2)
        lines = it.profile().splitlines()
    finally:
        it.close()
        workers.stop()
        for shard in shards:
            executor.kill(shard)
    assert max(len(line) for line in lines) <= 100
    assert any(line.startswith("(backoff: the plan's sleeps inside a pull") for line in lines)
    notes = lines[lines.index("notes:") + 1:]
    assert any(line.startswith("  ApexLearnerThread: ") and "in-queue" in line for line in notes)


def test_the_wall_time_is_accounted_for_operators_backoffs_between_pulls_and_the_rest() -> None:
    ready = iter([False, False, True, True, False, True])

    def poll() -> int | None:  # "nothing yet" twice: the pull backs off
        return 1 if next(ready) else None

    it = profiling.enable(LocalIterator.from_poll(poll).for_each(lambda x: time.sleep(0.02) or x))
    next(it)
    time.sleep(0.05)  # the caller's own work, between pulls
    next(it)
    accounts = profiling.profile_data(it)["time"]
    assert accounts["backoff_s"] >= 0.002  # two backoffs of 1 and 2 ms before the first item
    assert accounts["operators_s"] >= 0.04  # two items through the 20 ms operator
    assert accounts["between_pulls_s"] >= 0.05
    named = accounts["operators_s"] + accounts["backoff_s"]
    assert accounts["unaccounted_s"] == pytest.approx(max(0.0, accounts["pulls_s"] - named))
    assert accounts["attributed_share"] == pytest.approx(min(1.0, named / accounts["pulls_s"]))
    assert 0 < accounts["last_pull"]["attributed_share"] <= 1 and accounts["last_pull"]["wall_s"] > 0
