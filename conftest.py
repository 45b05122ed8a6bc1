"""Shared test set-up: one Ray instance on loopback for the whole session, and doctest names."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before anything imports ray
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# W&B (tests of `--logger wandb`) writes offline only, sends no error reports and stays quiet: no traffic leaves
# this machine
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.pop("MLFLOW_TRACKING_URI", None)  # MLflow: the run directory's own SQLite store

import pytest  # noqa: E402
import ray  # noqa: E402
from ray import cloudpickle  # noqa: E402

import flowrl  # noqa: E402
from flowrl import runtime  # noqa: E402
from flowrl.testing.network import keep_traffic_on_loopback  # noqa: E402

keep_traffic_on_loopback()  # Ray's start-up probe of the cloud metadata address stays on this machine

NUM_CPUS = 8  # logical CPUs for the test instance; the machine has 2 cores


@pytest.fixture(scope="session", autouse=True)
def ray_session() -> Iterator[None]:
    runtime.init(num_cpus=NUM_CPUS, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def local_executor(request: pytest.FixtureRequest) -> Iterator[None]:
    """Runs the test under the local executor (every actor in this process; see flowrl/executor.py): for tests
    of what a plan computes rather than of Ray itself. A module opts in with
    ``pytestmark = pytest.mark.usefixtures("local_executor")``; a test in it that is about Ray itself (remote
    tasks, Ray's errors, what crosses Ray's wire) stays on Ray with ``@pytest.mark.on_ray``."""
    if request.node.get_closest_marker("on_ray") is not None:
        yield
        return
    with runtime.local_executor():
        yield


@pytest.fixture(autouse=True)
def _pickle_test_module_by_value(request: pytest.FixtureRequest) -> None:
    # Ray's workers cannot import test modules by name; ship their functions by value instead.
    module = getattr(request, "module", None)
    if module is not None and module.__name__ not in ("builtins",) and not module.__name__.startswith("flowrl"):
        if module.__name__ in sys.modules:
            cloudpickle.register_pickle_by_value(module)


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace: dict[str, object]) -> None:
    from flowrl import iter as fiter
    from flowrl.testing import iter_list

    doctest_namespace.update(iter_list=iter_list, from_range=fiter.from_range, from_items=fiter.from_items,
                             LocalIterator=fiter.LocalIterator, flowrl=flowrl)
