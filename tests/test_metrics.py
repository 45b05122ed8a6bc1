"""The metrics context, timers and key constants."""

from __future__ import annotations

import pytest

from flowrl import metrics
from flowrl.metrics import MetricsContext, Timer


def test_save_restore_round_trips_counters_and_info_and_clears_timers_and_actor() -> None:
    ctx = MetricsContext()
    ctx.counters[metrics.STEPS_SAMPLED_COUNTER] += 5
    ctx.info[metrics.LEARNER_INFO] = {"default_policy": {"learner_stats": {"loss": 1.5}}}
    ctx.timers[metrics.SAMPLE_TIMER].push(0.1)
    ctx.current_actor = "actor"
    episode = {"episode_return": 9.0, "episode_length": 9, "policy_returns": {}, "custom_metrics": {}}
    ctx.episode_window.append(episode)
    state = ctx.save()
    assert state == {"counters": {"num_steps_sampled": 5},
                     "info": {"learner": {"default_policy": {"learner_stats": {"loss": 1.5}}}},
                     "episode_window": [episode], "timers": None}
    ctx.info[metrics.LEARNER_INFO]["default_policy"]["learner_stats"]["loss"] = 9.0
    assert state["info"]["learner"]["default_policy"]["learner_stats"]["loss"] == 1.5  # a copy
    ctx.counters["other"] = 3
    ctx.episode_window.clear()
    ctx.restore(state)
    assert dict(ctx.counters) == {"num_steps_sampled": 5}
    assert ctx.info["learner"]["default_policy"]["learner_stats"]["loss"] == 1.5
    assert ctx.episode_window == [episode] and ctx.episode_window[0] is not episode
    assert len(ctx.timers) == 0 and ctx.current_actor is None
    with pytest.raises(ValueError, match="counters"):
        ctx.restore({"info": {}})
    with pytest.raises(ValueError, match="episode_window"):
        ctx.restore({"counters": {}, "info": {}, "episode_window": {"not": "a list"}})


def test_absent_counters_and_timers_start_empty() -> None:
    ctx = MetricsContext()
    assert ctx.counters["never"] == 0
    ctx.counters["new"] += 2
    assert ctx.counters["new"] == 2
    assert ctx.timers["fresh"].mean == 0.0 and ctx.timers["fresh"].mean_throughput == 0.0


def test_timer_window_means_and_throughput() -> None:
    t = Timer(window_size=2)
    assert not t.has_units_processed()
    for seconds, units in [(10.0, 1), (1.0, 10), (3.0, 30)]:
        t.push(seconds)
        t.push_units_processed(units)
    assert t.mean == 2.0 and t.mean_units_processed == 20.0
    assert t.mean_throughput == 10.0
    assert t.has_units_processed()
    with Timer() as timed:
        pass
    assert timed.mean >= 0.0


def test_entering_an_entered_timer_raises() -> None:
    t = Timer()
    with t:
        with pytest.raises(RuntimeError, match="already entered"):
            t.__enter__()
    with t:  # usable again after exit
        pass


def test_key_constants_are_the_documented_strings() -> None:
    assert (metrics.STEPS_SAMPLED_COUNTER, metrics.STEPS_TRAINED_COUNTER, metrics.AGENT_STEPS_SAMPLED_COUNTER,
            metrics.STEPS_TRAINED_THIS_ITER_COUNTER, metrics.NUM_LEARNER_UPDATES) == (
        "num_steps_sampled", "num_steps_trained", "num_agent_steps_sampled", "num_steps_trained_this_iter",
        "num_learner_updates")
    assert (metrics.SAMPLE_TIMER, metrics.LEARN_ON_BATCH_TIMER, metrics.WORKER_UPDATE_TIMER,
            metrics.APPLY_GRADS_TIMER) == ("sample", "learn", "update", "apply_grad")
    assert metrics.PPO_AGENT_STEPS_TRAINED_COUNTER == "agent_steps_trained_PPO"
