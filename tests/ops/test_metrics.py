"""Reporting operators with injected clocks, fake workers and stub workers."""

from __future__ import annotations

import asyncio
import math
from typing import Any, Iterator

import pytest

from flowrl import executor
import ray

from flowrl.config import TrainerConfig
from flowrl.envs.base import EpisodeRecord
from flowrl.iter import LocalIterator
from flowrl.logger import flatten_result
from flowrl.metrics import (AGENT_STEPS_SAMPLED_COUNTER, AGENT_STEPS_TRAINED_COUNTER, CUSTOM_METRICS, LEARNER_INFO,
                            LEARN_ON_BATCH_TIMER, SAMPLE_TIMER, STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER,
                            STEPS_TRAINED_THIS_ITER_COUNTER, MetricsBinding, MetricsContext)
from flowrl.ops.metrics import (AddReplayShardStats, CollectMetrics, OncePerTimeInterval, OncePerTimestepsElapsed,
                                ReportGate, StandardMetricsReporting)
from flowrl.testing import FakeConfig, iter_list, make_fake_workers
from flowrl.workers import WorkerSet

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py


# -- fakes ------------------------------------------------------------------------------------------

class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def ep(ret: float, length: int = 10, **custom: float) -> EpisodeRecord:
    return EpisodeRecord(env_index=0, episode_return=ret, episode_length=length, custom_metrics=dict(custom),
                         policy_returns={"default_policy": ret})


class StubWorker:
    """A local worker whose ``get_metrics`` returns the next scripted list of episodes (then nothing)."""

    def __init__(self, *scripted: list[EpisodeRecord]) -> None:
        self.scripted = list(scripted)

    def get_metrics(self) -> list[EpisodeRecord]:
        return self.scripted.pop(0) if self.scripted else []


class StubWorkers:
    """The two WorkerSet members CollectMetrics uses."""

    def __init__(self, local: StubWorker, remote: list[Any] | None = None) -> None:
        self.local, self.remote = local, list(remote or [])

    def local_worker(self) -> StubWorker:
        return self.local

    def remote_workers(self) -> list[Any]:
        return list(self.remote)


@ray.remote(num_cpus=0)
class MetricsActor:
    """A remote worker whose ``get_metrics`` returns ``episodes``; ``gated`` answers wait for :meth:`release`."""

    def __init__(self, episodes: list[EpisodeRecord], gated: bool = False) -> None:
        self.episodes, self.gated, self.calls = episodes, gated, 0
        self._gate: asyncio.Event | None = None

    async def get_metrics(self) -> list[EpisodeRecord]:
        self.calls += 1
        if self._gate is None:
            self._gate = asyncio.Event()
        if self.gated:
            await self._gate.wait()
        return list(self.episodes)

    async def release(self) -> None:
        self.gated = False
        if self._gate is not None:
            self._gate.set()

    async def num_calls(self) -> int:
        return self.calls


@ray.remote(num_cpus=0)
class StatsActor:
    """A replay shard stand-in whose ``stats()`` answers ``{"num_added": <call number>}``; while ``gated`` an
    answer waits for :meth:`release`."""

    def __init__(self) -> None:
        self.gated, self.calls = False, 0
        self._gate: asyncio.Event | None = None

    async def stats(self) -> dict[str, int]:
        self.calls += 1
        calls = self.calls
        if self._gate is None:
            self._gate = asyncio.Event()
        if self.gated:
            await self._gate.wait()
        return {"num_added": calls}

    async def gate(self) -> None:
        self.gated, self._gate = True, asyncio.Event()

    async def release(self) -> None:
        self.gated = False
        if self._gate is not None:
            self._gate.set()

    async def num_calls(self) -> int:
        return self.calls


class Step(MetricsBinding):
    """A fake train step: each item advances the clock and the counters, and times ``learn`` with units."""

    def __init__(self, clock: FakeClock, seconds: float = 1.0, steps: int = 10, trained: int = 0) -> None:
        self.clock, self.seconds, self.steps, self.trained = clock, seconds, steps, trained

    def __call__(self, item: int) -> int:
        self.clock.now += self.seconds
        counters = self.metrics.counters
        counters[STEPS_SAMPLED_COUNTER] += self.steps
        counters[AGENT_STEPS_SAMPLED_COUNTER] += self.steps
        counters[STEPS_TRAINED_COUNTER] += self.trained
        counters[STEPS_TRAINED_THIS_ITER_COUNTER] += self.trained
        timer = self.metrics.timers[LEARN_ON_BATCH_TIMER]
        timer.push(0.5)
        timer.push_units_processed(self.steps)
        return item


