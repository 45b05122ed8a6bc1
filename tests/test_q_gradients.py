"""QGradients (flowrl/q_gradients.py): DQN's loss gradients derived by hand equal autograd's, and where it does not
apply the policy learns through autograd."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from flowrl.algorithms.cql_dqn import CQLDQNConfig, CQLDQNPolicy
from flowrl.algorithms.dqn import NSTEP_DISCOUNTS, DQNConfig, DQNPolicy
from flowrl.config import ModelConfig
from flowrl.models import QModel
from flowrl.q_gradients import QGradients
from flowrl.sample_batch import ACTIONS, NEXT_OBS, OBS, REWARDS, TD_ERROR, TERMINATEDS, WEIGHTS, SampleBatch

OBS_SPACE = gym.spaces.Box(-1, 1, (2, 3))  # a multi-dimensional observation: the encoder flattens it


def policy_pair(**settings: Any) -> tuple[DQNPolicy, DQNPolicy]:
    """Two policies with the same weights (a target network unlike the online one): by hand, and by autograd."""
    config = {"seed": 3, "model": ModelConfig(hidden_sizes=(12, 10)), "hiddens": (8,), **settings}
    manual = DQNPolicy(OBS_SPACE, gym.spaces.Discrete(3), DQNConfig(**config))
    auto = DQNPolicy(OBS_SPACE, gym.spaces.Discrete(3), DQNConfig(**{**config, "manual_gradients": False}))
    with torch.no_grad():
        for p in manual.target_model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    auto.set_state(manual.get_state())
    assert manual.q_gradients is not None and auto.q_gradients is None
    return manual, auto


def batch(rng: np.random.Generator, rows: int = 19, weights: bool = False, nstep: bool = True) -> SampleBatch:
    columns = {OBS: rng.normal(size=(rows, 2, 3)).astype(np.float32),
               NEXT_OBS: rng.normal(size=(rows, 2, 3)).astype(np.float32), ACTIONS: rng.integers(3, size=rows),
               REWARDS: rng.normal(0, 3, rows).astype(np.float32), TERMINATEDS: rng.random(rows) < 0.3}
    if nstep:
        columns[NSTEP_DISCOUNTS] = np.where(columns[TERMINATEDS], 0.0, rng.uniform(0.5, 1.0, rows)).astype(np.float32)
    if weights:
        columns[WEIGHTS] = rng.uniform(0.1, 1.0, rows).astype(np.float32)
    return SampleBatch(columns)


def assert_same_gradients(manual: DQNPolicy, auto: DQNPolicy, tensors: dict[str, torch.Tensor]) -> None:
    loss_m, stats_m = manual._loss_and_gradients(tensors)
    td_m = manual._td_error
    loss_a, stats_a = auto._loss_and_gradients(tensors)
    assert loss_m == pytest.approx(loss_a, rel=1e-5, abs=1e-6)
    np.testing.assert_allclose(td_m, auto._td_error, rtol=1e-5, atol=1e-5)
    assert stats_m.keys() == stats_a.keys()
    for key in stats_a:
        assert stats_m[key] == pytest.approx(stats_a[key], rel=1e-5, abs=1e-5), key
    for (name, p_m), p_a in zip(manual.model.named_parameters(), auto.model.parameters()):
        assert p_m.grad is not None and p_a.grad is not None and p_m.grad.shape == p_a.grad.shape, name
        scale = float(p_a.grad.abs().max()) + 1e-3
        assert float((p_m.grad - p_a.grad).abs().max()) <= 2e-5 * scale, name


@pytest.mark.parametrize("activation, dueling, hiddens", list(itertools.product(
    ["tanh", "relu", "elu"], [False, True], [(), (8,), (8, 6)])))
@pytest.mark.parametrize("double_q", [False, True])
def test_gradients_equal_autograds(activation: str, dueling: bool, hiddens: tuple[int, ...], double_q: bool) -> None:
    manual, auto = policy_pair(model=ModelConfig(hidden_sizes=(12, 10), activation=activation), dueling=dueling,
                               hiddens=hiddens, double_q=double_q)
    rng = np.random.default_rng(len(hiddens) + 10 * dueling)
    for weights, nstep in [(False, False), (True, True)]:
        b = batch(rng, weights=weights, nstep=nstep)
        assert np.abs(manual.q_values(b[OBS])).max() > 0  # (a network that computes something)
        assert_same_gradients(manual, auto, manual.to_tensors(b))


def test_both_huber_branches_and_relu_kinks_are_exercised() -> None:
    """The test above is only worth something if the batches cross the Huber threshold and some ReLUs are off."""
    manual, _ = policy_pair(model=ModelConfig(hidden_sizes=(12, 10), activation="relu"))
    b = batch(np.random.default_rng(0))
    manual._loss_and_gradients(manual.to_tensors(b))
    td = np.abs(manual._td_error)
    assert td.max() > 1.0 > td.min()
    with torch.no_grad():
        hidden = manual.model.torso(torch.as_tensor(b[OBS]).flatten(1))
    assert 0.1 < float((hidden == 0).float().mean()) < 0.9


def test_a_step_sequence_learns_the_same_weights_as_autograd() -> None:
    manual, auto = policy_pair(lr=0.01, grad_clip=1.0)  # clipping on most steps
    rng = np.random.default_rng(4)
    for _ in range(25):
        b = batch(rng, weights=True)
        info_m, info_a = manual.learn_on_batch(b), auto.learn_on_batch(b)
        np.testing.assert_allclose(info_m[TD_ERROR], info_a[TD_ERROR], rtol=1e-4, atol=1e-4)
    for (name, value), other in zip(manual.model.state_dict().items(), auto.model.state_dict().values()):
        np.testing.assert_allclose(value.numpy(), other.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    assert manual.weights_version == auto.weights_version == 25


def test_compute_gradients_and_the_unclipped_path_use_it_too() -> None:
    manual, auto = policy_pair(grad_clip=None)
    b = batch(np.random.default_rng(5))
    grads_m, info_m = manual.compute_gradients(b)
    grads_a, info_a = auto.compute_gradients(b)
    for g_m, g_a in zip(grads_m, grads_a):
        np.testing.assert_allclose(g_m, g_a, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(info_m[TD_ERROR], info_a[TD_ERROR], rtol=1e-5, atol=1e-5)
    calls = count_kernel_calls(manual)
    manual.compute_gradients(b)
    manual.learn_on_batch(b)  # grad_clip None: Policy.learn_on_tensors, through DQNPolicy._backward
    assert calls == [1, 1]


def count_kernel_calls(policy: DQNPolicy) -> list[int]:
    """Wraps the policy's kernel so that each call appends to the returned list."""
    calls: list[int] = []
    kernel = policy.q_gradients
    assert kernel is not None

    class Counting(QGradients):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            return super().__call__(*args, **kwargs)

    counting = copy.copy(kernel)
    counting.__class__ = Counting
    policy.q_gradients = counting
    return calls


