"""The README's promises that code can check: CI runs its test command in a fresh virtualenv, and its Python
quickstart runs as printed and writes only under ``runs/`` (which git ignores)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def code_block_after(marker: str, language: str) -> str:
    """The first fenced ``language`` block after the line containing ``marker``."""
    start = README.index(marker)
    match = re.compile(rf"```{language}\n(.*?)```", re.S).search(README, start)
    assert match is not None, f"no {language} block after {marker!r}"
    return match.group(1)


def test_ci_runs_the_readme_test_command_in_a_fresh_virtualenv() -> None:
    command = code_block_after("Install everything and run the tests", "bash").strip()
    assert "\n" not in command and "pytest" in command
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    runs = [i for i, line in enumerate(ci) if line.startswith(command)]
    assert runs, f".ci/run does not run the README's test command {command!r}"
    venv = [i for i, line in enumerate(ci) if re.match(r"python3? -m venv ", line)]
    activate = [i for i, line in enumerate(ci) if re.match(r"(source|\.) .*/bin/activate", line)]
    assert venv and activate and venv[0] < activate[0] < runs[0], \
        ".ci/run must create and activate a new virtualenv before the test command"


def test_gitignore_ignores_runs() -> None:
    assert "runs/" in (ROOT / ".gitignore").read_text().splitlines()


def test_python_quickstart_writes_only_under_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    snippet = code_block_after("## Quickstart in Python", "python")
    assert "for _ in range(10):" in snippet
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(snippet.replace("range(10)", "range(1)"), "README.md (quickstart)", "exec"), namespace)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    saved = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert (tmp_path / saved / "manifest.json").is_file()
    # "Use a trained policy" continues from the quickstart's `path`, as a reader would run it
    exec(compile(code_block_after("## Use a trained policy", "python"), "README.md (trained policy)", "exec"),
         namespace)
    assert float(capsys.readouterr().out.strip().splitlines()[-1]) > 0


def test_the_sweeps_python_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(code_block_after("## Sweeps", "python"), "README.md (sweeps)", "exec"), {})
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed.startswith("{'lr': ") and "'model.hidden_sizes': (" in printed and "Checkpoint(" in printed, printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    assert list((tmp_path / "runs" / "tune").glob("*/*/checkpoint_*/checkpoint_000002/manifest.json"))


DESIGN_DOCS = re.compile(r"\b(SEMANTICS|STYLE|PERFORMANCE|ARCHITECTURE)\.md\b|shared/design")


def test_nothing_cites_design_documents_outside_the_repository() -> None:
    # The design documents live outside the repository: a user cannot open them, so no message, docstring,
    # notebook or README line may send them there (a map inside the repository, such as docs/, may be cited).
    files = [ROOT / "README.md", *[p for folder in ("flowrl", "examples", "benchmarks", "notebooks", "tests")
                                   for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".ipynb", ".md")]]
    citing = [f"{p.relative_to(ROOT)}:{n}" for p in files
              for n, line in enumerate(p.read_text().splitlines(), 1)
              if DESIGN_DOCS.search(line) and p.name != "test_readme.py" and "docs/" not in line]
    assert not citing, f"these lines cite design documents a user cannot open: {citing}"
