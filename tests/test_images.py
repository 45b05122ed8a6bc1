"""Image observations (MinAtar, the quick image suite): the encoder picked from the frame size, frames kept in their
own dtype through workers, Ray and replay, every discrete-action algorithm running on them, and a short learning
check."""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

from flowrl import executor
from flowrl.algorithms import get_algorithm
from flowrl.config import ModelConfig
from flowrl.envs import EnvContext, make_env
from flowrl.models import MINATAR_CNN, NATURE_CNN, make_model
from flowrl.trainer import Trainer
from flowrl.workers import RolloutConfig, RolloutWorker

pytestmark = pytest.mark.usefixtures("local_executor")  # what is computed, not Ray: see conftest.py

BREAKOUT = "MinAtar/Breakout-v1"


def test_a_minatar_id_works_as_it_is_with_boolean_hwc_frames() -> None:
    env = make_env(BREAKOUT, EnvContext(seed=0))
    obs, _ = env.reset(seed=0)
    assert env.observation_space.shape == (10, 10, 4) and obs.dtype == np.bool_ and obs.shape == (10, 10, 4)
    assert env.action_space == gymnasium.spaces.Discrete(3)


def _conv_layers(model: torch.nn.Module) -> list[tuple[int, int, int]]:
    return [(m.out_channels, m.kernel_size[0], m.stride[0]) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]


def test_the_encoder_is_picked_by_the_frame_size_unless_the_config_names_one() -> None:
    actions = gymnasium.spaces.Discrete(3)
    minatar = gymnasium.spaces.Box(0, 1, (10, 10, 4), dtype=bool)
    atari = gymnasium.spaces.Box(0, 255, (84, 84, 4), dtype=np.uint8)
    assert _conv_layers(make_model(minatar, actions, ModelConfig())) == list(MINATAR_CNN)
    assert _conv_layers(make_model(atari, actions, ModelConfig())) == list(NATURE_CNN)
    assert _conv_layers(make_model(atari, actions, ModelConfig(conv_filters=((8, 4, 4),)))) == [(8, 4, 4)]
    with pytest.raises(ValueError, match=r"shrink an image of shape \(10, 10, 4\) \(height, width, channels\) to "
                                         r"nothing; set model.conv_filters to smaller kernels"):
        make_model(minatar, actions, ModelConfig(conv_filters=NATURE_CNN))
    with pytest.raises(ValueError, match=r"observation shape \(4, 84, 84\) looks channels-first .* move the frames "
                                         r"last .* a \(84, 84, 4\) Box"):
        make_model(gymnasium.spaces.Box(0, 255, (4, 84, 84), dtype=np.uint8), actions, ModelConfig())


def test_uint8_frames_are_scaled_on_the_model_and_bool_frames_read_as_0_or_1() -> None:
    actions = gymnasium.spaces.Discrete(2)
    atari = make_model(gymnasium.spaces.Box(0, 255, (36, 36, 1), dtype=np.uint8), actions, ModelConfig(hidden_sizes=(4,)))
    frames = torch.randint(0, 256, (2, 36, 36, 1), dtype=torch.uint8)
    scaled = atari.encoder.net((frames.float() / 255).permute(0, 3, 1, 2))  # type: ignore[operator]
    assert torch.allclose(atari.encoder(frames), scaled, atol=1e-6)  # uint8 in, 0..1 inside, channels first
    minatar = make_model(gymnasium.spaces.Box(0, 1, (10, 10, 2), dtype=bool), actions, ModelConfig(hidden_sizes=(4,)))
    grid = torch.rand((2, 10, 10, 2)) > 0.7
    assert torch.allclose(minatar(grid)[0], minatar(grid.float())[0])