def endless() -> LocalIterator[int]:
    return LocalIterator.from_iterable(lambda: iter(range(10 ** 9)), name="train_op")


@pytest.fixture
def fake_workers() -> Iterator[Any]:
    made: list[WorkerSet] = []

    def make(num_workers: int = 2, **config: Any) -> WorkerSet:
        made.append(make_fake_workers(num_workers, **config))
        return made[-1]

    yield make
    for ws in made:
        ws.stop()


def bound(op: Any, metrics: MetricsContext | None = None) -> Any:
    op.bind(metrics if metrics is not None else MetricsContext())
    return op


# -- OncePerTimestepsElapsed -----------------------------------------------------------------------

def test_once_per_timesteps_elapsed_fires_at_equality_and_moves_its_bookmark() -> None:
    metrics = MetricsContext()
    once = bound(OncePerTimestepsElapsed(100), metrics)
    metrics.counters[STEPS_SAMPLED_COUNTER] = 99
    assert once(None) is False
    metrics.counters[STEPS_SAMPLED_COUNTER] = 100
    assert once.check() is True and once.check() is True  # check() alone moves nothing
    assert once(None) is True and once.last == 100
    metrics.counters[STEPS_SAMPLED_COUNTER] = 199
    assert once(None) is False
    metrics.counters[STEPS_SAMPLED_COUNTER] = 200
    assert once(None) is True


def test_once_per_timesteps_elapsed_zero_delay_trained_counter_and_rebase() -> None:
    metrics = MetricsContext()
    assert bound(OncePerTimestepsElapsed(0), metrics)(None) is True
    once = bound(OncePerTimestepsElapsed(50, by_steps_trained=True), metrics)
    metrics.counters[STEPS_SAMPLED_COUNTER] = 1000
    assert once(None) is False  # sampled steps do not count
    metrics.counters[STEPS_TRAINED_COUNTER] = 500
    assert once(None) is True and once.last == 500
    metrics.counters[STEPS_TRAINED_COUNTER] = 120  # a restore to an earlier checkpoint
    assert once.check() is False and once.last == 120  # rebased in check(), not committed
    metrics.counters[STEPS_TRAINED_COUNTER] = 170
    assert once(None) is True


# -- OncePerTimeInterval -----------------------------------------------------------------------------

def test_once_per_time_interval_first_call_equality_and_check() -> None:
    clock = FakeClock()
    clock.now = 100.0
    once = OncePerTimeInterval(2.5, clock=clock)
    assert once(None) is True  # the first call
    assert once(None) is False
    clock.now = 102.4
    assert once(None) is False
    clock.now = 102.5
    assert once.check() is True and once.last == 100.0  # check() moves nothing
    assert once(None) is True and once.last == 102.5
    for delay in (None, 0, -1):
        always = OncePerTimeInterval(delay, clock=clock)
        assert all(always(None) for _ in range(3))


# -- ReportGate (§6.46) ------------------------------------------------------------------------------

def test_report_gate_steps_reached_early_do_not_need_another_window() -> None:
    clock, metrics = FakeClock(), MetricsContext()
    gate = bound(ReportGate(100, 5.0, clock=clock), metrics)
    counters = metrics.counters
    counters[STEPS_SAMPLED_COUNTER] = 100
    assert gate(None) is True  # t=0: 100 steps, first time check
    clock.now, counters[STEPS_SAMPLED_COUNTER] = 1.0, 200  # N more steps before T seconds
    assert gate(None) is False
    clock.now = 4.9
    assert gate(None) is False
    clock.now = 5.0  # the first item after T passes without another N steps
    assert gate(None) is True
    assert gate.steps.last == 200 and gate.time.last == 5.0


def test_report_gate_time_reached_early_waits_for_steps_without_moving_the_time_bookmark() -> None:
    clock, metrics = FakeClock(), MetricsContext()
    gate = bound(ReportGate(100, 5.0, clock=clock), metrics)
    metrics.counters[STEPS_SAMPLED_COUNTER] = 100
    assert gate(None) is True
    clock.now, metrics.counters[STEPS_SAMPLED_COUNTER] = 9.0, 150
    assert gate(None) is False
    assert gate.time.last == 0.0 and gate.steps.last == 100  # neither bookmark moved
    clock.now, metrics.counters[STEPS_SAMPLED_COUNTER] = 9.5, 200
    assert gate(None) is True


