"""Plan inspection (flowrl.plan_graph, LocalIterator.describe/validate): the operator graph of small plans and of
every algorithm's plan, its DOT and Mermaid text, and the checks that run before launch."""

from __future__ import annotations

import queue
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flowrl import executor

from flowrl import plan_graph
from flowrl.algorithms import apex, dqn, impala, multiagent, ppo
from flowrl.config import PolicySpec
from flowrl.iter import LocalIterator, from_range
from flowrl.metrics import MetricsBinding
from flowrl.ops.concurrency import Concurrently, Dequeue, Enqueue
from flowrl.plan_graph import PlanGraph, build, to_dot, to_mermaid
from flowrl.testing import iter_list, make_fake_workers
from flowrl.workers import WorkerSet

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py


class Double:
    """A named stage, so that its label shows in the tree."""

    def __call__(self, x: int) -> int:
        return 2 * x

    def __repr__(self) -> str:
        return "Double"


class CountItems(MetricsBinding):
    def __call__(self, x: int) -> int:
        self.metrics.counters["items"] += 1
        return x

    def __repr__(self) -> str:
        return "CountItems"


def lines(text: str) -> str:
    """A tree written as an indented triple-quoted block, without the block's own indentation."""
    rows = [r for r in text.splitlines() if r.strip()]
    margin = min(len(r) - len(r.lstrip()) for r in rows)
    return "\n".join(r[margin:] for r in rows)


# -- text trees of small plans on plain lists -----------------------------------------------------------

def test_a_chain_lists_its_stages_from_the_output_down_to_the_source() -> None:
    it = iter_list([1, -2, 3]).for_each(Double()).filter(bool).batch(2).flatten().for_each(abs)
    assert it.describe() == lines("""
        for_each()
        flatten()
        batch(2)
        filter()
        for_each(Double)
        iter_list
    """)
    assert it.take(3) == [2, 4, 6]  # describing pulled nothing


def test_unions_show_their_mode_weights_and_inputs_in_order() -> None:
    inner = Concurrently([iter_list([1]), iter_list([2]).for_each(Double())], mode="round_robin", output_indexes=[0],
                         round_robin_weights=[2, "*"])
    plan = iter_list([3]).union(inner).union(LocalIterator.from_poll(lambda: None, name="poll"), deterministic=True)
    assert plan.describe() == lines("""
        LocalUnion(round_robin)
          [0] LocalUnion(async)
                [0] iter_list
                [1] Concurrently(round_robin, round_robin_weights=[2, '*'], output_indexes=[0])
                      [0] iter_list
                      [1] for_each(Double)
                          iter_list
          [1] poll
    """)
    concurrently = next(n for n in build(plan).nodes if n.label.startswith("Concurrently"))
    assert (concurrently.kind, dict(concurrently.attrs)) == (
        "union", {"mode": "round_robin", "round_robin_weights": [2, "*"], "output_indexes": [0]})


def test_a_duplicated_stream_is_one_node_shown_once_and_then_referred_to() -> None:
    a, b, c = iter_list([1, 2]).for_each(Double()).duplicate(3)
    plan = Concurrently([a.for_each(abs), b, c.filter(bool)], mode="async")
    assert plan.describe() == lines("""
        Concurrently(async)
          [0] for_each()
              duplicate[0]
              for_each(Double) @1
              iter_list
          [1] duplicate[1]
              for_each(Double) @1 (shown above)
          [2] filter()
              duplicate[2]
              for_each(Double) @1 (shown above)
    """)
    graph = build(plan)
    (shared,) = [n for n in graph.nodes if n.label == "for_each(Double)"]
    assert sorted(graph.nodes[e.dst].attrs["index"] for e in graph.consumers(shared.id)) == [0, 1, 2]
    assert sorted(plan.take(6)) == [2, 2, 2, 4, 4, 4]


