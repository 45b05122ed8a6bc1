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
