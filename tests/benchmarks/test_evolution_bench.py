"""benchmarks/evolution.py, benchmarks/maml.py, benchmarks/learners.py and benchmarks/offline.py: their command
lines, the evolution bytes table (no Ray: one worker in this process), and the offline writing measure."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from benchmarks import evolution, learners, maml, offline

pytestmark = pytest.mark.usefixtures("local_executor")


@pytest.mark.parametrize("module", [evolution, maml, learners, offline], ids=["evolution", "maml", "learners",
                                                                               "offline"])
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


def test_the_offline_writing_measure_records_what_it_samples(tmp_path: Path) -> None:
    args = offline.parse_args(["--rounds", "1"])
    measured = offline.part_writing(args, tmp_path)
    assert measured["rows_written"] == (5 + 40) * 8 * 250  # the warm-up and the one round of 40 samples
    assert measured["plain_steps_per_s"] > 0 and 0 <= measured["add_share"] < 1
