"""Bad numbers and bad inputs are refused before training starts, in one line naming the field and the value:
non-finite float fields of every algorithm config, out-of-range seeds, env config keywords the env does not take,
non-finite stop criteria, and a malformed or dead ``--address``."""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from click.testing import CliRunner, Result

from flowrl.algorithms import ALGORITHMS, get_algorithm
from flowrl.algorithms.ppo import PPOConfig
from flowrl.cli import main
from flowrl.config import config_field_types

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

REPO = Path(__file__).resolve().parents[2]


#: a run that takes a second per iteration, should a bad value get through
SMALL = ["--config", "num_workers=0", "--config", "train_batch_size=64", "--config", "rollout_fragment_length=64",
         "--config", "sgd_minibatch_size=64", "--config", "num_sgd_iter=1"]


def invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def float_fields() -> Iterator[Any]:
    for name in sorted(ALGORITHMS):
        config_class = get_algorithm(name).config_class
        for field, tp in config_field_types(config_class).items():
            if tp is float or float in get_args(tp):  # float, or float | None
                yield pytest.param(config_class, field, id=f"{name}.{field}")


FLOAT_FIELDS = list(float_fields())


def test_the_algorithms_have_float_fields_to_check() -> None:
    ids = {p.id for p in FLOAT_FIELDS}
    assert {"ppo.lr", "ppo.clip_param", "appo.clip_param", "dqn.lr", "impala.learner_queue_timeout",
            "pg.num_cpus_per_worker", "a2c.min_iter_time_s", "apex.collect_metrics_timeout"} <= ids


@pytest.mark.parametrize(("config_class", "field"), FLOAT_FIELDS)
def test_every_float_field_of_every_algorithm_refuses_nan(config_class: type, field: str) -> None:
    with pytest.raises(ValueError, match=rf"\b{field}=nan must be a finite number"):
        config_class(num_workers=2, **{field: math.nan})


@pytest.mark.parametrize(("config_class", "field"), FLOAT_FIELDS)
def test_every_float_field_refuses_infinity_unless_it_means_something(config_class: type, field: str) -> None:
    if field in config_class.infinite_ok_fields:
        assert getattr(config_class(num_workers=2, **{field: math.inf}), field) == math.inf
        return
    with pytest.raises(ValueError, match=rf"\b{field}=inf must be a finite number(; pass a finite value|, or None)"):
        config_class(num_workers=2, **{field: math.inf})


def test_vf_clip_param_inf_still_turns_value_clipping_off() -> None:
    assert PPOConfig(num_workers=0, vf_clip_param=math.inf).vf_clip_param == math.inf


@pytest.mark.parametrize("seed", [1e30, -1, 2**70, 3.0, True])
def test_a_seed_that_is_not_a_small_non_negative_int_is_refused(seed: Any) -> None:
    with pytest.raises(ValueError, match=r"^seed="):
        PPOConfig(num_workers=0, seed=seed)


def test_the_largest_seed_torch_takes_is_accepted() -> None:
    assert PPOConfig(num_workers=0, seed=2**63 - 1).seed == 2**63 - 1
    assert dataclasses.replace(PPOConfig(num_workers=0), seed=None).seed is None