def test_report_gate_binds_its_step_filter_and_refuses_a_second_dataflow() -> None:
    gate = ReportGate(10, None)
    gate.bind(MetricsContext())
    assert gate.steps.metrics is gate.metrics
    with pytest.raises(ValueError, match="ReportGate"):
        gate.bind(MetricsContext())


# -- CollectMetrics --------------------------------------------------------------------------------

def test_collect_metrics_counts_all_workers_but_selected_workers_narrow_the_statistics(fake_workers: Any) -> None:
    ws = fake_workers(2)
    one, two = ws.remote_workers()
    executor.get([one.sample.remote(), two.sample.remote(), two.sample.remote()])  # returns 2.0 and 3.0, 3.0
    ws.local_worker().sample()  # return 1.0
    result = bound(CollectMetrics(ws, selected_workers=[one]))(None)
    assert result["episodes_this_iter"] == 4  # every worker's episodes
    assert result["hist_stats"]["episode_reward"] == [1.0, 2.0]  # local + the selected worker only
    assert (result["episode_reward_min"], result["episode_reward_max"], result["episode_reward_mean"]) == \
        (1.0, 2.0, 1.5)
    assert result["policy_reward_mean"] == {"default_policy": 1.5}
    assert result["episode_len_mean"] == 10.0
    assert result["num_healthy_workers"] == 2
    everyone = bound(CollectMetrics(ws))
    two.sample.remote()
    assert sorted(everyone(None)["hist_stats"]["episode_reward"]) == [3.0]  # new episodes only, from all


def test_collect_metrics_carries_unfinished_requests_over_instead_of_re_requesting() -> None:
    fast, slow = MetricsActor.remote([ep(5.0)]), MetricsActor.remote([ep(7.0)], gated=True)
    try:
        assert executor.get([fast.num_calls.remote(), slow.num_calls.remote()]) == [0, 0]  # both actors are up
        op = bound(CollectMetrics(StubWorkers(StubWorker(), [fast, slow]), timeout_seconds=0.5))
        first = op(None)
        assert first["episodes_this_iter"] == 1 and first["hist_stats"]["episode_reward"] == [5.0]
        second = op(None)
        assert second["episodes_this_iter"] == 1
        assert executor.get([fast.num_calls.remote(), slow.num_calls.remote()]) == [2, 1]  # slow: not asked again
        executor.get(slow.release.remote())
        op.timeout_seconds = 30  # the carried request answers now; do not depend on a short deadline
        third = op(None)
        assert third["episodes_this_iter"] == 2
        assert sorted(third["hist_stats"]["episode_reward"]) == [5.0, 5.0, 5.0, 7.0]
        assert executor.get([fast.num_calls.remote(), slow.num_calls.remote()]) == [3, 1]
        op(None)
        assert executor.get(slow.num_calls.remote()) == 2  # answered, so asked afresh
    finally:
        executor.kill(fast)
        executor.kill(slow)


def test_collect_metrics_smooths_over_a_true_window_of_the_last_min_history_episodes() -> None:
    local = StubWorker([ep(1.0), ep(2.0), ep(3.0)], [ep(4.0)], [], [ep(float(i)) for i in range(10, 15)])
    metrics = MetricsContext()
    op = bound(CollectMetrics(StubWorkers(local), min_history=3), metrics)
    assert op(None)["hist_stats"]["episode_reward"] == [1.0, 2.0, 3.0]
    second = op(None)
    assert second["hist_stats"]["episode_reward"] == [2.0, 3.0, 4.0]  # two earlier ones plus the new one
    assert second["episodes_this_iter"] == 1 and second["episode_reward_mean"] == 3.0
    third = op(None)
    assert third["hist_stats"]["episode_reward"] == [2.0, 3.0, 4.0] and third["episodes_this_iter"] == 0
    fourth = op(None)  # more new episodes than the window: only the last three count (the old padding kept all 5)
    assert fourth["hist_stats"]["episode_reward"] == [12.0, 13.0, 14.0]
    assert (fourth["episode_reward_min"], fourth["episode_reward_mean"], fourth["episode_reward_max"]) == \
        (12.0, 13.0, 14.0)
    assert fourth["episodes_this_iter"] == 5  # every episode of the report is counted
    assert fourth["policy_reward_mean"] == {"default_policy": 13.0}
    assert [e["episode_return"] for e in metrics.episode_window] == [12.0, 13.0, 14.0]  # kept in the context


