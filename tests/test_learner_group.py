"""Learner groups (num_learners > 1): the same weights as the lone driver learner for the same batch and seed,
the KL coefficient and optimizer state travelling with them, checkpoints, and the settings and resources refused
at build time with the field, the value and the fix."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from flowrl.algorithms.appo import APPOConfig, APPOPolicy
from flowrl.algorithms.impala import IMPALAConfig, IMPALAPolicy
from flowrl.algorithms.ppo import PPOConfig, PPOPolicy
from flowrl.config import ModelConfig
from flowrl.metrics import MetricsContext
from flowrl.ops import LearnOnBatch
from flowrl.sample_batch import SampleBatch
from flowrl.trainer import Trainer
from flowrl.workers import WorkerSet

SETTINGS = {"env": "CartPole-v1", "num_workers": 0, "seed": 3, "train_batch_size": 400, "num_cpus_per_learner": 0.5}


def test_shares_split_a_minibatch_in_rank_order() -> None:
    import gymnasium as gym

    policy = PPOPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), PPOConfig(seed=0))
    empty = SampleBatch({})
    assert [s.tolist() for s in policy.group_shares(empty, np.arange(7), 3)] == [[0, 1, 2], [3, 4], [5, 6]]
    # a learner may have no rows: it steps with the others, adding nothing
    assert [s.tolist() for s in policy.group_shares(empty, np.array([9]), 2)] == [[9], []]


def _learn_twice(num_learners: int, batch: SampleBatch | None) -> tuple[SampleBatch, dict[str, Any], Any, int]:
    """Two steps of 2 epochs of minibatches of 133 rows (the last of 1 row), with a KL update between them."""
    workers = WorkerSet(policy_class=PPOPolicy, config=PPOConfig(**SETTINGS, num_learners=num_learners))
    try:
        local = workers.local_worker()
        if batch is None:
            batch = SampleBatch.concat([local.sample() for _ in range(2)])
        op = LearnOnBatch(workers, num_sgd_iter=2, sgd_minibatch_size=133)
        op.bind(MetricsContext())
        op(batch)
        local.get_policy().update_kl(0.5)  # in the driver: the learners must take it up
        _, info = op(batch)
        state = local.get_state()["policies"]["default_policy"]
        return batch, info["default_policy"]["learner_stats"], state, local.get_policy().weights_version
    finally:
        workers.stop()


def test_a_learner_group_takes_the_lone_learners_steps_to_1e_6() -> None:
    batch, alone, state, version = _learn_twice(1, None)
    assert batch.count == 400
    _, grouped, group_state, group_version = _learn_twice(3, batch)  # shares of 45/44/44 rows, and 1/0/0
    assert group_version == version == 16  # 2 steps x 2 epochs x 4 minibatches
    for name, weight in state["weights"].items():
        np.testing.assert_allclose(group_state["weights"][name], weight, atol=1e-6, err_msg=name)
    assert group_state["kl_coeff"] == state["kl_coeff"] == pytest.approx(0.3)
    assert group_state["optimizer"]["state"][0]["step"] == 16  # the learners' Adam, read back for the checkpoint
    for key in ("total_loss", "policy_loss", "vf_loss", "kl", "entropy"):
        assert grouped[key] == pytest.approx(alone[key], rel=1e-5, abs=1e-7), key


def test_a_trainer_with_learners_trains_saves_and_restores(tmp_path: Any) -> None:
    config = PPOConfig(**{**SETTINGS, "num_workers": 1, "num_cpus_per_worker": 0.5}, num_learners=2,
                       sgd_minibatch_size=100, num_sgd_iter=2)
    trainer = Trainer("ppo", config)
    try:
        for _ in range(2):
            result = trainer.train()
        assert result["info"]["num_steps_trained"] == 800
        path = trainer.save(tmp_path)
        saved = trainer.workers.local_worker().get_state()["policies"]["default_policy"]
        trainer.train()
        trainer.restore(path)
        learners = trainer.workers.learner_group
        assert learners is not None
        import ray

        restored = ray.get(learners.learners[1].get_learner_state.remote())
        for name, weight in saved["weights"].items():
            np.testing.assert_array_equal(restored["weights"][name], weight, err_msg=name)
        assert restored["optimizer"]["state"][0]["step"] == saved["optimizer"]["state"][0]["step"] == 16  # 2 x 2 x 4

        trainer.train()  # the learners' Adam at 24 steps, the driver's copy of it still at 16 (read at save time)
        ray.kill(learners.learners[0])  # a learner dies: it is replaced and takes the survivor's learner state
        trainer.train()
        states = ray.get([learner.get_learner_state.remote() for learner in learners.learners])
        for name, weight in states[0]["weights"].items():
            np.testing.assert_array_equal(states[1]["weights"][name], weight, err_msg=name)
        assert states[0]["optimizer"]["state"][0]["step"] == states[1]["optimizer"]["state"][0]["step"] >= 24 + 8
    finally:
        trainer.stop()


@pytest.mark.parametrize(("settings", "message"), [
    ({"num_gpus_per_learner": 0.5, "num_learners": 2}, r"num_gpus_per_learner=0.5: learners that share a GPU"),
    ({"num_gpus_per_learner": 1}, r"num_gpus_per_learner=1 with num_learners=1: .* set num_gpus=1 instead"),
    ({"num_learners": 2, "num_gpus": 1}, r"num_learners=2 with num_gpus=1: .* num_gpus_per_learner=1"),
    ({"num_learners": 2, "executor": "local"}, r"num_learners=2 with executor='local': .* use executor='ray'"),
    ({"num_learners": 2, "model": ModelConfig(use_lstm=True)}, r"num_learners=2 with model.use_lstm=True"),
    ({"num_learners": 2, "simple_optimizer": False}, r"num_learners=2 with simple_optimizer=False"),
    ({"num_learners": 0}, r"num_learners=0"),
])
def test_bad_learner_settings_are_refused_when_the_config_is_built(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PPOConfig(**settings)


def test_a_policy_with_a_driver_updated_target_network_cannot_learn_in_a_group() -> None:
    with pytest.raises(ValueError, match=r"num_learners=2: APPOPolicy cannot learn in a learner group .* set "
                                         r"num_learners=1"):
        WorkerSet(policy_class=APPOPolicy, config=APPOConfig(env="CartPole-v1", num_workers=0, num_learners=2))


@pytest.mark.parametrize(("settings", "message"), [
    ({"num_learners": 40}, r"num_workers=0 x 1 CPU per worker \+ num_learners=40 x 1 CPU per learner needs 40 CPU "
                           r"but the Ray cluster has 8; lower num_workers or num_cpus_per_worker or num_learners or "
                           r"num_cpus_per_learner"),
    ({"num_workers": 2, "num_gpus_per_worker": 0.5}, r"num_workers=2 x 0.5 GPU per worker needs 1 GPU but the Ray "
                                                     r"cluster has 0"),
])
def test_resources_beyond_the_cluster_are_named_before_any_actor_starts(settings: dict[str, Any],
                                                                       message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkerSet(policy_class=PPOPolicy, config=PPOConfig(env="CartPole-v1", **{"num_workers": 0, **settings}))


def test_impalas_learner_group_cuts_between_trajectory_pieces_and_takes_the_lone_learners_step() -> None:
    settings = {"env": "CartPole-v1", "num_workers": 0, "seed": 3, "num_envs_per_worker": 4,
                "rollout_fragment_length": 50, "num_cpus_per_learner": 0.5}
    alone = WorkerSet(policy_class=IMPALAPolicy, config=IMPALAConfig(**settings))
    grouped = WorkerSet(policy_class=IMPALAPolicy, config=IMPALAConfig(**settings, num_learners=2))
    try:
        batch = alone.local_worker().sample()  # 4 envs' fragments of 50 rows, one after the other
        policy = alone.local_worker().get_policy()
        cut = [len(share) for share in policy.group_shares(batch, np.arange(200), 2)]
        assert cut == [100, 100]  # at the boundary between the 2nd and the 3rd env's fragments
        for workers in (alone, grouped):
            for _ in range(2):  # as IMPALA's learner thread does: the whole batch, one step
                workers.local_worker().learn_on_batch(batch)
        a, b = (w.local_worker().get_weights()["default_policy"] for w in (alone, grouped))
        for name in a:
            np.testing.assert_allclose(b[name], a[name], atol=1e-6, err_msg=name)
    finally:
        alone.stop()
        grouped.stop()


def test_impala_refuses_advantages_standardized_per_share() -> None:
    with pytest.raises(ValueError, match=r"normalize_advantages=True with num_learners=2: each learner would "
                                         r"standardize its share"):
        IMPALAConfig(num_learners=2, normalize_advantages=True)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_defaults_with_two_learners_pass_the_cartpole_gate(algo: str) -> None:
    """IMPALA's learner thread and PPO's TrainOneStep hand their steps to 2 learners; the defaults still reach
    RLlib's CartPole gate within half its budget (PPO's with its tuned preset's learning rate and epochs)."""
    settings: dict[str, Any] = {"env": "CartPole-v1", "seed": 101, "num_workers": 2, "num_learners": 2,
                                "num_cpus_per_learner": 0.5}
    if algo == "ppo":
        config: Any = PPOConfig(**settings, lr=3e-4, num_sgd_iter=6)
        budget = 50_000
    else:
        config, budget = IMPALAConfig(**settings), 250_000
    trainer = Trainer(algo, config)
    try:
        result = trainer.train()
        while result.get("episode_reward_mean", 0.0) < 150 and result["timesteps_total"] < budget:
            result = trainer.train()
    finally:
        trainer.stop()
    print(f"{algo} with 2 learners: {result.get('episode_reward_mean', 0.0):.1f} at {result['timesteps_total']}")
    assert result["episode_reward_mean"] >= 150 and result["timesteps_total"] <= budget