def test_a_named_composite_shows_its_internals_indented() -> None:
    it = iter_list([1]).for_each(Double()).named("Doubled").filter(bool)
    assert it.describe() == lines("""
        filter()
        Doubled
          for_each(Double)
          iter_list
    """)
    assert repr(it) == "LocalIterator[Doubled.filter()]" and it.take(2) == [2]


def test_gathers_show_their_kind_arguments_and_the_sharded_source() -> None:
    pi = from_range(4, num_shards=2).for_each(Double())
    source = "ParallelIterator[from_range[4, shards=2].for_each(Double)] (2 shards)"
    assert pi.gather_async(num_async=2).describe() == f"gather_async(num_async=2)\n{source}"
    assert pi.gather_async(batch_ms=5).describe() == f"gather_async(num_async=1, batch_ms=5)\n{source}"
    assert pi.gather_sync().for_each(abs).describe() == f"for_each()\ngather_sync()\n{source}"
    assert pi.batch_across_shards().describe() == f"batch_across_shards()\n{source}"
    assert pi.get_shard(1).describe() == ("shard[1](num_async=1)\n"
                                          "ParallelIterator[from_range[4, shards=2].for_each(Double)] (1 shard)")
    # gathered once, so the shard actors exist before their handles go (Ray prints "Failed to register actor"
    # for an actor dropped before it registered it)
    assert sorted(pi.gather_sync().take(4)) == [0, 2, 4, 6]


class FakeLearner:
    """What plan inspection recognises as a learner thread: an in-queue, an out-queue and ``is_alive``."""

    def __init__(self) -> None:
        self.inqueue: queue.Queue[Any] = queue.Queue(maxsize=2)
        self.outqueue: queue.Queue[Any] = queue.Queue()

    def is_alive(self) -> bool:
        return True


def test_a_learner_thread_sits_between_its_enqueue_and_its_dequeue() -> None:
    learner = FakeLearner()
    enqueue_op = iter_list([1]).for_each(Enqueue(learner.inqueue))
    plan = Concurrently([enqueue_op, Dequeue(learner.outqueue, check=learner.is_alive)], mode="async",
                        output_indexes=[1])
    assert plan.describe() == lines("""
        Concurrently(async, output_indexes=[1])
          [0] for_each(Enqueue(maxsize=2)) @1
              iter_list
          [1] Dequeue
                <~ FakeLearner
                     <~ for_each(Enqueue(maxsize=2)) @1 (shown above)
    """)
    graph = build(plan)
    hand_offs = [(graph.nodes[e.src].label, graph.nodes[e.dst].label) for e in graph.edges if e.via_queue]
    assert sorted(hand_offs) == [("FakeLearner", "Dequeue"), ("for_each(Enqueue(maxsize=2))", "FakeLearner")]
    plan.validate()  # a queue hand-off is no second reader of the Enqueue stage


# -- every algorithm's plan ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workers() -> Iterator[WorkerSet]:
    ws = make_fake_workers(2, rollout_fragment_length=10)
    yield ws
    ws.stop()


@pytest.fixture(scope="module")
def two_policy_workers() -> Iterator[WorkerSet]:
    ws = make_fake_workers(1, rollout_fragment_length=50, env=lambda ctx: None,
                           policies={"ppo_policy": PolicySpec(), "dqn_policy": PolicySpec()},
                           policy_mapping_fn={"agent_0": "ppo_policy", "agent_1": "dqn_policy"})
    yield ws
    ws.stop()


def build_ppo(workers: WorkerSet, _: WorkerSet) -> LocalIterator[Any]:
    return ppo.plan(workers, ppo.PPOConfig(train_batch_size=200, sgd_minibatch_size=50))


def build_dqn(workers: WorkerSet, _: WorkerSet) -> LocalIterator[Any]:
    return dqn.plan(workers, dqn.DQNConfig(learning_starts=64, timesteps_per_iteration=100, min_iter_time_s=0))


APEX = apex.ApexConfig(seed=0, num_workers=2, num_replay_buffer_shards=1, learning_starts=100, buffer_size=2000,
                       train_batch_size=20, rollout_fragment_length=10, target_network_update_freq=200,
                       timesteps_per_iteration=100, min_iter_time_s=0)


