"""benchmarks/evolution.py: its command line, and its bytes table (no Ray: one worker in this process)."""

from __future__ import annotations

import doctest

import pytest

from benchmarks import evolution

pytestmark = pytest.mark.usefixtures("local_executor")


def test_doctests_pass() -> None:
    result = doctest.testmod(evolution, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("algo", ["es", "ars"])
def test_an_answer_costs_the_same_bytes_for_a_small_and_a_large_policy(algo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evolution, "NOISE_SIZE", 200_000)
    small, large = evolution.wire_bytes(algo, (8,)), evolution.wire_bytes(algo, (64, 64))
    assert small["params"] < large["params"]
    assert small["result_bytes_per_eval"] == large["result_bytes_per_eval"] < 100
    assert small["weights_bytes_per_eval"] < large["weights_bytes_per_eval"]  # the weights grow with the model
