"""`flowrl evaluate` beyond one single-agent policy: a multi-agent checkpoint's per-policy returns, --render (the
env's render_mode) and --video (gymnasium's RecordVideo: one video per evaluated episode), and the one-line errors
when an env cannot render so or MoviePy is missing."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from click.testing import CliRunner, Result
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from flowrl.algorithms.dqn import DQNConfig
from flowrl.algorithms.multiagent import DQN_POLICY, PPO_POLICY, MultiAgentConfig
from flowrl.algorithms.pg import PGConfig
from flowrl.cli import main
from flowrl.evaluation import evaluate_checkpoint
from flowrl.trainer import Trainer

UNRENDERED = "FlowrlTest/UnrenderedCartPole-v0"


class UnrenderedCartPole(CartPoleEnv):
    """CartPole that offers no render mode (with rgb_array, gymnasium would show it on screen too)."""

    metadata = {"render_modes": [], "render_fps": 50}


if UNRENDERED not in gym.registry:
    gym.register(UNRENDERED, entry_point=lambda **kwargs: UnrenderedCartPole(**kwargs), max_episode_steps=30)


def invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def checkpoint(directory: Path, algorithm: str, config: Any) -> Path:
    trainer = Trainer(algorithm, config)
    try:
        return trainer.save(directory)
    finally:
        trainer.stop()


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoint(tmp_path_factory.mktemp("evaluate"), "pg", PGConfig(num_workers=0, seed=0))


@pytest.fixture(scope="module")
def unrendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoint(tmp_path_factory.mktemp("evaluate"), "pg", PGConfig(env=UNRENDERED, num_workers=0, seed=0))


def test_a_multi_agent_checkpoint_reports_every_policy(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, "multiagent", MultiAgentConfig(seed=0, dqn=DQNConfig(learning_starts=100)))
    result = invoke("evaluate", tmp_path, "--episodes", 3)
    assert result.exit_code == 0, result.output
    direct = evaluate_checkpoint(path, episodes=3)
    assert sorted(direct.policy_returns) == [DQN_POLICY, PPO_POLICY]
    assert f"3 episodes (greedy): mean return {direct.mean:.2f}" in result.output
    for pid, returns in direct.policy_returns.items():
        assert re.search(rf"^  {pid} +mean return {np.mean(returns):.2f} \(min {min(returns):.2f}, "
                         rf"max {max(returns):.2f}\) over 3 episodes$", result.output, re.MULTILINE), result.output
    # four agents, alternately PPO's and DQN's: an episode's return is both pairs' returns
    combined = 2 * np.array(direct.policy_returns[PPO_POLICY]) + 2 * np.array(direct.policy_returns[DQN_POLICY])
    np.testing.assert_allclose(direct.returns, combined)
    result = invoke("evaluate", tmp_path, "--render")
    assert result.exit_code == 2 and "multi-agent envs do not render" in result.output, result.output


def test_render_shows_the_env_in_human_mode(cartpole: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    modes: list[str | None] = []
    monkeypatch.setattr(CartPoleEnv, "render", lambda self: modes.append(self.render_mode))
    result = invoke("evaluate", cartpole, "--episodes", 2, "--render")
    assert result.exit_code == 0, result.output
    lengths = evaluate_checkpoint(cartpole, episodes=2, render=True).lengths
    assert len(modes) == 2 * (sum(lengths) + 3)  # both runs: every step and reset (the last autoreset too)
    assert set(modes) == {"human"}


def test_an_env_that_cannot_render_so_is_one_line(unrendered: Path, tmp_path: Path) -> None:
    for option, mode in (("--render", "human"), ("--video", "rgb_array")):
        result = invoke("evaluate", unrendered, option, *([tmp_path / "videos"] if option == "--video" else []))
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert (f"Invalid value for '{option}': env {UNRENDERED} cannot render in '{mode}' mode (its render "
                f"modes: [])") in result.output
    result = invoke("evaluate", unrendered, "--render", "--video", tmp_path / "videos")
    assert result.exit_code == 2 and "give --render or --video, not both" in result.output


class FakeClip:
    """MoviePy's ImageSequenceClip as RecordVideo uses it, writing the frames with numpy instead of encoding."""

    def __init__(self, frames: list[np.ndarray], fps: int) -> None:
        self.frames, self.fps = frames, fps

    def write_videofile(self, path: str, logger: Any = None) -> None:
        with open(path, "wb") as f:
            np.save(f, np.stack(self.frames))


def test_video_records_each_evaluated_episode(cartpole: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # MoviePy is an optional extra: a stand-in for its encoder; gymnasium's RecordVideo and the env rendering are real
    clip_module = types.ModuleType("moviepy.video.io.ImageSequenceClip")
    clip_module.ImageSequenceClip = FakeClip  # type: ignore[attr-defined]
    for name in ("moviepy", "moviepy.video", "moviepy.video.io"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "moviepy.video.io.ImageSequenceClip", clip_module)
    videos = tmp_path / "videos"
    result = invoke("evaluate", cartpole, "--episodes", 3, "--video", videos)
    assert result.exit_code == 0, result.output
    assert f"videos: {videos}" in result.output
    lengths = evaluate_checkpoint(cartpole, episodes=3, video_dir=tmp_path / "again").lengths
    assert sorted(p.name for p in videos.iterdir()) == [f"rl-video-episode-{i}.mp4" for i in range(3)]
    for i, length in enumerate(lengths):
        frames = np.load(videos / f"rl-video-episode-{i}.mp4")
        assert frames.shape == (length + 1, 400, 600, 3) and frames.dtype == np.uint8  # the reset frame, each step


def test_video_without_moviepy_is_one_line(cartpole: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "moviepy", None)  # `import moviepy` raises ImportError
    result = invoke("evaluate", cartpole, "--video", tmp_path / "videos")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.output == ("Error: recording videos needs moviepy (gymnasium's RecordVideo writes them with it); "
                             'install it with: pip install "flowrl[video]"\n')
