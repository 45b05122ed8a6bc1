"""The hand-written PPO, A3C and Ape-X of the lines-of-code benchmark (``benchmarks/handwritten/``), and its counter.

The hand-written versions must be the plans' algorithms over the same substrate: PPO ends two iterations with
the very weights the trainer's plan ends with; A3C answers each gradient to its producer alone, as the plan does;
A3C and Ape-X run on CartPole and report what their plans report. No timing here.
"""

from __future__ import annotations

import ast
import dataclasses
import doctest
import json
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest
import ray

from benchmarks import loc
from benchmarks.handwritten import a3c, apex, ppo
from flowrl.algorithms import ALGORITHMS
from flowrl.algorithms import a3c as a3c_plan
from flowrl.algorithms import apex as apex_plan
from flowrl.algorithms import ppo as ppo_plan
from flowrl.algorithms.a2c import ActorCriticPolicy
from flowrl.algorithms.a3c import A3CConfig
from flowrl.algorithms.apex import ApexConfig, ApexPolicy
from flowrl.algorithms.ppo import PPOConfig, PPOPolicy
from flowrl.config import ModelConfig
from flowrl.testing import make_fake_workers, plan_lines
from flowrl.trainer import Trainer
from flowrl.workers import WorkerSet

HANDWRITTEN = Path(loc.__file__).parent / "handwritten"
TINY = ModelConfig(hidden_sizes=(16,))
# result keys of a plan's report that the hand-written versions leave out: per-policy and custom statistics
# (single-agent runs here) and the raw episode windows
NOT_REPORTED = {"policy_reward_min", "policy_reward_max", "policy_reward_mean", "custom_metrics", "hist_stats"}
TRAINER_KEYS = {"training_iteration", "time_this_iter_s", "time_total_s", "episodes_total"}  # Trainer.train adds


