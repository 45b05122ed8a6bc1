"""RecurrentActorCritic: a sequence run at once equals the same steps taken one at a time carrying the state (what a
learner recomputes equals what a worker acted with), padding does not reach the real steps, and bad inputs are
named."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.config import ModelConfig
from flowrl.models import RecurrentActorCritic
from flowrl.sequences import pad, sequence_lengths, sequence_mask

OBS = gym.spaces.Box(-1, 1, (3,))


def model(cell: str, **kwargs: object) -> RecurrentActorCritic:
    torch.manual_seed(0)
    return RecurrentActorCritic(OBS, 2, ModelConfig(hidden_sizes=(16,)), cell_size=8, cell=cell, **kwargs)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("inputs", [{}, {"prev_action_dim": 2, "prev_reward": True}])
def test_a_sequence_at_once_equals_stepping_one_step_at_a_time(cell: str, inputs: dict[str, object]) -> None:
    net = model(cell, **inputs)
    torch.manual_seed(1)
    batch, steps = 4, 7
    obs, prev_a, prev_r = torch.randn(batch, steps, 3), torch.randn(batch, steps, 2), torch.randn(batch, steps)
    start = tuple(torch.randn_like(s) for s in net.initial_state(batch))  # a mid-episode state, not zeros
    kwargs = lambda sl: {"prev_actions": prev_a[:, sl], "prev_rewards": prev_r[:, sl]} if inputs else {}  # noqa: E731
    with torch.no_grad():
        whole_logits, whole_values, whole_state = net(obs, start, **kwargs(slice(None)))
        state, logits, values = start, [], []
        for t in range(steps):
            out_logits, out_values, state = net(obs[:, t:t + 1], state, **kwargs(slice(t, t + 1)))
            logits.append(out_logits[:, 0])
            values.append(out_values[:, 0])
    torch.testing.assert_close(whole_logits, torch.stack(logits, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(whole_values, torch.stack(values, 1), atol=1e-5, rtol=1e-5)
    for a, b in zip(whole_state, state):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_padding_after_a_sequence_does_not_change_its_real_steps(cell: str) -> None:
    """Rows cut into padded sequences (flowrl.sequences), run at once: each real step's output equals the output of
    its sequence run alone, unpadded."""
    net = model(cell)
    eps, t = np.array([0, 0, 0, 0, 0, 1, 1, 2]), np.array([0, 1, 2, 3, 4, 0, 1, 0])
    lens = sequence_lengths(eps, t, 3)
    rows = np.random.default_rng(0).standard_normal((len(eps), 3)).astype(np.float32)
    padded = torch.as_tensor(pad(rows, lens, 3))
    with torch.no_grad():
        logits, _, _ = net(padded, net.initial_state(len(lens)))
        start = 0
        for s, n in enumerate(lens):
            alone, _, _ = net(torch.as_tensor(rows[start:start + n])[None], net.initial_state(1))
            torch.testing.assert_close(logits[s, :n], alone[0])
            start += n
    assert sequence_mask(lens, 3).sum() == len(eps)


def test_the_state_carries_memory() -> None:
    """Two histories that end in the same observation give different outputs: the cell remembers."""
    net = model("lstm")
    with torch.no_grad():
        last = torch.zeros(1, 1, 3)
        a = net(torch.cat([torch.ones(1, 2, 3), last], 1), net.initial_state(1))[0][0, -1]
        b = net(torch.cat([-torch.ones(1, 2, 3), last], 1), net.initial_state(1))[0][0, -1]
    assert not torch.allclose(a, b)


def test_gradients_reach_every_parameter_through_time() -> None:
    net = model("lstm", prev_action_dim=2, prev_reward=True, extra_free_params=2)
    logits, values, _ = net(torch.randn(2, 5, 3), net.initial_state(2), torch.randn(2, 5, 2), torch.randn(2, 5))
    assert logits.shape == (2, 5, 4)
    (logits.sum() + values.sum()).backward()
    assert all(p.grad is not None and torch.count_nonzero(p.grad) > 0 for p in net.parameters())


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="cell='rnn'; use 'lstm' or 'gru'"):
        model("rnn")
    with pytest.raises(ValueError, match="cell_size=0 must be an int >= 1"):
        RecurrentActorCritic(OBS, 2, ModelConfig(), cell_size=0)
    net = model("gru", prev_action_dim=2)
    with pytest.raises(ValueError, match=r"pass prev_actions \[B, T, 2\]"):
        net(torch.zeros(1, 1, 3), net.initial_state(1))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("activation", ["tanh", "relu", "elu"])
@pytest.mark.parametrize("hidden", [(), (16,), (16, 8)])
@pytest.mark.parametrize("prev", [(False, False), (True, True), (False, True)], ids=["-", "prev-a-r", "prev-r"])
def test_the_numpy_mirror_steps_as_the_model_does_and_follows_its_updates(cell: str, activation: str,
                                                                         hidden: tuple[int, ...],
                                                                         prev: tuple[bool, bool]) -> None:
    """A rollout worker acts through NumpyRecurrent: 12 steps from a random state (and random previous actions and
    rewards, for a model that reads them) give the torch model's outputs and states to 1e-5, before and after an
    optimizer step (which the mirror must see)."""
    from flowrl.models import Categorical, NumpyRecurrent, make_model

    torch.manual_seed(0)
    config = ModelConfig(hidden_sizes=hidden, activation=activation, use_lstm=True, lstm_cell=cell, lstm_cell_size=6,
                         lstm_use_prev_action=prev[0], lstm_use_prev_reward=prev[1])
    model = make_model(gym.spaces.Box(-2, 2, (3,)), gym.spaces.Discrete(3), config)
    fast = NumpyRecurrent.build(model, Categorical)
    assert fast is not None
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(4, 12, 3)).astype(np.float32)
    prev_a = np.eye(3, dtype=np.float32)[rng.integers(3, size=(4, 12))]
    prev_r = rng.normal(size=(4, 12)).astype(np.float32)
    inputs = {k: torch.as_tensor(v) for k, v, used in (("prev_actions", prev_a, prev[0]),
                                                        ("prev_rewards", prev_r, prev[1])) if used}
    for update in range(2):
        state = tuple(rng.normal(size=(4, 6)).astype(np.float32) for _ in range(2 if cell == "lstm" else 1))
        with torch.no_grad():
            logits, values, last = model(torch.as_tensor(obs), tuple(torch.as_tensor(s) for s in state), **inputs)
        for t in range(12):
            parts = [p for p, used in ((prev_a[:, t], prev[0]), (prev_r[:, t, None], prev[1])) if used]
            dist_inputs, value, state = fast.step(obs[:, t], state, np.concatenate(parts, 1) if parts else None)
            np.testing.assert_allclose(dist_inputs, logits[:, t].numpy(), atol=1e-5)
            np.testing.assert_allclose(value, values[:, t].numpy(), atol=1e-5)
        for ours, theirs in zip(state, last):
            np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-5)
        if update == 0:  # an Adam step (foreach: version counters move), then the mirror must follow
            optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
            model(torch.as_tensor(obs), model.initial_state(4), **inputs)[0].sum().backward()
            optimizer.step()


def test_no_numpy_mirror_for_what_it_cannot_step_exactly() -> None:
    from flowrl.models import Categorical, NumpyRecurrent

    images = RecurrentActorCritic(gym.spaces.Box(0, 255, (16, 16, 3), np.uint8), 2,
                                  ModelConfig(hidden_sizes=(4,), conv_filters=((4, 4, 2),)), cell_size=4)
    assert NumpyRecurrent.build(images, Categorical) is None  # a CNN encoder: torch acts
    assert NumpyRecurrent.build(torch.nn.Linear(3, 2), Categorical) is None