def test_collect_metrics_without_a_window_covers_each_reports_episodes_only() -> None:
    op = bound(CollectMetrics(StubWorkers(StubWorker([ep(1.0), ep(3.0)], [], [ep(8.0)])), min_history=0))
    assert op(None)["episode_reward_mean"] == 2.0
    assert "episode_reward_mean" not in op(None)
    assert op(None)["hist_stats"]["episode_reward"] == [8.0]


def test_collect_metrics_goes_on_with_the_window_of_a_restored_context() -> None:
    first = MetricsContext()
    bound(CollectMetrics(StubWorkers(StubWorker([ep(1.0), ep(2.0)])), min_history=3), first)(None)
    second = MetricsContext()
    second.restore(first.save())  # as a checkpoint restore or a plan rebuild does
    result = bound(CollectMetrics(StubWorkers(StubWorker([ep(9.0), ep(10.0)])), min_history=3), second)(None)
    assert result["hist_stats"]["episode_reward"] == [2.0, 9.0, 10.0]
    assert result["episode_reward_mean"] == 7.0
    old = first.save()
    del old["episode_window"]  # saved before checkpoints held the window
    third = MetricsContext()
    third.restore(old)
    assert third.episode_window == []


def test_collect_metrics_without_episodes_reports_no_episode_statistics_and_no_nan() -> None:
    result = bound(CollectMetrics(StubWorkers(StubWorker())))(None)
    assert result["episodes_this_iter"] == 0
    for key in ("episode_reward_max", "episode_reward_min", "episode_reward_mean", "episode_len_mean"):
        assert key not in result
    assert result["policy_reward_mean"] == {} and result["custom_metrics"] == {}
    assert result["hist_stats"] == {"episode_reward": [], "episode_lengths": []}
    assert not [k for k, v in flatten_result(result).items() if not math.isfinite(v)]


def test_collect_metrics_per_policy_rewards_and_custom_metrics() -> None:
    episodes = [EpisodeRecord(env_index=0, episode_return=3.0, episode_length=4, custom_metrics={"hits": 1.0},
                              policy_returns={"a": 1.0, "b": 2.0}),
                EpisodeRecord(env_index=0, episode_return=7.0, episode_length=6,
                              custom_metrics={"hits": 3.0, "miss": math.nan}, policy_returns={"a": 5.0})]
    metrics = MetricsContext()
    metrics.info[CUSTOM_METRICS] = {"from_info": 42}
    result = bound(CollectMetrics(StubWorkers(StubWorker(list(episodes)))), metrics)(None)
    assert result["policy_reward_min"] == {"a": 1.0, "b": 2.0}
    assert result["policy_reward_max"] == {"a": 5.0, "b": 2.0}
    assert result["policy_reward_mean"] == {"a": 3.0, "b": 2.0}
    custom = result["custom_metrics"]
    assert (custom["hits_mean"], custom["hits_min"], custom["hits_max"]) == (2.0, 1.0, 3.0)
    assert "miss_mean" not in custom  # nan values are left out; with none left, so is the metric
    assert custom["from_info"] == 42 and "hits" not in custom
    assert CUSTOM_METRICS not in metrics.info and CUSTOM_METRICS not in result["info"]  # popped
    kept = bound(CollectMetrics(StubWorkers(StubWorker(list(episodes))), keep_per_episode_custom_metrics=True))
    assert kept(None)["custom_metrics"]["hits"] == [1.0, 3.0]