def test_frames_keep_their_dtype_and_bytes_through_a_worker_and_ray() -> None:
    config = RolloutConfig(env=BREAKOUT, seed=0, num_envs_per_worker=2, rollout_fragment_length=25)
    from flowrl.testing import TinyPGPolicy

    worker = RolloutWorker(policy_class=TinyPGPolicy, config=dataclasses.replace(
        config, model=ModelConfig(hidden_sizes=(16,))))
    batch = worker.sample()
    assert batch["obs"].dtype == np.bool_ and batch["obs"].shape == (50, 10, 10, 4)
    assert batch["obs"].nbytes == 50 * 10 * 10 * 4  # one byte a cell: no float copy
    worker.env.close()


def _sampled_on_ray(env: Any) -> Any:
    """One 20-step batch that a remote worker (a Ray actor) sampled from ``env``, as it arrives in the driver."""
    from flowrl.testing import TinyPGPolicy

    config = RolloutConfig(env=env, seed=0, num_envs_per_worker=1, rollout_fragment_length=20,
                           model=ModelConfig(hidden_sizes=(8,)), num_cpus_per_worker=0)
    remote = executor.create_actor(RolloutWorker, options={"num_cpus": 0}, policy_class=TinyPGPolicy, config=config)
    try:
        return executor.get(remote.sample.remote())
    finally:
        executor.kill(remote)


@pytest.mark.on_ray
def test_frames_cross_ray_in_their_dtype() -> None:
    batch = _sampled_on_ray(BREAKOUT)
    assert batch["obs"].dtype == np.bool_ and batch["obs"].nbytes == 20 * 10 * 10 * 4


def test_replay_keeps_the_frames_dtype() -> None:
    config = get_algorithm("dqn").config_class(env=BREAKOUT, seed=0, num_workers=0, learning_starts=50,
                                               rollout_fragment_length=25, train_batch_size=32,
                                               timesteps_per_iteration=100, model=ModelConfig(hidden_sizes=(16,)))
    trainer = Trainer("dqn", config)
    try:
        trainer.train()
        replayed = trainer.owned_state["replay_buffer"].replay()
        assert replayed is not None
        batch = replayed.policy_batches["default_policy"]
        assert batch["obs"].dtype == np.bool_ and batch["new_obs"].dtype == np.bool_
        assert batch["obs"].nbytes == batch.count * 10 * 10 * 4
    finally:
        trainer.stop()


SMALL_MODEL = ModelConfig(hidden_sizes=(16,))
# each discrete-action algorithm at a size that runs 2 reports in about a second on MinAtar frames
ON_IMAGES: dict[str, dict[str, Any]] = {
    "pg": {"train_batch_size": 100},
    "a2c": {"train_batch_size": 100, "rollout_fragment_length": 50},
    "a3c": {"num_workers": 1, "rollout_fragment_length": 50},
    "ppo": {"train_batch_size": 100, "sgd_minibatch_size": 50, "num_sgd_iter": 2},
    "impala": {"num_workers": 1, "rollout_fragment_length": 50, "train_batch_size": 100},
    "appo": {"num_workers": 1, "rollout_fragment_length": 50, "train_batch_size": 100},
    "dqn": {"learning_starts": 100, "rollout_fragment_length": 25, "train_batch_size": 32,
            "timesteps_per_iteration": 100},
    "apex": {"num_workers": 1, "learning_starts": 100, "rollout_fragment_length": 25, "train_batch_size": 32,
             "timesteps_per_iteration": 100},
    "r2d2": {"num_workers": 1, "learning_starts": 100, "rollout_fragment_length": 25, "train_batch_size": 8,
             "timesteps_per_iteration": 100},
}


@pytest.mark.parametrize("name", sorted(ON_IMAGES))
def test_every_discrete_action_algorithm_trains_on_minatar_frames(name: str) -> None:
    algorithm = get_algorithm(name)
    fields = {"env": BREAKOUT, "seed": 0, "num_workers": 0, "model": SMALL_MODEL, **ON_IMAGES[name]}
    if name == "r2d2":
        fields["model"] = dataclasses.replace(SMALL_MODEL, use_lstm=True, lstm_cell_size=16, max_seq_len=5)
    trainer = Trainer(name, algorithm.config_class(**fields))
    try:
        results = [trainer.train() for _ in range(2)]
    finally:
        trainer.stop()
    assert results[-1]["timesteps_total"] > results[0]["timesteps_total"] > 0
    assert results[-1]["info"]["num_steps_trained"] > 0, results[-1]["info"]


