"""Sweeps with Ray Tune (flowrl.tune, `flowrl tune`): a sweep with ASHA, a sweep killed part-way and resumed with
Tuner.restore, trials' resources, the command line and its errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import ray
from click.testing import CliRunner
from ray import tune
from ray.tune.schedulers import ASHAScheduler

from flowrl.algorithms import get_algorithm
from flowrl.algorithms.ppo import PPOConfig
from flowrl.cli import main
from flowrl.testing import sweeps
from flowrl.tune import parse_search, trainable, trial_config

REPO = Path(__file__).resolve().parents[1]
SMALL = PPOConfig(env="CartPole-v1", num_workers=0, train_batch_size=200, sgd_minibatch_size=100, num_sgd_iter=2)


def _rows(trial_dir: Path) -> list[dict[str, Any]]:
    """The results Tune logged for a trial, in order (its result.json, one JSON object a line)."""
    return [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines() if line.strip()]


def test_an_asha_sweep_of_four_trials_runs_each_trial_on_its_own_trainer(tmp_path: Path) -> None:
    tuner = tune.Tuner(
        trainable("ppo", SMALL), param_space={"lr": tune.loguniform(1e-4, 1e-2)},
        tune_config=tune.TuneConfig(metric="episode_reward_mean", mode="max", num_samples=4, max_concurrent_trials=2,
                                    scheduler=ASHAScheduler(max_t=3, grace_period=1, reduction_factor=2)),
        run_config=tune.RunConfig(name="asha", storage_path=str(tmp_path), stop={"training_iteration": 3}, verbose=0,
                                  checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True)))
    results = tuner.fit()
    assert len(results) == 4 and not results.errors
    lrs = {result.config["lr"] for result in results}
    assert len(lrs) == 4 and all(1e-4 <= lr <= 1e-2 for lr in lrs)
    iterations = sorted(result.metrics["training_iteration"] for result in results)
    assert iterations[-1] == 3 and all(1 <= n <= 3 for n in iterations)
    for result in results:  # each row is one train() of that trial's own trainer: its counters, its lr
        rows = _rows(Path(result.path))
        assert [row["training_iteration"] for row in rows] == list(range(1, len(rows) + 1))
        assert [row["timesteps_total"] for row in rows] == [200 * (i + 1) for i in range(len(rows))]
        assert result.checkpoint is not None  # a flowrl checkpoint inside Tune's
        assert list(Path(result.checkpoint.path).glob("checkpoint_*/manifest.json"))


@pytest.mark.slow  # ~20 s: a sweep killed and resumed
def test_a_sweep_killed_after_its_first_finished_trial_resumes_and_finishes_every_trial_exactly_once(
        tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.touch()
    env = {**os.environ, "TUNE_GLOBAL_CHECKPOINT_S": "0",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    address = ray.get_runtime_context().gcs_address
    killed = subprocess.run([sys.executable, "-m", "flowrl.testing.sweeps", address, str(tmp_path), "sweep", str(hold)],
                            capture_output=True, text=True, timeout=240, env=env)
    assert killed.returncode == -9, killed.stdout[-3000:] + killed.stderr[-3000:]
    for seed, done in zip(sweeps.SEEDS, ([1, 2, 3], [1], [1], [])):  # seed 0 finished, two held, one not started
        assert [row["iteration"] for row in sweeps.trained(hold, seed)] == done, seed
    hold.unlink()
    experiment = tmp_path / "sweep"
    results = tune.Tuner.restore(str(experiment), trainable=sweeps.sweep_trainable(hold), resume_unfinished=True).fit()
    assert len(results) == 4 and not results.errors
    assert sorted(result.config["seed"] for result in results) == list(sweeps.SEEDS)
    for result in results:
        seed = result.config["seed"]
        trained = sweeps.trained(hold, seed)
        # every iteration exactly once, and the counters go on from the checkpoint (a trial whose trainer started
        # again from scratch would train iteration 1 again, or report 200 steps at its second iteration)
        assert [row["iteration"] for row in trained] == [1, 2, 3], (seed, trained)
        assert [row["timesteps"] for row in trained] == [200, 400, 600], (seed, trained)
        if seed in (1, 2):  # held, killed and resumed in another process, from their first checkpoint
            assert trained[0]["pid"] != trained[1]["pid"] == trained[2]["pid"]
        else:
            assert len({row["pid"] for row in trained}) == 1
        assert (result.metrics["training_iteration"], result.metrics["timesteps_total"]) == (3, 600)
        rows = _rows(Path(result.path))  # Tune's own log of the trial agrees
        assert [row["training_iteration"] for row in rows] == [1, 2, 3], (result.path, rows)
        assert [row["info"]["num_steps_trained"] for row in rows] == [200, 400, 600]


def test_a_trial_asks_for_its_learner_and_its_remote_workers() -> None:
    PPO = trainable("ppo", PPOConfig(num_workers=2, num_cpus_per_worker=0.5))
    assert PPO.default_resource_request({}).bundles == [{"CPU": 1.0}, {"CPU": 0.5}, {"CPU": 0.5}]
    assert PPO.default_resource_request({"num_workers": 0}).bundles == [{"CPU": 1.0}]
    assert PPO.default_resource_request({"evaluation_interval": 1, "evaluation_num_workers": 1}).bundles == \
        [{"CPU": 1.0}, {"CPU": 0.5}, {"CPU": 0.5}, {"CPU": 0.5}]
    assert PPO.default_resource_request({"executor": "local"}).bundles == [{"CPU": 1.0}]
    GPU = trainable("ppo", PPOConfig(num_workers=1, num_gpus=1, num_gpus_per_worker=0.25, fake_gpus=False))
    assert GPU.default_resource_request({}).bundles == [{"CPU": 1.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 0.25}]


def test_a_trial_config_is_checked_as_the_command_line_checks_it() -> None:
    ppo = get_algorithm("ppo")
    config = trial_config(ppo, SMALL, {"lr": 0.002, "model.hidden_sizes": [16, 16], "use_gae": False})
    assert (config.lr, config.model.hidden_sizes, config.use_gae, config.train_batch_size) == (0.002, (16, 16), False, 200)
    with pytest.raises(ValueError, match=r"num_sgd_iter=0 must be an int >= 1"):
        trial_config(ppo, SMALL, {"num_sgd_iter": 0})
    with pytest.raises(ValueError, match=r"has no field 'lrr'; did you mean 'lr'"):
        trial_config(ppo, SMALL, {"lrr": 0.1})
    with pytest.raises(TypeError, match=r"needs a PPOConfig, got DQNConfig"):
        trainable("ppo", get_algorithm("dqn").config_class())


@pytest.mark.parametrize(("item", "message"), [
    ("lr", "is not KEY=EXPR; e.g. lr=loguniform(1e-4,1e-2)"),
    ("lr=0.1", "'0.1' is not FUNCTION(ARGS)"),
    ("lr=normal(0,1)", "unknown search function 'normal'; one of: uniform"),
    ("lr=loguniform(1e-4)", "loguniform takes (low, high), low > 0 as finite numbers"),
    ("lr=uniform(1e-2,1e-4)", "uniform needs low < high, got low=0.01 and high=0.0001"),
    ("lr=uniform(-1,1)", "PPOConfig rejects lr=-1.0"),
    ("lr=uniform(a,1)", "arguments must be literal numbers"),
    ("num_sgd_iter=randint(1.5,4)", "randint takes ints"),
    ("num_sgd_iter=choice()", "choice needs at least one value"),
    ("num_sgd_iter=grid(5,0)", "PPOConfig rejects num_sgd_iter=0"),
    ("activation=choice('tanh','gelu')", "activation takes one of"),
    ("lrr=uniform(0.1,0.2)", "has no field 'lrr'; did you mean 'lr'"),
])
def test_a_bad_search_expression_is_refused_naming_it(item: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_search(get_algorithm("ppo"), SMALL, [item])
    assert f"--search {item!r}" in str(info.value) and message in str(info.value), str(info.value)


def test_search_expressions_become_tune_domains() -> None:
    space = parse_search(get_algorithm("ppo"), SMALL, ["lr=loguniform(1e-4,1e-2)", "num_sgd_iter=randint(1,5)",
                                                       "model.hidden_sizes=choice([16],[32,32])", "seed=grid(0,1)",
                                                       "gamma=quniform(0.9,0.99,0.01)"])
    assert space["seed"] == {"grid_search": [0, 1]}
    assert space["model.hidden_sizes"].categories == [(16,), (32, 32)]
    assert (space["lr"].lower, space["lr"].upper) == (1e-4, 1e-2)
    assert (space["num_sgd_iter"].lower, space["num_sgd_iter"].upper) == (1, 5)
    with pytest.raises(ValueError, match="lr is searched twice"):
        parse_search(get_algorithm("ppo"), SMALL, ["lr=uniform(0.1,0.2)", "lr=uniform(0.1,0.2)"])


@pytest.mark.parametrize(("args", "message"), [
    (["--search", "lr=loguniform(0,1)", "--stop-iters", "2"], "loguniform needs 0 < low < high"),
    (["--search", "lr=uniform(1e-4,1e-3)"], "give at least one stop criterion"),
    (["--scheduler", "asha", "--stop-timesteps", "1000"], "ASHA needs the most iterations a trial may run"),
    (["--config", "lr=-1", "--stop-iters", "2"], "PPOConfig rejects"),
    (["--name", "a/b", "--stop-iters", "2"], "is not a directory name"),
])
def test_flowrl_tune_refuses_bad_input_before_any_trial(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["tune", "ppo", "--storage-path", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output, result.output
    assert not any(tmp_path.iterdir())  # nothing written


def test_flowrl_tune_resume_refuses_options_and_foreign_directories(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["tune", "ppo", "--resume", str(tmp_path), "--samples", "3"])
    assert result.exit_code == 2 and "--resume continues the sweep as it was started; drop --samples" in result.output
    result = CliRunner().invoke(main, ["tune", "ppo", "--resume", str(tmp_path)])
    assert result.exit_code == 2 and "holds no flowrl_sweep.json" in result.output, result.output


@pytest.mark.slow  # ~17 s: a sweep on a cluster, then resumed
def test_flowrl_tune_on_a_cluster_prints_the_results_table_and_resumes(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    address = ray.get_runtime_context().gcs_address
    common = ["--address", address]
    run = subprocess.run([sys.executable, "-m", "flowrl", "tune", "pg", "--search", "lr=grid(0.001,0.01)",
                          "--config", "train_batch_size=200", "--config", "num_workers=1",  # a remote worker a trial
                          "--config", "num_cpus_per_worker=0.5", "--stop-iters", "2", "--storage-path", str(tmp_path),
                          "--name", "cli", "--max-concurrent", "2", *common],
                         capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    table = run.stdout[run.stdout.index("2 trials, by episode_reward_mean (max)"):]
    assert "0.001" in table and "0.01" in table and table.count(" done ") == 2, table
    assert "best trial: PG_" in run.stdout and f"flowrl tune pg --resume {tmp_path / 'cli'}" in run.stdout
    checkpoint = run.stdout.split("its checkpoint: ")[1].split()[0]
    assert list(Path(checkpoint).glob("checkpoint_000002/manifest.json")), checkpoint
    record = json.loads((tmp_path / "cli" / "flowrl_sweep.json").read_text())
    assert record["algorithm"] == "pg" and record["search"] == ["lr=grid(0.001,0.01)"]
    assert record["config"]["fields"]["num_workers"] == 1
    again = subprocess.run([sys.executable, "-m", "flowrl", "tune", "pg", "--resume", str(tmp_path / "cli"), *common],
                           capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout[again.stdout.index("2 trials"):].count(" done ") == 2  # both finished: nothing runs again
    for trial in (tmp_path / "cli").glob("PG_*"):
        assert [row["training_iteration"] for row in _rows(trial)] == [1, 2]


def test_flowrl_tune_without_ray_tune_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray.tune", None)  # what an import of a missing package does
    result = CliRunner().invoke(main, ["tune", "ppo", "--stop-iters", "1"])
    assert result.exit_code == 1 and "install it with pip install 'flowrl[tune]'" in result.output, result.output


def test_the_progress_lines_name_trials_metrics_and_searched_values(capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    from flowrl._cli_tune import SweepProgress

    progress = SweepProgress("evaluation/episode_reward_mean", ["lr=uniform(0.1,0.2)"])
    done = SimpleNamespace(local_path="/s/PPO_ab12c_00001_1_lr=0.15_2026", config={"lr": 0.15}, status="TERMINATED",
                           last_result={"training_iteration": 4, "evaluation": {"episode_reward_mean": 87.5}})
    running = SimpleNamespace(local_path="/s/PPO_ab12c_00002_2_lr=0.12_2026", config={"lr": 0.12}, status="RUNNING",
                              last_result={"training_iteration": 2, "evaluation/episode_reward_mean": 12.0})
    progress.on_trial_complete(iteration=5, trials=[done, running], trial=done)
    progress.on_step_end(iteration=6, trials=[done, running])
    progress.on_step_end(iteration=7, trials=[done, running])  # within PROGRESS_EVERY_S: no second line
    assert capsys.readouterr().out.splitlines() == [
        "PPO_ab12c_00001 done: 4 iterations, evaluation/episode_reward_mean=87.5 (lr=0.15)",
        "sweep: 1 running, 1 terminated; best evaluation/episode_reward_mean so far 87.5 (lr=0.15)",
    ]


def test_flowrl_tune_resume_refuses_a_sweep_whose_tune_state_was_cut_short(tmp_path: Path) -> None:
    from flowrl._cli_train import StopCriteria
    from flowrl._cli_tune import SweepOptions, _options_data
    from flowrl.tune import SWEEP_RECORD, sweep_record

    options = SweepOptions(search=("lr=uniform(0.001,0.01)",), samples=2, scheduler="fifo", metric="episode_reward_mean",
                           mode="max", stop=StopCriteria(iters=2), checkpoint_freq=1, max_concurrent=None)
    record = sweep_record(get_algorithm("ppo"), SMALL, options.search, options=_options_data(options))
    (tmp_path / SWEEP_RECORD).write_text(json.dumps(record))
    (tmp_path / "experiment_state-2026-12-07_06-15-46.json").write_bytes(b"")  # killed while Tune copied it
    result = CliRunner().invoke(main, ["tune", "ppo", "--resume", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "experiment_state-2026-12-07_06-15-46.json is empty or cut short" in " ".join(result.output.split())
    (tmp_path / SWEEP_RECORD).write_text(json.dumps({**record, "options": {}}))
    result = CliRunner().invoke(main, ["tune", "ppo", "--resume", str(tmp_path)])
    assert result.exit_code == 2 and "is malformed: it has no 'search'" in " ".join(result.output.split())
