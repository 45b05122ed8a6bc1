"""GPU learners (they skip without CUDA devices; CI has none): PPO's and IMPALA's driver learner on CUDA, a learner
group of CUDA learners over NCCL, and DD-PPO's workers on a GPU each. On CPU, the device plumbing these share is
tested in tests/test_learner_group.py and tests/algorithms/test_ddppo.py (gloo)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flowrl.algorithms.ddppo import DDPPOConfig
from flowrl.algorithms.impala import IMPALAConfig
from flowrl.algorithms.ppo import PPOConfig
from flowrl.trainer import Trainer

GPUS = torch.cuda.device_count()
SMALL = {"env": "CartPole-v1", "seed": 0, "num_envs_per_worker": 2, "rollout_fragment_length": 50}
pytestmark = pytest.mark.gpu


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA device")
@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_the_driver_learner_trains_on_cuda(algo: str) -> None:
    config_class = PPOConfig if algo == "ppo" else IMPALAConfig
    extra = {"train_batch_size": 200, "sgd_minibatch_size": 100, "num_sgd_iter": 2} if algo == "ppo" else {}
    trainer = Trainer(algo, config_class(**SMALL, num_workers=1, device="cuda", **extra))
    try:
        before = trainer.get_policy().get_weights()
        for _ in range(2):
            trainer.train()
        policy = trainer.get_policy()
        assert next(policy.model.parameters()).is_cuda
        assert any(not np.array_equal(before[k], v) for k, v in policy.get_weights().items())
    finally:
        trainer.stop()


@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA devices")
def test_a_learner_group_of_cuda_learners_all_reduces_over_nccl() -> None:
    trainer = Trainer("ppo", PPOConfig(**SMALL, num_workers=1, train_batch_size=200, sgd_minibatch_size=100,
                                       num_learners=2, num_gpus_per_learner=1))
    try:
        assert trainer.workers.learner_group is not None and trainer.workers.learner_group.backend == "nccl"
        assert trainer.train()["info"]["num_steps_trained"] == 200
    finally:
        trainer.stop()


@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA devices")
def test_ddppo_workers_learn_on_a_gpu_each_over_nccl() -> None:
    import ray

    trainer = Trainer("ddppo", DDPPOConfig(**SMALL, num_workers=2, sgd_minibatch_size=50, device="cuda",
                                           num_gpus_per_worker=1, collective_backend="nccl"))
    try:
        for _ in range(2):
            trainer.train()
        a, b = (w["default_policy"] for w in ray.get([w.get_weights.remote() for w in trainer.workers.remote_workers()]))
        assert all(np.array_equal(a[k], b[k]) for k in a)
    finally:
        trainer.stop()