def build_apex(workers: WorkerSet, _: WorkerSet) -> LocalIterator[Any]:
    shards = apex.make_replay_shards(APEX)
    return apex.plan(workers, APEX, replay_actors=shards).on_close(lambda: [executor.kill(s) for s in shards])


def build_impala(workers: WorkerSet, _: WorkerSet) -> LocalIterator[Any]:
    return impala.plan(workers, impala.IMPALAConfig(train_batch_size=20, timesteps_per_iteration=0,
                                                    learner_queue_size=2))


def build_two_policies(_: WorkerSet, workers: WorkerSet) -> LocalIterator[Any]:
    config = multiagent.MultiAgentConfig(timesteps_per_iteration=200, min_iter_time_s=0,
                                         ppo=ppo.PPOConfig(train_batch_size=100, sgd_minibatch_size=50))
    return multiagent.plan(workers, config)


BULK_SYNC_ROLLOUTS = """
ParallelRollouts(bulk_sync)
  for_each(ReportSampled)
  for_each()
  batch_across_shards()
  ParallelIterator[from_actors[shards=2]] (2 shards)"""

PPO_TREE = """
for_each(WarnAboutBadRewardScales)
for_each(CollectMetrics)
filter(ReportGate(0 steps, 0 s))
for_each(UpdateKL)
for_each(TrainOneStep)
for_each(StandardizeFields(['advantages']))
combine(ConcatBatches(200))
for_each(SelectExperiences(['default_policy']))""" + BULK_SYNC_ROLLOUTS

# (1) store lockstep rollouts, (2) replay -> train -> priorities -> target net, round robin, emitting (2)
DQN_TREE = """
for_each(CollectMetrics)
filter(ReportGate(100 steps, 0 s))
Concurrently(round_robin, round_robin_weights=[1.0, 1.0], output_indexes=[1])
  [0] for_each(StoreToReplayBuffer(local))""" + BULK_SYNC_ROLLOUTS.replace("\n", "\n      ") + """
  [1] for_each(UpdateTargetNetwork(500))
      for_each(UpdatePriorities)
      for_each(TrainOneStep)
      Replay(local)"""

# three sub-flows under Concurrently(async, output_indexes=[2]): (1) async rollouts stored in the replay shards,
# each worker's weights synced; (2) replay from the shards into the learner's in-queue; (3) its out-queue ->
# priorities back to the shards -> count -> target update
APEX_TREE = """
for_each(AddReplayShardStats(replay_shard_0))
for_each()
for_each(CollectMetrics)
filter(ReportGate(100 steps, 0 s))
Concurrently(async, output_indexes=[2])
  [0] for_each(UpdateWorkerWeights(400))
      zip_with_source_actor()
      for_each(StoreToReplayBuffer(actors=1))
      ParallelRollouts(async)
        for_each(ReportSampled)
        gather_async(num_async=2)
        ParallelIterator[from_actors[shards=2]] (2 shards)
  [1] for_each(Enqueue(maxsize=16)) @1
      zip_with_source_actor()
      Replay(actors=1)
        none_as_not_ready()
        gather_async(num_async=4)
        ParallelIterator[from_actors[shards=1]] (1 shard)
  [2] for_each(UpdateTargetNetwork(200))
      for_each(RecordLearnerOutput)
      for_each(UpdateReplayShardPriorities)
      Dequeue
        <~ ApexLearnerThread
             <~ for_each(Enqueue(maxsize=16)) @1 (shown above)"""

