"""The user-composed plans in examples/: each runs through the Trainer, and A2C with replay learns."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a2c_with_replay_trains_on_fresh_and_replayed_batches_and_learns() -> None:
    """Seeded: ~22k env steps to return 150 (A2C alone with the same settings: ~30k)."""
    example = load("a2c_with_replay")
    result = example.main(["--stop-reward", "150", "--max-steps", "60000", "--seed", "0"])
    assert result["episode_reward_mean"] >= 150
    info = result["info"]
    # one fresh 200-step batch, then one replayed 200-row batch: trained ~ 2x sampled once replay starts
    assert info["num_steps_trained"] >= 1.8 * info["num_steps_sampled"]


def test_a2c_with_replay_plan_uses_only_public_operators() -> None:
    import flowrl.ops

    module = load("a2c_with_replay")
    operators = {name for name, value in vars(module).items()
                 if getattr(value, "__module__", "").startswith("flowrl.ops")}
    assert {"StoreToReplayBuffer", "Replay", "Concurrently", "TrainOneStep"} <= operators
    assert operators <= set(flowrl.ops.__all__)


def test_ppo_under_the_a3c_plan_runs_ppo_losses_asynchronously() -> None:
    example = load("ppo_under_a3c")
    assert example.PPO_UNDER_A3C.plan.__module__ == "flowrl.algorithms.a3c"
    result = example.main(["--num-workers", "2", "--stop-reward", "1e9", "--max-steps", "5000"])
    assert result["timesteps_total"] >= 5000
    assert {"kl", "entropy"} <= set(result["info"]["learner"]["default_policy"]["learner_stats"])  # PPO's loss ran


@pytest.mark.parametrize("argv, message", [(["--num-workers", "0"], "--num-workers=0")])
def test_ppo_under_a3c_names_a_setting_it_cannot_run(argv: list[str], message: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load("ppo_under_a3c").main(argv)
    assert message in capsys.readouterr().err
