"""The map in docs/ARCHITECTURE.md holds: every module of flowrl/ sits on one layer of its table, no import goes up
the layers, no two modules import each other at import time (directly or round a longer loop), and only the top
layer uses the test helpers. The imports are read from the source with ``ast`` (nothing is imported), so the check
takes a moment and sees imports inside functions and under ``TYPE_CHECKING`` too."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAP = ROOT / "docs/ARCHITECTURE.md"


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    kind: str  # "module" (runs at import), "function" (runs when called) or "typing" (under TYPE_CHECKING)


def modules_of(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file below ``package`` (a package is its ``__init__``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(package: Path) -> list[Import]:
    """Every import of a module of ``package`` by a module of ``package``, resolved to the module it loads
    (``from flowrl.ops import Replay`` -> ``flowrl.ops``; ``from flowrl.algorithms import dqn`` ->
    ``flowrl.algorithms.dqn``). A module's implicit load of its parent packages is not counted."""
    modules = modules_of(package)
    prefix = package.name

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found: list[Import] = []
    for name, path in modules.items():
        package_parts = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]

        class Visitor(ast.NodeVisitor):
            def __init__(self) -> None:
                self.kind = "module"

            def _within(self, kind: str, nodes: list[ast.stmt]) -> None:
                before, self.kind = self.kind, kind if self.kind != "typing" else "typing"
                for node in nodes:
                    self.visit(node)
                self.kind = before

            def visit_If(self, node: ast.If) -> None:
                if "TYPE_CHECKING" in ast.unparse(node.test):
                    self._within("typing", node.body)
                    self._within(self.kind, node.orelse)
                else:
                    self.generic_visit(node)

            def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
                self._within("function", node.body)

            visit_AsyncFunctionDef = visit_FunctionDef

            def _add(self, target: str | None, node: ast.stmt) -> None:
                if target is not None and target != name:
                    found.append(Import(name, target, node.lineno, self.kind))

            def visit_Import(self, node: ast.Import) -> None:
                for alias in node.names:
                    if alias.name.split(".")[0] == prefix:
                        self._add(owner(alias.name), node)

            def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
                if node.level:
                    base = package_parts[:len(package_parts) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                if module.split(".")[0] != prefix:
                    return
                for alias in node.names:
                    submodule = f"{module}.{alias.name}"
                    self._add(submodule if submodule in modules else owner(module), node)

        Visitor().visit(ast.parse(path.read_text(), str(path)))
    return found


def read_layers(text: str) -> list[tuple[str, list[str]]]:
    """(layer, module patterns) from the map's layer table, lowest layer first: the rows between
    ``<!-- layers -->`` and ``<!-- /layers -->``, each ``| layer | `pattern`, `pattern` | ... |``; a pattern
    ``flowrl.ops.*`` is the package and everything in it."""
    block = re.search(r"<!-- layers -->(.*?)<!-- /layers -->", text, re.S)
    assert block, f"{MAP} has no layer table between <!-- layers --> and <!-- /layers -->"
    layers = []
    for row in block.group(1).strip().splitlines():
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        patterns = re.findall(r"`(flowrl[\w.*]*)`", cells[1]) if len(cells) > 1 else []
        if patterns:
            layers.append((cells[0].strip("*"), patterns))
    return layers


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> list[int]:
    """The indexes of the layers whose patterns match ``module`` (one, when the map is right)."""
    def matches(pattern: str) -> bool:
        if pattern.endswith(".*"):
            return module == pattern[:-2] or module.startswith(pattern[:-1])
        return module == pattern
    return [i for i, (_, patterns) in enumerate(layers) if any(matches(p) for p in patterns)]


def upward_imports(imports: list[Import], layers: list[tuple[str, list[str]]]) -> list[str]:
    """Each import of a module on a higher layer than the importer's, as a readable line. The last row of the
    table is the test helpers, beside the stack: they may import anything, and of the library only the layer
    below them in the table (the top of the stack) may import them."""
    bad = []
    beside = len(layers) - 1
    for imp in imports:
        source, target = layer_of(imp.source, layers), layer_of(imp.target, layers)
        if not source or not target or source[0] == beside:
            continue
        if target[0] == beside and source[0] != beside - 1:
            bad.append(f"{imp.source}:{imp.line} ({layers[source[0]][0]}) imports the test helpers {imp.target}; "
                       f"only the {layers[beside - 1][0]} layer may")
        elif target[0] > source[0] and target[0] != beside:
            bad.append(f"{imp.source}:{imp.line} ({layers[source[0]][0]}) imports {imp.target} "
                       f"({layers[target[0]][0]}), a higher layer ({imp.kind}-level import)")
    return bad


def import_cycles(imports: list[Import]) -> list[list[str]]:
    """The groups of modules that import each other round a loop (strongly connected components of more than one
    module), counting the imports that run when a module is imported (at module level): those decide the import
    order and fail on a loop. An import inside a function runs later, once every module is loaded; it still may
    not go up the layers."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.kind == "module":
            graph.setdefault(imp.source, set()).add(imp.target)
            graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


# -- the real tree ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def layers() -> list[tuple[str, list[str]]]:
    return read_layers(MAP.read_text())


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return imports_of(ROOT / "flowrl")


def test_every_module_sits_on_exactly_one_layer_of_the_map(layers: list[tuple[str, list[str]]]) -> None:
    placed = {module: layer_of(module, layers) for module in modules_of(ROOT / "flowrl")}
    missing = sorted(m for m, found in placed.items() if not found)
    doubled = sorted(m for m, found in placed.items() if len(found) > 1)
    assert not missing, f"modules missing from the layer table in {MAP.name}: {missing}; add each to its layer"
    assert not doubled, f"modules on more than one layer in {MAP.name}: {doubled}"


def test_no_import_goes_up_the_layers(imports: list[Import], layers: list[tuple[str, list[str]]]) -> None:
    bad = upward_imports(imports, layers)
    assert not bad, "imports that go up the layers of docs/ARCHITECTURE.md:\n" + "\n".join(bad)


def test_no_two_modules_import_each_other_at_import_time(imports: list[Import]) -> None:
    cycles = import_cycles(imports)
    assert not cycles, f"import cycles (each group imports round a loop): {cycles}"


# -- the checks themselves can fail --------------------------------------------------------------------

def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "flowrl"
    for name, source in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return package


def test_an_injected_cycle_and_upward_import_are_found(tmp_path: Path) -> None:
    package = _package(tmp_path, {
        "__init__.py": "",
        "core.py": "from flowrl.ops import train\n",  # core -> ops: up the layers
        "ops/__init__.py": "from flowrl.ops.train import Step\n",
        "ops/train.py": "from flowrl import core\nfrom flowrl.ops import Step\nclass Step: ...\n",
        "testing.py": "from flowrl import ops\n",
        "algo.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from flowrl import testing\n",
        "cli.py": "def main():\n    from flowrl import testing, algo\n",  # the top layer may use the helpers
    })
    layers = read_layers("<!-- layers -->\n| core | `flowrl`, `flowrl.core` |\n| ops | `flowrl.ops.*` |\n"
                         "| algorithms | `flowrl.algo` |\n| top | `flowrl.cli` |\n| beside | `flowrl.testing` |\n"
                         "<!-- /layers -->")
    found = imports_of(package)
    assert {(i.source, i.target, i.kind) for i in found} == {
        ("flowrl.core", "flowrl.ops.train", "module"), ("flowrl.ops", "flowrl.ops.train", "module"),
        ("flowrl.ops.train", "flowrl.core", "module"), ("flowrl.ops.train", "flowrl.ops", "module"),
        ("flowrl.testing", "flowrl.ops", "module"), ("flowrl.algo", "flowrl.testing", "typing"),
        ("flowrl.cli", "flowrl.testing", "function"), ("flowrl.cli", "flowrl.algo", "function")}
    assert import_cycles(found) == [["flowrl.core", "flowrl.ops", "flowrl.ops.train"]]
    assert upward_imports(found, layers) == [
        "flowrl.algo:3 (algorithms) imports the test helpers flowrl.testing; only the top layer may",
        "flowrl.core:1 (core) imports flowrl.ops.train (ops), a higher layer (module-level import)"]
    assert layer_of("flowrl.ops.train", layers) == [1] and layer_of("flowrl.opsx", layers) == []


def test_a_loop_closed_only_in_a_function_or_for_type_checking_is_not_an_import_cycle(tmp_path: Path) -> None:
    package = _package(tmp_path, {
        "__init__.py": "", "config.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                        "    from flowrl.policy import Policy\n",
        "policy.py": "from flowrl.config import Config\n",
        "local.py": "def describe():\n    from flowrl.graph import build\n", "graph.py": "from flowrl.local import It\n"})
    assert import_cycles(imports_of(package)) == []