# async rollouts -> weights to each delivering worker -> mix-in replay -> concat -> learner thread -> counted
IMPALA_TREE = """
for_each()
for_each(CollectMetrics)
filter(ReportGate(0 steps, 0 s))
Concurrently(async, output_indexes=[1])
  [0] for_each(Enqueue(maxsize=2)) @1
      combine(ConcatBatches(20))
      combine(MixInReplay(0, 0.0))
      for_each(BroadcastUpdateLearnerWeights(1))
      zip_with_source_actor()
      ParallelRollouts(async)
        for_each(ReportSampled)
        gather_async(num_async=2)
        ParallelIterator[from_actors[shards=2]] (2 shards)
  [1] for_each(RecordLearnerOutput)
      Dequeue
        <~ LearnerThread
             <~ for_each(Enqueue(maxsize=2)) @1 (shown above)"""

# one bulk_sync rollout source, duplicated into a PPO branch and a DQN branch (store/replay round robin),
# joined by Concurrently(async) that emits the DQN branch's items
TWO_POLICY_TREE = """
for_each(CollectMetrics)
filter(ReportGate(200 steps, 0 s))
Concurrently(async, output_indexes=[1])
  [0] for_each(UpdateKL)
      for_each(TrainOneStep)
      for_each(StandardizeFields(['advantages']))
      for_each(CountSteps(agent_steps_trained_PPO))
      combine(ConcatBatches(100))
      for_each(SelectExperiences(['ppo_policy']))
      duplicate[1]
      ParallelRollouts(bulk_sync) @1
        for_each(ReportSampled)
        for_each()
        batch_across_shards()
        ParallelIterator[from_actors[shards=1]] (1 shard)
  [1] Concurrently(round_robin, round_robin_weights=[1.0, 12.5], output_indexes=[1])
        [0] for_each(StoreToReplayBuffer(local))
            for_each(SelectExperiences(['dqn_policy']))
            duplicate[0]
            ParallelRollouts(bulk_sync) @1 (shown above)
        [1] for_each(UpdateTargetNetwork(500))
            for_each(UpdatePriorities)
            for_each(TrainOneStep)
            for_each(CountSteps(agent_steps_trained_DQN))
            Replay(local)"""

PlanBuilder = Callable[[WorkerSet, WorkerSet], LocalIterator[Any]]
PLANS: list[tuple[str, PlanBuilder, str]] = [
    ("ppo", build_ppo, PPO_TREE), ("dqn", build_dqn, DQN_TREE), ("apex", build_apex, APEX_TREE),
    ("impala", build_impala, IMPALA_TREE), ("two_policies", build_two_policies, TWO_POLICY_TREE)]


@pytest.fixture(params=PLANS, ids=[name for name, _, _ in PLANS])
def algorithm_plan(request: pytest.FixtureRequest, workers: WorkerSet,
                   two_policy_workers: WorkerSet) -> Iterator[tuple[LocalIterator[Any], str]]:
    _, make_plan, tree = request.param
    it = make_plan(workers, two_policy_workers)
    yield it, tree.strip("\n")
    it.close()


def test_each_algorithm_plan_reads_like_the_papers_dataflow_and_validates(
        algorithm_plan: tuple[LocalIterator[Any], str]) -> None:
    it, tree = algorithm_plan
    assert it.describe() == tree
    it.validate()  # no problem: returns None


def check_dot(graph: PlanGraph, text: str) -> None:
    rows = text.splitlines()
    assert rows[:3] == ["digraph plan {", "  rankdir=LR;", '  node [shape=box, fontname="monospace"];']
    assert rows[-1] == "}"
    declared = [m.group(1) for r in rows if (m := re.fullmatch(r'  (n\d+) \[label="(?:[^"\\]|\\.)*", shape=\w+\];', r))]
    edges = [re.fullmatch(r"  (n\d+) -> (n\d+)(?: \[(?:label=\"\d+\"|style=dashed)(?:, style=dashed)?\])?;", r)
             for r in rows if r.startswith("  n") and " -> " in r.split("[")[0]]
    assert len(declared) == len(set(declared)) == len(graph.nodes)
    assert len(declared) + len(edges) == len(rows) - 4  # nothing else in the body
    assert all(m is not None and {m.group(1), m.group(2)} <= set(declared) for m in edges)
    assert len(edges) == len(graph.edges)


