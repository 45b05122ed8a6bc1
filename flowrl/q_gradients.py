"""DQN's TD loss and its gradients for a plain MLP :class:`~flowrl.models.QModel`, derived by hand.

A DQN learner step on a small batch (32 rows through a 64-64-256 network, the common CartPole setting) is
dispatch-bound: every torch op costs more than its arithmetic, and autograd adds a graph to record and walk
back, which is most of the step. :class:`QGradients` computes the same loss and gradients under
``torch.no_grad()`` in a few dense ops: one ``addmm`` and one in-place activation per layer forward, two
matmuls, a row sum and one multiply per layer back. A step then takes about 40% of autograd's time. The
numbers are autograd's to float32 rounding (``tests/test_q_gradients.py`` pins them against ``backward()`` for
every activation, dueling and plain heads, double Q, n-step discounts and prioritized weights).

:meth:`QGradients.build` returns ``None`` for anything it does not mirror exactly (a CNN encoder, a subclass of
``QModel``, a GPU, another dtype); the policy then learns through autograd, as with ``manual_gradients=False``.

Examples:
    >>> import gymnasium as gym
    >>> from flowrl.config import ModelConfig
    >>> from flowrl.models import QModel
    >>> model = QModel(gym.spaces.Box(-1, 1, (3,)), 2, ModelConfig(hidden_sizes=(8,)), hiddens=(4,), dueling=True)
    >>> kernel = QGradients.build(model, model)
    >>> obs = torch.ones(5, 3)
    >>> out = kernel(obs, torch.zeros(5, dtype=torch.int64), torch.ones(5), torch.zeros(5), obs,
    ...              double_q=True, huber_delta=1.0)
    >>> len(out.grads) == len(list(model.parameters())), tuple(out.td_error.shape)
    (True, (5,))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn

from flowrl.models import QModel

__all__ = ["QGradients", "QStep"]

# activation (in place) and its derivative from the activation's output y (all three are monotone, so y says it)
_ACT: dict[type[nn.Module], tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]]
_ACT = {
    nn.Tanh: (torch.tanh_, lambda y: 1.0 - y * y),
    nn.ReLU: (torch.relu_, lambda y: (y > 0).to(y.dtype)),
    nn.ELU: (nn.functional.elu_, lambda y: torch.where(y > 0, 1.0, y + 1.0)),  # alpha 1: the slope is y + 1
}

#: a layer: weight, bias, the activation after it (in place) and its derivative from its output (None: linear)
_Layer = tuple[torch.Tensor, torch.Tensor, "Callable[[torch.Tensor], torch.Tensor] | None",
               "Callable[[torch.Tensor], torch.Tensor] | None"]


@dataclass(frozen=True)
class QStep:
    """What :class:`QGradients` computed for one batch.

    Attributes:
        loss: ``mean_i w_i huber(td_error_i)``.
        q: ``Q(s_i, a_i)`` ``[B]``. td_error: ``Q(s_i, a_i) - y_i`` ``[B]``.
        grads: the loss's gradient for each of the model's parameters, in ``model.parameters()`` order.
    """

    loss: float
    q: torch.Tensor
    td_error: torch.Tensor
    grads: list[torch.Tensor]


def _plain_layers(seq: nn.Module, activation_required: bool) -> list[_Layer] | None:
    """``seq``'s (Linear, activation) pairs, a trailing Linear allowed unless ``activation_required``; None if it
    holds anything else."""
    modules = [m for m in seq.modules() if not isinstance(m, nn.Sequential)]
    layers: list[_Layer] = []
    i = 0
    while i < len(modules):
        linear = modules[i]
        if type(linear) is not nn.Linear or linear.bias is None:
            return None
        act = modules[i + 1] if i + 1 < len(modules) else None
        if act is None:
            if activation_required:
                return None
            layers.append((linear.weight, linear.bias, None, None))
            i += 1
            continue
        if type(act) not in _ACT or (type(act) is nn.ELU and act.alpha != 1.0):
            return None
        layers.append((linear.weight, linear.bias, *_ACT[type(act)]))
        i += 2
    return layers


class QGradients:
    """The Q-learning loss and its gradients for one plain MLP ``QModel`` and its target network, by hand.

    Call it with a batch's tensors; it returns a :class:`QStep` (the loss, ``Q(s, a)``, the TD errors and one
    gradient per parameter) and leaves the parameters and their ``.grad`` alone. The loss is DQN's:
    ``mean_i w_i huber(Q(s_i, a_i) - y_i)`` with ``y = rewards + discounts * Q_target(s', a')``, where ``a'`` is
    the online network's greedy action with ``double_q`` and the target network's own otherwise.

    Build it with :meth:`build`, which checks that the models are exactly what it mirrors.
    """

    def __init__(self, model: nn.Module, target_model: nn.Module, torso: list[_Layer], advantage: list[_Layer],
                 value: list[_Layer] | None, target: tuple[list[_Layer], list[_Layer], list[_Layer] | None]) -> None:
        self.model, self.target_model = model, target_model
        self._online = (torso, advantage, value)
        self._target = target

    @staticmethod
    def _layers(model: nn.Module) -> tuple[list[_Layer], list[_Layer], list[_Layer] | None] | None:
        if type(model) is not QModel or type(model.encoder) is not nn.Flatten:
            return None
        params = list(model.parameters())
        if not params or any(p.device.type != "cpu" or p.dtype != torch.float32 for p in params):
            return None
        torso = _plain_layers(model.torso, activation_required=True)
        advantage = _plain_layers(model.advantage, activation_required=False)
        value = None if model.value is None else _plain_layers(model.value, activation_required=False)
        if torso is None or advantage is None or (model.value is not None and value is None):
            return None
        heads = [advantage] + ([value] if value is not None else [])
        if any(not head or head[-1][2] is not None for head in heads):  # each head ends in a linear layer
            return None
        order = [p for layers in (torso, *heads) for w, b, _, _ in layers for p in (w, b)]
        if len(order) != len(params) or any(a is not b for a, b in zip(order, params)):
            return None  # some parameter this does not know about: autograd's job
        return torso, advantage, value

    @classmethod
    def build(cls, model: nn.Module, target_model: nn.Module) -> QGradients | None:
        """The kernel for ``model`` and its target network, or ``None`` unless both are plain MLP ``QModel``\\ s
        (a ``Flatten`` encoder, Linear layers each followed by Tanh, ReLU or ELU(1), linear heads) of float32
        parameters on the CPU."""
        online, target = cls._layers(model), cls._layers(target_model)
        if online is None or target is None:
            return None
        return cls(model, target_model, *online, target=target)

    @staticmethod
    def _forward(x: torch.Tensor, layers: list[_Layer], saved: list[torch.Tensor] | None) -> torch.Tensor:
        """``x`` through ``layers``; each layer's input is appended to ``saved`` (when given)."""
        for weight, bias, act, _ in layers:
            if saved is not None:
                saved.append(x)
            x = nn.functional.linear(x, weight, bias)
            if act is not None:
                x = act(x)
        return x

    def _q(self, x: torch.Tensor, nets: tuple[list[_Layer], list[_Layer], list[_Layer] | None],
           saved: dict[str, list[torch.Tensor]] | None) -> torch.Tensor:
        """``Q(x, .)`` ``[B, A]`` for flat float observations ``x``; with ``saved``, every layer's input (the
        features under ``"features"``) for :meth:`_gradients`."""
        torso, advantage, value = nets
        features = self._forward(x, torso, None if saved is None else saved["torso"])
        if saved is not None:
            saved["features"] = [features]
        adv = self._forward(features, advantage, None if saved is None else saved["advantage"])
        if value is None:
            return adv
        v = self._forward(features, value, None if saved is None else saved["value"])
        return v + adv - adv.mean(dim=1, keepdim=True)

    @staticmethod
    def _backward(g: torch.Tensor, layers: list[_Layer], inputs: list[torch.Tensor], output: torch.Tensor,
                  grads: list[torch.Tensor], rows: int | None, input_grad: bool = True) -> torch.Tensor:
        """Back through ``layers`` (their inputs ``inputs``, the last one's output ``output``; only the first
        ``rows`` rows when not None) from the gradient ``g`` at their output; prepends the weight and bias
        gradients to ``grads`` (last layer first); the gradient at their input (without ``input_grad``: at the first
        layer's output, the input's gradient is never needed)."""
        for k in range(len(layers) - 1, -1, -1):
            weight, _, _, slope = layers[k]
            if slope is not None:  # the activation's output: the next layer's input, or the stack's output
                y = inputs[k + 1] if k + 1 < len(inputs) else output
                g = g * slope(y if rows is None else y[:rows])
            x = inputs[k] if rows is None else inputs[k][:rows]
            grads[:0] = [g.t().mm(x), g.sum(0)]
            if k or input_grad:
                g = g.mm(weight)
        return g

    def __call__(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor,
                 next_obs: torch.Tensor, *, double_q: bool, huber_delta: float,
                 weights: torch.Tensor | None = None) -> QStep:
        """The loss, ``Q(s, a)``, TD errors and gradients for a batch; ``discounts`` are each row's bootstrap
        factor (``gamma^n``, 0 where the episode terminated) and ``weights`` the importance weights (None: 1)."""
        n = len(obs)
        saved: dict[str, list[torch.Tensor]] = {"torso": [], "advantage": [], "value": []}
        x, next_x = obs.reshape(n, -1).float(), next_obs.reshape(n, -1).float()
        with torch.no_grad():
            if double_q:  # the online network on obs and next_obs in one pass; only obs's rows are backed through
                q_all = self._q(torch.cat([x, next_x]), self._online, saved)
                q_BA, online_next_q_BA = q_all[:n], q_all[n:]
            else:
                q_BA = self._q(x, self._online, saved)
            target_q_BA = self._q(next_x, self._target, None)
            if double_q:
                next_q_B = target_q_BA.gather(1, online_next_q_BA.argmax(dim=1, keepdim=True)).squeeze(1)
            else:
                next_q_B = target_q_BA.amax(dim=1)
            actions_B1 = actions.long().unsqueeze(1)
            q_B = q_BA.gather(1, actions_B1).squeeze(1)
            td_B = q_B - (rewards.float() + discounts.float() * next_q_B)
            grad_B = td_B.clamp(-huber_delta, huber_delta)  # d huber / d td
            if weights is not None:
                grad_B = weights.float() * grad_B
            grad_BA = torch.zeros_like(q_BA).scatter_(1, actions_B1, (grad_B / n).unsqueeze(1))
            grads = self._gradients(grad_BA, saved, n if double_q else None)
        td = td_B.numpy()  # the loss is a number to report: on a small batch numpy's few ops cost less than torch's
        abs_td = np.abs(td)
        huber = np.where(abs_td < huber_delta, 0.5 * td * td, huber_delta * (abs_td - 0.5 * huber_delta))
        if weights is not None:
            huber = weights.float().numpy() * huber
        return QStep(loss=float(huber.mean()), q=q_B, td_error=td_B, grads=grads)

    def _gradients(self, grad_BA: torch.Tensor, saved: dict[str, list[torch.Tensor]],
                   rows: int | None) -> list[torch.Tensor]:
        """Every parameter's gradient, in ``model.parameters()`` order, from the gradient at ``Q``."""
        torso, advantage, value = self._online
        features = saved["features"][0]
        head_grads: list[torch.Tensor] = []
        if value is None:
            g_features = self._backward(grad_BA, advantage, saved["advantage"], features, head_grads, rows)
        else:  # Q = V + A - mean(A): dA = dQ - mean(dQ), dV = sum(dQ)
            value_grads: list[torch.Tensor] = []
            g_features = self._backward(grad_BA - grad_BA.mean(dim=1, keepdim=True), advantage, saved["advantage"],
                                        features, head_grads, rows)
            g_features = g_features + self._backward(grad_BA.sum(dim=1, keepdim=True), value, saved["value"],
                                                     features, value_grads, rows)
            head_grads += value_grads
        grads: list[torch.Tensor] = []
        self._backward(g_features, torso, saved["torso"], features, grads, rows, input_grad=False)
        return grads + head_grads
