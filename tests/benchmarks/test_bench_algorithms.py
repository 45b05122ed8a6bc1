"""The all-algorithm benchmarks' logic: ``benchmarks/throughput.py`` and ``benchmarks/time_to_solve.py``.

Argument parsing, every algorithm's benchmark config, the threshold bookkeeping, the medians, tables and last
lines, and one tiny run of each script's core function. No timing assertions (benchmarks live in
``benchmarks/``, never as timed assertions in tests).
"""

from __future__ import annotations

import doctest
import math
import threading
from types import ModuleType
from typing import Any

import pytest

from benchmarks import throughput
from benchmarks import time_to_solve as tts
from flowrl.algorithms import ALGORITHMS, get_algorithm
from flowrl.algorithms.ppo import PPOConfig
from flowrl.cli import build_config
from flowrl.presets import find_preset


@pytest.mark.parametrize("module", [throughput, tts], ids=["throughput", "time_to_solve"])
def test_doctests_pass(module: ModuleType) -> None:
    # the default test run collects doctests under flowrl/ and tests/ only, so the scripts' examples run here
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_both_scripts_cover_every_cartpole_algorithm_with_a_reasoned_setting() -> None:
    # every registered algorithm but the two-policy composition, which needs a multi-agent env, those for
    # continuous actions (their configs default to another env; SAC's benchmark is benchmarks/sac_pendulum.py) and
    # those made to learn from a recorded dataset (benchmarks/offline.py)
    single_agent = tuple(name for name in ALGORITHMS
                         if name not in ("multiagent", "marwil", "bc", "cql", "cql_dqn")
                         and get_algorithm(name).config_class().env == "CartPole-v1")
    assert throughput.ALGOS == tts.ALGOS == single_agent and {"ppo", "dqn"} <= set(single_agent)
    assert set(throughput._OVERRIDES) <= set(single_agent) and set(tts._SETTINGS) <= set(single_agent)
    for setting in [*tts._SETTINGS.values(), tts.setting_of("an algorithm added later")]:
        assert setting.quick_budget <= setting.budgets[150] < setting.budgets[450]


def test_tuned_settings_come_from_the_presets() -> None:
    ppo = find_preset("ppo", "CartPole-v1")
    assert ppo is not None and tts._SETTINGS["ppo"].overrides == throughput.tuned("ppo")
    assert build_config(PPOConfig, ppo.settings) == PPOConfig(**throughput.tuned("ppo"))
    own = ("num_workers", "num_envs_per_worker", "rollout_fragment_length")  # throughput sets these for all
    assert list(throughput._OVERRIDES["ppo"]) == [key for key in ppo.keys() if key not in own]


# -- throughput -----------------------------------------------------------------------------------------

def test_throughput_command_line() -> None:
    args = throughput.parse_args([])
    assert (args.algos, args.worker_counts, args.runs, args.seconds, args.quick) == (
        list(throughput.ALGOS), [2, 4], 3, 20.0, False)
    quick = throughput.parse_args(["--quick", "--runs", "5", "--seconds", "30", "--out", "x.json"])
    assert (quick.worker_counts, quick.runs, quick.seconds, quick.out) == ([2], 2, 3.0, "x.json")


