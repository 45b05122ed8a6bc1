"""Item 8 of issue 31: tuned presets kept as data, applied by `flowrl train --tuned`, never silently."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from flowrl import cli
from flowrl.algorithms import get_algorithm
from flowrl.cli import build_config, main
from flowrl.presets import PRESETS, find_preset

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: f"{p.algorithm}-{p.env}")
def test_every_preset_builds_and_trains_the_batch_it_asks_for(preset: Any) -> None:
    config = build_config(get_algorithm(preset.algorithm).config_class, [*preset.settings, f"env={preset.env}"])
    assert config.train_batch_size_warning() is None
    assert len(set(preset.keys())) == len(preset.keys())  # one value per key


def test_the_pendulum_ppo_preset_is_rllibs_tuned_example() -> None:
    preset = find_preset("ppo", "Pendulum-v1")
    assert preset is not None
    config = build_config(get_algorithm("ppo").config_class, preset.settings)
    assert (config.gamma, config.lambda_, config.lr, config.sgd_minibatch_size, config.num_sgd_iter,
            config.model.hidden_sizes, config.vf_clip_param) == (0.95, 0.1, 3e-4, 64, 6, (256, 256), 10.0)


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """`flowrl train` up to the config it would train with (nothing starts)."""
    seen: dict[str, Any] = {}

    def fake_train(algorithm: Any, config: Any, stop: Any, **kwargs: Any) -> None:
        seen["config"] = config

    monkeypatch.setattr(cli, "_train", fake_train)
    return seen


def _train(*args: str) -> Any:
    return CliRunner().invoke(main, ["train", *args, "--stop-iters", "1"])


def test_tuned_applies_the_preset_in_one_line_and_explicit_config_wins(captured: dict[str, Any]) -> None:
    result = _train("ppo", "--env", "Pendulum-v1", "--tuned", "--config", "lr=1e-3")
    assert result.exit_code == 0, result.output
    config = captured["config"]
    assert (config.gamma, config.lambda_, config.model.hidden_sizes, config.lr) == (0.95, 0.1, (256, 256), 1e-3)
    [line] = [line for line in result.stderr.splitlines() if "preset" in line]
    assert line.startswith("tuned preset for ppo on Pendulum-v1: num_workers=2 ")
    assert "lr=3e-4" not in line and "gamma=0.95" in line and "(your --config lr kept)" in line


def test_without_tuned_the_defaults_train_and_one_line_names_the_preset(captured: dict[str, Any]) -> None:
    result = _train("ppo", "--env", "Pendulum-v1")
    assert result.exit_code == 0, result.output
    assert captured["config"] == build_config(get_algorithm("ppo").config_class, ["env=Pendulum-v1"])
    assert result.stderr.strip().splitlines()[-1].startswith("a tuned preset exists for ppo on Pendulum-v1: add "
                                                             "--tuned to use it (num_workers=2 ")


def test_tuned_without_a_preset_says_so_and_keeps_the_defaults(captured: dict[str, Any]) -> None:
    result = _train("pg", "--env", "Pendulum-v1", "--tuned")
    assert result.exit_code == 0, result.output
    assert captured["config"] == build_config(get_algorithm("pg").config_class, ["env=Pendulum-v1"])
    assert "no tuned preset for pg on Pendulum-v1" in result.stderr


def test_tuned_is_refused_on_resume(tmp_path: Path, captured: dict[str, Any]) -> None:
    result = _train("ppo", "--tuned", "--resume", str(tmp_path))
    assert result.exit_code == 2 and "a resumed run keeps its saved config; drop --tuned" in result.stderr


def test_the_readme_table_lists_every_preset_setting() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme[readme.index("## Tuned settings and defaults"):]
    section = section[:section.index("\n## ", 1)]
    for preset in PRESETS:
        row = section[section.index(f"{preset.algorithm:<11}{preset.env}"):]
        row = row[:row.index("\n", row.index(preset.settings[-1]))]  # the preset's rows end with its last setting
        assert all(item in row for item in preset.settings), preset
