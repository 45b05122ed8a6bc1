"""The command line (flowrl.cli): train -> run logs, checkpoints, PNG; resume; evaluate; plot; algorithms;
configs as checkpoint data; and bad invocations, which are usage errors before any worker starts."""

from __future__ import annotations

import csv
import dataclasses
import json
import re
import shutil
import string
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrl._checkpoint import read_checkpoint, write_checkpoint
from flowrl.algorithms import ALGORITHMS, get_algorithm
from flowrl.algorithms.multiagent import MultiAgentConfig
from flowrl.algorithms.pg import PGConfig
from flowrl.algorithms.ppo import PPOConfig
from flowrl.cli import MAIN_JOB, build_config, main
from flowrl.config import config_from_data, config_to_data
from flowrl.envs import EnvContext
from flowrl.evaluation import evaluate_checkpoint
from flowrl.testing import tb_scalars
from flowrl.trainer import Trainer

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def read_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "progress.csv", newline="") as f:
        return list(csv.DictReader(f))


def read_results(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]


@pytest.fixture(scope="module")
def pg_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Two iterations of PG on CartPole (200-step batches, one per report, in the driver) through the CLI."""
    run_dir = tmp_path_factory.mktemp("cli") / "pg_run"
    result = invoke("train", "pg", "--env", "CartPole-v1", "--config", "train_batch_size=200", "--config",
                    "timesteps_per_iteration=0", "--seed", 0, "--stop-iters", 2, "--log-dir", run_dir)
    assert result.exit_code == 0, result.output
    return run_dir, result.output


def test_train_writes_progress_results_tensorboard_a_checkpoint_and_the_png(pg_run: tuple[Path, str]) -> None:
    run_dir, output = pg_run
    rows, results = read_rows(run_dir), read_results(run_dir)
    assert [int(r["training_iteration"]) for r in rows] == [1, 2] == [r["training_iteration"] for r in results]
    assert [int(r["timesteps_total"]) for r in rows] == [200, 400] == [r["timesteps_total"] for r in results]
    for row, result in zip(rows, results):
        assert float(row["episode_reward_mean"]) == pytest.approx(result["episode_reward_mean"])
        assert float(row["timers/learn_time_ms"]) == pytest.approx(result["timers"]["learn_time_ms"])
        assert int(row["info/num_steps_trained"]) == result["info"]["num_steps_trained"] == result["timesteps_total"]
    assert "hist_stats/episode_reward" not in rows[0]  # lists stay in result.json only
    assert len(results[0]["hist_stats"]["episode_reward"]) == results[0]["episodes_this_iter"]
    scalars = tb_scalars(run_dir / "tb")
    assert [step for step, _ in scalars["episode_reward_mean"]] == [200, 400]
    assert [v for _, v in scalars["episode_reward_mean"]] == pytest.approx(
        [r["episode_reward_mean"] for r in results], rel=1e-6)
    assert (run_dir / "checkpoints" / "checkpoint_000002" / "manifest.json").is_file()
    assert (run_dir / "learning_curve.png").read_bytes()[:8] == PNG_MAGIC
    for where in ("progress.csv", "tb", "checkpoint_000002", "learning_curve.png"):
        assert where in output
    # not a terminal: one plain line per iteration, no control characters
    assert "\x1b" not in output and "\r" not in output
    assert len(re.findall(r"^iter +\d+ ", output, flags=re.MULTILINE)) == 2


def test_resume_continues_the_iteration_count_and_appends_to_the_run(pg_run: tuple[Path, str],
                                                                     tmp_path: Path) -> None:
    run_dir = shutil.copytree(pg_run[0], tmp_path / "run")
    result = invoke("train", "pg", "--resume", run_dir, "--stop-iters", 4)
    assert result.exit_code == 0, result.output
    assert "resuming" in result.output and "at iteration 2" in result.output
    rows = read_rows(run_dir)
    assert [int(r["training_iteration"]) for r in rows] == [1, 2, 3, 4]
    assert [int(r["timesteps_total"]) for r in rows] == [200, 400, 600, 800]
    assert [r["training_iteration"] for r in read_results(run_dir)] == [1, 2, 3, 4]
    assert (run_dir / "checkpoints" / "checkpoint_000004").is_dir()
    # resuming an earlier checkpoint drops the logs of the iterations it trains again
    result = invoke("train", "pg", "--resume", run_dir / "checkpoints" / "checkpoint_000002", "--stop-iters", 3,
                    "--env", "CartPole-v1", "--config", "train_batch_size=200")  # agreeing values are fine
    assert result.exit_code == 0, result.output
    assert [int(r["training_iteration"]) for r in read_rows(run_dir)] == [1, 2, 3]
    assert [r["training_iteration"] for r in read_results(run_dir)] == [1, 2, 3]
    # disagreeing values and another algorithm are refused
    result = invoke("train", "pg", "--resume", run_dir, "--stop-iters", 9, "--config", "lr=0.1")
    assert result.exit_code == 2 and "lr=0.1 differs from the checkpoint's lr=0.0004" in result.output
    result = invoke("train", "ppo", "--resume", run_dir, "--stop-iters", 9)
    assert result.exit_code == 2 and "is a checkpoint of 'pg', not 'ppo'" in result.output


def test_evaluate_reports_the_mean_return_of_n_complete_episodes(pg_run: tuple[Path, str]) -> None:
    result = invoke("evaluate", pg_run[0], "--episodes", 3, "--seed", 1)
    assert result.exit_code == 0, result.output
    match = re.search(r"3 episodes \(greedy\): mean return ([\d.]+) \(min ([\d.]+), max ([\d.]+)\)", result.output)
    assert match is not None, result.output
    mean, low, high = map(float, match.groups())
    direct = evaluate_checkpoint(pg_run[0] / "checkpoints" / "checkpoint_000002", episodes=3, seed=1)
    assert len(direct.returns) == 3 and low <= mean <= high
    assert (mean, low, high) == pytest.approx((direct.mean, direct.min, direct.max), abs=0.005)


def test_a_trained_checkpoint_evaluates_well_above_a_random_policy(tmp_path: Path) -> None:
    result = invoke("train", "ppo", "--config", "num_workers=0", "--config", "num_envs_per_worker=4",
                    "--config", "rollout_fragment_length=250", "--config", "train_batch_size=1000",
                    "--config", "sgd_minibatch_size=250", "--config", "num_sgd_iter=6", "--config", "lr=1e-3",
                    "--seed", 0, "--stop-reward", 100, "--stop-timesteps", 30_000, "--log-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    evaluated = evaluate_checkpoint(tmp_path / "run" / "checkpoints" / sorted(
        p.name for p in (tmp_path / "run" / "checkpoints").iterdir())[-1], episodes=10, seed=0)
    env, rng, random_returns = gym.make("CartPole-v1"), np.random.default_rng(0), []
    for episode in range(10):
        env.reset(seed=episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(2)))
            total, done = total + float(reward), terminated or truncated
        random_returns.append(total)
    assert evaluated.mean > max(100.0, 3 * float(np.mean(random_returns)))


def test_algorithms_lists_every_registered_algorithm_and_one_algorithms_fields() -> None:
    result = invoke("algorithms")
    assert result.exit_code == 0, result.output
    listed = [line.split()[0] for line in result.output.splitlines()]
    assert listed == sorted(ALGORITHMS)
    assert "PPOConfig" in result.output and "proximal policy optimization" in result.output
    fields = invoke("algorithms", "appo").output
    assert "  lr = 0.0005" in fields and "  model.hidden_sizes = (64, 64)" in fields
    assert "after_train_step = UpdateTargetAndKL  (a callable or class" in fields


def test_plot_writes_the_png_where_asked(pg_run: tuple[Path, str], tmp_path: Path) -> None:
    result = invoke("plot", pg_run[0], "--out", tmp_path / "curve.png")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:8] == PNG_MAGIC
    result = invoke("plot", tmp_path)
    assert result.exit_code == 2 and "progress.csv does not exist" in result.output


def make_cartpole(ctx: EnvContext) -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


def test_checkpoints_without_a_config_or_with_a_callable_field_are_refused_clearly(pg_run: tuple[Path, str],
                                                                                 tmp_path: Path) -> None:
    saved = pg_run[0] / "checkpoints" / "checkpoint_000002"
    tree = read_checkpoint(saved, algorithm="pg")
    assert config_from_data(PGConfig, tree["config"]) == PGConfig(train_batch_size=200, timesteps_per_iteration=0,
                                                                  seed=0)
    del tree["config"]  # as written before checkpoints held their config
    old = write_checkpoint(tmp_path / "old", "checkpoint_000002", tree, algorithm="pg")
    for args in (("evaluate", old), ("train", "pg", "--resume", old, "--stop-iters", 5)):
        result = invoke(*args)
        assert result.exit_code == 2 and "holds no config" in result.output, result.output
        assert "Trainer('pg', <its config>).restore(path)" in result.output and "Traceback" not in result.output
    trainer = Trainer("pg", PGConfig(train_batch_size=200, seed=0))
    trainer.restore(old)  # Python restores it as before
    assert trainer.training_iteration == 2
    trainer.stop()

    trainer = Trainer("pg", PGConfig(env=make_cartpole, train_batch_size=200, seed=0))
    trainer.train()
    with_callable = trainer.save(tmp_path / "callable")
    trainer.stop()
    for args in (("evaluate", with_callable), ("train", "pg", "--resume", with_callable, "--stop-iters", 5)):
        result = invoke(*args)
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert "this config holds a callable field env (make_cartpole)" in result.output
        assert "restore it from Python with Trainer(...).restore(path)" in result.output


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_default_config_round_trips_through_checkpoint_data(name: str) -> None:
    config = get_algorithm(name).config_class()
    data = json.loads(json.dumps(config_to_data(config)))  # plain JSON, as in a checkpoint
    assert config_from_data(type(config), data) == config


def test_callables_that_the_defaults_rebuild_round_trip_others_are_refused() -> None:
    config = MultiAgentConfig(seed=3, rollout_fragment_length=20)  # env, policies, mapping: derived defaults
    data = config_to_data(config)
    assert set(data["not_stored"]) == {"env", "policies", "policy_mapping_fn", "ppo.env", "dqn.env"}
    assert data["not_stored_are_defaults"] and config_from_data(MultiAgentConfig, data) == config
    data = config_to_data(dataclasses.replace(config, policy_mapping_fn=lambda agent: "ppo_policy"))
    assert not data["not_stored_are_defaults"]
    with pytest.raises(ValueError, match="this config holds a callable field policy_mapping_fn"):
        config_from_data(MultiAgentConfig, data)


def test_the_main_job_is_flowrl_train_with_the_tuned_ppo_settings(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from flowrl.presets import find_preset

    assert "--tuned" in MAIN_JOB and "--config" not in MAIN_JOB  # the main job is PPO's CartPole preset
    preset = find_preset("ppo", "CartPole-v1")
    assert preset is not None
    config = build_config(PPOConfig, preset.settings)
    assert (config.num_workers, config.num_envs_per_worker, config.rollout_fragment_length, config.train_batch_size,
            config.sgd_minibatch_size, config.num_sgd_iter, config.lr) == (2, 4, 500, 4000, 128, 6, 3e-4)
    assert MAIN_JOB[:4] == ("train", "ppo", "--env", "CartPole-v1")
    stops = dict(zip(MAIN_JOB[::2], MAIN_JOB[1::2])) | dict(zip(MAIN_JOB[1::2], MAIN_JOB[2::2]))
    assert stops["--stop-reward"] == "450" and stops["--stop-timesteps"] == "300000"
    from flowrl.__main__ import main as module_main

    monkeypatch.setattr(sys, "argv", ["python -m flowrl", "algorithms"])  # with arguments: the CLI
    with pytest.raises(SystemExit) as exit_:
        module_main()
    assert exit_.value.code == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == sorted(ALGORITHMS)


# -- bad invocations: usage errors (exit code 2) that name the argument and the value, no traceback ----

PPO_FIELDS = {f.name for f in dataclasses.fields(PPOConfig)}
WORDS = st.text(alphabet=string.ascii_lowercase + "_", min_size=1, max_size=10)
NOT_A_NUMBER = WORDS.filter(lambda w: w not in ("inf", "infinity", "nan"))
STOP = ["--stop-iters", "1"]


def _config_error(key: str, text: str) -> tuple[list[str], list[str]]:
    return ["train", "ppo", "--config", f"{key}={text}", *STOP], [f"{key}={text}", "'--config'"]


bad_invocations = st.one_of(
    # an unknown algorithm
    WORDS.filter(lambda w: w not in ALGORITHMS).map(lambda w: (["train", w, *STOP], ["'ALGO'", repr(w)])),
    # an unknown config key
    WORDS.filter(lambda w: w not in PPO_FIELDS).map(lambda w: _config_error(w, "1")),
    # a value of the wrong type
    st.tuples(st.sampled_from(["lr", "gamma", "clip_param", "kl_target"]), NOT_A_NUMBER).map(lambda kv: _config_error(*kv)),
    st.tuples(st.sampled_from(["num_sgd_iter", "train_batch_size", "num_workers"]),
              st.one_of(NOT_A_NUMBER, st.floats(0.1, 1e4).filter(lambda x: not x.is_integer()).map(repr)))
    .map(lambda kv: _config_error(*kv)),
    st.tuples(st.sampled_from(["use_gae", "shuffle_sequences", "numpy_acting"]),
              WORDS.filter(lambda w: w not in ("true", "false", "yes", "no", "on", "off")))
    .map(lambda kv: _config_error(*kv)),
    st.tuples(st.just("batch_mode"), WORDS).map(lambda kv: _config_error(*kv)),
    st.tuples(st.just("model.hidden_sizes"), NOT_A_NUMBER).map(lambda kv: _config_error(*kv)),
    # an out-of-range value, caught by the config's own validation
    st.floats(-1e3, 0).map(lambda x: _config_error("lr", repr(x))),
    st.floats(1.001, 1e3).map(lambda x: _config_error("gamma", repr(x))),
    st.floats(1.001, 1e3).map(lambda x: _config_error("lambda_", repr(x))),
    st.integers(-100, -1).map(lambda n: _config_error("num_workers", str(n))),
    st.integers(-100, 0).map(lambda n: _config_error("rollout_fragment_length", str(n))),
    st.integers(-100, 0).map(lambda n: _config_error("num_sgd_iter", str(n))),
    st.integers(4001, 10**6).map(lambda n: _config_error("sgd_minibatch_size", str(n))),
    # no stop criterion
    st.just((["train", "ppo", "--config", "lr=1e-3"], ["stop criterion", "--stop-reward"])),
    # a bad --episodes (checked before the checkpoint is read)
    st.one_of(st.integers(-100, 0).map(str), NOT_A_NUMBER).map(
        lambda n: (["evaluate", ".", f"--episodes={n}"], ["'--episodes'", n])),
)


@settings(max_examples=100, deadline=None)
@given(bad_invocations)
def test_bad_invocations_are_usage_errors_naming_the_argument_and_value(case: tuple[list[str], list[str]]) -> None:
    args, named = case
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for text in named:
        assert text in result.output, (text, result.output)


def test_a_dotted_key_into_a_mapping_field_names_the_json_spelling_that_works() -> None:
    """``env_config`` is a mapping, not a nested config: ``env_config.KEY=VALUE`` is refused with the JSON-object
    spelling, and that spelling builds the config."""
    result = invoke("train", "ppo", "--config", "env_config.repeat_action_probability=0.0", *STOP)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    spelling = 'env_config={"repeat_action_probability": 0.0}'
    assert spelling in result.output, result.output
    assert build_config(PPOConfig, [spelling]).env_config == {"repeat_action_probability": 0.0}


@pytest.mark.parametrize("args", [
    ("ppo", "--config", "use_lstm=true", "--config", "lstm_cell_size=16", "--config", "max_seq_len=10",
     "--config", "train_batch_size=200", "--config", "sgd_minibatch_size=50", "--config", "num_sgd_iter=2"),
    ("r2d2", "--config", "learning_starts=200", "--config", "timesteps_per_iteration=200"),
], ids=["ppo-use_lstm", "r2d2"])
def test_memory_on_the_command_line_trains_resumes_and_evaluates(args: tuple[str, ...], tmp_path: Path) -> None:
    """`flowrl train ppo --config use_lstm=true` (model.use_lstm by its own name) and `flowrl train r2d2` on the
    stateless CartPole: checkpoints every iteration, a resume goes on from the saved iteration with the recurrent
    state of the workers, and `flowrl evaluate` acts with a carried state."""
    run_dir = tmp_path / "run"  # --local: what is remembered does not depend on where the workers run
    result = invoke("train", *args, "--env", "flowrl/StatelessCartPole-v1", "--seed", 1, "--stop-iters", 2,
                    "--log-dir", run_dir, "--local")
    assert result.exit_code == 0, result.output
    checkpoint = run_dir / "checkpoints" / "checkpoint_000002"
    assert checkpoint.is_dir()
    result = invoke("train", args[0], "--resume", run_dir, "--stop-iters", 3, "--local")
    assert result.exit_code == 0, result.output
    assert "at iteration 2" in result.output and (run_dir / "checkpoints" / "checkpoint_000003").is_dir()
    result = invoke("evaluate", run_dir, "--episodes", 2, "--seed", 0)
    assert result.exit_code == 0 and "2 episodes (greedy)" in result.output, result.output


@pytest.mark.parametrize("algo", ["es", "ars"])
def test_evolution_strategies_train_resume_and_evaluate_from_the_command_line(algo: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    small = ("--config", "noise_size=100000", "--config", "num_workers=2")
    result = invoke("train", algo, *small, "--seed", 1, "--stop-iters", 2, "--log-dir", run_dir, "--local")
    assert result.exit_code == 0, result.output
    assert (run_dir / "checkpoints" / "checkpoint_000002").is_dir()
    result = invoke("train", algo, "--resume", run_dir, "--stop-iters", 3, "--local")
    assert result.exit_code == 0, result.output
    assert "at iteration 2" in result.output and (run_dir / "checkpoints" / "checkpoint_000003").is_dir()
    result = invoke("evaluate", run_dir, "--episodes", 2, "--seed", 0)
    assert result.exit_code == 0 and "2 episodes (greedy)" in result.output, result.output
    result = invoke("train", algo, "--config", "noise_size=5", "--stop-iters", 1, "--local")
    assert result.exit_code != 0 and "noise_size=5 is smaller than the policy's" in result.output
    assert "Traceback" not in result.output


def test_maml_trains_resumes_and_evaluates_from_the_command_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    small = ("--config", "num_envs_per_worker=2", "--config", "rollout_fragment_length=100")
    result = invoke("train", "maml", *small, "--seed", 1, "--stop-iters", 2, "--log-dir", run_dir, "--local")
    assert result.exit_code == 0, result.output
    assert (run_dir / "checkpoints" / "checkpoint_000002").is_dir()
    result = invoke("train", "maml", "--resume", run_dir, "--stop-iters", 3, "--local")
    assert result.exit_code == 0 and "at iteration 2" in result.output, result.output
    assert "adaptation_delta" in (run_dir / "progress.csv").read_text().splitlines()[0]
    result = invoke("evaluate", run_dir, "--episodes", 2, "--seed", 0)
    assert result.exit_code == 0 and "2 episodes (greedy)" in result.output, result.output
    result = invoke("train", "maml", "--env", "CartPole-v1", *small, "--stop-iters", 1, "--local")
    assert result.exit_code != 0 and "is not a task distribution" in result.output
    assert "Traceback" not in result.output


@pytest.mark.on_ray
def test_ddppo_trains_resumes_and_evaluates_from_the_command_line_and_refuses_local(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    small = ("--config", "num_envs_per_worker=2", "--config", "rollout_fragment_length=50",
             "--config", "sgd_minibatch_size=50", "--config", "num_cpus_per_worker=0.5")
    result = invoke("train", "ddppo", *small, "--seed", 1, "--stop-iters", 2, "--log-dir", run_dir)
    assert result.exit_code == 0, result.output
    result = invoke("train", "ddppo", "--resume", run_dir, "--stop-iters", 3)
    assert result.exit_code == 0 and "at iteration 2" in result.output, result.output
    assert (run_dir / "checkpoints" / "checkpoint_000003").is_dir()
    result = invoke("evaluate", run_dir, "--episodes", 2, "--seed", 0)
    assert result.exit_code == 0 and "2 episodes (greedy)" in result.output, result.output
    result = invoke("train", "ddppo", *small, "--stop-iters", 1, "--local")
    assert result.exit_code != 0 and "executor='local': DD-PPO's workers form a process group" in result.output
    assert "Traceback" not in result.output


def test_local_trains_in_this_process_and_a_resumed_run_runs_on_ray_unless_local_again(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from flowrl import executor
    from flowrl.trainer import Trainer

    built: list[str] = []
    real_init = Trainer.__init__

    def spy(self: Trainer, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        built.append(f"{self.executor} {[type(w).__name__ for w in self.workers.remote_workers()]}")

    monkeypatch.setattr(Trainer, "__init__", spy)
    common = ("--config", "num_workers=2", "--config", "rollout_fragment_length=50", "--config",
              "train_batch_size=100", "--config", "timesteps_per_iteration=0", "--log-dir", tmp_path / "run")
    result = invoke("train", "pg", "--env", "CartPole-v1", "--local", "--stop-iters", 1, "--seed", 0, *common)
    assert result.exit_code == 0, result.output
    for stop, flag in ((2, ["--local"]), (3, [])):
        result = invoke("train", "pg", "--resume", tmp_path / "run", *flag, "--stop-iters", stop, "--log-dir",
                        tmp_path / "run")
        assert result.exit_code == 0, result.output
    assert built == ["local ['LocalActor', 'LocalActor']"] * 2 + ["ray ['ActorHandle', 'ActorHandle']"]
    assert executor.current() == "ray"  # nothing leaked out of the commands
    bad = invoke("train", "pg", "--local", "--address", "auto", "--stop-iters", 1)
    assert bad.exit_code == 2 and "--local runs everything in this process" in bad.output
