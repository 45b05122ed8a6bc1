"""The benchmark suite's command line and summary line, and the minimal PPO computing what flowrl's PPO computes.

No timing here.
"""

from __future__ import annotations

import doctest
import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType

import gymnasium as gym
import numpy as np
import pytest
import ray
import torch

import benchmarks.__main__ as suite
from benchmarks import dummy, minimal_ppo, rollout_overhead, sac_pendulum, scaling
from flowrl.algorithms.ppo import PPOConfig, PPOPolicy, adapt_kl_coeff
from flowrl.postprocessing import add_advantages, compute_gae
from flowrl.sample_batch import (ACTION_DIST_INPUTS, ACTIONS, ADVANTAGES, LOGP, NEXT_OBS, OBS, REWARDS, TERMINATEDS,
                                 TRUNCATEDS, VALUE_TARGETS, VF_PREDS, SampleBatch)
from flowrl.workers import WorkerSet


# -- the suite --------------------------------------------------------------------------------------------
def test_suite_doctests_pass() -> None:
    # pytest's --doctest-modules skips __main__.py files, so its examples run here
    result = doctest.testmod(suite, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_all_expands_in_order_and_names_run_once() -> None:
    args = suite.parse_args(["ppo", "all", "--quick"])
    assert args.benchmarks == ["ppo", "rollout_overhead", "sampling", "recurrent_sampling", "throughput",
                               "time_to_solve", "scaling", "loc", "evolution", "maml", "learners", "dqn", "sac",
                               "ppo_lstm"]
    assert args.quick and args.repeats == 3
    assert suite.parse_args(["rllib_ppo_2x1", "--repeats", "5"]).benchmarks == ["rllib_ppo_2x1"]
    for micro in ("iter_overhead", "segment_tree", "sac_lunar", "atari", "atari_learning", "offline"):  # by name only
        assert suite.parse_args([micro, "all"]).benchmarks[0] == micro and micro not in suite.ALL


@pytest.mark.parametrize("argv", [["bogus"], [], ["ppo", "--repeats", "0"]])
def test_bad_command_lines_exit_with_usage(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        suite.parse_args(argv)
    assert info.value.code == 2


def test_every_system_has_a_step_budget_and_a_known_script() -> None:
    for system in suite.SYSTEMS.values():
        for args in (system.full, system.quick):
            assert "--max-steps" in args
        assert (suite.HERE / system.script).is_file()
    for name in suite.SCRIPTS:
        assert (suite.HERE / f"{name}.py").is_file()
    assert suite.SYSTEMS["sb3_ppo"].budget(quick=True) == "20k steps"
    assert suite.SYSTEMS["ppo_cartpole"].budget(quick=False) == "to 450, <= 300k steps"
    assert suite.SYSTEMS["sb3_sac"].budget(quick=False) == "to -200, <= 30k steps"


def test_groups_compare_flowrl_with_peers_on_the_same_thresholds() -> None:
    for group in ("dqn", "sac", "ppo_lstm"):
        systems = [suite.SYSTEMS[n] for n in suite.TRAINER_GROUPS[group]]
        assert not systems[0].peer and any(s.peer for s in systems)  # the first is flowrl's: the ratio column's
        assert {s.thresholds for s in systems} == {systems[0].thresholds}
        for s in systems:  # every system stops at its group's last threshold in the full run
            assert s.full[s.full.index("--stop-return") + 1] == str(systems[0].thresholds[-1])
    assert "--matched" in suite.SYSTEMS["dqn_cartpole_matched"].full
    assert "--matched" in suite.SYSTEMS["dqn_cartpole_matched"].quick


def test_summary_line_from_given_numbers() -> None:
    runs = {"ppo_cartpole": [{"env_steps_per_s": 3000.0, "seconds_to_450": 30.0},
                             {"env_steps_per_s": 2800.0, "seconds_to_450": 36.0},
                             {"error": "rc 1"}],  # a failed run is left out of the medians
            "minimal_ppo": [{"env_steps_per_s": 2500.0, "seconds_to_450": 40.0},
                            {"env_steps_per_s": 2400.0, "seconds_to_450": None},  # never got there: counts as inf
                            {"env_steps_per_s": 2600.0, "seconds_to_450": 44.0}],
            "sb3_ppo": [{"env_steps_per_s": 1450.0, "seconds_to_450": None}] * 3,
            "rllib_ppo_2x1": [{"env_steps_per_s": 480.0, "seconds_to_450": None}] * 3,
            "rllib_ppo_2x4": [{"env_steps_per_s": 1450.0, "seconds_to_450": None}] * 3,
            "sac_pendulum": [{"env_steps_per_s": 300.0}, {"env_steps_per_s": 280.0}, {"env_steps_per_s": 320.0}],
            "sb3_sac": [{"env_steps_per_s": 200.0}] * 3,
            "rllib_sac": [{"env_steps_per_s": 40.0}, {"error": "rc 1"}],
            "dqn_cartpole": [{"env_steps_per_s": 1000.0}] * 3,  # the defaults: not what the matched ratio reads
            "dqn_cartpole_matched": [{"env_steps_per_s": 3000.0}] * 3,
            "sb3_dqn": [{"env_steps_per_s": 1500.0}] * 3,
            "ppo_lstm_cartpole": [{"env_steps_per_s": 6000.0}] * 3,
            "rllib_ppo_lstm": [{"env_steps_per_s": 1500.0}] * 3,
            "sb3_recurrent_ppo": [{"env_steps_per_s": 800.0}, {"error": "rc 1"}]}
    values = suite.summary_values(runs, overhead_ratio=1.02, recurrent_sampling=0.71)
    assert values["ppo_vs_sb3"] == pytest.approx(2900 / 1450)
    assert values["ppo_time_to_450_vs_minimal"] == pytest.approx(33 / 44)
    assert values["sac_vs_sb3"] == pytest.approx(1.5) and values["sac_vs_rllib"] == pytest.approx(7.5)
    assert suite.format_summary(values) == \
        ("overhead_ratio=1.020 ppo_vs_sb3=2.000 ppo_vs_rllib=6.042 ppo_time_to_450_vs_minimal=0.750 "
         "ppo_vs_rllib_2x4=2.000 sac_vs_sb3=1.500 sac_vs_rllib=7.500 dqn_vs_sb3_matched=2.000 ppo_lstm_vs_rllib=4.000 "
         "ppo_lstm_vs_sb3=7.500 recurrent_sampling_efficiency=0.710")


def test_ratios_per_cpu_second_read_each_runs_cpu_time() -> None:
    runs = {"dqn_cartpole_matched": [{"env_steps": 5000, "cpu_s": 2.0, "env_steps_per_s": 900.0}] * 3,
            "sb3_dqn": [{"env_steps": 5000, "cpu_s": 5.0, "env_steps_per_s": 1000.0},
                        {"env_steps": 5000, "cpu_s": None, "env_steps_per_s": 1000.0}]}  # no CPU time: left out
    per_cpu = suite.summary_values(runs, None, rate=suite.median_steps_per_cpu_s)
    assert per_cpu["dqn_vs_sb3_matched"] == pytest.approx(2.5)
    assert suite.summary_values(runs, None)["dqn_vs_sb3_matched"] == pytest.approx(0.9)  # per wall second


def test_summary_line_writes_nan_for_what_was_not_measured() -> None:
    runs = {"ppo_cartpole": [{"env_steps_per_s": 3000.0, "seconds_to_450": None}] * 3,
            "minimal_ppo": [{"env_steps_per_s": 2500.0, "seconds_to_450": 40.0}] * 3}
    line = suite.format_summary(suite.summary_values(runs, overhead_ratio=None))
    assert line == ("overhead_ratio=nan ppo_vs_sb3=nan ppo_vs_rllib=nan ppo_time_to_450_vs_minimal=nan "
                    "ppo_vs_rllib_2x4=nan sac_vs_sb3=nan sac_vs_rllib=nan dqn_vs_sb3_matched=nan "
                    "ppo_lstm_vs_rllib=nan ppo_lstm_vs_sb3=nan recurrent_sampling_efficiency=nan")
    assert suite.format_summary({k: math.nan for k in suite.SUMMARY_KEYS}) == line


def test_normalize_reads_flowrl_and_peer_field_names() -> None:
    flowrl = suite.normalize({"env_steps_per_s_sampled": 10.0, "env_steps_sampled": 40, "seconds_to_450": 3.0})
    peer = suite.normalize({"env_steps_per_s": 10.0, "env_steps": 40, "seconds_to_450": 3.0, "version": "2.9.2"})
    assert {k: flowrl[k] for k in ("env_steps_per_s", "env_steps", "seconds_to_450")} == \
        {k: peer[k] for k in ("env_steps_per_s", "env_steps", "seconds_to_450")} == \
        {"env_steps_per_s": 10.0, "env_steps": 40, "seconds_to_450": 3.0}
    sac = suite.normalize({"env_steps_per_s": 5.0, "seconds_to_-200": 9.0, "steps_to_-200": 7000}, (-200,))
    assert (sac["seconds_to_-200"], sac["steps_to_-200"]) == (9.0, 7000) and "seconds_to_450" not in sac
    assert suite.normalize({"benchmark": "sac_lunarlandercontinuous", "skipped": "no box2d"}) == {"skipped": "no box2d"}


# -- the SAC scripts ---------------------------------------------------------------------------------------
def test_sac_script_doctests_pass() -> None:
    result = doctest.testmod(sac_pendulum, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_sac_benchmark_runs_the_matched_settings() -> None:
    config = sac_pendulum.make_config(sac_pendulum.parse_args(["--seed", "3"]))
    assert (config.env, config.seed, config.train_batch_size, config.actor_hiddens, config.critic_hiddens) == \
        ("Pendulum-v1", 3, 256, (256, 256), (256, 256))
    assert (config.learning_starts, config.rollout_fragment_length, config.round_robin_weights) == (1000, 1, [1.0, 1.0])
    assert config.metrics_smoothing_episodes == 20 and config.timesteps_per_iteration == 1000  # as the peers report
    lunar = sac_pendulum.make_config(sac_pendulum.parse_args(["--env", "LunarLanderContinuous-v3"]))
    assert lunar.env == "LunarLanderContinuous-v3" and lunar.train_batch_size == 256


def test_lunar_lander_without_box2d_is_skipped_saying_what_to_install(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "lunar.json"
    monkeypatch.setattr(sac_pendulum.importlib.util, "find_spec", lambda name: None)  # as if Box2D were missing
    assert sac_pendulum.box2d_missing("Pendulum-v1") is None  # Pendulum needs nothing extra
    sac_pendulum.main(["--env", "LunarLanderContinuous-v3", "--out", str(out)])
    record = suite.normalize(json.loads(out.read_text()), (200,))
    assert set(record) == {"skipped"} and 'pip install "gymnasium[box2d]"' in record["skipped"]
    monkeypatch.setattr(sac_pendulum.importlib.util, "find_spec", lambda name: object())  # as if installed
    assert sac_pendulum.box2d_missing("LunarLanderContinuous-v3") is None


def test_peer_progress_records_any_thresholds() -> None:
    spec = importlib.util.spec_from_file_location("peers_common", suite.HERE / "peers" / "_common.py")
    assert spec is not None and spec.loader is not None
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    assert doctest.testmod(common).failed == 0
    clock = iter([0.0, 3.0, 7.0]).__next__
    progress = common.Progress(stop_return=-200.0, max_steps=30_000, clock=clock, thresholds=(-200,))
    assert progress.update(steps=1000, mean_return=-900.0) is False
    assert progress.update(steps=2000, mean_return=-180.0) is True  # at or above -200: stop
    assert progress.reached == {-200.0: (7.0, 2000)}


# -- the sampling microbenchmark and the scaling benchmark -------------------------------------------------
@pytest.mark.parametrize("module", [dummy, scaling], ids=["dummy", "scaling"])
def test_script_doctests_pass(module: ModuleType) -> None:
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_markdown_tables_keep_each_table_with_its_caption() -> None:
    log = "starting\n\nfirst\n| a |\n|---|\n| 1 |\nprogress\n\nsecond\n| b |\n| 2 |\nwrote it\nx=1"
    assert suite.markdown_tables(log) == "first\n| a |\n|---|\n| 1 |\n\nsecond\n| b |\n| 2 |"
    assert suite.markdown_tables("no table\nx=1") == ""


def test_rollout_overhead_paired_ratio_cancels_drift_between_rounds() -> None:
    # the machine slows down round by round; flowrl is 2% faster than hand in every round
    hand = [20_000.0, 16_000.0, 12_000.0, 18_000.0]
    flowrl = [1.02 * h for h in hand]
    assert rollout_overhead.paired_ratio(flowrl, hand) == pytest.approx(1.02)
    assert rollout_overhead.paired_ratio([3.0, 1.0, 2.0], [1.0, 1.0, 1.0]) == 2.0  # a median, not a mean
    with pytest.raises(ValueError, match="equally long"):
        rollout_overhead.paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="non-empty"):
        rollout_overhead.paired_ratio([], [])


def test_rollout_overhead_sides_sample_the_same_steps_from_the_same_workers() -> None:
    """Both sides of both modes pull whole fragments from the same two workers; timed() checks the env steps each
    side counted in its window (flowrl through num_steps_sampled) against the fragments it was asked for, and
    that the window was opened."""
    dummy.ship_by_value()
    workers = WorkerSet(policy_class=dummy.DummyPolicy,
                        config=dummy.rollout_config(num_workers=2, fragment=10, seed=0))
    try:
        for runs in rollout_overhead.MODES.values():
            for run in runs.values():
                rate, startup_s, cpu_s = rollout_overhead.timed(run, workers, n=6, k=2)
                assert rate > 0 and startup_s > 0 and cpu_s > 0
        with pytest.raises(RuntimeError, match="expected 60"):  # a side that loses fragments is caught
            rollout_overhead.timed(lambda ws, n, k, window: (window.start(), 50)[1], workers, n=6, k=2)
        with pytest.raises(RuntimeError, match="never started its timed window"):
            rollout_overhead.timed(lambda ws, n, k, window: 60, workers, n=6, k=2)
        weights = ray.get(workers.remote_workers()[0].get_weights.remote())
        assert {k: v.shape for k, v in weights["default_policy"].items()} == {"w": ()}  # one scalar
    finally:
        workers.stop()


# -- the minimal PPO computes what flowrl's PPO computes ---------------------------------------------------
def random_trajectory(seed: int, steps: int = 60, envs: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    kinds = rng.choice(["", "term", "trunc"], p=[0.8, 0.1, 0.1], size=(steps, envs))
    return {"rewards": rng.normal(size=(steps, envs)).astype(np.float32),
            "values": rng.normal(size=(steps, envs)).astype(np.float32),
            "next_values": rng.normal(size=(steps, envs)).astype(np.float32),
            "terminateds": kinds == "term", "truncateds": kinds == "trunc"}


@pytest.mark.parametrize("seed", range(3))
def test_minimal_ppo_gae_equals_flowrl_compute_gae(seed: int) -> None:
    t = random_trajectory(seed)
    adv, targets = minimal_ppo.gae(t["rewards"], t["values"], t["next_values"], t["terminateds"], t["truncateds"],
                                   0.99, 0.95)
    for i in range(t["rewards"].shape[1]):  # flowrl: one env's time-ordered steps at a time
        expected = compute_gae(**{k: v[:, i] for k, v in t.items()}, gamma=0.99, lambda_=0.95)
        np.testing.assert_array_equal(adv[:, i], expected[0])
        np.testing.assert_array_equal(targets[:, i], expected[1])


def test_minimal_ppo_gae_equals_flowrl_postprocessing_of_episode_pieces() -> None:
    """The path flowrl's sampler takes: each episode piece of each env through ``add_advantages``, bootstrapping
    ``V(new_obs)`` at truncations and at the fragment's end, ``vf_preds`` of the next row inside a piece."""
    t = random_trajectory(7)
    steps, envs = t["rewards"].shape
    next_values = t["next_values"].copy()
    done = t["terminateds"] | t["truncateds"]
    next_values[:-1][~done[:-1]] = t["values"][1:][~done[:-1]]  # a consistent trajectory: V(s') is the next V(s)
    adv, targets = minimal_ppo.gae(t["rewards"], t["values"], next_values, t["terminateds"], t["truncateds"],
                                   minimal_ppo.GAMMA, minimal_ppo.LAMBDA)
    for i in range(envs):
        row_of = np.arange(steps, dtype=np.float32)[:, None]  # new_obs[t] = [t]: value_fn looks V(s'_t) up
        cuts = [0, *(np.flatnonzero(done[:, i]) + 1).tolist(), steps]
        for a, b in zip(cuts[:-1], cuts[1:]):
            if a == b:
                continue
            piece = SampleBatch({REWARDS: t["rewards"][a:b, i], VF_PREDS: t["values"][a:b, i],
                                 NEXT_OBS: row_of[a:b], TERMINATEDS: t["terminateds"][a:b, i],
                                 TRUNCATEDS: t["truncateds"][a:b, i]})
            out = add_advantages(piece, lambda obs: next_values[obs[:, 0].astype(int), i],  # noqa: B023
                                 gamma=minimal_ppo.GAMMA, lambda_=minimal_ppo.LAMBDA)
            np.testing.assert_allclose(adv[a:b, i], out[ADVANTAGES], rtol=1e-6, atol=1e-5)
            np.testing.assert_allclose(targets[a:b, i], out[VALUE_TARGETS], rtol=1e-6, atol=1e-5)


def test_minimal_ppo_hyperparameters_are_flowrl_main_jobs() -> None:
    from flowrl.cli import MAIN_JOB
    from flowrl.presets import find_preset

    preset = find_preset(MAIN_JOB[1], MAIN_JOB[3])
    assert "--tuned" in MAIN_JOB and preset is not None
    overrides = dict(item.split("=") for item in preset.settings)
    config = PPOConfig()
    assert minimal_ppo.NUM_ENVS == int(overrides["num_workers"]) * int(overrides["num_envs_per_worker"])
    assert minimal_ppo.NUM_ENVS * minimal_ppo.STEPS_PER_ENV == int(overrides["train_batch_size"])
    assert (minimal_ppo.MINIBATCH, minimal_ppo.EPOCHS, minimal_ppo.LR) == \
        (int(overrides["sgd_minibatch_size"]), int(overrides["num_sgd_iter"]), float(overrides["lr"]))
    assert (minimal_ppo.GAMMA, minimal_ppo.LAMBDA, minimal_ppo.CLIP, minimal_ppo.VF_CLIP, minimal_ppo.VF_COEFF) == \
        (config.gamma, config.lambda_, config.clip_param, config.vf_clip_param, config.vf_loss_coeff)
    assert (minimal_ppo.KL_COEFF, minimal_ppo.KL_TARGET, config.entropy_coeff) == (config.kl_coeff, config.kl_target, 0)


@pytest.mark.parametrize("sampled_kl", [0.0, 0.004, 0.005, 0.01, 0.02, 0.021, 1.0])
def test_minimal_ppo_kl_rule_is_flowrls(sampled_kl: float) -> None:
    assert minimal_ppo.adapt_kl_coeff(0.2, sampled_kl) == adapt_kl_coeff(0.2, sampled_kl, minimal_ppo.KL_TARGET)


def test_minimal_ppo_model_and_loss_equal_flowrl_ppo_policy() -> None:
    policy = PPOPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), PPOConfig(seed=0))
    torch.manual_seed(0)  # what minimal_ppo.train does before building its model
    model = minimal_ppo.ActorCritic(4, 2)
    flowrl_weights = policy.model.state_dict()
    assert flowrl_weights.keys() == model.state_dict().keys()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, flowrl_weights[name], rtol=0, atol=0)  # same initialisation
    rng = np.random.default_rng(0)
    n = 64
    columns = {OBS: rng.normal(size=(n, 4)), ACTIONS: rng.integers(0, 2, n), LOGP: np.log(rng.uniform(0.2, 0.8, n)),
               ACTION_DIST_INPUTS: rng.normal(size=(n, 2)), VF_PREDS: rng.normal(size=n) * 20,
               ADVANTAGES: rng.normal(size=n), VALUE_TARGETS: rng.normal(size=n) * 20}
    tensors = {k: torch.as_tensor(v, dtype=torch.int64 if k == ACTIONS else torch.float32) for k, v in columns.items()}
    policy.kl_coeff = 0.3
    expected, stats = policy.loss(tensors)
    ours = {"obs": OBS, "actions": ACTIONS, "logp": LOGP, "logits": ACTION_DIST_INPUTS, "values": VF_PREDS,
            "advantages": ADVANTAGES, "targets": VALUE_TARGETS}
    loss, kl = minimal_ppo.ppo_loss(model, {k: tensors[v] for k, v in ours.items()}, kl_coeff=0.3)
    torch.testing.assert_close(loss, expected)
    assert kl == pytest.approx(stats["kl"], rel=1e-6)


# -- memory: the recurrent sampling microbenchmark and the PPO+LSTM benchmark's settings --------------------------
def test_recurrent_sampling_measures_both_workers_and_the_state_columns() -> None:
    from benchmarks import recurrent_sampling

    out = recurrent_sampling.measure(num_envs=2, fragment=20, repeats=1, samples=1, cell="gru")
    assert out["recurrent_steps_per_s"] > 0 and out["feed_forward_steps_per_s"] > 0
    assert out["efficiency"] == pytest.approx(out["recurrent_steps_per_s"] / out["feed_forward_steps_per_s"])
    assert out["state_bytes_per_row"] == 2 * 64 * 4  # a GRU: h in and h out, 64 float32 each


def test_ppo_lstm_benchmark_runs_the_stateless_cartpole_preset_without_the_filter() -> None:
    from benchmarks import ppo_lstm

    config = ppo_lstm.make_config(seed=3)
    assert config.env == "flowrl/StatelessCartPole-v1" and config.model.use_lstm and config.seed == 3
    assert (config.num_envs_per_worker, config.rollout_fragment_length, config.train_batch_size,
            config.sgd_minibatch_size, config.num_sgd_iter, config.model.lstm_cell_size,
            config.model.max_seq_len) == (8, 250, 2000, 250, 10, 64, 20)
    assert config.observation_filter == "NoFilter"