def test_collect_metrics_merges_counters_timers_and_resets_steps_trained_this_iter() -> None:
    metrics = MetricsContext()
    counters = metrics.counters
    counters[STEPS_SAMPLED_COUNTER], counters[STEPS_TRAINED_COUNTER] = 300, 200
    counters[AGENT_STEPS_SAMPLED_COUNTER], counters[AGENT_STEPS_TRAINED_COUNTER] = 600, 400
    counters[STEPS_TRAINED_THIS_ITER_COUNTER] = 200
    counters["custom_counter"] = 7
    metrics.info[LEARNER_INFO] = {"default_policy": {"learner_stats": {"loss": 0.5}}}
    metrics.timers[SAMPLE_TIMER].push(0.0123456)
    metrics.timers[LEARN_ON_BATCH_TIMER].push(2.0)
    metrics.timers[LEARN_ON_BATCH_TIMER].push_units_processed(3)
    op = bound(CollectMetrics(StubWorkers(StubWorker())), metrics)
    result = op(None)
    assert result["timesteps_total"] == 300 and result["timesteps_this_iter"] == 300  # the first subtracts 0
    assert result["agent_timesteps_total"] == 600
    assert (result["num_steps_sampled"], result["num_steps_trained"], result["num_agent_steps_sampled"],
            result["num_agent_steps_trained"]) == (300, 200, 600, 400)
    assert result["info"][LEARNER_INFO] == {"default_policy": {"learner_stats": {"loss": 0.5}}}
    assert result["info"]["custom_counter"] == 7 and result["info"][STEPS_TRAINED_THIS_ITER_COUNTER] == 200
    assert result["timers"] == {"sample_time_ms": 12.346, "learn_time_ms": 2000.0, "learn_throughput": 1.5}
    assert counters[STEPS_TRAINED_THIS_ITER_COUNTER] == 0
    result["info"]["custom_counter"] = -1
    assert counters["custom_counter"] == 7  # the result holds a copy
    counters[STEPS_SAMPLED_COUNTER] = 450
    assert op(None)["timesteps_this_iter"] == 150
    counters[STEPS_SAMPLED_COUNTER] = 100  # restored to an earlier checkpoint
    after_restore = op(None)
    assert after_restore["timesteps_total"] == 100 and after_restore["timesteps_this_iter"] == 0
    by_trained = bound(CollectMetrics(StubWorkers(StubWorker()), by_steps_trained=True), metrics)
    assert by_trained(None)["timesteps_total"] == 200