@pytest.mark.parametrize("argv", [["--algos", "sac"], ["--workers", "0"], ["--workers", "two"], ["--runs", "0"]])
def test_throughput_bad_command_lines_exit_with_usage(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        throughput.parse_args(argv)
    assert info.value.code == 2


@pytest.mark.parametrize("name", throughput.ALGOS)
def test_throughput_config_builds_for_every_algorithm(name: str) -> None:
    module = throughput.load(name)
    config = throughput.make_config(module, name, 2, throughput.parse_args(["--quick"]))
    assert (config.num_workers, config.num_envs_per_worker, config.min_iter_time_s) == (2, 4, 1.0)
    assert config.timesteps_per_iteration == 0  # reports gated by time alone
    if name == "ppo":  # one sampling round fills the train batch
        assert config.rollout_fragment_length * 2 * 4 >= config.train_batch_size


def test_learner_clock_sums_calls_from_several_threads() -> None:
    class Worker:
        def learn_on_batch(self, batch: int) -> int:
            return batch

    worker = Worker()
    clock = throughput.LearnerClock(worker)
    before = clock.read()
    threads = [threading.Thread(target=lambda: [worker.learn_on_batch(i) for i in range(100)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(before) == {"learn_on_batch"}  # only the methods the worker has are wrapped
    seconds, calls = throughput.window_delta(before, clock.read())
    assert calls == {"learn_on_batch": 400} and seconds >= 0


def test_throughput_table_names_what_is_timed_and_marks_failures() -> None:
    args = throughput.parse_args(["--quick"])
    median = {"env_steps_per_s_sampled": 100.0, "env_steps_per_s_trained": 90.0, "learner_utilisation": 0.25,
              "learner_utilisation_from_timer": None}
    results = [{"algorithm": "a3c", "workers": 2, "rollout_fragment_length": 10, "train_batch_size": 200,
                "learner_timed": ["apply_gradients"], "startup_s": 3.0, "median": median},
               {"algorithm": "ppo", "workers": 2, "error": "RuntimeError: boom"}]
    text = throughput.table(results, args)
    assert "| 25% (apply_gradients; gradients computed on the workers) | - |" in text
    assert "| ppo | 2 | failed: RuntimeError: boom |" in text
    assert throughput.summary_line(results, ["a3c", "ppo"], 2) == "a3c_env_steps_per_s=100.0 ppo_env_steps_per_s=nan"


def test_throughput_bench_smoke(tmp_path: Any) -> None:
    """PG with the driver sampling (no actor to start), one run of a fraction of a second."""
    args = throughput.parse_args(["--algos", "pg", "--runs", "1", "--seconds", "0.3", "--report-s", "0.1",
                                  "--out", str(tmp_path / "t.json")])
    result = throughput.bench("pg", throughput.load("pg"), 0, args)
    assert set(result["median"]) == set(throughput.MEDIAN_KEYS)
    assert result["median"]["env_steps_per_s_trained"] > 0 and result["learner_timed"] == ["learn_on_batch"]
    assert result["median"]["learner_utilisation_from_timer"] is None  # no learner thread in PG


# -- time to solve --------------------------------------------------------------------------------------

def test_time_to_solve_command_line() -> None:
    full = tts.parse_args(["--seeds", "4,5"])
    assert (full.seeds, full.thresholds, full.max_train_s, full.quick) == ([4, 5], [150.0, 450.0], None, False)
    quick = tts.parse_args(["--quick", "--max-train-s", "60"])
    assert (quick.seeds, quick.thresholds, quick.max_train_s) == ([0], [150.0], tts.QUICK_MAX_TRAIN_S)
    assert tts.parse_args(["--quick", "--max-train-s", "5"]).max_train_s == 5.0


@pytest.mark.parametrize("argv", [["--algos", "sac"], ["--seeds", "a"], ["--max-train-s", "0"]])
def test_time_to_solve_bad_command_lines_exit_with_usage(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        tts.parse_args(argv)
    assert info.value.code == 2


@pytest.mark.parametrize("name", tts.ALGOS)
def test_time_to_solve_config_builds_for_every_algorithm(name: str) -> None:
    config = tts.make_config(tts.load(name), name, seed=1, report_s=0.5)
    assert (config.env, config.seed, config.min_iter_time_s, config.timesteps_per_iteration) == (
        "CartPole-v1", 1, 0.5, 0)
    assert config.num_workers == {"pg": 0, "dqn": 0}.get(name, 2)  # PG's and DQN's defaults sample in the driver


def test_first_crossing_is_the_first_report_at_or_above() -> None:
    reports = [(0.5, 100, math.nan), (1.0, 200, 150.0), (1.5, 300, 149.0), (2.0, 400, 460.0)]
    assert tts.first_crossing(reports, 150) == tts.Crossing(1.0, 200)  # at, not only above
    assert tts.first_crossing(reports, 450) == tts.Crossing(2.0, 400)
    assert tts.first_crossing(reports, 500) is None and tts.first_crossing([], 150) is None


def test_stop_reason_checks_the_lowest_unreached_thresholds_budget_first() -> None:
    budgets = {150.0: 1000, 450.0: 3000}
    none = {150.0: None, 450.0: None}
    assert tts.stop_reason(none, budgets, 999, 100.0, None) is None
    assert tts.stop_reason(none, budgets, 1000, 0.0, None) == "budget"  # 150 missed: 450 is not tried
    reached = {150.0: tts.Crossing(1.0, 500), 450.0: None}
    assert tts.stop_reason(reached, budgets, 2000, 1.0, None) is None
    assert tts.stop_reason(reached, budgets, 3000, 1.0, None) == "budget"
    assert tts.stop_reason(reached, budgets, 2000, 9.0, 9.0) == "time"


def test_medians_count_not_reached_as_infinitely_slow() -> None:
    assert tts.median_or_inf([3.0, None]) == math.inf  # an even count: the mean of 3 and inf
    runs = [{"seconds_to_150": 2.0, "steps_to_150": 100, "seconds_to_450": None, "steps_to_450": None,
             "final_return": 200.0}]
    assert tts.summarize(runs, [150.0, 450.0]) == {
        "seconds_to_150": 2.0, "steps_to_150": 100, "seconds_to_450": None, "steps_to_450": None,
        "final_return": 200.0, "reached_150": "1/1", "reached_450": "0/1"}


def test_time_to_solve_table_and_last_line() -> None:
    median = {"seconds_to_150": 4.31, "steps_to_150": 40000, "final_return": 185.2, "reached_150": "1/1"}
    results = [{"algorithm": "ppo", "workers": 2, "median": median, "budget": "150 by 60k steps; 15 s"},
               {"algorithm": "dqn", "error": "RuntimeError: boom"}]
    text = tts.table(results, [0])
    assert "| ppo | 2 | 4.3 | 40,000 | - | - | 185.2 | 150 by 60k steps; 15 s |" in text
    assert "| dqn |  | failed: RuntimeError: boom |" in text
    assert tts.summary_line(results, [150.0]) == "time_to_150_s_median=4.31 time_to_450_s_median=nan"


def test_time_to_solve_smoke() -> None:
    """PG (the driver samples: no actor to start) for 2000 steps: not reached, and said so."""
    run = tts.solve(tts.load("pg"), "pg", 0, [150.0], {150.0: 2000}, max_train_s=20.0, report_s=0.0,
                    verbose=False)
    assert run["stopped_by"] == "budget" and run["steps_to_150"] is None and run["seconds_to_150"] is None
    assert run["env_steps_sampled"] >= 2000 and run["iterations"] >= 10 and math.isfinite(run["final_return"])