def check_mermaid(graph: PlanGraph, text: str) -> None:
    rows = text.splitlines()
    assert rows[0] == "flowchart LR"
    shapes = "|".join(re.escape(shape).replace("LABEL", '[^"]*') for shape in (  # a quoted label in a node shape
        '(["LABEL"])', '[["LABEL"]]', '[/"LABEL"\\]', '{{"LABEL"}}', '[\\"LABEL"/]', '>"LABEL"]', '[("LABEL")]',
        '["LABEL"]'))
    declared = [m.group(1) for r in rows[1:] if (m := re.fullmatch(rf"  (n\d+)(?:{shapes})", r))]
    edges = [re.fullmatch(r"  (n\d+) (?:-->|-->\|\d+\||-\.->) (n\d+)", r) for r in rows[1:] if re.match(r"  n\d+ ", r)]
    assert len(declared) == len(set(declared)) == len(graph.nodes)
    assert len(declared) + len(edges) == len(rows) - 1
    assert all(m is not None and {m.group(1), m.group(2)} <= set(declared) for m in edges)
    assert len(edges) == len(graph.edges)


def test_dot_and_mermaid_of_each_algorithm_plan_are_well_formed(algorithm_plan: tuple[LocalIterator[Any], str]) -> None:
    graph = build(algorithm_plan[0])
    check_dot(graph, to_dot(graph))
    check_mermaid(graph, to_mermaid(graph))


def test_labels_with_quotes_are_escaped() -> None:
    graph = build(iter_list([1]).named('say "hi"\\'))
    assert '[label="say \\"hi\\"\\\\", shape=box]' in to_dot(graph)
    assert 'n1["say #quot;hi#quot;\\"]' in to_mermaid(graph)
    check_dot(graph, to_dot(graph))


def test_the_ape_x_graph_has_three_sub_flows_and_the_learner_between_queues(workers: WorkerSet) -> None:
    it = build_apex(workers, workers)
    try:
        graph = build(it)
        (union,) = [n for n in graph.nodes if n.kind == "union"]
        assert (union.attrs["mode"], union.attrs["output_indexes"]) == ("async", [2])
        assert [e.index for e in graph.inputs(union.id)] == [0, 1, 2]
        (learner,) = [n for n in graph.nodes if n.kind == "thread"]
        assert [graph.nodes[e.src].label for e in graph.inputs(learner.id)] == ["for_each(Enqueue(maxsize=16))"]
        assert [graph.nodes[e.dst].label for e in graph.consumers(learner.id)] == ["Dequeue"]
        assert sorted(n.attrs["num_async"] for n in graph.nodes if n.kind == "gather") == [2, 4]
    finally:
        it.close()


def test_the_composition_reads_one_rollout_stream_through_duplicate(two_policy_workers: WorkerSet) -> None:
    it = build_two_policies(two_policy_workers, two_policy_workers)
    graph = build(it)
    (rollouts,) = [n for n in graph.nodes if n.label == "ParallelRollouts(bulk_sync)"]
    children = [graph.nodes[e.dst] for e in graph.consumers(rollouts.id)]
    assert sorted((c.kind, c.attrs["index"], c.attrs["n"]) for c in children) == [("duplicate", 0, 2),
                                                                                   ("duplicate", 1, 2)]
    assert sorted(n.attrs["mode"] for n in graph.nodes if n.kind == "union") == ["async", "round_robin"]
    assert len([n for n in graph.nodes if n.kind == "gather"]) == 1


# -- validation before launch: one test per error ----------------------------------------------------------

def test_output_indexes_that_name_no_op_are_rejected_at_construction() -> None:
    with pytest.raises(ValueError, match=r"entry 2 is not the index of one of the 2 ops; pass a non-empty list of op "
                                         r"indices in \[0, 2\)"):
        Concurrently([iter_list([1]), iter_list([2])], output_indexes=[2])


