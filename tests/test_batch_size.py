"""Item 11 of issue 31: a train_batch_size that whole samples cannot make is said at build time, with the size
that will be used and the fields to change."""

from __future__ import annotations

import logging

import pytest

from flowrl.algorithms import ALGORITHMS, get_algorithm
from flowrl.algorithms.a2c import A2CConfig
from flowrl.algorithms.a3c import A3CConfig
from flowrl.algorithms.dqn import DQNConfig
from flowrl.algorithms.impala import IMPALAConfig
from flowrl.algorithms.pg import PGConfig
from flowrl.algorithms.ppo import PPOConfig
from flowrl.trainer import Trainer

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithms_defaults_train_the_batch_size_they_ask_for(name: str) -> None:
    config = get_algorithm(name).config_class()
    assert config.train_batch_size_warning() is None


def test_fragments_larger_than_the_batch_are_named_with_the_size_used() -> None:
    # the case: 20 envs x 200-step fragments for a 512-step batch
    config = PPOConfig(num_workers=0, num_envs_per_worker=20, rollout_fragment_length=200, train_batch_size=512,
                       sgd_minibatch_size=64)
    assert config.actual_train_batch_size == 4000
    warning = config.train_batch_size_warning()
    assert warning is not None
    assert "train_batch_size=512" in warning and "4000 steps" in warning
    assert "rollout_fragment_length" in warning and "num_envs_per_worker" in warning
    assert "set train_batch_size=4000" in warning
    assert "\n" not in warning


def test_bulk_sync_samples_hold_one_fragment_of_every_worker() -> None:
    # 3 workers x 200 steps = 600-step samples: 4000 is met by 7 of them, 4200 steps
    assert PPOConfig(num_workers=3).actual_train_batch_size == 4200
    assert "x 3 = 600 steps" in (PPOConfig(num_workers=3).train_batch_size_warning() or "")
    assert PPOConfig(num_workers=4).actual_train_batch_size == 4000


def test_async_plans_concatenate_single_fragments() -> None:
    # IMPALA gathers one worker's fragment at a time, so the worker count plays no part
    assert IMPALAConfig(num_workers=3, rollout_fragment_length=50, train_batch_size=500).actual_train_batch_size == 500
    config = IMPALAConfig(num_workers=3, rollout_fragment_length=60, train_batch_size=500)
    assert config.actual_train_batch_size == 540
    assert "rollout_fragment_length x num_envs_per_worker = 60 x 1 = 60 steps" in (config.train_batch_size_warning()
                                                                                    or "")


def test_replay_and_gradient_plans_never_warn() -> None:
    assert DQNConfig(rollout_fragment_length=50, train_batch_size=32).train_batch_size_warning() is None
    assert A3CConfig(train_batch_size=7).actual_train_batch_size is None  # A3C's gradients are one fragment each
    assert A3CConfig(train_batch_size=7).train_batch_size_warning() is None


def test_a2c_microbatches_are_rounded_up_to_whole_samples() -> None:
    config = A2CConfig(num_workers=0, rollout_fragment_length=20, train_batch_size=40, microbatch_size=30)
    assert config.actual_train_batch_size == 80  # 2 microbatches of 40 steps
    warning = config.train_batch_size_warning() or ""
    assert "microbatch_size=30" in warning and "80 steps" in warning


def test_complete_episodes_have_no_fixed_size() -> None:
    config = PGConfig(num_workers=0, batch_mode="complete_episodes", rollout_fragment_length=150)
    assert config.actual_train_batch_size is None and config.train_batch_size_warning() is None


def test_the_trainer_says_it_when_built_and_trains_the_size_it_said(caplog: pytest.LogCaptureFixture) -> None:
    config = PGConfig(num_workers=0, rollout_fragment_length=150, train_batch_size=200, seed=3,
                      timesteps_per_iteration=0, min_iter_time_s=0)
    with caplog.at_level(logging.WARNING, logger="flowrl.trainer"):
        trainer = Trainer("pg", config)
    try:
        assert [r.getMessage() for r in caplog.records if r.name == "flowrl.trainer"] == \
            [config.train_batch_size_warning()]
        result = trainer.train()
        assert result["info"]["num_steps_trained"] == config.actual_train_batch_size == 300
    finally:
        trainer.stop()
