"""The teaching notebooks in notebooks/: each runs end to end in a fresh kernel and ends on a visible result
(a plot or a text table), and the committed copies carry no outputs.

Each notebook starts (and shuts down) its own Ray instance on loopback, separate from the test session's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 120  # one cell; each notebook runs in well under a minute on 2 cores (pytest's timeout: 300 s)
# 01 and 02 train for 30-45 s each on 2 cores, so their runs are in the slow tier; 03 runs in the default one
RUNS = [pytest.param(p, id=p.stem, marks=() if p.stem == "03_benchmarks" else pytest.mark.slow) for p in NOTEBOOKS]


def read(path: Path) -> Any:
    return nbformat.read(path, as_version=nbformat.NO_CONVERT)


def test_the_notebooks_are_all_there() -> None:
    assert [p.name for p in NOTEBOOKS] == ["01_compose_a_plan.ipynb", "02_port_an_algorithm.ipynb",
                                           "03_benchmarks.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_is_valid_and_stripped(path: Path) -> None:
    nb = read(path)
    nbformat.validate(nb)
    assert nb.nbformat == 4
    dirty = [i for i, cell in enumerate(nb.cells)
             if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)]
    assert not dirty, (f"{path.name}: code cells {dirty} hold outputs or execution counts; strip them with "
                       f"`jupyter nbconvert --clear-output --inplace {path.relative_to(NOTEBOOKS_DIR.parent)}`")


def _shows_a_result(output: Any) -> bool:
    """An image, or printed text with a markdown table row in it."""
    if output.output_type in ("display_data", "execute_result"):
        return "image/png" in output.data
    return output.output_type == "stream" and output.name == "stdout" and "|---" in output.text


@pytest.mark.parametrize("path", RUNS)
def test_notebook_runs_end_to_end_and_ends_on_a_result(path: Path) -> None:
    nb = read(path)
    # a kernel of its own, run from notebooks/ as Jupyter would; RAY_ADDRESS would send it to the test session's Ray
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS_DIR)}})
    start = time.perf_counter()
    client.execute(env=env)  # raises CellExecutionError, with the traceback, at the first failing cell
    print(f"{path.name}: executed in {time.perf_counter() - start:.1f} s")
    last = [cell for cell in nb.cells if cell.cell_type == "code"][-1]
    kinds = [o.output_type for o in last.outputs]
    assert any(_shows_a_result(o) for o in last.outputs), f"{path.name}: the last cell showed no plot or table: {kinds}"
