"""DD-PPO: build-time errors, and on Ray (its workers form a gloo process group on loopback): the weights stay
identical on every worker and the driver, the counts, the plan graph, a NaN update skipped by the whole group, the
observation filter shared bit for bit, and a member that fell behind catching up when the group re-forms."""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np
import pytest

from flowrl import executor, plan_graph
from flowrl.algorithms.ddppo import ALGORITHM, DDPPOConfig
from flowrl.collective import Rendezvous
from flowrl.config import ModelConfig
from flowrl.ops import form_process_group
from flowrl.trainer import Trainer
from flowrl.workers import OBS_FILTER_KEY

SMALL = {"env": "CartPole-v1", "num_workers": 2, "num_envs_per_worker": 2, "rollout_fragment_length": 50,
         "sgd_minibatch_size": 25, "num_sgd_iter": 2, "seed": 0, "lr": 1e-3, "num_cpus_per_worker": 0.5}


@pytest.mark.parametrize(("settings", "message"), [
    ({"num_workers": 1}, r"num_workers=1: DD-PPO's workers learn together, each in its own process, so it needs at "
                         r"least 2; set num_workers=2"),
    ({"executor": "local"}, r"executor='local': .* use executor='ray'"),
    ({"batch_mode": "complete_episodes"}, r"batch_mode='complete_episodes': .* use batch_mode='truncate_episodes'"),
    ({"collective_backend": "mpi"}, r"collective_backend='mpi' is not one of \('gloo', 'nccl'\)"),
    ({"collective_backend": "nccl"}, r"collective_backend='nccl' .* num_gpus_per_worker=0 and device='cpu'; set "
                                     r"num_gpus_per_worker=1 and device='cuda'"),
    ({"num_gpus": 1}, r"num_gpus=1, num_learners=1: DD-PPO has no central learner .* num_gpus_per_worker=1"),
    ({"num_learners": 2}, r"num_gpus=0, num_learners=2: DD-PPO has no central learner"),
    ({"sgd_minibatch_size": 600}, r"sgd_minibatch_size=600 exceeds each worker's batch of rollout_fragment_length x "
                                  r"num_envs_per_worker = 500 rows"),
    ({"collective_timeout_s": 0.0}, r"collective_timeout_s=0.0"),
    ({"model": ModelConfig(use_lstm=True)}, r"use_lstm"),
])
def test_bad_settings_are_refused_when_the_config_is_built(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DDPPOConfig(**{"num_workers": 2, **settings})


def test_a_round_is_every_workers_fragment_and_train_batch_size_is_not_used() -> None:
    config = DDPPOConfig(num_workers=3, rollout_fragment_length=40, num_envs_per_worker=2, train_batch_size=7)
    assert config.actual_train_batch_size == 240 and config.train_batch_size_warning() is None


def test_a_rendezvous_names_its_field_and_value() -> None:
    with pytest.raises(ValueError, match=r"timeout_s=inf must be a finite number of seconds"):
        Rendezvous("127.0.0.1", 1, world_size=2, backend="gloo", timeout_s=math.inf)


def test_the_local_executor_cannot_form_a_group() -> None:
    from flowrl.testing import make_fake_workers

    with pytest.raises(ValueError, match="at least 2 remote workers"):
        form_process_group(make_fake_workers(1))


# -- on Ray ----------------------------------------------------------------------------------------------------

def _worker_weights(trainer: Trainer) -> list[dict[str, np.ndarray]]:
    weights = executor.get([w.get_weights.remote() for w in trainer.workers.remote_workers()])
    return [w["default_policy"] for w in weights]


def _assert_identical(trainer: Trainer) -> None:
    """Every worker's weights (and filter statistics) equal bit for bit, and the driver's copy equal to them."""
    first, *others = _worker_weights(trainer)
    for other in others:
        assert first.keys() == other.keys()
        for name in first:
            np.testing.assert_array_equal(first[name], other[name], err_msg=name)
    local = trainer.workers.local_worker().get_weights()["default_policy"]
    for name in local:
        np.testing.assert_array_equal(local[name], first[name], err_msg=name)


@pytest.fixture(scope="module")
def trainer() -> Iterator[Trainer]:
    trainer = Trainer("ddppo", DDPPOConfig(**SMALL, observation_filter="MeanStdFilter"))
    yield trainer
    trainer.stop()


def test_the_weights_and_filters_are_identical_everywhere_after_every_round(trainer: Trainer) -> None:
    start = _worker_weights(trainer)[0]
    for i in range(3):
        result = trainer.train()
        assert result["info"]["num_steps_sampled"] == result["info"]["num_steps_trained"] == 200 * (i + 1)
        _assert_identical(trainer)
    assert OBS_FILTER_KEY in start
    after = _worker_weights(trainer)[0]
    assert not np.array_equal(after["__obs_filter__"], start["__obs_filter__"])  # the filter learned, together
    assert any(not np.array_equal(after[n], start[n]) for n in after if n != OBS_FILTER_KEY)  # and the weights
    stats = result["info"]["learner"]["default_policy"]["learner_stats"]
    assert {"total_loss", "kl", "entropy"} <= set(stats)


def test_a_restore_in_a_live_trainer_restores_the_groups_filter_too(trainer: Trainer, tmp_path: Any) -> None:
    def count() -> float:
        return float(_worker_weights(trainer)[0][OBS_FILTER_KEY][0])  # the filter's count of observations

    trainer.train()
    path, saved = trainer.save(tmp_path), count()
    for _ in range(2):
        trainer.train()
    later = count()
    trainer.restore(path)
    trainer.train()
    _assert_identical(trainer)
    assert saved < count() < later  # one round on the restored statistics, not on those before the restore


def test_the_trainers_graph_is_the_stand_in_plans(trainer: Trainer) -> None:
    trained = plan_graph.to_text(plan_graph.build(trainer.plan))
    with plan_graph.stand_in_plan(ALGORITHM, trainer.config) as plan:
        assert plan_graph.to_text(plan_graph.build(plan)) == trained
    assert "AllReduceTrainOneStep" in trained and "(2 shards)" in trained


def _poison_loss(worker: Any) -> None:
    policy = worker.get_policy()
    loss = type(policy).loss

    def nan_loss(batch: Any) -> Any:
        total, stats = loss(policy, batch)
        return total * float("nan"), stats

    policy.loss = nan_loss


def _restore_loss(worker: Any) -> int:
    policy = worker.get_policy()
    policy.__dict__.pop("loss", None)
    return int(policy.num_nonfinite_updates_skipped)


def test_a_nan_gradient_on_one_worker_is_skipped_by_the_whole_group(trainer: Trainer) -> None:
    trainer.train()
    before = _worker_weights(trainer)
    first = trainer.workers.remote_workers()[0]
    executor.get(first.apply.remote(_poison_loss))
    trainer.train()  # worker 1's gradients are NaN, so the group's mean is: every member skips every step
    skipped = executor.get([w.apply.remote(_restore_loss) for w in trainer.workers.remote_workers()])
    assert skipped[0] == skipped[1] == 8  # 2 epochs x 4 minibatches of 25 of its 100 rows, on both workers
    after = _worker_weights(trainer)
    for b, a in zip(before, after):
        for name in b:
            if name != OBS_FILTER_KEY:
                np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    trainer.train()  # finite again: both learn, equally
    _assert_identical(trainer)
    assert any(not np.array_equal(_worker_weights(trainer)[0][n], before[0][n]) for n in before[0])


def _fall_behind(worker: Any) -> None:
    """As a fresh replacement would be: other weights, a fresh optimizer, version 0."""
    policy = worker.get_policy()
    fresh = type(policy)(policy.observation_space, policy.action_space, policy.config)
    policy.set_learner_state(fresh.get_learner_state())
    policy.weights_version = 0


def _adam_steps(worker: Any) -> int:
    """How many steps the policy's Adam took (0 for a fresh one)."""
    state = worker.get_policy().optimizer.state_dict()["state"]
    return int(state[0]["step"]) if state else 0


def _steps_everywhere(trainer: Trainer) -> list[int]:
    return executor.get([w.apply.remote(_adam_steps) for w in trainer.workers.remote_workers()])


def test_a_member_that_fell_behind_adopts_the_groups_state_when_the_group_re_forms(trainer: Trainer) -> None:
    trainer.train()
    ahead = _worker_weights(trainer)[1]
    [steps, _] = _steps_everywhere(trainer)
    first = trainer.workers.remote_workers()[0]  # rank 0 falls behind: the group must not follow it
    executor.get(first.apply.remote(_fall_behind))
    assert _steps_everywhere(trainer)[0] == 0
    assert not np.array_equal(_worker_weights(trainer)[0]["pi_trunk.0.weight"], ahead["pi_trunk.0.weight"])
    form_process_group(trainer.workers, timeout_s=30.0)  # as a rebuilt plan does
    trainer.train()
    _assert_identical(trainer)
    # every member went on from the state that was ahead: its optimizer's steps, plus one round's 8
    assert _steps_everywhere(trainer) == [steps + 8, steps + 8]


def test_a_killed_worker_is_replaced_and_the_new_one_adopts_the_groups_state(trainer: Trainer) -> None:
    """The survivor's all-reduce loses its peer (PeerLostError), the trainer replaces the dead worker and re-forms
    the group, and the replacement takes the survivor's weights, optimizer and filter instead of its fresh ones."""
    import ray

    trainer.train()
    [_, steps] = _steps_everywhere(trainer)
    ray.kill(trainer.workers.remote_workers()[0])  # rank 0: its replacement is the member behind
    trainer.train()
    _assert_identical(trainer)
    assert _steps_everywhere(trainer) == [steps + 8, steps + 8]  # the survivor's optimizer went on, everywhere