def test_the_kernel_is_really_used_and_leaves_parameters_alone() -> None:
    manual, _ = policy_pair()
    calls = count_kernel_calls(manual)
    before = [p.detach().clone() for p in manual.model.parameters()]
    tensors = manual.to_tensors(batch(np.random.default_rng(6)))
    manual._loss_and_gradients(tensors)
    assert calls == [1]
    assert all(torch.equal(a, p) for a, p in zip(before, manual.model.parameters()))
    manual.learn_on_batch(batch(np.random.default_rng(7)))
    assert calls == [1, 1]


def test_a_nonfinite_batch_is_skipped_through_the_kernel() -> None:
    manual, _ = policy_pair()
    b = batch(np.random.default_rng(8))
    b[REWARDS][2] = np.nan
    before = {k: v.clone() for k, v in manual.model.state_dict().items()}
    info = manual.learn_on_batch(b)
    assert manual.num_nonfinite_updates_skipped == 1 and info[TD_ERROR][2] == 0.0
    assert all(torch.equal(before[k], v) for k, v in manual.model.state_dict().items())


def test_a_policy_with_its_own_loss_learns_through_autograd() -> None:
    """CQL-DQN adds a term to DQN's loss: the kernel, which knows only DQN's, must not be used for it."""
    policy = CQLDQNPolicy(OBS_SPACE, gym.spaces.Discrete(3), CQLDQNConfig(seed=0, model=ModelConfig(hidden_sizes=(8,))))
    assert policy.q_gradients is not None  # built, as for any plain MLP QModel ...

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the kernel computed CQL-DQN's gradients")

    policy.q_gradients = refuse  # type: ignore[assignment]
    policy.learn_on_batch(batch(np.random.default_rng(9)))  # ... but not called
    assert policy.weights_version == 1


def test_manual_gradients_off_and_swapped_models_use_autograd() -> None:
    policy = DQNPolicy(OBS_SPACE, gym.spaces.Discrete(3), DQNConfig(seed=0, manual_gradients=False))
    assert policy.q_gradients is None
    manual, auto = policy_pair()
    manual.target_model = copy.deepcopy(manual.target_model)  # not the network the kernel was built for
    assert_same_gradients(manual, auto, manual.to_tensors(batch(np.random.default_rng(10))))


def q_model(**kwargs: Any) -> QModel:
    return QModel(gym.spaces.Box(-1, 1, (4,)), 2, ModelConfig(**{"hidden_sizes": (8,), **kwargs}), hiddens=(),
                  dueling=False)


def test_build_refuses_what_it_does_not_mirror() -> None:
    plain = q_model()
    assert QGradients.build(plain, copy.deepcopy(plain)) is not None
    image = QModel(gym.spaces.Box(0, 255, (12, 12, 3), np.uint8), 2,
                   ModelConfig(hidden_sizes=(8,), conv_filters=((4, 3, 2),)), hiddens=(), dueling=False)
    assert QGradients.build(image, copy.deepcopy(image)) is None  # a CNN

    class Custom(QModel):
        pass

    custom = Custom(gym.spaces.Box(-1, 1, (4,)), 2, ModelConfig(hidden_sizes=(8,)), hiddens=(), dueling=False)
    assert QGradients.build(custom, copy.deepcopy(custom)) is None  # a subclass may compute anything
    double = q_model().double()
    assert QGradients.build(double, copy.deepcopy(double)) is None
    elu = q_model(activation="elu")
    elu.torso[1] = nn.ELU(alpha=0.5)
    assert QGradients.build(elu, copy.deepcopy(elu)) is None
    sigmoid = q_model()
    sigmoid.torso[1] = nn.Sigmoid()
    assert QGradients.build(sigmoid, copy.deepcopy(sigmoid)) is None
    extra = q_model()
    extra.scale = nn.Parameter(torch.ones(1))  # a parameter the kernel would not give a gradient
    assert QGradients.build(extra, copy.deepcopy(extra)) is None
    assert QGradients.build(plain, image) is None  # the target network is checked too
