"""`flowrl algorithms NAME`: each public field with its default, its type and the one-line description from the
config's docstring, in 100 columns."""

from __future__ import annotations

import dataclasses
import re

import pytest
from click.testing import CliRunner

from flowrl.algorithms import ALGORITHMS, get_algorithm
from flowrl.cli import main

FIELD = re.compile(r"^  (?P<key>[a-z][\w.]*) = (?P<value>.+)  \((?P<kind>[^)].*)\)$")


def listing(name: str) -> list[str]:
    result = CliRunner().invoke(main, ["algorithms", name])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_public_field_has_a_default_a_type_and_a_description_in_100_columns(name: str) -> None:
    lines = listing(name)
    assert lines[0] == f"{name}: {get_algorithm(name).config_class.__name__} (set with --config KEY=VALUE)"
    assert [line for line in lines if len(line) > 100] == []
    keys = []
    for line, following in zip(lines[1:], [*lines[2:], ""]):
        if line.startswith("      "):
            continue
        match = FIELD.match(line)
        assert match is not None, line
        keys.append(match["key"])
        assert following.startswith("      ") and following.strip(), f"{line!r} has no description"
    public = [f.name for f in dataclasses.fields(get_algorithm(name).config_class) if not f.name.startswith("_")]
    assert {key.split(".")[0] for key in keys} == set(public)


def test_ppo_lists_types_and_descriptions() -> None:
    lines = listing("ppo")
    assert "  fake_gpus = False  (true or false)" in lines  # a public field since it lost its underscore
    assert lines[lines.index("  lr = 5e-05  (a number)") + 1] == "      Adam learning rate (5e-5)."
    assert lines[lines.index("  model.activation = 'tanh'  (one of ['tanh', 'relu', 'elu'])") + 1] == (
        '      "tanh", "relu" or "elu".')
    # simple_optimizer stays: a public switch (TrainOneStep or MultiGPUTrainOneStep) that DQN's errors name
    assert "  simple_optimizer = None  (true or false or none)" in lines


def test_a_long_default_is_cut_to_the_line() -> None:
    policies = next(line for line in listing("multiagent") if line.startswith("  policies = "))
    assert policies.startswith("  policies = {'ppo_policy': PolicySpec") and "...  (a callable or class" in policies
    assert len(policies) <= 100
