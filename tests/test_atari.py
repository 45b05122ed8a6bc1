"""Atari through ale-py with the papers' preprocessing (flowrl.envs.atari): the frames the agent sees, a lost life
ending the learning episode but not the game's statistics, the env config's errors, and every discrete-action
algorithm running on Pong with one worker."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

from flowrl.algorithms import get_algorithm
from flowrl.config import ModelConfig
from flowrl.envs import GAME_CONTINUES, EnvContext, VectorEnv, make_env
from flowrl.trainer import Trainer

pytestmark = pytest.mark.usefixtures("local_executor")  # what is computed, not Ray: see conftest.py

PONG, BREAKOUT = "ALE/Pong-v5", "ALE/Breakout-v5"


def test_an_ale_id_gives_84x84_grey_uint8_frames_stacked_last_newest_last() -> None:
    stacked = make_env(PONG, EnvContext(seed=3))
    single = make_env(PONG, EnvContext(seed=3, config={"frame_stack": 1}))
    assert stacked.observation_space.shape == (84, 84, 4) and stacked.observation_space.dtype == np.uint8
    assert single.observation_space.shape == (84, 84, 1)
    obs, _ = stacked.reset(seed=3)
    frame, _ = single.reset(seed=3)
    assert obs.dtype == np.uint8 and obs.shape == (84, 84, 4)
    frames = [frame[..., 0]]
    for action in [2, 3, 2, 2, 3, 0, 1, 2]:  # both envs draw the same sticky-action coins from the same seed
        obs, *_ = stacked.step(action)
        frame, *_ = single.step(action)
        frames.append(frame[..., 0])
        np.testing.assert_array_equal(obs[..., -1], frame[..., 0])
    np.testing.assert_array_equal(np.moveaxis(obs, -1, 0), np.stack(frames[-4:]))  # oldest first
    assert make_env(PONG, EnvContext(config={"preprocess": False})).observation_space.shape == (210, 160, 3)


@pytest.mark.parametrize("backend", ["loop", "gymnasium"])
def test_a_lost_life_ends_the_learning_episode_and_the_statistics_count_the_whole_game(backend: str) -> None:
    env = VectorEnv(BREAKOUT, 2, seed=0, backend=backend)  # the gymnasium backend: SyncVectorEnv's final_info
    env.reset()
    rng = np.random.default_rng(0)
    rewards, terminations, games = np.zeros(2), np.zeros(2, dtype=int), []
    while len(games) < 6:
        step = env.step(rng.integers(0, 4, size=2))
        rewards += step.rewards
        terminations += step.terminateds
        for record in step.episodes:
            i = record.env_index
            games.append((record.episode_return, rewards[i], terminations[i]))
            rewards[i], terminations[i] = 0.0, 0
    for game_return, summed, lives_lost in games:
        assert game_return == summed
        assert lives_lost == 5  # Breakout's five lives, each ending a learning episode
    env.close()


def test_life_loss_is_marked_and_the_next_reset_goes_on_with_the_same_game() -> None:
    env = make_env(BREAKOUT, EnvContext(seed=1))
    env.reset(seed=1)
    ale = env.unwrapped.ale
    rng = np.random.default_rng(1)
    while True:
        _, _, terminated, truncated, info = env.step(int(rng.integers(0, 4)))
        if terminated:
            break
    assert info.get(GAME_CONTINUES) is True and ale.lives() == 4
    env.reset()
    assert ale.lives() == 4  # not a new game
    off = make_env(BREAKOUT, EnvContext(seed=1, config={"terminal_on_life_loss": False}))
    off.reset(seed=1)
    for _ in range(400):
        _, _, terminated, _, info = off.step(int(rng.integers(0, 4)))
        assert GAME_CONTINUES not in info
        if terminated:
            assert off.unwrapped.ale.lives() == 0
            break


@pytest.mark.parametrize("config, message", [
    ({"frame_stack": 0}, "frame_stack=0 must be an int >= 1"),
    ({"noop_max": -1}, "noop_max=-1 must be an int >= 0"),
    ({"screen_size": 84.0}, "screen_size=84.0 must be an int >= 8"),
    ({"grayscale": "yes"}, "grayscale='yes' must be true or false"),
    ({"frameskip": 4}, "frameskip=4 would skip frames twice"),
    ({"obs_type": "ram"}, "obs_type='ram' is set by the preprocessing"),
    ({"preprocess": False, "frame_stack": 4}, "frame_stack shape the preprocessing, which preprocess=false turns off"),
])
def test_a_bad_preprocessing_key_names_itself(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_env(PONG, EnvContext(config=config))


def test_missing_opencv_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cv2", None)  # import cv2 raises ImportError
    with pytest.raises(ValueError, match=r"pip install 'flowrl\[atari\]'"):
        make_env(PONG, EnvContext())
    assert make_env(PONG, EnvContext(config={"preprocess": False})).observation_space.shape == (210, 160, 3)


# each discrete-action algorithm at a size that runs 2 reports on Pong's 84x84x4 frames (the Nature CNN) in seconds
ON_ATARI: dict[str, dict[str, Any]] = {
    "pg": {"train_batch_size": 64},
    "a2c": {"train_batch_size": 64, "rollout_fragment_length": 32},
    "a3c": {"rollout_fragment_length": 32},
    "ppo": {"train_batch_size": 64, "sgd_minibatch_size": 32, "num_sgd_iter": 1},
    "impala": {"rollout_fragment_length": 32, "train_batch_size": 64},
    "appo": {"rollout_fragment_length": 32, "train_batch_size": 64},
    "dqn": {"learning_starts": 64, "rollout_fragment_length": 16, "train_batch_size": 16,
            "timesteps_per_iteration": 64},
    "apex": {"learning_starts": 64, "rollout_fragment_length": 16, "train_batch_size": 16,
             "timesteps_per_iteration": 64},
    "r2d2": {"learning_starts": 64, "rollout_fragment_length": 16, "train_batch_size": 4,
             "timesteps_per_iteration": 64},
}


@pytest.mark.parametrize("name", sorted(ON_ATARI))
def test_every_discrete_action_algorithm_trains_on_pong_with_one_worker(name: str) -> None:
    algorithm = get_algorithm(name)
    model = ModelConfig(hidden_sizes=(32,))
    if name == "r2d2":
        model = ModelConfig(hidden_sizes=(32,), use_lstm=True, lstm_cell_size=16, max_seq_len=4)
    config = algorithm.config_class(env=PONG, seed=0, num_workers=1, clip_rewards=1.0, model=model, **ON_ATARI[name])
    trainer = Trainer(name, config)
    try:
        results = [trainer.train() for _ in range(2)]
    finally:
        trainer.stop()
    assert results[-1]["timesteps_total"] > results[0]["timesteps_total"] > 0
    assert results[-1]["info"]["num_steps_trained"] > 0, results[-1]["info"]


@pytest.mark.parametrize("model, env_config, message", [
    (ModelConfig(conv_filters=()), {}, r"model.conv_filters=\(\) would flatten the 84x84x4 frames \(28224 inputs\)"),
    (ModelConfig(conv_filters=((32, 8, 4), (64, 4, 2), (64, 3, 1))), {"screen_size": 24},
     r"shrink an image of shape \(24, 24, 4\) .* to nothing"),
    (ModelConfig(), {"frame_stack": 1, "screen_size": 84}, None),
])
def test_a_model_that_does_not_fit_the_frames_fails_when_the_trainer_is_built(
        model: ModelConfig, env_config: dict[str, Any], message: str | None) -> None:
    config = get_algorithm("ppo").config_class(env=PONG, num_workers=0, model=model, env_config=env_config,
                                               train_batch_size=64, sgd_minibatch_size=32)
    if message is None:  # a single 84x84x1 frame fits the Nature CNN
        Trainer("ppo", config).stop()
        return
    with pytest.raises(ValueError, match=message):
        Trainer("ppo", config)


def test_the_nature_cnn_policys_worker_and_learner_compute_the_same_logits_on_pong_frames() -> None:
    import dataclasses

    import torch

    from flowrl.algorithms.impala import IMPALAPolicy
    from flowrl.sample_batch import ACTION_DIST_INPUTS
    from flowrl.workers import RolloutWorker

    config = get_algorithm("impala").config_class(env=PONG, seed=0, num_workers=0, num_envs_per_worker=2,
                                                  rollout_fragment_length=10, model=ModelConfig(hidden_sizes=(32,)))
    worker = RolloutWorker(policy_class=IMPALAPolicy, config=config)
    try:
        learner = IMPALAPolicy(worker.env.observation_space, worker.env.action_space,
                               dataclasses.replace(config, seed=7))
        worker.set_weights({"default_policy": learner.get_weights()})  # as a broadcast sends them
        batch = worker.sample()
        assert batch["obs"].dtype == np.uint8
        logits, _ = learner.model(torch.as_tensor(batch["obs"]))
        assert np.allclose(logits.detach().numpy(), batch[ACTION_DIST_INPUTS], atol=1e-5)
    finally:
        worker.env.close()
