"""An asynchronous run on Ray, recorded (``record=``), replays bit for bit (``replay=``) under the local executor
and under Ray; a replay against another config fails at start, and one that diverges says where."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flowrl import decisions
from flowrl.algorithms import get_algorithm
from flowrl.trainer import Trainer

from test_local_executor import SETTINGS, Outcome, assert_identical, differences
from test_local_executor import run as run_plan

ASYNC = ["a3c", "impala", "appo", "apex"]
# and the multi-agent composition, whose async union of its two branches makes its Ray runs timing-dependent too:
# its Ray run replays bit for bit under the local executor
RECORDED = [*ASYNC, "multiagent"]
REPORTS = 20


def run(name: str, executor_name: str, reports: int = REPORTS, **log: Any) -> Outcome:
    return run_plan(name, executor_name, iterations=reports, seed=11, **log)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Outcome]]:
    """Each async algorithm run on Ray with 2 workers for 20 reports, its decisions recorded."""
    out = {}
    for name in RECORDED:
        path = tmp_path_factory.mktemp(name) / "run.decisions"
        out[name] = (path, run(name, "ray", record=str(path)))
    return out


@pytest.mark.parametrize("name", RECORDED)
def test_a_recorded_ray_run_replays_bit_for_bit_under_the_local_executor(
        name: str, recorded: dict[str, tuple[Path, Outcome]]) -> None:
    path, original = recorded[name]
    assert original.counters["num_steps_trained"] > 0
    assert_identical(original, run(name, "local", replay=str(path)))


@pytest.mark.parametrize("name", ASYNC)
def test_a_recorded_ray_run_replays_bit_for_bit_under_ray(name: str, recorded: dict[str, tuple[Path, Outcome]]) -> None:
    path, original = recorded[name]
    assert_identical(original, run(name, "ray", replay=str(path)))


def test_the_log_holds_a_header_report_markers_and_decisions(recorded: dict[str, tuple[Path, Outcome]]) -> None:
    path, _ = recorded["impala"]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["flowrl_decisions"] == decisions.FORMAT and lines[0]["algorithm"] == "impala"
    assert [line["report"] for line in lines if isinstance(line, dict) and "report" in line] == \
        list(range(1, REPORTS + 1))
    kinds = {line[0] for line in lines[1:] if isinstance(line, list)}
    assert {"wait", "put", "get", "flag"} <= kinds  # gathers, the learner's queues, its weights flag


def test_a_replay_with_another_config_fails_at_start_naming_the_field(
        recorded: dict[str, tuple[Path, Outcome]]) -> None:
    path, _ = recorded["a3c"]
    algorithm = get_algorithm("a3c")
    config = algorithm.config_class(seed=11, num_workers=2, executor="local", replay=str(path),  # type: ignore[call-arg]
                                    **{**SETTINGS["a3c"], "rollout_fragment_length": 20})
    with pytest.raises(ValueError, match=r"another config \(rollout_fragment_length: recorded 10, now 20\)"):
        Trainer(algorithm, config)
    with pytest.raises(ValueError, match="was recorded by 'a3c', this run is 'impala'"):
        Trainer("impala", get_algorithm("impala").config_class(num_workers=2, executor="local", replay=str(path),
                                                               seed=11))


def test_a_replay_that_diverges_names_the_report_and_the_decision(recorded: dict[str, tuple[Path, Outcome]],
                                                                   tmp_path: Path) -> None:
    path, _ = recorded["impala"]
    lines = path.read_text().splitlines()
    report_3 = lines.index('{"report": 3}')
    entry = json.loads(lines[report_3 + 1])
    lines[report_3 + 1] = json.dumps(["get", "SomewhereElse.poll", entry[2], entry[3]])
    tampered = tmp_path / "tampered.decisions"
    tampered.write_text("\n".join(lines) + "\n")
    with pytest.raises(decisions.ReplayDivergence, match=rf"diverged at report 3, decision #\d+: the log has get in "
                                                         rf"SomewhereElse.poll, the run made {entry[0]} in"):
        run("impala", "local", replay=str(tampered))


def test_record_and_replay_are_exclusive_and_refuse_a_clock_gated_report() -> None:
    config_class = get_algorithm("a3c").config_class
    with pytest.raises(ValueError, match="either records its decisions or replays recorded ones"):
        config_class(record="a", replay="b", seed=0)
    with pytest.raises(ValueError, match="min_iter_time_s=2 ends reports by the clock"):
        config_class(record="a", seed=0, min_iter_time_s=2)
    with pytest.raises(ValueError, match="replay= needs a seed"):
        config_class(replay="a")


def test_the_comparison_sees_a_run_that_was_not_replayed(recorded: dict[str, tuple[Path, Outcome]]) -> None:
    _, original = recorded["impala"]
    assert differences(original.learner, run("impala", "local", reports=3).learner)
