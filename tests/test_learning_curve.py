"""The learning curve (flowrl.logger.learning_curve / plot_progress): the target return, each policy's return in a
multi-agent run, and the legend outside the axes."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from flowrl.cli import main
from flowrl.logger import RunLogger, learning_curve, record_target


def write_run(run_dir: Path, policies: dict[str, float] | None = None) -> None:
    with RunLogger(run_dir, tensorboard=False) as logs:
        for i in range(1, 4):
            result = {"timesteps_total": 100 * i, "episode_reward_mean": 10.0 * i, "episode_reward_min": 5.0 * i,
                      "episode_reward_max": 20.0 * i}
            if policies is not None:
                result["policy_reward_mean"] = {pid: scale * i for pid, scale in policies.items()}
            logs.log(result)


def labels(fig: object) -> list[str]:
    return [line.get_label() for line in fig.axes[0].get_lines()]  # type: ignore[attr-defined]


def test_the_target_return_is_a_horizontal_line_given_or_recorded(tmp_path: Path) -> None:
    write_run(tmp_path)
    assert labels(learning_curve(tmp_path)) == ["episode_reward_mean"]
    line = learning_curve(tmp_path, target=25).axes[0].get_lines()[-1]
    assert line.get_label() == "target return 25" and list(line.get_ydata()) == [25, 25]
    record_target(tmp_path, 450.0)  # as `flowrl train --stop-reward 450` does
    record_target(tmp_path, None)  # a resume without --stop-reward keeps it
    assert labels(learning_curve(tmp_path)) == ["episode_reward_mean", "target return 450"]
    assert labels(learning_curve(tmp_path, target=300)) == ["episode_reward_mean", "target return 300"]
    out = tmp_path / "curve.png"
    assert CliRunner().invoke(main, ["plot", str(tmp_path), "--out", str(out), "--target", "200"]).exit_code == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_a_multi_agent_run_draws_each_policys_return(tmp_path: Path) -> None:
    write_run(tmp_path, {"ppo_policy": 4.0, "dqn_policy": 6.0})
    fig = learning_curve(tmp_path)
    assert labels(fig) == ["episode_reward_mean", "policy_reward_mean/ppo_policy", "policy_reward_mean/dqn_policy"]
    assert list(fig.axes[0].get_lines()[2].get_ydata()) == [6.0, 12.0, 18.0]


def test_a_single_policy_run_draws_no_second_copy_of_its_return(tmp_path: Path) -> None:
    write_run(tmp_path, {"default_policy": 10.0})
    assert labels(learning_curve(tmp_path)) == ["episode_reward_mean"]


def test_the_legend_is_outside_the_axes_and_covers_no_data(tmp_path: Path) -> None:
    write_run(tmp_path)
    fig = learning_curve(tmp_path, target=25)
    fig.canvas.draw()  # type: ignore[attr-defined]
    assert fig.axes[0].get_legend() is None and len(fig.legends) == 1
    legend = fig.legends[0].get_window_extent()
    axes = fig.axes[0].get_window_extent()
    assert legend.x0 >= axes.x1  # to the right of the plotting area
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "episode_reward_min/max", "episode_reward_mean", "target return 25"]
