"""NaN or inf never trains into the weights: a rollout worker refuses non-finite env output (naming the env, the
episode, the step and the field), and every learner path skips (and counts) or refuses an update whose gradient is
not finite."""

from __future__ import annotations

import logging
from typing import Any, SupportsFloat

import gymnasium
import numpy as np
import pytest

from flowrl.algorithms import ALGORITHMS, get_algorithm
from flowrl.envs import EnvContext
from flowrl.metrics import MetricsContext
from flowrl.ops import MultiGPUTrainOneStep
from flowrl.policy import NONFINITE_UPDATES_SKIPPED
from flowrl.sample_batch import NEXT_OBS, OBS, REWARDS, SampleBatch
from flowrl.testing import TinyPGPolicy
from flowrl.trainer import Trainer
from flowrl.workers import RolloutConfig, RolloutWorker, WorkerSet


class NonFiniteAt(gymnasium.Wrapper[Any, Any, Any, Any]):
    """CartPole that returns ``value`` as its reward or observation at step ``step`` of every episode."""

    def __init__(self, env: gymnasium.Env[Any, Any], *, field: str, step: int, value: float) -> None:
        super().__init__(env)
        self.field, self.at, self.value, self.t = field, step, value, 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.t = 0
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.t == self.at:
            if self.field == "reward":
                reward = self.value
            else:
                obs = np.full_like(obs, self.value)
        self.t += 1
        return obs, reward, terminated, truncated, info


def nan_reward_env(ctx: EnvContext) -> gymnasium.Env[Any, Any]:
    return NonFiniteAt(gymnasium.make("CartPole-v1"), field="reward", step=5, value=float("nan"))


def inf_obs_env(ctx: EnvContext) -> gymnasium.Env[Any, Any]:
    return NonFiniteAt(gymnasium.make("CartPole-v1"), field="obs", step=3, value=float("inf"))


def worker(env: Any, **config: Any) -> RolloutWorker:
    cfg = RolloutConfig(env=env, num_envs_per_worker=2, rollout_fragment_length=16, seed=0, vector_backend="loop",
                        **config)
    return RolloutWorker(policy_class=TinyPGPolicy, config=cfg)


def test_a_nan_reward_is_refused_naming_env_episode_step_and_field() -> None:
    with pytest.raises(ValueError) as err:
        worker(nan_reward_env).sample()
    message = str(err.value)
    assert message.startswith("env nan_reward_env returned a non-finite reward (nan) at step 5 of episode 0 "
                              "(worker 0, env 0)"), message
    assert "\n" not in message


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # acting on the inf obs, before the check
def test_an_infinite_observation_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"^env inf_obs_env returned a non-finite observation \(\[inf, inf, inf, "
                                         r"inf\]\) at step 3 of episode 0 \(worker 0, env 0\)"):
        worker(inf_obs_env).sample()


def test_finite_fragments_pass_and_a_fragment_before_the_bad_step_is_kept() -> None:
    w = RolloutWorker(policy_class=TinyPGPolicy, config=RolloutConfig(
        env=nan_reward_env, num_envs_per_worker=1, rollout_fragment_length=5, seed=0, vector_backend="loop"))
    first = w.sample()  # steps 0..4: all finite
    assert np.isfinite(first[REWARDS]).all() and first.count == 5
    with pytest.raises(ValueError, match="non-finite reward"):
        w.sample()


def test_a_trainer_on_a_nan_env_stops_with_the_envs_error_and_finite_weights() -> None:
    config = get_algorithm("pg").config_class(env=nan_reward_env, num_workers=0, rollout_fragment_length=16,
                                              train_batch_size=16, seed=0, vector_backend="loop")
    trainer = Trainer(get_algorithm("pg"), config)
    try:
        with pytest.raises(ValueError, match="non-finite reward"):
            trainer.train()
        weights = trainer.workers.local_worker().get_weights()["default_policy"]
        assert all(np.isfinite(w).all() for w in weights.values())
    finally:
        trainer.stop()


def test_a_remote_worker_reports_the_env_error_to_the_driver() -> None:
    import ray

    cfg = RolloutConfig(env=nan_reward_env, num_workers=1, rollout_fragment_length=16, seed=0, vector_backend="loop",
                        num_cpus_per_worker=0)
    workers = WorkerSet(policy_class=TinyPGPolicy, config=cfg)
    try:
        with pytest.raises(ray.exceptions.RayTaskError, match=r"non-finite reward \(nan\) at step 5 of episode "
                                                              r"1000000000 \(worker 1, env 0\)"):
            ray.get(workers.remote_workers()[0].sample.remote())
    finally:
        workers.stop()


# -- learners ---------------------------------------------------------------------------------------------------

# every registered learner but A3C (its workers compute gradients: the compute/apply gradients test below) and the
# two-policy composition (multiagent: its policies are PPO's and DQN's, covered here)
# ES and ARS learn from returns, not batches, and MAML and DD-PPO need remote workers: tests/algorithms/test_evolution.py,
# tests/algorithms/test_maml.py and tests/algorithms/test_ddppo.py check that they skip a NaN update
ALGOS = [name for name in ALGORITHMS if name not in ("a3c", "multiagent", "es", "ars", "maml", "ddppo")]


