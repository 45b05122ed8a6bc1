"""Placement: custom resources, Ray placement groups for a plan's workers and learners (placement_strategy), the
settings refused at build time, and (slow tier) plans on a local two-node cluster: workers spread over the nodes or
packed onto one, DD-PPO's process group across nodes, and a learner group."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import ray

from flowrl.algorithms.ppo import PPOConfig, PPOPolicy
from flowrl.trainer import Trainer
from flowrl.workers import WorkerSet

REPO = Path(__file__).resolve().parents[1]
SMALL = {"env": "CartPole-v1", "train_batch_size": 200, "rollout_fragment_length": 100, "sgd_minibatch_size": 100,
         "num_sgd_iter": 1, "seed": 0}


@pytest.mark.parametrize(("settings", "message"), [
    ({"placement_strategy": "CLOSE"}, r"placement_strategy='CLOSE'; use one of \['PACK', 'SPREAD', 'STRICT_PACK', "
                                      r"'STRICT_SPREAD'\], or None"),
    ({"custom_resources_per_worker": {"CPU": 1}}, r"custom_resources_per_worker has the key 'CPU'; .* "
                                                  r"num_cpus_per_worker"),
    ({"custom_resources_per_worker": {"tpu": -1}}, r"custom_resources_per_worker\['tpu'\]=-1 must be a finite "
                                                   r"number >= 0"),
])
def test_bad_placement_settings_are_refused_when_the_config_is_built(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PPOConfig(**settings)


def test_a_custom_resource_the_cluster_lacks_is_named() -> None:
    with pytest.raises(ValueError, match=r"num_workers=2 x 1 tpu per worker needs 2 tpu but the Ray cluster has 0; "
                                         r"lower num_workers or custom_resources_per_worker\['tpu'\]"):
        WorkerSet(policy_class=PPOPolicy, config=PPOConfig(num_workers=2, custom_resources_per_worker={"tpu": 1}))


def test_workers_that_ask_for_nothing_cannot_be_placed_in_bundles() -> None:
    with pytest.raises(ValueError, match=r"placement_strategy='PACK' reserves a bundle .* num_cpus_per_worker=0"):
        WorkerSet(policy_class=PPOPolicy, config=PPOConfig(num_workers=1, num_cpus_per_worker=0,
                                                            placement_strategy="PACK"))


def test_a_plans_workers_run_in_one_placement_group_released_when_the_trainer_stops() -> None:
    from ray.util import placement_group_table

    trainer = Trainer("ppo", PPOConfig(**SMALL, num_workers=2, num_cpus_per_worker=0.5, placement_strategy="PACK"))
    group = trainer.workers.placement_group
    try:
        assert group is not None and placement_group_table(group)["state"] == "CREATED"
        assert placement_group_table(group)["bundles"] == {0: {"CPU": 0.5}, 1: {"CPU": 0.5}}
        assert trainer.train()["info"]["num_steps_trained"] == 200
        in_group = ray.get([w.apply.remote(lambda _: ray.get_runtime_context().get_placement_group_id())
                            for w in trainer.workers.remote_workers()])
        assert in_group == [group.id.hex()] * 2
    finally:
        trainer.stop()
    assert placement_group_table(group)["state"] == "REMOVED"


TWO_NODES = """
from flowrl import runtime  # first: Ray's loopback variable
import numpy as np, ray
from ray.cluster_utils import Cluster
from flowrl.algorithms.ddppo import DDPPOConfig
from flowrl.algorithms.ppo import PPOConfig
from flowrl.trainer import Trainer

small = dict(env="CartPole-v1", seed=0, num_envs_per_worker=2, rollout_fragment_length=50, num_sgd_iter=1)


def nodes(trainer):
    return ray.get([w.apply.remote(lambda _: ray.get_runtime_context().get_node_id())
                    for w in trainer.workers.remote_workers()])


def trained(algo, config, rounds=2):
    trainer = Trainer(algo, config)
    try:
        for _ in range(rounds):
            result = trainer.train()
        return result, nodes(trainer)
    finally:
        trainer.stop()


def body(second):
    for strategy in ("STRICT_SPREAD", "STRICT_PACK"):
        result, where = trained("ppo", PPOConfig(**small, num_workers=2, train_batch_size=200, sgd_minibatch_size=100,
                                                 placement_strategy=strategy))
        print(strategy, len(set(where)), result["info"]["num_steps_trained"])
    result, where = trained("ppo", PPOConfig(**small, num_workers=2, train_batch_size=200, sgd_minibatch_size=100,
                                             custom_resources_per_worker={"second_node": 1}))
    print("custom", where == [second.node_id] * 2)
    trainer = Trainer("ddppo", DDPPOConfig(**small, num_workers=2, sgd_minibatch_size=50,
                                           placement_strategy="STRICT_SPREAD"))
    try:
        for _ in range(3):
            trainer.train()
        weights = [w["default_policy"] for w in ray.get([w.get_weights.remote()
                                                         for w in trainer.workers.remote_workers()])]
        print("ddppo", len(set(nodes(trainer))), all(np.array_equal(weights[0][k], weights[1][k]) for k in weights[0]))
    finally:
        trainer.stop()
    result, _ = trained("ppo", PPOConfig(**small, num_workers=1, train_batch_size=200, sgd_minibatch_size=50,
                                         num_learners=2, placement_strategy="SPREAD"))  # 3 bundles, 2 nodes
    print("learners", result["info"]["num_steps_trained"])


cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "include_dashboard": False})
try:
    second = cluster.add_node(num_cpus=3, resources={"second_node": 2})
    cluster.wait_for_nodes()
    runtime.init(address=cluster.address, log_to_driver=False)
    body(second)
finally:  # a cluster left running is the one the next ray.init() on this machine would join
    ray.shutdown()
    cluster.shutdown()
"""


@pytest.mark.slow
def test_plans_run_on_a_two_node_local_cluster_with_placement_groups() -> None:
    done = subprocess.run([sys.executable, "-c", TWO_NODES], capture_output=True, text=True,
                          cwd=REPO, timeout=600, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split("\n")[:5] == ["STRICT_SPREAD 2 400", "STRICT_PACK 1 400", "custom True", "ddppo 2 True",
                                           "learners 400"], done.stdout