def test_all_star_weights_are_rejected_by_concurrently_and_found_in_a_hand_made_union() -> None:
    with pytest.raises(ValueError, match="are all '\\*'; give at least one op a numeric weight"):
        Concurrently([iter_list([1]), iter_list([2])], round_robin_weights=["*", "*"])
    union = iter_list([1]).union(iter_list([2]), round_robin_weights=["*", "*"])  # legal for the core union
    with pytest.raises(ValueError, match=r"the plan has 1 problem:\n- LocalUnion\(round_robin, round_robin_"
                                         r"weights=\['\*', '\*'\]\): the round_robin_weights are all '\*', .* give at "
                                         r"least one input a numeric weight"):
        union.validate()


def test_weights_in_async_mode_are_rejected_at_construction() -> None:
    with pytest.raises(ValueError, match="given with mode='async'; .* use mode='round_robin' or drop the weights"):
        Concurrently([iter_list([1]), iter_list([2])], mode="async", round_robin_weights=[1, 2])


def test_a_parallel_iterator_cannot_enter_a_plan_without_a_gather() -> None:
    """A plan reads a ParallelIterator only through a gather; every other way in is refused at construction."""
    pi = from_range(2, num_shards=1)
    with pytest.raises(TypeError, match="gather a ParallelIterator first"):
        iter_list([1]).union(pi)  # type: ignore[arg-type]  # the misuse under test
    with pytest.raises(TypeError, match="ops\\[1\\] is a ParallelIterator, not a LocalIterator; gather a "
                                        "ParallelIterator first"):
        Concurrently([iter_list([1]), pi])  # type: ignore[list-item]  # the misuse under test
    with pytest.raises(TypeError, match="call .gather_sync\\(\\) or .gather_async\\(\\)"):
        iter(pi)
    assert pi.gather_sync().take(2) == [0, 1]  # (the shard actor is up before its handle goes)


def test_a_duplicate_child_that_is_never_consumed_is_found() -> None:
    a, b, c = iter_list([1, 2]).duplicate(3)
    with pytest.raises(ValueError, match=r"the plan has 2 problems:\n- duplicate\[1\] of iter_list is never "
                                         r"consumed by the plan: its siblings stall .* consume every child, e.g. each "
                                         r"in a Concurrently branch, or duplicate into fewer\n- duplicate\[2\] of "
                                         r"iter_list"):
        a.for_each(abs).validate()
    Concurrently([a, b, c]).validate()  # every child consumed: no problem


def test_a_stream_read_twice_without_duplicate_is_found() -> None:
    rollouts = iter_list([1, 2]).for_each(Double())
    plan = Concurrently([rollouts.for_each(abs), rollouts.filter(bool)], mode="async")
    with pytest.raises(ValueError, match=r"for_each\(Double\) is read by 2 consumers \(for_each\(\), filter\(\)"
                                         r"\) without duplicate\(\): each builds its own copy .* call "
                                         r"\.duplicate\(2\) on it"):
        plan.validate()


def test_an_operator_bound_to_another_plans_metrics_is_found() -> None:
    op = CountItems()
    first = iter_list([1]).for_each(op)
    assert first.take(1) == [1]  # binds op to the first plan's context
    second = iter_list([2]).for_each(op)
    with pytest.raises(ValueError, match=r"for_each\(CountItems\) is bound to another dataflow's metrics context .* "
                                         r"build a new CountItems\(...\) for this plan"):
        second.validate()
    with pytest.raises(ValueError, match="already bound to another dataflow"):  # what launching it would do
        next(second)
    first.validate()  # its own context: no problem


def test_every_problem_is_listed_at_once() -> None:
    op = CountItems()
    iter_list([1]).for_each(op).take(1)
    a, _ = iter_list([1]).duplicate(2)
    plan = a.for_each(op).union(iter_list([2]), round_robin_weights=["*", "*"])
    found = plan_graph.problems(build(plan), plan.metrics)
    assert [p.split(" ")[0] for p in found] == ["duplicate[1]", "for_each(CountItems)", "LocalUnion(round_robin,"]
    with pytest.raises(ValueError, match="the plan has 3 problems"):
        plan.validate()
