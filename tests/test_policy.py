"""Torch models, action distributions and the Policy base: acting, learning, weights and state."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.models import Categorical, DiagGaussian, ModelConfig, make_model
from flowrl.policy import Policy, PolicyConfig, TensorBatch, step_adam
from flowrl.sample_batch import ACTIONS, OBS, REWARDS, SampleBatch

BOX4 = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)


class ReinforcePolicy(Policy):
    """The smallest real loss: -logp(a) * reward."""

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        dist_inputs, _ = self.model(batch[OBS])
        logp = self.action_distribution(dist_inputs).logp(batch[ACTIONS])
        return -(logp * batch[REWARDS]).mean(), {"mean_logp": float(logp.detach().mean())}


def make_policy(action_space: gym.Space[Any] = gym.spaces.Discrete(3), **kwargs: Any) -> ReinforcePolicy:
    return ReinforcePolicy(BOX4, action_space, PolicyConfig(seed=1, model=ModelConfig(hidden_sizes=(16,)), **kwargs))


def batch_for(policy: Policy, n: int = 32, seed: int = 0) -> SampleBatch:
    obs = np.random.default_rng(seed).uniform(-1, 1, (n, 4)).astype(np.float32)
    actions, _ = policy.compute_actions(obs)
    return SampleBatch({OBS: obs, ACTIONS: actions, REWARDS: np.linspace(-1, 1, n, dtype=np.float32)})


def test_categorical_matches_torch_distributions() -> None:
    logits = torch.randn(5, 3)
    ours, ref = Categorical(logits), torch.distributions.Categorical(logits=logits)
    actions = torch.tensor([0, 1, 2, 1, 0])
    torch.testing.assert_close(ours.logp(actions), ref.log_prob(actions))
    torch.testing.assert_close(ours.entropy(), ref.entropy())
    other = torch.randn(5, 3)
    torch.testing.assert_close(ours.kl(Categorical(other)), torch.distributions.kl_divergence(
        ref, torch.distributions.Categorical(logits=other)))
    counts = np.bincount(Categorical(torch.tensor([[0.0, np.log(3.0)]]).expand(4000, 2)).sample(
        torch.Generator().manual_seed(0)).numpy(), minlength=2)
    assert 0.72 < counts[1] / 4000 < 0.78  # p = 0.75


def test_diag_gaussian_matches_torch_distributions() -> None:
    mean, log_std = torch.randn(6, 2), torch.randn(6, 2) * 0.3
    ours = DiagGaussian(torch.cat([mean, log_std], -1))
    ref = torch.distributions.Independent(torch.distributions.Normal(mean, log_std.exp()), 1)
    x = torch.randn(6, 2)
    torch.testing.assert_close(ours.logp(x), ref.log_prob(x))
    torch.testing.assert_close(ours.entropy(), ref.entropy())
    m2, s2 = torch.randn(6, 2), torch.randn(6, 2) * 0.3
    ref2 = torch.distributions.Independent(torch.distributions.Normal(m2, s2.exp()), 1)
    torch.testing.assert_close(ours.kl(DiagGaussian(torch.cat([m2, s2], -1))), torch.distributions.kl_divergence(ref, ref2))


def test_models_for_vectors_images_and_continuous_actions() -> None:
    image = gym.spaces.Box(0, 255, (42, 42, 3), np.uint8)
    model = make_model(image, gym.spaces.Discrete(4), ModelConfig(hidden_sizes=(32,)))
    logits, values = model(torch.zeros(2, 42, 42, 3, dtype=torch.uint8))
    assert logits.shape == (2, 4) and values.shape == (2,)
    shared = make_model(BOX4, gym.spaces.Box(-1, 1, (2,)), ModelConfig(vf_share_layers=True))
    inputs, _ = shared(torch.zeros(3, 4))
    assert inputs.shape == (3, 4) and shared.vf_trunk is None
    policy = make_policy(gym.spaces.Box(-2, 2, (2,), np.float32))
    actions, extra = policy.compute_actions(np.zeros((5, 4), np.float32))
    assert actions.shape == (5, 2) and extra["logp"].shape == (5,)


@pytest.mark.parametrize("space", [gym.spaces.Discrete(5), gym.spaces.Dict({"a": BOX4}),
                                   gym.spaces.Box(0, 1, (1, 2, 3, 4))])
def test_unsupported_observation_spaces_are_named(space: gym.Space[Any]) -> None:
    with pytest.raises(ValueError, match="observation space .* is not supported"):
        make_model(space, gym.spaces.Discrete(2), ModelConfig())


def test_unsupported_action_space_and_bad_configs() -> None:
    with pytest.raises(ValueError, match="action space"):
        make_model(BOX4, gym.spaces.MultiBinary(3), ModelConfig())
    with pytest.raises(ValueError, match="hidden_sizes"):
        ModelConfig(hidden_sizes=(0,))
    with pytest.raises(ValueError, match="activation"):
        ModelConfig(activation="gelu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lr"):
        PolicyConfig(lr=0)
    with pytest.raises(ValueError, match="conv_filters"):
        make_model(gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), gym.spaces.Discrete(2),
                   ModelConfig(conv_filters=((16, 8, 4), (32, 4, 2))))


def test_seeded_policies_act_identically() -> None:
    obs = np.zeros((64, 4), np.float32)
    a, b = make_policy(), make_policy()
    assert np.array_equal(a.compute_actions(obs)[0], b.compute_actions(obs)[0])
    greedy, _ = a.compute_actions(obs, explore=False)
    assert len(set(greedy.tolist())) == 1


def test_weights_round_trip_and_mismatches_are_named() -> None:
    a, b = make_policy(), ReinforcePolicy(BOX4, gym.spaces.Discrete(3), PolicyConfig(seed=2, model=ModelConfig(hidden_sizes=(16,))))
    assert not all(np.array_equal(x, y) for x, y in zip(a.get_weights().values(), b.get_weights().values()))
    b.set_weights(a.get_weights())
    for key, value in a.get_weights().items():
        assert np.array_equal(value, b.get_weights()[key])
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    np.testing.assert_array_equal(a.value(obs), b.value(obs))
    with pytest.raises(ValueError, match="names differ"):
        b.set_weights({"nope": np.zeros(1)})


def test_learning_changes_weights_and_gradients_path_equals_learn_on_batch() -> None:
    a, b = make_policy(), make_policy()
    batch = batch_for(a)
    before = a.get_weights()
    info = a.learn_on_batch(batch)
    assert set(info["learner_stats"]) >= {"loss", "mean_logp"}
    assert any(not np.array_equal(before[k], v) for k, v in a.get_weights().items())
    grads, _ = b.compute_gradients(batch)
    b.apply_gradients(grads)
    for key, value in a.get_weights().items():
        np.testing.assert_allclose(value, b.get_weights()[key], rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="compute_gradients"):
        b.apply_gradients(grads[:1])


def test_grad_clip_bounds_the_norm() -> None:
    policy = make_policy(grad_clip=1e-3)
    grads, info = policy.compute_gradients(batch_for(policy))
    assert np.sqrt(sum(float((g ** 2).sum()) for g in grads)) <= 1e-3 * 1.001
    assert info["learner_stats"]["grad_gnorm"] > 1e-3


def test_state_restores_optimizer_and_rngs() -> None:
    a = make_policy()
    a.learn_on_batch(batch_for(a))
    state = a.get_state()
    obs = np.zeros((16, 4), np.float32)
    a.learn_on_batch(batch_for(a, seed=1))
    next_actions = a.compute_actions(obs)[0]
    next_weights = a.get_weights()
    b = make_policy()
    b.set_state(state)
    b.learn_on_batch(batch_for(b, seed=1))  # same Adam moments, same RNG draws
    assert np.array_equal(b.compute_actions(obs)[0], next_actions)
    for key, value in next_weights.items():
        np.testing.assert_allclose(b.get_weights()[key], value, rtol=1e-6, atol=1e-7)


def test_base_policy_has_no_loss_and_cuda_is_checked() -> None:
    policy = Policy(BOX4, gym.spaces.Discrete(2), PolicyConfig())
    with pytest.raises(NotImplementedError, match="override"):
        policy.learn_on_batch(batch_for(policy))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA device"):
            Policy(BOX4, gym.spaces.Discrete(2), PolicyConfig(device="cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_policy_learns_on_cuda_and_returns_cpu_numpy() -> None:
    policy = make_policy(device="cuda")
    batch = batch_for(policy)
    policy.learn_on_batch(batch)
    assert all(isinstance(v, np.ndarray) for v in policy.get_weights().values())
    cpu = make_policy()
    cpu.set_weights(policy.get_weights())
    cpu.set_state(policy.get_state())


@pytest.mark.parametrize("action_space", [gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (2,), np.float32)])
@pytest.mark.parametrize("model", [ModelConfig(hidden_sizes=(16, 8)), ModelConfig(hidden_sizes=(16,), activation="relu",
                                                                                   vf_share_layers=True),
                                   ModelConfig(hidden_sizes=(8, 8), activation="elu", free_log_std=False)])
def test_numpy_acting_mirrors_the_torch_model_through_learning_and_set_weights(
        action_space: gym.Space[Any], model: ModelConfig) -> None:
    policy = ReinforcePolicy(BOX4, action_space, PolicyConfig(seed=3, model=model, lr=0.05))
    fast = policy.numpy_acting
    assert fast is not None
    obs = np.random.default_rng(0).uniform(-1, 1, (6, 4)).astype(np.float32)

    def assert_mirrors() -> None:
        with torch.no_grad():
            ref_inputs, ref_values = policy.model(torch.as_tensor(obs))
        inputs, values = fast.forward(obs)
        np.testing.assert_allclose(inputs, ref_inputs.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(values, ref_values.numpy(), rtol=1e-5, atol=1e-6)
        actions, extras = policy.compute_actions(obs)
        ref_logp = policy.dist_class(ref_inputs).logp(torch.as_tensor(actions)).numpy()
        np.testing.assert_allclose(extras["logp"], ref_logp, rtol=1e-5, atol=1e-5)
        assert actions.dtype == (np.int64 if isinstance(action_space, gym.spaces.Discrete) else np.float32)

    assert_mirrors()
    assert policy.optimizer.defaults["fused"]  # whose steps leave the parameters' version counters alone
    before = fast.forward(obs)[0].copy()
    policy.learn_on_batch(batch_for(policy))  # an in-place optimizer step: the mirror must see it
    assert not np.allclose(fast.forward(obs)[0], before)
    assert_mirrors()
    before = fast.forward(obs)[0].copy()
    policy.apply_gradients(policy.compute_gradients(batch_for(policy))[0])
    assert not np.allclose(fast.forward(obs)[0], before)
    assert_mirrors()
    other = ReinforcePolicy(BOX4, action_space, PolicyConfig(seed=99, model=model))
    policy.set_weights(other.get_weights())
    assert_mirrors()


def test_numpy_acting_samples_the_categorical_distribution() -> None:
    policy = make_policy(gym.spaces.Discrete(3))
    assert policy.numpy_acting is not None
    obs = np.zeros((20000, 4), np.float32)
    actions, extras = policy.compute_actions(obs)
    probs = np.exp(extras["logp"][[int(np.flatnonzero(actions == a)[0]) for a in range(3)]])
    freq = np.bincount(actions, minlength=3) / len(actions)
    np.testing.assert_allclose(freq, probs, atol=0.015)  # 20000 draws: sd < 0.0036
    greedy, _ = policy.compute_actions(obs[:2], explore=False)
    assert greedy.tolist() == [int(np.argmax(probs))] * 2


def test_numpy_acting_is_seeded_restorable_and_optional() -> None:
    a, b = make_policy(), make_policy()
    obs = np.random.default_rng(1).uniform(-1, 1, (16, 4)).astype(np.float32)
    assert np.array_equal(a.compute_actions(obs)[0], b.compute_actions(obs)[0])
    state = a.get_state()
    first = a.compute_actions(obs)[0]
    b.set_state(state)
    assert np.array_equal(b.compute_actions(obs)[0], first)
    assert make_policy(numpy_acting=False).numpy_acting is None
    wide = ModelConfig(hidden_sizes=(256, 256))
    assert ReinforcePolicy(BOX4, gym.spaces.Discrete(2), PolicyConfig(model=wide)).numpy_acting is None


# -- step_adam: the fused Adam kernel called directly -------------------------------------------------------------

def adam_pair(groups: int = 1, **kwargs: Any) -> tuple[torch.nn.Module, torch.optim.Adam, torch.nn.Module,
                                                       torch.optim.Adam]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    twin = copy.deepcopy(model)

    def adam(module: torch.nn.Module) -> torch.optim.Adam:
        params = list(module.parameters())
        if groups == 1:
            return torch.optim.Adam(params, lr=1e-2, eps=1e-7, betas=(0.8, 0.95), **kwargs)
        return torch.optim.Adam([{"params": params[:2]}, {"params": params[2:], "lr": 3e-3}], lr=1e-2, **kwargs)

    return model, adam(model), twin, adam(twin)


def run_steps(model: torch.nn.Module, twin: torch.nn.Module, step: Any, twin_step: Any, steps: int = 6) -> None:
    for i in range(steps):
        x = torch.randn(4, 5)
        for module in (model, twin):
            module.zero_grad(set_to_none=True)
            module(x).pow(2).sum().backward()
            if i == 3:  # a parameter without a gradient: step() leaves it (and its state) alone
                module[0].bias.grad = None
        step()
        twin_step()


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("kwargs", [{"fused": True}, {"fused": True, "weight_decay": 0.1}, {"fused": True, "amsgrad": True},
                                    {}, {"foreach": False}], ids=["fused", "decay", "amsgrad", "default", "for-loop"])
def test_step_adam_takes_exactly_the_optimizers_step(groups: int, kwargs: dict[str, Any]) -> None:
    """Bit for bit, parameters and state: the direct fused call where it applies, step() (the fallback) elsewhere."""
    model, adam, twin, twin_adam = adam_pair(groups, **kwargs)
    run_steps(model, twin, adam.step, lambda: step_adam(twin_adam))
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q)
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(adam.state[p][key], twin_adam.state[q][key]), key
    assert float(twin_adam.state[twin[0].bias]["step"]) == 5.0 and float(twin_adam.state[twin[0].weight]["step"]) == 6


def test_step_adam_honours_hooks_and_a_patched_step() -> None:
    _, _, twin, twin_adam = adam_pair(fused=True)
    calls: list[str] = []
    handle = twin_adam.register_step_post_hook(lambda *args: calls.append("hook"))
    twin(torch.ones(1, 5)).sum().backward()
    for _ in range(2):
        step_adam(twin_adam)
    assert calls == ["hook", "hook"]
    handle.remove()
    original = twin_adam.step
    twin_adam.step = lambda *args, **kwargs: calls.append("patched") or original()  # type: ignore[method-assign]
    step_adam(twin_adam)
    assert calls[-1] == "patched" and float(next(iter(twin_adam.state.values()))["step"]) == 3
