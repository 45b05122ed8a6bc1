"""ContinuousQModel: stacked critics that compute what independent MLPs compute, load the earlier one-Linear-per-layer
state dicts, keep each critic's gradient its own; the MLPs' in-place activations keep gradients exact."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from torch import nn

from flowrl.algorithms.ddpg import DDPGConfig, DDPGPolicy
from flowrl.config import ModelConfig
from flowrl.models import ActorModel, ContinuousQModel

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

OBS_SPACE = gym.spaces.Box(-1, 1, (3,))


def legacy_critics(num_q: int, hidden: tuple[int, ...], activation: type[nn.Module]) -> nn.Module:
    """The layout ContinuousQModel had before its layers were stacked: one Sequential per critic."""
    sizes = [3 + 2, *hidden]
    module = nn.Module()
    module.critics = nn.ModuleList(
        nn.Sequential(nn.Sequential(*[m for a, b in zip(sizes[:-1], sizes[1:]) for m in (nn.Linear(a, b), activation())]),
                      nn.Linear(sizes[-1], 1)) for _ in range(num_q))
    return module


def legacy_forward(module: nn.Module, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    x = torch.cat([obs, actions], dim=-1)
    return torch.stack([critic(x).squeeze(-1) for critic in module.critics])


@pytest.mark.parametrize("activation, act_class", [("relu", nn.ReLU), ("tanh", nn.Tanh), ("elu", nn.ELU)])
@pytest.mark.parametrize("num_q", [1, 2, 3])
def test_a_state_dict_of_one_linear_per_layer_loads_and_gives_the_same_q(activation: str, act_class: type[nn.Module],
                                                                       num_q: int) -> None:
    torch.manual_seed(0)
    old = legacy_critics(num_q, (8, 6), act_class)
    new = ContinuousQModel(OBS_SPACE, 2, ModelConfig(hidden_sizes=(8, 6), activation=activation), num_q=num_q)
    new.load_state_dict(old.state_dict())
    assert sorted(new.state_dict()) == ["biases.0", "biases.1", "biases.2", "weights.0", "weights.1", "weights.2"]
    obs, actions = torch.randn(5, 3), torch.randn(5, 2)
    expected = legacy_forward(old, obs, actions)
    got = new(obs, actions)
    torch.testing.assert_close(got, expected if num_q > 1 else expected[0])
    for k in range(num_q):
        torch.testing.assert_close(new.single(obs, actions, k), expected[k])


def test_a_state_dict_of_another_shape_is_still_refused() -> None:
    new = ContinuousQModel(OBS_SPACE, 2, ModelConfig(hidden_sizes=(8, 6)), num_q=2)
    with pytest.raises(RuntimeError, match="size mismatch"):
        new.load_state_dict(legacy_critics(2, (8, 7), nn.ReLU).state_dict())


def test_each_critic_gets_only_its_own_losss_gradient() -> None:
    torch.manual_seed(1)
    q = ContinuousQModel(OBS_SPACE, 2, ModelConfig(hidden_sizes=(8, 8)), num_q=2)
    q(torch.randn(4, 3), torch.randn(4, 2))[1].sum().backward()
    for param in q.parameters():
        assert param.grad is not None
        assert torch.count_nonzero(param.grad[0]) == 0 and torch.count_nonzero(param.grad[1]) > 0


def test_the_critics_start_as_nn_linear_starts_them() -> None:
    """Per layer, weights and biases drawn uniformly from +-1/sqrt(fan_in), as nn.Linear's default."""
    torch.manual_seed(2)
    q = ContinuousQModel(OBS_SPACE, 1, ModelConfig(hidden_sizes=(256, 256)), num_q=2)
    for w, b, fan_in in zip(q.weights, q.biases, (4, 256, 256)):
        bound = fan_in ** -0.5
        assert w.abs().max() <= bound and b.abs().max() <= bound
        assert w.abs().max() > 0.9 * bound and w[0].std() > 0.5 * bound  # spread over the range, not clustered
        assert not torch.equal(w[0], w[1])  # two different critics


@pytest.mark.parametrize("activation", ["relu", "elu", "tanh"])
def test_in_place_activations_give_the_same_gradients_as_out_of_place_ones(activation: str) -> None:
    torch.manual_seed(3)
    model = ActorModel(OBS_SPACE, 2, ModelConfig(hidden_sizes=(16, 16), activation=activation))
    obs = torch.randn(6, 3)
    model(obs).square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    functional = {"relu": torch.relu, "elu": nn.functional.elu, "tanh": torch.tanh}[activation]
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    x = obs
    for layer in linears[:-1]:
        x = functional(layer(x))
    expected = torch.autograd.grad(linears[-1](x).square().sum(), list(model.parameters()))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)


def test_ddpgs_l2_penalty_counts_the_weight_matrices_of_every_critic_and_no_bias() -> None:
    config = DDPGConfig(seed=0, actor_hiddens=(8,), critic_hiddens=(8,), l2_reg=0.5, twin_q=True)
    policy = DDPGPolicy(OBS_SPACE, gym.spaces.Box(-1, 1, (2,)), config)
    critic = policy.critic
    expected = 0.5 * 0.5 * sum(w.pow(2).sum() for w in critic.weights)
    torch.testing.assert_close(policy._l2("critic"), expected)
    actor_weights = [m.weight for m in policy.actor.modules() if isinstance(m, nn.Linear)]
    torch.testing.assert_close(policy._l2("actor"), 0.5 * 0.5 * sum(w.pow(2).sum() for w in actor_weights))