@pytest.mark.parametrize(("args", "option", "named"), [
    (["--stop-reward", "nan", "--stop-iters", "1"], "'--stop-reward'", "nan is not a finite number"),
    (["--stop-reward", "inf", "--stop-iters", "1"], "'--stop-reward'", "inf is not a finite number"),
    (["--stop-time", "inf", "--stop-iters", "1"], "'--stop-time'", "inf is not a finite number"),
    (["--stop-iters", "1", "--config", "seed=-1"], "'--config'", "seed=-1 must be None or an int >= 0"),
    (["--stop-iters", "1", "--config", "num_cpus_per_worker=nan"], "'--config'", "num_cpus_per_worker=nan must be"),
    (["--stop-iters", "1", "--config", "num_cpus_per_worker=inf"], "'--config'", "num_cpus_per_worker=inf must be"),
    (["--stop-iters", "1", "--config", "min_iter_time_s=nan"], "'--config'", "min_iter_time_s=nan must be"),
    (["--stop-iters", "1", "--config", "collect_metrics_timeout=nan"], "'--config'",
     "collect_metrics_timeout=nan must be"),
    (["--stop-iters", "1", "--config", "lr=inf"], "'--config'", "lr=inf must be a finite number"),
    (["--stop-iters", "1", "--config", "clip_param=inf"], "'--config'", "clip_param=inf must be a finite number"),
    (["--stop-iters", "1", "--address", "foo:bar:baz"], "'--address'", "address 'foo:bar:baz' is not 'auto'"),
])
def test_bad_numbers_on_the_command_line_are_one_line_usage_errors(tmp_path: Path, args: list[str], option: str,
                                                                   named: str) -> None:
    result = invoke("train", "ppo", *SMALL, "--log-dir", tmp_path / "run", *args)
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and f"Invalid value for {option}" in error[0] and named in error[0], result.output
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()


def test_an_env_config_keyword_the_env_does_not_take_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    result = invoke("train", "ppo", *SMALL, "--config", 'env_config={"no_such_kw": 1}',
                    "--stop-iters", "1", "--log-dir", tmp_path / "run")
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1, result.output
    assert "env 'CartPole-v1' does not accept no_such_kw" in error[0]
    assert "sutton_barto_reward" in error[0]  # what it does take
    assert not isinstance(result.exception, TypeError) and not (tmp_path / "run" / "progress.csv").exists()


def test_a_callable_envs_rejected_keyword_is_named_too() -> None:
    import gymnasium

    from flowrl.envs import EnvContext, make_env

    def build(ctx: EnvContext) -> gymnasium.Env[Any, Any]:
        return gymnasium.make("CartPole-v1", **ctx.config)

    with pytest.raises(ValueError, match=r"env .*build does not accept typo_kw \(env_config=\{'typo_kw': 2\}\)"):
        make_env(build, EnvContext(config={"typo_kw": 2}))


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound (so nothing else takes it) but not listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_an_address_where_nothing_listens_fails_fast_naming_it(tmp_path: Path, dead_port: int) -> None:
    address = f"127.0.0.1:{dead_port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "flowrl", "train", "ppo", "--address", address, "--stop-iters", "1",
                           *SMALL, "--log-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"--address {address}" in errors[0] and "Connection refused" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_check_reachable_refuses_a_dead_loopback_port(dead_port: int) -> None:
    from flowrl.runtime import check_reachable

    with pytest.raises(ConnectionError, match=rf"nothing accepts connections at 127\.0\.0\.1:{dead_port}"):
        check_reachable(f"127.0.0.1:{dead_port}", timeout_s=5)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=5)  # something listens: no error


@pytest.mark.parametrize(("algorithm", "env", "named"), [
    ("dqn", "Pendulum-v1", "DQN needs a Discrete action space, got Box("),
    ("sac", "CartPole-v1", "SAC needs a Box (continuous) action space, got Discrete(2)"),
    ("ddpg", "CartPole-v1", "DDPGPolicy needs a 1-D Box action space, got Discrete(2)"),
    ("td3", "CartPole-v1", "DDPGPolicy needs a 1-D Box action space, got Discrete(2)"),
    ("apex_ddpg", "CartPole-v1", "ApexDDPGPolicy needs a 1-D Box action space, got Discrete(2)"),
])
def test_an_env_whose_actions_the_algorithm_cannot_take_is_refused_naming_the_space(
        tmp_path: Path, algorithm: str, env: str, named: str) -> None:
    result = invoke("train", algorithm, "--env", env, "--config", "num_workers=0", "--stop-iters", "1",
                    "--log-dir", tmp_path / "run")
    assert result.exit_code != 0, result.output
    assert named in result.output + repr(result.exception), (result.output, result.exception)
    assert not (tmp_path / "run" / "progress.csv").exists()
