"""An env that cannot be made says so in one line: what is missing and the pip command (or gymnasium's hint)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import gymnasium
import pytest
from click.testing import CliRunner

from flowrl.cli import main
from flowrl.envs import EnvContext, VectorEnv, make_env
from flowrl.envs import base


def one_line_error(env: Any) -> str:
    with pytest.raises(ValueError) as err:
        make_env(env, EnvContext())
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.skipif(importlib.util.find_spec("Box2D") is not None, reason="Box2D is installed here")
def test_a_missing_box2d_names_the_pip_command() -> None:
    message = one_line_error("CarRacing-v3")
    assert message.startswith("env 'CarRacing-v3' needs a package that is not installed: Box2D is not installed")
    assert 'pip install "gymnasium[box2d]"' in message


def test_an_ale_id_without_ale_py_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    # ale-py is in the dev extra: hide it (and the ids it registered) as on a machine without it
    monkeypatch.setitem(sys.modules, "ale_py", None)  # import ale_py raises ImportError
    if "ALE/Pong-v5" in gymnasium.registry:
        monkeypatch.delitem(gymnasium.registry, "ALE/Pong-v5")
    message = one_line_error("ALE/Pong-v5")
    assert message.startswith("env id 'ALE/Pong-v5' needs the ale-py package")
    assert message.endswith("pip install ale-py")


def test_a_known_namespace_is_registered_by_importing_its_package(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "flowrl_fake_ns.py").write_text(
        "import gymnasium\n"
        "gymnasium.register('FakeNs/Cart-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(base._NAMESPACE_PACKAGES, "FakeNs", ("fake-ns", "flowrl_fake_ns"))
    try:
        assert make_env("FakeNs/Cart-v0", EnvContext()).spec.id == "FakeNs/Cart-v0"  # as ale_py registers ALE/...
    finally:
        gymnasium.registry.pop("FakeNs/Cart-v0", None)
        sys.modules.pop("flowrl_fake_ns", None)


def test_an_unknown_id_keeps_gymnasiums_hint() -> None:
    message = one_line_error("CartPole-v9")
    assert "It provides versioned environments: [ `v0`, `v1` ]" in message and "'CartPole-v1'" in message
    assert "Have you installed the proper package for Nope?" in one_line_error("Nope/Thing-v0")
    assert "unknown gymnasium env id 'CartPole'" in one_line_error("CartPole")  # unversioned ids stay refused


def test_an_env_creator_raising_dependency_not_installed_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def creator(**kwargs: Any) -> gymnasium.Env[Any, Any]:
        try:
            import flowrl_no_such_module  # type: ignore[import-not-found]  # noqa: F401
        except ModuleNotFoundError as e:
            raise gymnasium.error.DependencyNotInstalled("FancySim is not installed") from e
        raise AssertionError("unreachable")

    gymnasium.register("FlowrlFancy-v0", entry_point=creator)
    try:
        assert one_line_error("FlowrlFancy-v0") == (
            "env 'FlowrlFancy-v0' needs a package that is not installed: FancySim is not installed; install the "
            "package that provides the module 'flowrl_no_such_module'")

        def build(ctx: EnvContext) -> gymnasium.Env[Any, Any]:
            return gymnasium.make("FlowrlFancy-v0")

        assert one_line_error(build).startswith("env test_an_env_creator_raising_dependency_not_installed_is_one_line"
                                                ".<locals>.build needs a package that is not installed")
        with pytest.raises(ValueError, match="needs a package that is not installed"):
            VectorEnv("FlowrlFancy-v0", 2)
        result = CliRunner().invoke(main, ["train", "pg", "--env", "FlowrlFancy-v0", "--config", "num_workers=0",
                                           "--stop-iters", "1"])
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert result.output.splitlines()[-1] == (
            "Error: env 'FlowrlFancy-v0' needs a package that is not installed: FancySim is not installed; install "
            "the package that provides the module 'flowrl_no_such_module'")
    finally:
        gymnasium.registry.pop("FlowrlFancy-v0", None)