def test_collect_metrics_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="min_history"):
        CollectMetrics(StubWorkers(StubWorker()), min_history=-1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_seconds"):
        CollectMetrics(StubWorkers(StubWorker()), timeout_seconds=-1)  # type: ignore[arg-type]


# -- StandardMetricsReporting (§6.45) --------------------------------------------------------------

def test_reports_are_at_least_min_iter_time_s_apart() -> None:
    clock = FakeClock()
    plan = StandardMetricsReporting(endless().for_each(Step(clock, seconds=0.7)), StubWorkers(StubWorker()),
                                    TrainerConfig(min_iter_time_s=2.5), clock=clock)
    times = []
    for _ in range(5):
        next(plan)
        times.append(clock.now)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(2.5 <= gap < 2.5 + 0.7 for gap in gaps), gaps  # waits long enough, and no longer


def test_each_report_advances_at_least_timesteps_per_iteration() -> None:
    clock = FakeClock()
    plan = StandardMetricsReporting(endless().for_each(Step(clock, steps=30)), StubWorkers(StubWorker()),
                                    TrainerConfig(timesteps_per_iteration=100), clock=clock)
    results = plan.take(4)
    totals = [r["timesteps_total"] for r in results]
    assert totals == [120, 240, 360, 480]
    assert [r["timesteps_this_iter"] for r in results] == [120, 120, 120, 120]


def test_reports_by_steps_trained_gate_and_count_trained_steps() -> None:
    clock = FakeClock()
    plan = StandardMetricsReporting(endless().for_each(Step(clock, steps=10, trained=25)),
                                    StubWorkers(StubWorker()), TrainerConfig(timesteps_per_iteration=50),
                                    by_steps_trained=True, clock=clock)
    assert [r["timesteps_total"] for r in plan.take(2)] == [50, 100]
    assert plan.metrics.counters[STEPS_SAMPLED_COUNTER] == 40


def test_a_report_has_the_standard_keys(fake_workers: Any) -> None:
    ws = fake_workers(2)
    clock = FakeClock()
    plan = StandardMetricsReporting(endless().for_each(Step(clock, steps=10)), ws,
                                    TrainerConfig(timesteps_per_iteration=20), clock=clock)
    assert repr(plan) == ("LocalIterator[train_op.for_each().filter(ReportGate(20 steps, 0 s))"
                          ".for_each(CollectMetrics)]")
    ws.local_worker().sample()  # one finished episode, so the episode statistics are there
    result = next(plan)
    for key in ("timesteps_total", "timesteps_this_iter", "agent_timesteps_total", "episode_reward_mean",
                "episode_reward_min", "episode_reward_max", "episode_len_mean", "episodes_this_iter",
                "custom_metrics", "hist_stats", "policy_reward_mean", "info", "timers", "num_healthy_workers"):
        assert key in result, key
    assert result["timesteps_total"] == 20
    assert result["info"][STEPS_SAMPLED_COUNTER] == 20 and result["info"][AGENT_STEPS_SAMPLED_COUNTER] == 20
    assert result["timers"]["learn_time_ms"] == 500.0 and result["timers"]["learn_throughput"] == 20.0
    assert result["num_healthy_workers"] == 2


def test_a_config_without_reporting_fields_gets_the_defaults() -> None:
    config = FakeConfig()
    assert not hasattr(config, "timesteps_per_iteration")
    clock = FakeClock()
    plan = StandardMetricsReporting(endless().for_each(Step(clock)), StubWorkers(StubWorker()), config, clock=clock)
    assert repr(plan).endswith(".filter(ReportGate(0 steps, 0 s)).for_each(CollectMetrics)]")
    assert [r["timesteps_total"] for r in plan.take(3)] == [10, 20, 30]  # no gate: one report per item


def test_a_dict_config_is_read_by_its_keys() -> None:
    clock = FakeClock()
    config = {"timesteps_per_iteration": 100, "min_iter_time_s": 2.5, "metrics_smoothing_episodes": 1,
              "lr": 1e-3}  # an RLlib 1.x dict config: other keys are not the reporter's
    plan = StandardMetricsReporting(endless().for_each(Step(clock, steps=30, seconds=1.0)),
                                    StubWorkers(StubWorker([ep(1.0), ep(3.0)])), config, clock=clock)
    assert repr(plan).endswith(".filter(ReportGate(100 steps, 2.5 s)).for_each(CollectMetrics)]")
    result = next(plan)
    assert result["timesteps_total"] == 120 and clock.now == 4.0
    assert result["episode_reward_mean"] == 3.0  # a window of one episode


def test_reporting_ignores_the_train_op_values() -> None:
    plan = StandardMetricsReporting(iter_list(["a", None, 3]), StubWorkers(StubWorker([ep(1.0)])), FakeConfig())
    results = list(plan)
    assert len(results) == 3 and all(isinstance(r, dict) for r in results)
    assert [r["episodes_this_iter"] for r in results] == [1, 0, 0]


# -- AddReplayShardStats ----------------------------------------------------------------------------

def test_replay_shard_stats_keep_the_previous_answer_on_timeout_and_never_re_request() -> None:
    shard = StatsActor.remote()
    try:
        op = AddReplayShardStats(shard, timeout_s=30)  # a fresh actor may take seconds to start on a loaded machine
        assert repr(op) == "AddReplayShardStats(replay_shard_0)"
        first = op({"info": {"learner": {}}})
        assert first["info"] == {"learner": {}, "replay_shard_0": {"num_added": 1}}
        executor.get(shard.gate.remote())
        op.timeout_s = 0.5  # the gated shard cannot answer: these waits time out whatever the load
        assert op({})["info"]["replay_shard_0"] == {"num_added": 1}  # timed out: the previous answer
        assert op({})["info"]["replay_shard_0"] == {"num_added": 1}
        assert executor.get(shard.num_calls.remote()) == 2  # the pending request was not sent again
        executor.get(shard.release.remote())
        op.timeout_s = 30  # the carried request answers now; do not depend on a short deadline
        assert op({})["info"]["replay_shard_0"] == {"num_added": 2}
        assert op({})["info"]["replay_shard_0"] == {"num_added": 3}  # answered, so asked afresh
    finally:
        executor.kill(shard)


def test_replay_shard_stats_reject_bad_arguments() -> None:
    with pytest.raises(TypeError, match="needs a replay shard actor"):
        AddReplayShardStats(object())
    shard = StatsActor.remote()
    try:
        with pytest.raises(ValueError, match=r"timeout_s=0 must be a number > 0 \(seconds"):
            AddReplayShardStats(shard, timeout_s=0)
    finally:
        executor.kill(shard)
