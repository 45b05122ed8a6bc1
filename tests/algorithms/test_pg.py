"""PG: config, REINFORCE postprocessing and loss, the plan's shape, determinism, and a
seeded learning check on CartPole-v1.

``train_until``, ``first_results`` and ``comparable`` are shared with the A2C and A3C tests.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import time
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.algorithms import get_algorithm
from flowrl.algorithms.pg import ALGORITHM, PGConfig, PGPolicy, plan
from flowrl.config import TrainerConfig
from flowrl.metrics import TIMING_BREAKDOWN_INFO
from flowrl.policy import Policy
from flowrl.sample_batch import ACTIONS, OBS, RETURNS, REWARDS, TERMINATEDS, TRUNCATEDS, SampleBatch
from flowrl.workers import WorkerSet

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

Plan = Callable[..., Any]
WALL_CLOCK_KEYS = ("timers", "time_this_iter_s", "time_total_s")


def plan_code_lines(fn: Plan) -> int:
    """Non-blank source lines of a plan function, docstring excluded."""
    source = inspect.getsource(fn).replace(f'"""{fn.__doc__}"""', "")
    return sum(1 for line in source.splitlines() if line.strip())


def comparable(result: dict[str, Any]) -> str:
    """A result dict without its wall-clock entries, as text so that nan equals nan."""
    kept = {k: v for k, v in result.items() if k not in WALL_CLOCK_KEYS}
    kept["info"] = {k: v for k, v in result["info"].items() if k != TIMING_BREAKDOWN_INFO}
    return repr(kept)


def first_results(policy_class: type[Policy], config: TrainerConfig, plan_fn: Plan, n: int) -> list[dict[str, Any]]:
    """The first ``n`` results of ``plan_fn`` on a fresh WorkerSet (stopped afterwards)."""
    workers = WorkerSet(policy_class=policy_class, config=config)
    try:
        results = plan_fn(workers, config)
        return [next(results) for _ in range(n)]
    finally:
        workers.stop()


def train_until(policy_class: type[Policy], config: TrainerConfig, plan_fn: Plan, *, target: float,
                max_steps: int) -> tuple[dict[str, Any], float]:
    """Trains until ``episode_reward_mean >= target`` or ``max_steps`` sampled; the last result and the seconds."""
    workers = WorkerSet(policy_class=policy_class, config=config)
    start = time.perf_counter()
    try:
        for result in plan_fn(workers, config):
            print(f"{result['timesteps_total']:>8} steps  return {result['episode_reward_mean']:6.1f}  "
                  f"{time.perf_counter() - start:5.1f} s")
            if result["episode_reward_mean"] >= target or result["timesteps_total"] >= max_steps:
                return result, time.perf_counter() - start
        raise AssertionError("the plan ended")
    finally:
        workers.stop()


# -- config -----------------------------------------------------------------------------------------

def test_config_has_pg_defaults_and_is_frozen() -> None:
    config = PGConfig()
    assert (config.num_workers, config.lr, config.train_batch_size, config.use_simple_optimizer) == (0, 4e-4, 200, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lr = 0.1  # type: ignore[misc]  # the point of the test
    assert dataclasses.replace(config, lr=0.1).lr == 0.1


@pytest.mark.parametrize("field, value, fix", [("train_batch_size", 0, "an int >= 1"), ("lr", 0.0, "> 0"),
                                               ("num_workers", -1, ">= 0"), ("gamma", 1.5, "[0, 1]")])
def test_config_validation_names_field_value_and_fix(field: str, value: Any, fix: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"{field}={value}")) as error:
        PGConfig(**{field: value})
    assert fix in str(error.value)


def test_registered_under_pg() -> None:
    assert get_algorithm("pg") is ALGORITHM
    assert (ALGORITHM.config_class, ALGORITHM.policy_class, ALGORITHM.plan) == (PGConfig, PGPolicy, plan)


# -- policy -----------------------------------------------------------------------------------------

def make_policy(**kwargs: Any) -> PGPolicy:
    return PGPolicy(gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2), PGConfig(seed=0, **kwargs))


def piece(rewards: list[float], terminated_last: bool, truncated_last: bool = False) -> SampleBatch:
    n = len(rewards)
    ends = np.zeros(n, bool)
    ends[-1] = True
    return SampleBatch({OBS: np.random.default_rng(n).uniform(-1, 1, (n, 4)).astype(np.float32),
                        ACTIONS: np.arange(n) % 2, REWARDS: np.asarray(rewards, np.float32),
                        TERMINATEDS: ends & terminated_last, TRUNCATEDS: ends & truncated_last})


@pytest.mark.parametrize("terminated, truncated", [(True, False), (False, True), (False, False)])
def test_postprocess_adds_discounted_returns_to_go(terminated: bool, truncated: bool) -> None:
    out = make_policy(gamma=0.9).postprocess_trajectory(piece([1.0, 2.0, 3.0], terminated, truncated))
    # REINFORCE has no critic: a terminated, truncated or cut episode all end at zero value
    np.testing.assert_allclose(out[RETURNS], [1 + 0.9 * 2 + 0.81 * 3, 2 + 0.9 * 3, 3.0], rtol=1e-6)
    assert out[RETURNS].dtype == np.float32


def test_loss_is_minus_mean_logp_times_return() -> None:
    policy = make_policy()
    batch = policy.postprocess_trajectory(piece([1.0, 0.0, 2.0, 1.0], terminated_last=True))
    tensors = policy.to_tensors(batch)
    loss, stats = policy.loss(tensors)
    logits = policy.model(tensors[OBS])[0]
    logp = torch.log_softmax(logits, -1).gather(1, tensors[ACTIONS].long()[:, None])[:, 0]
    torch.testing.assert_close(loss, -(logp * tensors[RETURNS]).mean())
    assert stats["entropy"] == pytest.approx(math.log(2), abs=1e-3)  # near-uniform initial policy


def test_a_step_raises_the_likelihood_of_well_rewarded_actions() -> None:
    policy = make_policy(lr=0.01)
    batch = SampleBatch({OBS: np.ones((8, 4), np.float32), ACTIONS: np.ones(8, np.int64),
                         REWARDS: np.ones(8, np.float32), TERMINATEDS: np.eye(8, dtype=bool)[7],
                         TRUNCATEDS: np.zeros(8, bool)})
    batch = policy.postprocess_trajectory(batch)
    before = policy.loss(policy.to_tensors(batch))[0].item()
    for _ in range(5):
        policy.learn_on_batch(batch)
    assert policy.loss(policy.to_tensors(batch))[0].item() < before


# -- plan -------------------------------------------------------------------------------------------

def test_plan_reads_like_the_figure_and_counts_steps() -> None:
    config = PGConfig(seed=0, train_batch_size=300, rollout_fragment_length=100, timesteps_per_iteration=0)
    workers = WorkerSet(policy_class=PGPolicy, config=config)
    results = plan(workers, config)
    assert repr(results) == ("LocalIterator[ParallelRollouts(bulk_sync).combine(ConcatBatches(300))"
                             ".for_each(TrainOneStep).filter(ReportGate(0 steps, 0 s)).for_each(CollectMetrics)]")
    first, second = next(results), next(results)
    assert (first["timesteps_total"], second["timesteps_total"], second["timesteps_this_iter"]) == (300, 600, 300)
    assert second["info"]["num_steps_trained"] == 600
    assert set(second["info"]["learner"]["default_policy"]["learner_stats"]) == {"loss", "entropy"}


def test_plan_uses_the_multi_device_learner_without_the_simple_optimizer() -> None:
    config = PGConfig(seed=0, num_gpus=2, fake_gpus=True, timesteps_per_iteration=0)
    assert not config.use_simple_optimizer
    results = plan(WorkerSet(policy_class=PGPolicy, config=config), config)
    assert ".for_each(MultiGPUTrainOneStep(2 fake cpu))." in repr(results)
    assert next(results)["info"]["num_steps_trained"] == 200


@pytest.mark.parametrize("name", ["pg", "a2c", "a3c"])
def test_plans_fit_on_one_screen(name: str) -> None:
    assert plan_code_lines(get_algorithm(name).plan) <= 25


def test_same_seed_gives_identical_results() -> None:
    config = PGConfig(seed=3, train_batch_size=500, num_envs_per_worker=2, rollout_fragment_length=50)
    runs = [[comparable(r) for r in first_results(PGPolicy, config, plan, 3)] for _ in range(2)]
    assert runs[0] == runs[1]
    other = [comparable(r) for r in first_results(PGPolicy, dataclasses.replace(config, seed=4), plan, 3)]
    assert other != runs[0]  # the seed matters


# -- learning ---------------------------------------------------------------------------------------

def test_pg_learns_cartpole_within_100k_steps() -> None:
    config = PGConfig(env="CartPole-v1", seed=0, timesteps_per_iteration=5000)  # RLlib's PG defaults otherwise
    result, seconds = train_until(PGPolicy, config, plan, target=150, max_steps=100_000)
    print(f"PG: return {result['episode_reward_mean']:.1f} after {result['timesteps_total']} steps, {seconds:.0f} s")
    assert result["episode_reward_mean"] >= 150
