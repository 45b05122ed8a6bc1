"""Item 8 of issue 31: default worker counts fit the machine (or the joined cluster); a chosen count is kept."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import ray
from click.testing import CliRunner

from flowrl import cli, config as config_module
from flowrl.algorithms import ALGORITHMS, get_algorithm
from flowrl.algorithms.apex import ApexConfig
from flowrl.algorithms.ppo import PPOConfig
from flowrl.config import available_cpus, num_workers_that_fit

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py


def test_available_cpus_are_the_running_ray_instances() -> None:
    assert ray.is_initialized()  # the session's instance
    assert available_cpus() == int(ray.cluster_resources()["CPU"])


def test_a_default_beyond_the_cpus_is_capped_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(config_module, "available_cpus", lambda: 2)
    with caplog.at_level(logging.WARNING, logger="flowrl.config"):
        config = ApexConfig()
    assert config.num_workers == 2
    [line] = [r.getMessage() for r in caplog.records if r.name == "flowrl.config"]
    assert "ApexConfig.num_workers defaults to 2" in line and "32 workers" in line and "2 CPUs" in line
    assert "--config num_workers=N" in line and "\n" not in line


def test_a_chosen_count_is_kept_silently(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(config_module, "available_cpus", lambda: 2)
    with caplog.at_level(logging.WARNING, logger="flowrl.config"):
        assert ApexConfig(num_workers=32).num_workers == 32
        assert PPOConfig().num_workers == 2  # fits: no line
    assert not [r for r in caplog.records if r.name == "flowrl.config"]


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithms_default_fits_one_cpu(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_module, "available_cpus", lambda: 1)
    if name == "ddppo":  # its workers learn together, one process each: one CPU is too few, and it says so
        with pytest.raises(ValueError, match=r"num_workers=1: DD-PPO's workers .* needs at least 2; set num_workers"):
            get_algorithm(name).config_class()
        return
    assert get_algorithm(name).config_class().num_workers <= 1


def test_num_workers_that_fit_keeps_what_fits() -> None:
    assert num_workers_that_fit(1, "X")() == 1
    assert num_workers_that_fit(10_000, "X")() == available_cpus()


class _FakeTrainer:
    def __init__(self, algorithm: Any, config: Any) -> None:
        self.config = config


def _run_make_trainer(monkeypatch: pytest.MonkeyPatch, config: Any, **kwargs: Any) -> tuple[Any, str]:
    import flowrl.trainer

    monkeypatch.setattr(flowrl.trainer, "Trainer", _FakeTrainer)
    runner = CliRunner()
    out: dict[str, Any] = {}

    @cli.click.command()
    def command() -> None:
        out["config"] = cli._make_trainer(get_algorithm(kwargs.pop("algo", "apex")), config, **kwargs).config

    result = runner.invoke(command, [])
    assert result.exit_code == 0, result.output
    return out["config"], result.output


def test_a_chosen_count_beyond_the_machine_is_kept_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.os, "cpu_count", lambda: 2)
    config, output = _run_make_trainer(monkeypatch, ApexConfig(num_workers=6))
    assert config.num_workers == 6
    assert output.strip().splitlines() == ["num_workers=6 (x 1 CPU each) is more than this machine's 2 CPUs: kept as "
                                           "set, the workers share the cores; lower num_workers for less contention"]


def test_joining_a_cluster_fits_the_default_to_the_clusters_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    # the config was built (and its default fitted) before joining; the joined cluster has available_cpus() CPUs
    local = ApexConfig(num_workers=1)
    config, output = _run_make_trainer(monkeypatch, local, address="auto", workers_chosen=False)
    assert config.num_workers == min(32, available_cpus()) > 1
    assert f"num_workers={config.num_workers}: the default fitted to the {available_cpus()} CPUs" in output
    config, _ = _run_make_trainer(monkeypatch, local, address="auto", workers_chosen=True)
    assert config.num_workers == 1
