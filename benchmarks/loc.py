r"""Lines of code: flowrl's plans against hand-written equivalents on Ray actors (the paper's 2-9x claim).

The RLlib Flow paper (https://arxiv.org/abs/2011.12719) reports that its execution plans take 2-9x fewer lines
than the hand-written distributed code they replaced, over the same workers and policies. Here the plans of
A3C, PPO and Ape-X (``flowrl/algorithms/*.py``, counted by ``flowrl.testing.plan_lines``: the function's
non-blank lines, signature included, docstring excluded) meet ``benchmarks/handwritten/{a3c,ppo,apex}.py``:
the same algorithms over the same substrate, written with ``ray.get``/``ray.wait`` loops. A hand-written file
counts its whole execution code (:func:`code_lines`: no blank lines, comments, docstrings or imports). The
helpers the three share (``benchmarks/handwritten/__init__.py``) are counted once, apart: the per-file ratio
leaves them out, the "with shared" ratio adds them to each algorithm.

For context it also lists every plan's lines and the size of flowrl's core and operators (``tools/loc.py``).
The last line is ``loc_ratio_median=<median of the three hand-written / plan ratios> min=... max=...``.

Run: ``python benchmarks/loc.py [--out benchmarks/results/loc.json]``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import io
import json
import statistics
import tokenize
from pathlib import Path
from typing import Any, Callable

import flowrl
from flowrl.algorithms import ALGORITHMS, get_algorithm
from flowrl.testing import plan_lines

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
HANDWRITTEN = HERE / "handwritten"
COMPARED = ("a3c", "ppo", "apex")
CORE = (*(f"flowrl/iter/{name}.py" for name in ("__init__", "stages", "pullers", "local", "shards", "parallel")),
        "flowrl/metrics.py", "flowrl/runtime.py")
_NOT_CODE = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)


def code_lines(source: str) -> int:
    r"""Lines of code in Python ``source``: lines that hold a token of code, leaving out blank lines, comments,
    docstrings (of the module, classes and functions) and import statements.

    Examples:
        >>> code_lines("'''Module doc.'''\nimport os\nfrom typing import (Any,\n    cast)\n\n"
        ...            "def f(x):  # adds one\n    '''Doc\n    on two lines.'''\n    # a comment line\n"
        ...            "    return (x +\n            1)\n")
        3
        >>> code_lines("x = '''not a docstring\n'''\n")
        2
    """
    skipped: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            skipped.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            skipped.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - skipped)


def file_lines(path: Path) -> int:
    """:func:`code_lines` of a file."""
    return code_lines(path.read_text(encoding="utf-8"))


def tools_code_lines() -> Callable[[str], int]:
    """``tools/loc.py``'s counter (docstrings, comments and blank lines left out; imports counted)."""
    spec = importlib.util.spec_from_file_location("flowrl_tools_loc", REPO / "tools" / "loc.py")
    assert spec is not None and spec.loader is not None  # the file is part of this repository
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    counter: Callable[[str], int] = module.code_lines
    return counter


def measure() -> dict[str, Any]:
    shared = file_lines(HANDWRITTEN / "__init__.py")
    compared: dict[str, dict[str, Any]] = {}
    for name in COMPARED:
        plan, hand = plan_lines(get_algorithm(name).plan), file_lines(HANDWRITTEN / f"{name}.py")
        compared[name] = {"plan_lines": plan, "handwritten_lines": hand, "ratio": hand / plan,
                          "ratio_with_shared": (hand + shared) / plan,
                          "handwritten_file": f"benchmarks/handwritten/{name}.py"}
    tools_count = tools_code_lines()
    ops = sorted(str(p.relative_to(REPO)) for p in (REPO / "flowrl" / "ops").glob("*.py"))
    ratios = [c["ratio"] for c in compared.values()]
    return {"benchmark": "loc", "compared": compared, "shared_handwritten_lines": shared,
            "plans": {name: plan_lines(get_algorithm(name).plan) for name in ALGORITHMS},
            "core_lines": {path: tools_count(str(REPO / path)) for path in CORE},
            "ops_lines": {path: tools_count(str(REPO / path)) for path in ops},
            "loc_ratio_median": statistics.median(ratios), "loc_ratio_min": min(ratios),
            "loc_ratio_max": max(ratios), "flowrl": flowrl.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/loc.json")
    args = parser.parse_args()
    data = measure()

    print("\nflowrl plan (flowrl.testing.plan_lines) against the hand-written version on Ray actors "
          "(code lines, benchmarks/handwritten/)\n")
    print("| algorithm | flowrl plan | hand-written | hand-written / plan | with shared helpers |")
    print("|---|---:|---:|---:|---:|")
    for name, c in data["compared"].items():
        print(f"| {name} | {c['plan_lines']} | {c['handwritten_lines']} | {c['ratio']:.1f}x | "
              f"{c['ratio_with_shared']:.1f}x |")
    print(f"\nshared hand-written helpers (episode statistics, report schedule, result dict): "
          f"{data['shared_handwritten_lines']} lines\n")
    print("| plan | lines |\n|---|---:|")
    for name, lines in data["plans"].items():
        print(f"| {name} | {lines} |")
    core, ops = sum(data["core_lines"].values()), sum(data["ops_lines"].values())
    print(f"\ncore ({', '.join(CORE)}): {core} lines; operators (flowrl/ops/): {ops} lines; together {core + ops} "
          f"(tools/loc.py; the paper's core: 1,118)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2))
    print(f"\nwrote {out}")
    print(f"loc_ratio_median={data['loc_ratio_median']:.2f} min={data['loc_ratio_min']:.2f} "
          f"max={data['loc_ratio_max']:.2f}")


if __name__ == "__main__":
    main()