def take(results: Iterator[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The first ``n`` results, then the generator closed (its threads and actors stopped)."""
    try:
        return [next(results) for _ in range(n)]
    finally:
        results.close()  # type: ignore[attr-defined]  # a generator


def assert_reports_like_the_plan(result: dict[str, Any], plan_result: dict[str, Any]) -> None:
    assert set(plan_result) - NOT_REPORTED - TRAINER_KEYS <= set(result)
    assert {k for k in plan_result["info"] if k != "learner_queue"} <= set(result["info"])
    # the learner-thread timers and the multi-device learner's "load" timer are left out
    assert {k for k in plan_result["timers"] if not k.startswith(("learner_", "load_"))} <= set(result["timers"])


# -- PPO: the same numerics as the plan ----------------------------------------------------------------

@pytest.mark.parametrize("settings", [
    pytest.param({"num_workers": 1, "rollout_fragment_length": 100}, id="1-remote-worker"),
    pytest.param({"num_workers": 2, "rollout_fragment_length": 100}, id="2-remote-workers", marks=pytest.mark.slow),
    pytest.param({"num_workers": 0, "num_gpus": 2, "fake_gpus": True}, id="multi-device-2-fake-towers"),
    pytest.param({"num_workers": 0, "simple_optimizer": False}, id="multi-device-1-cpu-tower"),
])
def test_ppo_ends_with_the_plans_weights(settings: dict[str, Any]) -> None:
    config = PPOConfig(seed=0, train_batch_size=400, sgd_minibatch_size=64, num_sgd_iter=3, model=TINY, **settings)
    trainer = Trainer("ppo", config)
    try:
        plan_results = [trainer.train() for _ in range(2)]
        plan_policy = trainer.get_policy()
        assert isinstance(plan_policy, PPOPolicy)
        plan_weights, plan_kl = plan_policy.get_weights(), plan_policy.kl_coeff
    finally:
        trainer.stop()
    workers = WorkerSet(policy_class=PPOPolicy, config=config)
    try:
        results = take(ppo.train(workers, config), 2)
        policy = workers.local_worker().get_policy()
        assert isinstance(policy, PPOPolicy)
        weights, kl = policy.get_weights(), policy.kl_coeff
    finally:
        workers.stop()
    assert sorted(weights) == sorted(plan_weights)
    assert all(np.array_equal(weights[name], plan_weights[name]) for name in weights)
    assert kl == plan_kl
    for result, plan_result in zip(results, plan_results):
        for key in ("num_steps_sampled", "num_steps_trained", "timesteps_total", "episodes_this_iter",
                    "episode_reward_mean", "num_healthy_workers"):
            assert result[key] == plan_result[key], key
        assert result["info"]["learner"] == plan_result["info"]["learner"]
        assert_reports_like_the_plan(result, plan_result)
    assert results[1]["num_steps_trained"] == 800


def test_ppo_with_another_seed_ends_elsewhere() -> None:
    """The equality above is not vacuous: the weights depend on the seed."""
    def final_weights(seed: int) -> dict[str, np.ndarray]:
        config = PPOConfig(seed=seed, num_workers=0, train_batch_size=200, sgd_minibatch_size=50, num_sgd_iter=2,
                           model=TINY)
        workers = WorkerSet(policy_class=PPOPolicy, config=config)
        take(ppo.train(workers, config), 1)
        return workers.local_worker().get_policy().get_weights()  # type: ignore[no-any-return]

    first, second = final_weights(0), final_weights(1)
    assert not all(np.array_equal(first[name], second[name]) for name in first)


# -- A3C ----------------------------------------------------------------------------------------------

def test_a3c_answers_each_gradient_to_its_producer_alone_and_reports_like_the_plan() -> None:
    """As the plan's test (tests/algorithms/test_a3c.py), on fake workers; then the plan on the same workers."""
    workers = make_fake_workers(2, rollout_fragment_length=10)
    try:
        results = take(a3c.train(workers, A3CConfig(timesteps_per_iteration=0)), 12)  # no gate: a report per gradient
        assert (results[-1]["info"]["num_steps_trained"], results[-1]["info"]["num_steps_sampled"]) == (120, 120)
        assert len(workers.local_worker().applied_gradients) == 12
        records = ray.get([w.get_record.remote() for w in workers.remote_workers()])
        # two initial syncs per worker (WorkerSet, train), then the version after each applied gradient
        answers = [[versions["default_policy"] for versions, _ in r["set_weights_calls"][2:]] for r in records]
        assert sorted(v for a in answers for v in a) == list(range(1, 13))
        for record, answered in zip(records, answers):
            assert answered == sorted(answered)
            assert record["sample_calls"] - len(answered) in (0, 1)  # one request in flight per worker
        plan_result = take(a3c_plan.plan(workers, A3CConfig(timesteps_per_iteration=0)), 1)[0]
    finally:
        workers.stop()
    for result in results:
        assert_reports_like_the_plan(result, plan_result)


def test_a3c_needs_remote_workers() -> None:
    with pytest.raises(ValueError, match="A3C computes gradients on remote workers"):
        next(a3c.train(make_fake_workers(0), A3CConfig(timesteps_per_iteration=0)))


def test_a3c_trains_cartpole() -> None:
    config = A3CConfig(seed=0, num_workers=1, min_iter_time_s=0, timesteps_per_iteration=50, model=TINY)
    workers = WorkerSet(policy_class=ActorCriticPolicy, config=config)
    try:
        results = take(a3c.train(workers, config), 3)
        applied = workers.local_worker().get_policy().weights_version
    finally:
        workers.stop()
    totals = [r["timesteps_total"] for r in results]
    assert totals[0] >= 50 and all(b - a >= 50 for a, b in zip(totals, totals[1:]))
    assert all(r["num_steps_trained"] == r["num_steps_sampled"] == r["timesteps_total"] for r in results)
    assert applied == totals[-1] // 10  # one applied gradient per 10-step fragment
    assert sum(r["episodes_this_iter"] for r in results) > 0
    stats = results[-1]["info"]["learner"]["default_policy"]["learner_stats"]
    assert {"policy_loss", "vf_loss", "entropy", "grad_gnorm"} <= set(stats)


# -- Ape-X --------------------------------------------------------------------------------------------

APEX = ApexConfig(seed=0, num_workers=1, num_replay_buffer_shards=1, learning_starts=64, buffer_size=2000,
                  train_batch_size=32, rollout_fragment_length=16, max_weight_sync_delay=32,
                  target_network_update_freq=64, timesteps_per_iteration=100, min_iter_time_s=0, model=TINY,
                  hiddens=(16,))


def _learner_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "handwritten-apex-learner" and t.is_alive()]


def test_apex_trains_cartpole_and_reports_like_the_plan() -> None:
    local_config = dataclasses.replace(APEX, num_workers=0)
    plan_workers = WorkerSet(policy_class=ApexPolicy, config=local_config)
    plan_result = take(apex_plan.plan(plan_workers, local_config), 1)[0]
    workers = WorkerSet(policy_class=ApexPolicy, config=APEX)
    try:
        results = take(apex.train(workers, APEX), 3)
        epsilons = workers.foreach_worker(lambda w: w.get_policy().epsilon)  # type: ignore[attr-defined]
    finally:
        workers.stop()
    assert not _learner_threads()  # closing the generator stopped its learner
    totals = [r["timesteps_total"] for r in results]
    assert totals[0] >= 100 and all(b - a >= 100 for a, b in zip(totals, totals[1:]))
    trained = [r["num_steps_trained"] for r in results]
    assert trained == sorted(trained) and trained[0] > 0 and all(t % 32 == 0 for t in trained)
    last = results[-1]["info"]
    assert last["num_learner_updates"] == last["num_steps_trained"] // 32
    assert last["num_target_updates"] >= 1 and last["num_weight_syncs"] >= 1
    assert last["replay_shard_0"]["num_added"] >= 64
    assert epsilons == [0.0, 0.4]  # the learner's replica greedy, the one sampling worker 0.4
    for result in results:
        assert_reports_like_the_plan(result, plan_result)


def test_apex_round_robin_with_training_intensity_on_the_local_worker() -> None:
    config = dataclasses.replace(APEX, num_workers=0, training_intensity=4.0)  # weights [1, 2]: 2 replays a turn
    workers = WorkerSet(policy_class=ApexPolicy, config=config)
    results = take(apex.train(workers, config), 2)
    info = results[-1]["info"]
    assert info["num_steps_trained"] > 0 and info["num_steps_sampled"] >= 200
    assert info.get("num_weight_syncs", 0) == 0  # no remote workers to sync
    assert not _learner_threads()


# -- the lines-of-code benchmark ------------------------------------------------------------------------

def test_loc_doctests_pass() -> None:
    result = doctest.testmod(loc, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 2 and result.failed == 0


def test_code_lines_leaves_out_docstrings_comments_blanks_and_imports_only() -> None:
    source = ('"""Doc."""\nfrom __future__ import annotations\nimport os  # why\n\n\nclass A:\n    """Doc."""\n\n'
              '    x = "a string statement"\n    # note\n    def f(self) -> str:\n        """Doc."""\n'
              '        import sys\n        return """not a\n        docstring"""\n')
    assert loc.code_lines(source) == 5  # class A, x, def f, and the two lines of the returned string
    assert loc.code_lines("") == 0


@pytest.mark.parametrize("name", ["__init__", "a3c", "ppo", "apex"])
def test_handwritten_code_uses_no_flowrl_dataflow_layer(name: str) -> None:
    tree = ast.parse((HANDWRITTEN / f"{name}.py").read_text())
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    forbidden = {m for m in modules if m.split(".")[:2] in (["flowrl", "iter"], ["flowrl", "ops"],
                                                            ["flowrl", "trainer"])}
    assert not forbidden
    plan_imports = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and (node.module or "").startswith("flowrl.algorithms")
                    for alias in node.names if alias.name == "plan"}
    assert not plan_imports


def test_loc_script_counts_plans_and_handwritten_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "loc.json"
    monkeypatch.setattr(sys, "argv", ["loc.py", "--out", str(out)])
    loc.main()
    last = capsys.readouterr().out.strip().splitlines()[-1]
    data = json.loads(out.read_text())
    assert last == (f"loc_ratio_median={data['loc_ratio_median']:.2f} min={data['loc_ratio_min']:.2f} "
                    f"max={data['loc_ratio_max']:.2f}")
    assert list(data["compared"]) == ["a3c", "ppo", "apex"]
    plans: dict[str, Callable[..., Any]] = {"a3c": a3c_plan.plan, "ppo": ppo_plan.plan, "apex": apex_plan.plan}
    for name, row in data["compared"].items():
        assert row["plan_lines"] == plan_lines(plans[name])
        assert row["handwritten_lines"] == loc.file_lines(HANDWRITTEN / f"{name}.py")
        assert row["ratio"] == row["handwritten_lines"] / row["plan_lines"] > 1
    assert set(data["plans"]) == set(ALGORITHMS)  # every registered algorithm's plan
    assert data["shared_handwritten_lines"] > 0 and sum(data["core_lines"].values()) > 0

