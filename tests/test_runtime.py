"""Ray start-up: the shared test instance is local, on loopback, without a dashboard."""

from __future__ import annotations

import os

import pytest
import ray

from flowrl import runtime


def test_the_session_instance_is_bound_to_loopback() -> None:
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert nodes and all(n["NodeManagerAddress"] == "127.0.0.1" for n in nodes)
    assert ray.cluster_resources()["CPU"] == 8


def test_init_is_a_no_op_when_ray_runs() -> None:
    runtime.init()
    runtime.ensure_initialized()
    assert ray.is_initialized()


def test_joining_a_cluster_does_not_take_local_resources() -> None:
    with pytest.raises(ValueError, match="joins a cluster"):
        runtime.init(address="auto", num_cpus=2)


def test_actor_options_never_let_ray_restart_an_actor() -> None:
    assert runtime.actor_options(num_cpus=0.5, num_gpus=1, max_restarts=5) == {
        "num_cpus": 0.5, "num_gpus": 1, "max_restarts": 0}
    with pytest.raises(ValueError, match="num_cpus=-1"):
        runtime.actor_options(num_cpus=-1)
