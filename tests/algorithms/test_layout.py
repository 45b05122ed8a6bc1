"""Every algorithm file reads "what" before "how", algorithms import each other only to extend or compose, and
every plan fits its line limit."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from flowrl.algorithms import ALGORITHMS, get_algorithm
from flowrl.testing import plan_lines

# algorithm -> the algorithms it builds on (APPO extends IMPALA, Ape-X extends DQN, DDPG and SAC run DQN's plan,
# TD3 is DDPG with twin Q, Ape-X DDPG runs Ape-X's plan over DDPG's policy, the composition runs PPO and DQN, MARWIL
# and BC run PG's plan, BC is MARWIL with beta 0, CQL extends SAC on DQN's plan and discrete CQL extends DQN);
# shared pieces live in modules that register no algorithm (actor_critic, off_policy, vtrace)
EXTENDS = {"apex": {"dqn"}, "appo": {"impala"}, "multiagent": {"dqn", "ppo"}, "ddpg": {"dqn"}, "sac": {"dqn"},
           "td3": {"ddpg"}, "apex_ddpg": {"apex", "ddpg"}, "r2d2": {"dqn", "apex"}, "ddppo": {"ppo"},
           "marwil": {"pg"}, "bc": {"marwil", "pg"}, "cql": {"dqn", "sac"}, "cql_dqn": {"dqn"}}


def top_level(name: str) -> tuple[ast.Module, list[str]]:
    """The module's syntax tree and the names it defines at its top level, in order."""
    path = Path(importlib.import_module(ALGORITHMS[name]).__file__ or "")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            names.append(node.targets[0].id)
    return tree, names


def imported_from_algorithms(tree: ast.Module) -> set[str]:
    """The names the module imports from another algorithm's module (DDPG's ``plan`` is DQN's, say)."""
    return {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
            and node.module is not None and node.module.rsplit(".", 1)[-1] in ALGORITHMS for alias in node.names}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_config_plan_owned_state_policy_registration_in_that_order(name: str) -> None:
    algorithm = get_algorithm(name)
    module = ALGORITHMS[name]
    tree, names = top_level(name)
    reused = imported_from_algorithms(tree)  # defined in the algorithm it extends: no place in this file's order
    wanted = [algorithm.config_class.__name__ if algorithm.config_class.__module__ == module else None, "plan",
              "make_owned_state" if algorithm.make_owned_state is not None else None,
              algorithm.policy_class.__name__ if algorithm.policy_class.__module__ == module else None]
    present = [n for n in wanted if n is not None and n not in reused]
    assert [names.index(n) for n in present] == sorted(names.index(n) for n in present), (name, present, names)
    assert names[-1] == "ALGORITHM"


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_algorithms_import_each_other_only_to_extend_or_compose(name: str) -> None:
    tree, _ = top_level(name)
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module == "flowrl.algorithms":
                imported |= {alias.name for alias in node.names if alias.name in ALGORITHMS}
            elif node.module.startswith("flowrl.algorithms."):
                imported.add(node.module.rsplit(".", 1)[1])
    assert imported & set(ALGORITHMS) == EXTENDS.get(name, set())


#: plans fit on one screen: 25 lines, 40 for the plans with several concurrent sub-flows
LONG_PLANS = {"apex": 40, "apex_ddpg": 40, "impala": 40, "multiagent": 40}  # Ape-X DDPG runs Ape-X's plan


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_plan_keeps_its_line_limit(name: str) -> None:
    assert plan_lines(get_algorithm(name).plan) <= LONG_PLANS.get(name, 25)
