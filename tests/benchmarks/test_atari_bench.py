"""``benchmarks/atari.py``'s and ``benchmarks/atari_learning.py``'s logic: command lines, the configs built from the
Atari presets, the CPU budget arithmetic and the reading of a run's progress. No timing assertions (benchmarks live
in ``benchmarks/``)."""

from __future__ import annotations

import doctest

import pytest

from benchmarks import atari, atari_learning
from flowrl.presets import find_preset


@pytest.mark.parametrize("module", [atari, atari_learning], ids=["atari", "atari_learning"])
def test_doctests_pass(module: object) -> None:
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_the_learning_run_counts_frames_and_stops_at_its_target() -> None:
    args = atari_learning.parse_args(["--algo", "impala", "--quick"])
    assert (args.algo, args.frames, args.target, args.out) == (
        "impala", 200_000, -15.0, "benchmarks/results/atari_learning_impala.json")
    assert atari_learning.parse_args([]).frames == 3_000_000


@pytest.mark.parametrize("name", ["impala", "appo"])
def test_the_benchmark_runs_each_algorithms_pong_preset_reporting_every_second(name: str) -> None:
    preset = find_preset(name, "ALE/Pong-v5")
    assert preset is not None
    config = atari.preset_config(name, "ALE/Pong-v5", 3, ["num_envs_per_worker=4"])
    assert (config.env, config.seed, config.min_iter_time_s, config.timesteps_per_iteration) == (
        "ALE/Pong-v5", 3, 1, 0)
    assert config.num_envs_per_worker == 4  # the benchmark's own setting wins over the preset's
    assert config.clip_rewards == 1.0 and config.model.vf_share_layers and config.num_workers == 2


def test_the_cpu_budget_adds_a_steps_costs_and_divides_the_cores_by_them() -> None:
    run = {"median": {"learn_s_per_step": 400e-6}, "infer_s_per_step": 100e-6}
    budget = atari.cpu_budget(2, 4 * 4000.0, run)  # 2 processes stepping 4000 agent steps/s: 500 us a step each
    assert budget["env_us"] == pytest.approx(500) and budget["learner_us"] == pytest.approx(400)
    assert budget["ceiling_frames_per_s"] == pytest.approx(2 / 1000e-6 * 4)


def test_the_command_line() -> None:
    args = atari.parse_args(["--algos", "appo", "--tree", "--envs-per-worker", "8"])
    assert (args.algos, args.tree, args.envs_per_worker, args.runs, args.seconds) == (["appo"], True, 8, 3, 30.0)
    assert args.out == "benchmarks/results/atari.json"