def poisoned(name: str, **overrides: Any) -> tuple[WorkerSet, SampleBatch]:
    """A worker set (local worker only) of the algorithm's policy and one of its batches with a NaN observation."""
    algorithm = get_algorithm(name)
    if name == "ppo":
        overrides = {"sgd_minibatch_size": 32, **overrides}
    settings = {"num_workers": 0, "rollout_fragment_length": 16, "num_envs_per_worker": 2, "train_batch_size": 32,
                "seed": 0, "vector_backend": "loop", **overrides}
    if name == "r2d2":  # its sequences form within a fragment: one at least model.max_seq_len (20) long
        settings["rollout_fragment_length"] = 20
    config = algorithm.config_class(**settings)
    workers = WorkerSet(policy_class=algorithm.policy_class, config=config)
    batch = workers.local_worker().sample()
    assert isinstance(batch, SampleBatch)
    batch = SampleBatch({k: np.array(v) for k, v in batch.items()})
    batch[OBS][3] = np.nan
    if NEXT_OBS in batch:
        batch[NEXT_OBS][3] = np.nan
    return workers, batch


def weights_of(w: RolloutWorker) -> dict[str, np.ndarray]:
    return w.get_weights()["default_policy"]


def assert_unchanged(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> None:
    assert before.keys() == after.keys()
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])


@pytest.mark.parametrize("name", ALGOS)
def test_every_learner_skips_and_counts_a_nan_update(name: str, caplog: pytest.LogCaptureFixture) -> None:
    workers, batch = poisoned(name)
    w = workers.local_worker()
    policy = w.get_policy()
    before, version = weights_of(w), policy.weights_version
    with caplog.at_level(logging.WARNING, logger="flowrl.policy"):
        info = w.learn_on_batch(batch)["default_policy"]
        w.learn_on_batch(batch)
    assert_unchanged(before, weights_of(w))
    assert policy.weights_version == version and policy.num_nonfinite_updates_skipped == 2
    assert info["learner_stats"][NONFINITE_UPDATES_SKIPPED] == 1
    warned = [r for r in caplog.records if "holds NaN or inf" in r.getMessage()]
    assert len(warned) == 1  # once, not per update
    if "td_error" in info:  # replay priorities stay finite
        assert np.isfinite(info["td_error"]).all()
    clean = SampleBatch({k: np.nan_to_num(v) if v.dtype.kind == "f" else v for k, v in batch.items()})
    w.learn_on_batch(clean)  # a finite batch trains as before
    assert policy.weights_version == version + 1
    assert any(not np.array_equal(before[k], v) for k, v in weights_of(w).items())


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_on_nonfinite_update_raise_refuses_it_and_keeps_the_weights(name: str) -> None:
    workers, batch = poisoned(name, on_nonfinite_update="raise")
    w = workers.local_worker()
    before = weights_of(w)
    with pytest.raises(FloatingPointError, match="a gradient holds NaN or inf .* the update was not applied"):
        w.learn_on_batch(batch)
    assert_unchanged(before, weights_of(w))


def test_the_a3c_path_never_applies_a_nan_gradient() -> None:
    workers, batch = poisoned("a2c")
    w = workers.local_worker()
    grads, _ = w.compute_gradients(batch)
    before = weights_of(w)
    w.apply_gradients(grads)
    assert_unchanged(before, weights_of(w))
    assert w.get_policy().num_nonfinite_updates_skipped == 1


@pytest.mark.parametrize("fake_gpus", [1, 2])
def test_the_multi_device_learner_skips_a_nan_minibatch_and_reports_the_count(fake_gpus: int) -> None:
    workers, batch = poisoned("ppo", num_sgd_iter=2)
    w = workers.local_worker()
    op = MultiGPUTrainOneStep(workers, sgd_minibatch_size=32, num_sgd_iter=2, num_gpus=fake_gpus, fake_gpus=True)
    op.bind(MetricsContext())
    before = weights_of(w)
    _, info = op(batch)
    assert_unchanged(before, weights_of(w))
    assert info["default_policy"]["learner_stats"][NONFINITE_UPDATES_SKIPPED] == 2  # the running count, not a mean


def test_on_nonfinite_update_is_validated() -> None:
    with pytest.raises(ValueError, match=r"on_nonfinite_update='ignore'; use 'skip'"):
        get_algorithm("ppo").config_class(num_workers=0, on_nonfinite_update="ignore")  # type: ignore[arg-type]


def test_a_finite_gradient_whose_norm_overflows_is_still_applied() -> None:
    import gymnasium as gym
    import torch

    policy = TinyPGPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2),
                          get_algorithm("pg").config_class(num_workers=0, seed=0))
    params = list(policy.model.parameters())
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.full_like(p, 1e19)  # finite, but the sum of their squares overflows float32
    policy.optimizer_step()
    assert policy.num_nonfinite_updates_skipped == 0 and policy.weights_version == 1
    assert any(not torch.equal(b, p) for b, p in zip(before, params))
    params[0].grad = torch.full_like(params[0], float("nan"))
    policy.optimizer_step()
    assert policy.num_nonfinite_updates_skipped == 1 and policy.weights_version == 1