RANDOM_BREAKOUT_RETURN = 0.5  # a uniformly random policy, 30 episodes of MinAtar/Breakout-v1 (std 0.56)


@pytest.mark.parametrize("seed", [0, 1])
def test_ppo_learns_minatar_breakout_to_three_times_the_random_return(seed: int) -> None:
    # measured: each of seeds 0-3 passes 1.5 at 22k env steps (about 2 s here); the bound is 100k
    config = get_algorithm("ppo").config_class(
        env=BREAKOUT, seed=seed, num_workers=0, num_envs_per_worker=8, train_batch_size=2000, sgd_minibatch_size=250,
        num_sgd_iter=4, lr=1e-3, entropy_coeff=0.01, model=ModelConfig(hidden_sizes=(64,)))
    trainer = Trainer("ppo", config)
    try:
        result = trainer.train()
        while result["episode_reward_mean"] < 3 * RANDOM_BREAKOUT_RETURN and result["timesteps_total"] < 100_000:
            result = trainer.train()
    finally:
        trainer.stop()
    assert result["episode_reward_mean"] >= 3 * RANDOM_BREAKOUT_RETURN, result["timesteps_total"]


def test_a_cnn_policys_worker_and_learner_compute_the_same_logits() -> None:
    from flowrl.algorithms.ppo import PPOPolicy
    from flowrl.sample_batch import ACTION_DIST_INPUTS

    config = get_algorithm("ppo").config_class(env=BREAKOUT, seed=0, num_workers=0, num_envs_per_worker=2,
                                               rollout_fragment_length=20, model=ModelConfig(hidden_sizes=(16,)))
    worker = RolloutWorker(policy_class=PPOPolicy, config=config)
    try:
        learner = PPOPolicy(worker.env.observation_space, worker.env.action_space, dataclasses.replace(config, seed=7))
        worker.set_weights({"default_policy": learner.get_weights()})  # as a sync sends them
        batch = worker.sample()
        logits, _ = learner.model(torch.as_tensor(batch["obs"]))
        assert np.allclose(logits.detach().numpy(), batch[ACTION_DIST_INPUTS], atol=1e-5)
    finally:
        worker.env.close()


class _Frames(gymnasium.Env[np.ndarray, int]):
    """uint8 frames of 36x36x2 (the Nature CNN's smallest size), random, 20 steps an episode."""

    observation_space = gymnasium.spaces.Box(0, 255, (36, 36, 2), dtype=np.uint8)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.integers(0, 256, (36, 36, 2), dtype=np.uint8), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return (self.np_random.integers(0, 256, (36, 36, 2), dtype=np.uint8), float(action), self.t >= 20, False, {})


def _frames(ctx: EnvContext) -> gymnasium.Env[np.ndarray, int]:
    return _Frames()


@pytest.mark.on_ray
def test_uint8_frames_keep_their_dtype_and_bytes_through_ray_and_replay() -> None:
    batch = _sampled_on_ray(_frames)
    assert batch["obs"].dtype == np.uint8 and batch["obs"].nbytes == 20 * 36 * 36 * 2  # no float copy on the wire
    dqn = get_algorithm("dqn").config_class(env=_frames, seed=0, num_workers=1, num_cpus_per_worker=0,
                                            learning_starts=40, rollout_fragment_length=20, train_batch_size=16,
                                            timesteps_per_iteration=40, model=ModelConfig(hidden_sizes=(8,)))
    trainer = Trainer("dqn", dqn)
    try:
        trainer.train()
        replayed = trainer.owned_state["replay_buffer"].replay()
        rows = replayed.policy_batches["default_policy"]
        assert rows["obs"].dtype == np.uint8 and rows["new_obs"].dtype == np.uint8
        assert rows["obs"].nbytes == rows.count * 36 * 36 * 2
    finally:
        trainer.stop()
