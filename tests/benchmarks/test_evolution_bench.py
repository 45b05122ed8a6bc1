"""benchmarks/evolution.py, benchmarks/maml.py and benchmarks/learners.py: their command lines, and the evolution
bytes table (no Ray: one worker in this process)."""

from __future__ import annotations

import doctest

import pytest

from benchmarks import evolution, learners, maml

pytestmark = pytest.mark.usefixtures("local_executor")


@pytest.mark.parametrize("module", [evolution, maml, learners], ids=["evolution", "maml", "learners"])
def test_doctests_pass(module: object) -> None:
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("algo", ["es", "ars"])
def test_an_answer_costs_the_same_bytes_for_a_small_and_a_large_policy(algo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evolution, "NOISE_SIZE", 200_000)
    small, large = evolution.wire_bytes(algo, (8,)), evolution.wire_bytes(algo, (64, 64))
    assert small["params"] < large["params"]
    assert small["result_bytes_per_eval"] == large["result_bytes_per_eval"] < 100
    assert small["weights_bytes_per_eval"] < large["weights_bytes_per_eval"]  # the weights grow with the model
