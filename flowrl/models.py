"""Torch models and action distributions for flowrl policies.

:func:`make_model` builds an actor-critic network for a gymnasium observation space (an MLP for
vector observations, a small CNN for images) and :func:`dist_class_for` picks the action
distribution (categorical for ``Discrete``, diagonal Gaussian for ``Box``). :class:`QModel` is DQN's
Q-network (dueling or plain); :class:`ActorModel` and :class:`ContinuousQModel` are the actor and the
``Q(s, a)`` critics of DDPG, TD3 and SAC. :class:`NumpyActing`, :class:`NumpyQ` and :class:`NumpyMLP` mirror an
MLP model in numpy for the small CPU batches a rollout worker acts on.

Examples:
    >>> import gymnasium as gym
    >>> model = make_model(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), ModelConfig(hidden_sizes=(8,)))
    >>> logits, values = model(torch.zeros(3, 4))
    >>> tuple(logits.shape), tuple(values.shape)
    ((3, 2), (3,))
"""

from __future__ import annotations

import math
from typing import Callable
import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flowrl.config import ModelConfig

__all__ = ["ModelConfig", "ActorCriticModel", "make_model", "ActionDistribution", "Categorical",
           "DiagGaussian", "dist_class_for", "NATURE_CNN", "MINATAR_CNN", "default_conv_filters", "NumpyActing", "QModel", "NumpyQ", "ActorModel", "ContinuousQModel",
           "NumpyMLP", "RecurrentActorCritic", "NumpyRecurrent", "prev_action_size", "encode_prev_actions"]

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}
_INPLACE = (nn.ReLU, nn.ELU)  # the activations that take ``inplace=True``
#: the same activations as in-place functions, for the layers that are not modules (ContinuousQModel's critics)
_INPLACE_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh": torch.tanh_, "relu": torch.relu_, "elu": lambda x: nn.functional.elu(x, inplace=True)}


def _mlp(sizes: list[int], activation: type[nn.Module]) -> nn.Sequential:
    """Linear layers, each followed by ``activation`` (in place where it can be: a Linear layer's backward does not
    read its output, so ReLU and ELU may overwrite it, which saves a fresh activation tensor per layer)."""
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), activation(inplace=True) if activation in _INPLACE else activation()]
    return nn.Sequential(*layers)


def _init_linear(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class _ConvEncoder(nn.Module):
    """HWC images (uint8 0..255 or float) to a flat feature vector."""

    def __init__(self, shape: tuple[int, ...], filters: tuple[tuple[int, int, int], ...],
                 activation: type[nn.Module], scale: float) -> None:
        super().__init__()
        height, width, channels = shape
        layers: list[nn.Module] = []
        for out, kernel, stride in filters:
            layers += [nn.Conv2d(channels, out, kernel, stride), activation()]
            channels = out
            height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
            if height < 1 or width < 1:
                raise ValueError(f"ModelConfig.conv_filters={filters} shrink an image of shape {shape} (height, "
                                 f"width, channels) to nothing; set model.conv_filters to smaller kernels/strides "
                                 f"for this size, e.g. [[16,3,1]] (a frame stack puts its frames last: HWC)")
        self.net = nn.Sequential(*layers, nn.Flatten())
        self.out_size, self.scale = channels * height * width, scale

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        # NHWC as an NCHW view first, then one float copy scaled in place: 14% less time for an 84x84x4 batch's
        # forward and backward than scaling a contiguous float copy (its strides are what conv2d reads fastest)
        images = obs.permute(0, 3, 1, 2)
        if images.dtype == torch.float32:
            images = images / self.scale if self.scale != 1.0 else images
        else:
            images = images.float()
            if self.scale != 1.0:
                images.mul_(1.0 / self.scale)
        return self.net(images)  # type: ignore[no-any-return]


#: Mnih et al. 2015 ("Human-level control through deep reinforcement learning"), for 84x84 Atari frames.
NATURE_CNN: tuple[tuple[int, int, int], ...] = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
#: Young & Tian 2019 (MinAtar), for 10x10 frames: one 3x3 layer of 16 channels, stride 1.
MINATAR_CNN: tuple[tuple[int, int, int], ...] = ((16, 3, 1),)
#: From this height and width up, images get :data:`NATURE_CNN` (84x84 Atari, 64x64 Procgen); below, :data:`MINATAR_CNN`.
NATURE_CNN_MIN_SIZE = 36


def default_conv_filters(shape: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    """The conv layers for HWC images of ``shape`` when ``ModelConfig.conv_filters`` is ``None``.

    Examples:
        >>> default_conv_filters((84, 84, 4)) == NATURE_CNN, default_conv_filters((10, 10, 4)) == MINATAR_CNN
        (True, True)
    """
    return NATURE_CNN if min(shape[0], shape[1]) >= NATURE_CNN_MIN_SIZE else MINATAR_CNN


def _pixel_scale(space: gym.spaces.Box) -> float:
    """What an image's values are divided by on the learner: 255 for uint8 frames, 1 for bool (MinAtar) and float."""
    return 255.0 if space.dtype == np.uint8 else 1.0


def _encoder(obs_space: gym.spaces.Box, config: ModelConfig) -> tuple[nn.Module, int]:
    """The observation encoder and its output size: a CNN for HWC images (``config.conv_filters``, or the one
    :func:`default_conv_filters` picks for their size; uint8 frames scaled from 0..255 on the model's device), else
    a flatten."""
    shape = tuple(obs_space.shape)
    if len(shape) == 3:
        if shape[1] == shape[2] and shape[0] < shape[1] and shape[0] <= 16:
            raise ValueError(f"observation shape {shape} looks channels-first ({shape[0]} frames of {shape[1]}x"
                             f"{shape[2]}, as gymnasium's FrameStackObservation stacks them); flowrl's image "
                             f"encoders take height x width x channels: move the frames last (e.g. "
                             f"gymnasium.wrappers.TransformObservation with np.moveaxis(obs, 0, -1) and a "
                             f"({shape[1]}, {shape[2]}, {shape[0]}) Box)")
        filters = config.conv_filters if config.conv_filters is not None else default_conv_filters(shape)
        if not filters and min(shape[0], shape[1]) >= NATURE_CNN_MIN_SIZE:
            raise ValueError(f"model.conv_filters=() would flatten the {shape[0]}x{shape[1]}x{shape[2]} frames "
                             f"({int(np.prod(shape))} inputs) straight into the fully connected layers; leave "
                             f"model.conv_filters unset (None: the Nature CNN for frames this size) or give conv "
                             f"layers such as [[32,8,4],[64,4,2],[64,3,1]]")
        conv = _ConvEncoder(shape, filters, nn.ReLU, _pixel_scale(obs_space))
        return conv, conv.out_size
    if len(shape) == 2 and obs_space.dtype == np.uint8 and min(shape) >= NATURE_CNN_MIN_SIZE:
        raise ValueError(f"observation shape {shape} (uint8) looks like grey frames without a channel axis, which "
                         f"would go flat into the fully connected layers; give the frames a last axis of channels "
                         f"(e.g. AtariPreprocessing(grayscale_newaxis=True), or a frame stack moved last) so the "
                         f"CNN reads them")
    return nn.Flatten(), int(np.prod(shape))


class ActorCriticModel(nn.Module):
    """``forward(obs) -> (action_dist_inputs [B, A], values [B])``."""

    def __init__(self, obs_space: gym.spaces.Box, num_outputs: int, config: ModelConfig,
                 extra_free_params: int = 0) -> None:
        super().__init__()
        act = _ACTIVATIONS[config.activation]
        self.activation_name = config.activation
        self.encoder, in_size = _encoder(obs_space, config)
        sizes = [in_size, *config.hidden_sizes]
        self.pi_trunk = _mlp(sizes, act)
        self.vf_trunk = None if config.vf_share_layers else _mlp(sizes, act)
        self.pi_head = _init_linear(nn.Linear(sizes[-1], num_outputs), 0.01)
        self.vf_head = _init_linear(nn.Linear(sizes[-1], 1), 1.0)
        self.free_params = nn.Parameter(torch.zeros(extra_free_params)) if extra_free_params else None

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.encoder(obs.float() if obs.dtype != torch.uint8 else obs)
        pi_features = self.pi_trunk(features)
        vf_features = pi_features if self.vf_trunk is None else self.vf_trunk(features)
        dist_inputs = self.pi_head(pi_features)
        if self.free_params is not None:
            dist_inputs = torch.cat([dist_inputs, self.free_params.expand(len(dist_inputs), -1)], dim=-1)
        return dist_inputs, self.vf_head(vf_features).squeeze(-1)


class RecurrentActorCritic(nn.Module):
    """An actor-critic with memory: ``encoder -> MLP (hidden_sizes) -> LSTM or GRU cell -> (policy head, value
    head)``, optionally fed the previous action and reward beside the features.

    ``forward(obs [B, T, ...], state, prev_actions [B, T, action_dim], prev_rewards [B, T])`` returns
    ``(dist_inputs [B, T, A], values [B, T], state)``: ``B`` sequences of ``T`` steps, each starting from its row of
    ``state`` (a tuple of ``[B, cell_size]`` tensors: ``(h, c)`` for an LSTM, ``(h,)`` for a GRU;
    :meth:`initial_state` is the zeros an episode starts from). The returned state is the one after the ``T``-th
    step; a rollout worker steps with ``T = 1`` and carries it to the next step. Padding steps at the end of a
    sequence do not change the outputs at its real steps (the cell runs forward in time), so a learner may run
    padded sequences and mask the padding out of its losses.

    Args:
        obs_space: a ``Box`` (vector or HWC image) observation space.
        num_outputs: the policy head's outputs (the action distribution's inputs).
        config: the encoder's and MLP's settings (``hidden_sizes``, ``activation``, ``conv_filters``;
            ``hidden_sizes=()`` feeds the encoder's features to the cell directly).
        cell_size: the cell's state size (256). cell: ``"lstm"`` or ``"gru"``.
        prev_action_dim: the size of the previous-action input (0: not an input); the policy encodes the
            actions (one-hot for ``Discrete``). prev_reward: the previous reward is an input.
        extra_free_params: state-independent outputs appended to the policy head's (a Gaussian's free log-std).

    Examples:
        >>> model = RecurrentActorCritic(gym.spaces.Box(-1, 1, (2,)), 2, ModelConfig(hidden_sizes=(8,)), cell_size=4)
        >>> state = model.initial_state(3)
        >>> dist_inputs, values, state = model(torch.zeros(3, 5, 2), state)
        >>> tuple(dist_inputs.shape), tuple(values.shape), [tuple(s.shape) for s in state]
        ((3, 5, 2), (3, 5), [(3, 4), (3, 4)])
    """

    def __init__(self, obs_space: gym.spaces.Box, num_outputs: int, config: ModelConfig, *, cell_size: int = 256,
                 cell: str = "lstm", prev_action_dim: int = 0, prev_reward: bool = False,
                 extra_free_params: int = 0) -> None:
        super().__init__()
        if cell not in ("lstm", "gru"):
            raise ValueError(f"cell={cell!r}; use 'lstm' or 'gru'")
        if isinstance(cell_size, bool) or not isinstance(cell_size, int) or cell_size < 1:
            raise ValueError(f"cell_size={cell_size!r} must be an int >= 1, e.g. 256")
        self.cell, self.cell_size = cell, cell_size
        self.activation_name = config.activation
        self.prev_action_dim, self.prev_reward = prev_action_dim, prev_reward
        self.encoder, in_size = _encoder(obs_space, config)
        sizes = [in_size, *config.hidden_sizes]
        self.trunk = _mlp(sizes, _ACTIVATIONS[config.activation])
        rnn_class = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn_class(sizes[-1] + prev_action_dim + int(prev_reward), cell_size, batch_first=True)
        self.pi_head = _init_linear(nn.Linear(cell_size, num_outputs), 0.01)
        self.vf_head = _init_linear(nn.Linear(cell_size, 1), 1.0)
        self.free_params = nn.Parameter(torch.zeros(extra_free_params)) if extra_free_params else None

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        """The zero state of ``batch_size`` episodes' starts: ``(h, c)`` (LSTM) or ``(h,)`` (GRU), ``[B, cell]``."""
        device = self.pi_head.weight.device
        zeros = [torch.zeros(batch_size, self.cell_size, device=device) for _ in range(2 if self.cell == "lstm" else 1)]
        return tuple(zeros)

    def forward(self, obs: torch.Tensor, state: tuple[torch.Tensor, ...], prev_actions: torch.Tensor | None = None,
                prev_rewards: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        batch, steps = obs.shape[:2]
        flat = obs.reshape(batch * steps, *obs.shape[2:])
        features = self.trunk(self.encoder(flat.float() if flat.dtype != torch.uint8 else flat))
        inputs = [features.reshape(batch, steps, -1)]
        if self.prev_action_dim:
            if prev_actions is None:
                raise ValueError("this model takes the previous actions as an input: pass prev_actions [B, T, "
                                 f"{self.prev_action_dim}]")
            inputs.append(prev_actions.float().reshape(batch, steps, self.prev_action_dim))
        if self.prev_reward:
            if prev_rewards is None:
                raise ValueError("this model takes the previous rewards as an input: pass prev_rewards [B, T]")
            inputs.append(prev_rewards.float().reshape(batch, steps, 1))
        x = torch.cat(inputs, dim=-1) if len(inputs) > 1 else inputs[0]
        layered = tuple(s.unsqueeze(0).contiguous() for s in state)  # torch's cells take [layers, B, cell]
        out, new_state = self.rnn(x, layered if self.cell == "lstm" else layered[0])
        new = new_state if isinstance(new_state, tuple) else (new_state,)
        dist_inputs = self.pi_head(out)
        if self.free_params is not None:
            dist_inputs = torch.cat([dist_inputs, self.free_params.expand(batch, steps, -1)], dim=-1)
        return dist_inputs, self.vf_head(out).squeeze(-1), tuple(s.squeeze(0) for s in new)


class ActionDistribution:
    """A batch of action distributions built from the model's ``dist_inputs``."""

    def __init__(self, inputs: torch.Tensor) -> None:
        self.inputs = inputs

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        raise NotImplementedError

    def deterministic_sample(self) -> torch.Tensor:
        raise NotImplementedError

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def entropy(self) -> torch.Tensor:
        raise NotImplementedError

    def kl(self, other: ActionDistribution) -> torch.Tensor:
        raise NotImplementedError


class Categorical(ActionDistribution):
    """Categorical over logits; sampling is one Gumbel-max over the whole batch.

    Examples:
        >>> d = Categorical(torch.tensor([[0.0, 100.0], [100.0, 0.0]]))
        >>> d.sample(torch.Generator().manual_seed(0)).tolist()
        [1, 0]
    """

    def __init__(self, inputs: torch.Tensor) -> None:
        super().__init__(inputs)
        self.log_probs = torch.log_softmax(inputs, dim=-1)

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        u = torch.rand(self.inputs.shape, generator=generator, device=self.inputs.device)
        return torch.argmax(self.log_probs - torch.log(-torch.log(u.clamp_min(1e-20))), dim=-1)

    def deterministic_sample(self) -> torch.Tensor:
        return torch.argmax(self.inputs, dim=-1)

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        return self.log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        return -(self.log_probs.exp() * self.log_probs).sum(-1)

    def kl(self, other: ActionDistribution) -> torch.Tensor:
        if not isinstance(other, Categorical):
            raise TypeError(f"KL between Categorical and {type(other).__name__} is undefined")
        return (self.log_probs.exp() * (self.log_probs - other.log_probs)).sum(-1)


class DiagGaussian(ActionDistribution):
    """Diagonal Gaussian; ``inputs = [mean, log_std]`` along the last axis."""

    def __init__(self, inputs: torch.Tensor) -> None:
        super().__init__(inputs)
        self.mean, self.log_std = torch.chunk(inputs, 2, dim=-1)
        self.std = self.log_std.exp()

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        noise = torch.randn(self.mean.shape, generator=generator, device=self.mean.device)
        return self.mean + self.std * noise

    def deterministic_sample(self) -> torch.Tensor:
        return self.mean

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - self.mean) / self.std
        return (-0.5 * z.pow(2) - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self) -> torch.Tensor:
        return (self.log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)

    def kl(self, other: ActionDistribution) -> torch.Tensor:
        if not isinstance(other, DiagGaussian):
            raise TypeError(f"KL between DiagGaussian and {type(other).__name__} is undefined")
        return (other.log_std - self.log_std + (self.std.pow(2) + (self.mean - other.mean).pow(2))
                / (2 * other.std.pow(2)) - 0.5).sum(-1)


def dist_class_for(action_space: gym.Space[object]) -> tuple[type[ActionDistribution], int]:
    """The distribution class for ``action_space`` and the number of model outputs it needs.

    Raises:
        ValueError: an action space other than ``Discrete`` or a 1-D ``Box``.
    """
    if isinstance(action_space, gym.spaces.Discrete):
        return Categorical, int(action_space.n)
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        return DiagGaussian, 2 * int(action_space.shape[0])
    raise ValueError(f"action space {action_space} is not supported; flowrl's models handle Discrete and "
                     f"1-D Box action spaces (flatten or wrap the env's action space)")


def prev_action_size(action_space: gym.Space[object]) -> int:
    """The width of the previous action as a recurrent model's input: ``n`` (one-hot) for a Discrete space, the
    flattened action for a Box.

    Raises:
        ValueError: another action space.
    """
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, gym.spaces.Box):
        return int(np.prod(action_space.shape))
    raise ValueError(f"model.lstm_use_prev_action=True takes a Discrete or Box action space, got {action_space}; "
                     f"set lstm_use_prev_action=False")


def encode_prev_actions(actions: np.ndarray, action_space: gym.Space[object]) -> np.ndarray:
    """Actions ``[..., *action_shape]`` as a recurrent model's previous-action input ``[..., width]`` float32
    (:func:`prev_action_size`): one-hot for a Discrete space, flattened for a Box.

    Examples:
        >>> encode_prev_actions(np.array([[2, 0]]), gym.spaces.Discrete(3)).tolist()
        [[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]]
        >>> encode_prev_actions(np.zeros((4, 2, 3)), gym.spaces.Box(-1, 1, (2, 3))).shape
        (4, 6)
    """
    width = prev_action_size(action_space)
    if isinstance(action_space, gym.spaces.Discrete):
        return np.eye(width, dtype=np.float32)[np.asarray(actions, np.int64)]
    values = np.asarray(actions, np.float32)
    lead = values.shape[:values.ndim - len(action_space.shape or ())]
    return values.reshape(*lead, width)


def make_model(obs_space: gym.Space[object], action_space: gym.Space[object],
               config: ModelConfig) -> ActorCriticModel | RecurrentActorCritic:
    """An actor-critic model for a Box observation space: 1-D (or flattened) via MLP, HWC images via CNN; with
    ``config.use_lstm`` a :class:`RecurrentActorCritic` over the same encoder and MLP.

    Raises:
        ValueError: an observation space that is not a Box (e.g. Dict, Discrete), or an unsupported action space.
    """
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) not in (1, 2, 3):
        raise ValueError(f"observation space {obs_space} is not supported; flowrl's models take a Box with 1 "
                         f"(vector), 2 (flattened) or 3 (HWC image) dimensions; wrap the env, e.g. with "
                         f"gymnasium.wrappers.FlattenObservation")
    dist_class, num_outputs = dist_class_for(action_space)
    free = num_outputs // 2 if dist_class is DiagGaussian and config.free_log_std else 0
    if config.use_lstm:
        return RecurrentActorCritic(obs_space, num_outputs - free, config, cell_size=config.lstm_cell_size,
                                    cell=config.lstm_cell, extra_free_params=free,
                                    prev_action_dim=prev_action_size(action_space) if config.lstm_use_prev_action
                                    else 0, prev_reward=config.lstm_use_prev_reward)
    return ActorCriticModel(obs_space, num_outputs - free, config, extra_free_params=free)


_NP_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tanh": lambda x: np.tanh(x, out=x), "relu": lambda x: np.maximum(x, 0, out=x),  # x is a fresh array
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
}


def _block_diag(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.zeros((a.shape[0] + b.shape[0], a.shape[1] + b.shape[1]), a.dtype)
    out[:a.shape[0], :a.shape[1]], out[a.shape[0]:, a.shape[1]:] = a, b
    return out


def _linears(seq: nn.Module | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(weight.T, bias)`` numpy views of the Linear layers in ``seq``, in order (none for ``None``)."""
    return [] if seq is None else [(m.weight.detach().numpy().T, m.bias.detach().numpy())
                                   for m in seq.modules() if isinstance(m, nn.Linear)]


def _np_dense(x: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray]],
              activation: Callable[[np.ndarray], np.ndarray] | None) -> np.ndarray:
    """``x`` through ``(weight.T, bias)`` layers in float32, ``activation`` after each (none: linear)."""
    for w, b in layers:
        x = x @ w
        x += b  # in place: x is a fresh array
        if activation is not None:
            x = activation(x)
    return x


class _NumpyMirror:
    """The part of a numpy mirror that stays in step with a torch model: :meth:`_refresh` calls :meth:`_read`
    whenever a parameter's version counter has moved since the last read, or after :meth:`invalidate`."""

    def __init__(self, model: nn.Module) -> None:
        self.params = list(model.parameters())
        self._versions: tuple[int, ...] = ()

    def invalidate(self) -> None:
        """Re-read the parameters at the next call."""
        self._versions = ()

    def _refresh(self) -> None:
        versions = tuple(p._version for p in self.params)
        if versions != self._versions:
            self._read()
            self._versions = versions

    def _read(self) -> None:
        raise NotImplementedError


class NumpyActing(_NumpyMirror):
    """Acting with an MLP :class:`ActorCriticModel` in numpy, for small CPU batches.

    A rollout worker computes actions for a few envs at a time, where torch's per-op dispatch (tens
    of microseconds per forward pass) costs more than the arithmetic. This mirror reads the model's
    parameters as numpy views and checks their torch version counters on every call, so any in-place
    update (an optimizer step, ``load_state_dict``) is seen at once; nothing is ever stale. Fused optimizer
    kernels update parameters without moving their version counters: after such a step call :meth:`invalidate`
    (as :meth:`flowrl.policy.Policy.optimizer_step` does).
    :meth:`build` returns ``None`` for a model it cannot mirror exactly (a CNN, a subclass, a GPU).

    Examples:
        >>> import gymnasium as gym
        >>> model = make_model(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), ModelConfig(hidden_sizes=(8,)))
        >>> fast = NumpyActing.build(model, Categorical)
        >>> obs = np.ones((3, 4), np.float32)
        >>> logits, values = fast.forward(obs)
        >>> bool(np.allclose(logits, model(torch.as_tensor(obs))[0].detach().numpy(), atol=1e-6))
        True
    """

    def __init__(self, model: ActorCriticModel, dist_class: type[ActionDistribution], activation: str) -> None:
        super().__init__(model)
        self.model, self.dist_class = model, dist_class
        self.activation = _NP_ACTIVATIONS[activation]
        self._layers: list[tuple[np.ndarray, np.ndarray]] = []  # fused [pi | vf] layers, then the heads

    @staticmethod
    def build(model: nn.Module, dist_class: type[ActionDistribution]) -> NumpyActing | None:
        """A numpy mirror of ``model``, or ``None`` if it is not a plain MLP ActorCriticModel on the CPU."""
        if type(model) is not ActorCriticModel or not isinstance(model.encoder, nn.Flatten):
            return None
        if dist_class not in (Categorical, DiagGaussian) or any(p.device.type != "cpu" for p in model.parameters()):
            return None
        widest = max(m.out_features for m in model.modules() if isinstance(m, nn.Linear))
        if model.vf_trunk is not None and widest > 128:
            return None  # side-by-side trunks double the work of wide layers; torch is as fast there
        return NumpyActing(model, dist_class, model.activation_name)

    def _read(self) -> None:
        model = self.model
        pi, vf = _linears(model.pi_trunk), _linears(model.vf_trunk)
        heads = _linears(model.pi_head) + _linears(model.vf_head)
        if vf:  # separate trunks side by side: [pi | vf] features through block-diagonal layers
            fused = [(np.concatenate([pi[0][0], vf[0][0]], 1), np.concatenate([pi[0][1], vf[0][1]]))]
            fused += [(_block_diag(p[0], v[0]), np.concatenate([p[1], v[1]])) for p, v in zip(pi[1:], vf[1:])]
            head_w = _block_diag(heads[0][0], heads[1][0])
        else:
            fused, head_w = pi, np.concatenate([heads[0][0], heads[1][0]], 1)
        self._layers = [*fused, (head_w, np.concatenate([heads[0][1], heads[1][1]]))]

    def forward(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(action_dist_inputs [B, A], values [B])`` as float32, equal to the model's forward."""
        self._refresh()
        x = _np_dense(np.asarray(obs, np.float32).reshape(len(obs), -1), self._layers[:-1], self.activation)
        out = _np_dense(x, self._layers[-1:], None)
        dist_inputs = out[:, :-1]
        if self.model.free_params is not None:
            free = self.model.free_params.detach().numpy()
            dist_inputs = np.concatenate([dist_inputs, np.broadcast_to(free, (len(x), len(free)))], axis=1)
        return dist_inputs, out[:, -1]

    def compute_actions(self, obs: np.ndarray, rng: np.random.Generator,
                        explore: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(actions, logp, values, dist_inputs)`` with the same distributions as the torch classes."""
        actions, values, dist_inputs = self.sample(obs, rng, explore)
        return actions, self.logp(dist_inputs, actions), values, dist_inputs

    def sample(self, obs: np.ndarray, rng: np.random.Generator,
               explore: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(actions, values, dist_inputs)``: :meth:`compute_actions` without the log-probabilities, which a
        rollout worker computes for a whole fragment at once with :meth:`logp`."""
        dist_inputs, values = self.forward(obs)
        return _np_sample(self.dist_class, dist_inputs, rng, explore), values, dist_inputs

    def logp(self, dist_inputs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """float32 ``log pi(actions)`` for dist inputs ``[..., D]`` and actions ``[...]`` (Categorical) or
        ``[..., A]`` (DiagGaussian), row by row, so any leading shape gives the same values."""
        return _np_logp(self.dist_class, dist_inputs, actions)


def _np_sample(dist_class: type[ActionDistribution], dist_inputs: np.ndarray, rng: np.random.Generator,
               explore: bool) -> np.ndarray:
    """Actions ``[B]`` (Categorical) or ``[B, A]`` (DiagGaussian) for dist inputs ``[B, D]``, drawn as the torch
    classes draw them (``explore=False``: the mode)."""
    if dist_class is Categorical:
        if explore:  # Gumbel-max: the argmax of logits + Gumbel noise is a categorical draw
            actions = np.argmax(dist_inputs + rng.gumbel(size=dist_inputs.shape), axis=1)
        else:
            actions = np.argmax(dist_inputs, axis=1)
        chosen: np.ndarray = actions.astype(np.int64, copy=False)
        return chosen
    mean, log_std = np.split(dist_inputs, 2, axis=1)
    drawn: np.ndarray = mean + np.exp(log_std) * rng.standard_normal(mean.shape, dtype=np.float32) if explore \
        else mean.copy()
    return drawn


def _np_logp(dist_class: type[ActionDistribution], dist_inputs: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """float32 ``log pi(actions)``, row by row (see :meth:`NumpyActing.logp`)."""
    if dist_class is Categorical:  # log-softmax of the chosen logit
        flat, chosen_actions = dist_inputs.reshape(-1, dist_inputs.shape[-1]), actions.reshape(-1)
        chosen = flat[np.arange(len(chosen_actions)), chosen_actions].reshape(actions.shape)
        logp: np.ndarray = chosen - np.logaddexp.reduce(dist_inputs, axis=-1)
    else:
        mean, log_std = np.split(dist_inputs, 2, axis=-1)
        z = (actions - mean) / np.exp(log_std)
        logp = (-0.5 * z * z - log_std - np.float32(0.5 * math.log(2 * math.pi))).sum(axis=-1)
    return logp.astype(np.float32, copy=False)


class NumpyRecurrent(_NumpyMirror):
    """One step of a :class:`RecurrentActorCritic` (MLP encoder, LSTM or GRU, with or without the previous action
    and reward inputs) in numpy, for a rollout worker's few envs per step: the recurrent counterpart of :class:`NumpyActing`, kept in
    step with the model the same way (version counters, :meth:`invalidate` after a fused optimizer step).
    :meth:`build` returns ``None`` for a model it cannot mirror exactly.

    Examples:
        >>> import gymnasium as gym
        >>> config = ModelConfig(hidden_sizes=(8,), use_lstm=True, lstm_cell_size=4)
        >>> model = make_model(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), config)
        >>> fast = NumpyRecurrent.build(model, Categorical)
        >>> obs, state = np.ones((5, 3), np.float32), tuple(np.full((5, 4), 0.5, np.float32) for _ in range(2))
        >>> logits, values, new_state = fast.step(obs, state)
        >>> torch_logits, torch_values, torch_state = model(torch.as_tensor(obs)[:, None],
        ...                                                 tuple(torch.as_tensor(s) for s in state))
        >>> bool(np.allclose(logits, torch_logits[:, 0].detach().numpy(), atol=1e-6))
        True
        >>> bool(np.allclose(new_state[1], torch_state[1].detach().numpy(), atol=1e-6))
        True
    """

    def __init__(self, model: RecurrentActorCritic, dist_class: type[ActionDistribution], activation: str) -> None:
        super().__init__(model)
        self.model, self.dist_class = model, dist_class
        self.activation = _NP_ACTIVATIONS[activation]
        self._trunk: list[tuple[np.ndarray, np.ndarray]] = []
        self._cell: tuple[np.ndarray, ...] = ()
        self._head: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0))

    @staticmethod
    def build(model: nn.Module, dist_class: type[ActionDistribution]) -> NumpyRecurrent | None:
        """A numpy mirror of ``model``, or ``None`` unless it is a plain-MLP :class:`RecurrentActorCritic` on the
        CPU, acting with a Categorical or DiagGaussian."""
        if type(model) is not RecurrentActorCritic or not isinstance(model.encoder, nn.Flatten):
            return None
        if dist_class not in (Categorical, DiagGaussian):
            return None
        if any(p.device.type != "cpu" for p in model.parameters()):
            return None
        return NumpyRecurrent(model, dist_class, model.activation_name)

    def _read(self) -> None:
        model = self.model
        self._trunk = _linears(model.trunk)
        rnn = {name: p.detach().numpy() for name, p in model.rnn.named_parameters()}
        w_ih, w_hh, b_ih, b_hh = (rnn[f"{kind}_l0"] for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
        # sigmoid(x) = (tanh(x / 2) + 1) / 2: the sigmoid gates' columns are halved here, so one tanh over all
        # the gates serves them and the tanh ones alike
        size = model.cell_size
        if model.cell == "lstm":  # one matmul of [x | h] gives the four gates (torch's order: i, f, g, o)
            weight, bias = np.concatenate([w_ih.T, w_hh.T]), b_ih + b_hh
            halve = np.r_[0:2 * size, 3 * size:4 * size]
            weight[:, halve] *= 0.5
            bias[halve] *= 0.5
            self._cell = (weight, bias)
        else:  # a GRU's new-gate keeps the hidden part apart: n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
            w_ih_t, w_hh_t, b_ih, b_hh = w_ih.T.copy(), w_hh.T.copy(), b_ih.copy(), b_hh.copy()
            for array in (w_ih_t, w_hh_t):
                array[:, :2 * size] *= 0.5  # r and z
            for vector in (b_ih, b_hh):
                vector[:2 * size] *= 0.5
            self._cell = (w_ih_t, b_ih, w_hh_t, b_hh)
        heads = _linears(model.pi_head) + _linears(model.vf_head)
        self._head = (np.concatenate([heads[0][0], heads[1][0]], 1), np.concatenate([heads[0][1], heads[1][1]]))

    def step(self, obs: np.ndarray, state: tuple[np.ndarray, ...], prev_inputs: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
        """``(dist_inputs [B, A], values [B], new_state)`` of one step from ``state`` (float32 ``[B, cell]``
        arrays), equal to the model's forward over a length-1 sequence; ``prev_inputs`` ``[B, D]``: the encoded
        previous actions then rewards, for a model that reads them."""
        self._refresh()
        x = np.asarray(obs, np.float32).reshape(len(obs), -1)
        if self._trunk:
            x = _np_dense(x, self._trunk, self.activation)
        if prev_inputs is not None:
            x = np.concatenate([x, prev_inputs], axis=1)
        size = self.model.cell_size
        if self.model.cell == "lstm":
            h, c = state
            weight, bias = self._cell
            gates = np.concatenate([x, h], axis=1) @ weight
            gates += bias
            np.tanh(gates, out=gates)
            t_i, t_f, t_g, t_o = (gates[:, k * size:(k + 1) * size] for k in range(4))
            c_new = 0.5 * ((t_f + 1.0) * c + (t_i + 1.0) * t_g)
            h_new = 0.5 * (t_o + 1.0) * np.tanh(c_new)
            new_state: tuple[np.ndarray, ...] = (h_new, c_new)
        else:
            (h,) = state
            w_ih, b_ih, w_hh, b_hh = self._cell
            gi = x @ w_ih
            gi += b_ih
            gh = h @ w_hh
            gh += b_hh
            rz = np.tanh(gi[:, :2 * size] + gh[:, :2 * size])
            r, z = 0.5 * (rz[:, :size] + 1.0), 0.5 * (rz[:, size:] + 1.0)
            n = np.tanh(gi[:, 2 * size:] + r * gh[:, 2 * size:])
            h_new = n + z * (h - n)
            new_state = (h_new,)
        out = h_new @ self._head[0]
        out += self._head[1]
        dist_inputs = out[:, :-1]
        if self.model.free_params is not None:
            free = self.model.free_params.detach().numpy()
            dist_inputs = np.concatenate([dist_inputs, np.broadcast_to(free, (len(x), len(free)))], axis=1)
        return dist_inputs, out[:, -1], new_state

    def compute_actions(self, obs: np.ndarray, state: tuple[np.ndarray, ...], rng: np.random.Generator,
                        explore: bool, prev_inputs: np.ndarray | None = None
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
        """``(actions, logp, values, dist_inputs, new_state)``, sampled as :class:`NumpyActing` samples."""
        dist_inputs, values, new_state = self.step(obs, state, prev_inputs)
        actions = self.sample(dist_inputs, rng, explore)
        return actions, self.logp(dist_inputs, actions), values, dist_inputs, new_state

    def sample(self, dist_inputs: np.ndarray, rng: np.random.Generator, explore: bool) -> np.ndarray:
        """Actions drawn from dist inputs ``[B, D]`` (``explore=False``: the mode)."""
        return _np_sample(self.dist_class, dist_inputs, rng, explore)

    def logp(self, dist_inputs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """float32 ``log pi(actions)``, row by row (as :meth:`NumpyActing.logp`)."""
        return _np_logp(self.dist_class, dist_inputs, actions)


class QModel(nn.Module):
    """``forward(obs) -> q_values [B, A]``: an MLP (or CNN + MLP) torso and a Q head, dueling or plain.

    Dueling: ``Q(s, a) = V(s) + A(s, a) - mean_a A(s, a)``, with value and advantage heads of ``hiddens``.

    Examples:
        >>> model = QModel(gym.spaces.Box(-1, 1, (4,)), 3, ModelConfig(hidden_sizes=(8,)), hiddens=(5,), dueling=True)
        >>> tuple(model(torch.zeros(2, 4)).shape)
        (2, 3)
    """

    def __init__(self, obs_space: gym.spaces.Box, num_actions: int, config: ModelConfig, *,
                 hiddens: tuple[int, ...], dueling: bool) -> None:
        super().__init__()
        act = _ACTIVATIONS[config.activation]
        self.activation_name = config.activation
        self.encoder, in_size = _encoder(obs_space, config)
        torso = [in_size, *config.hidden_sizes]
        self.torso = _mlp(torso, act)
        head = [torso[-1], *hiddens]
        self.advantage = nn.Sequential(_mlp(head, nn.ReLU), nn.Linear(head[-1], num_actions))
        self.value = nn.Sequential(_mlp(head, nn.ReLU), nn.Linear(head[-1], 1)) if dueling else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        features = self.torso(self.encoder(obs.float() if obs.dtype != torch.uint8 else obs))
        advantages_BA: torch.Tensor = self.advantage(features)
        if self.value is None:
            return advantages_BA
        value_B1: torch.Tensor = self.value(features)
        return value_B1 + advantages_BA - advantages_BA.mean(dim=-1, keepdim=True)


class NumpyQ(_NumpyMirror):
    """``Q(obs, .)`` of an MLP :class:`QModel` in numpy, for the small CPU batches that acting works on.

    A worker acts on a few envs at a time, where torch's per-op dispatch costs several times the arithmetic
    (a 64-64 dueling network on one observation: ~190 us through torch, ~25 us here). Like
    :class:`~flowrl.models.NumpyActing`, the mirror reads the parameters as numpy views and re-reads them when
    their torch version counters move or after :meth:`invalidate` (fused optimizer steps leave the counters
    alone). The value and advantage heads run side by side through block-diagonal layers, and the dueling
    combination ``V + A - mean(A)``, linear in the heads' last layers, is folded into one layer.
    :meth:`build` returns ``None`` for a model it cannot mirror exactly (a CNN, a subclass, a GPU).

    Examples:
        >>> model = QModel(gym.spaces.Box(-1, 1, (4,)), 3, ModelConfig(hidden_sizes=(8,)), hiddens=(5,), dueling=True)
        >>> obs = np.ones((2, 4), np.float32)
        >>> bool(np.allclose(NumpyQ.build(model).q_values(obs), model(torch.as_tensor(obs)).detach().numpy(),
        ...                  atol=1e-6))
        True
    """

    def __init__(self, model: QModel) -> None:
        super().__init__(model)
        self.model = model
        self.activation = _NP_ACTIVATIONS[model.activation_name]
        self._torso: list[tuple[np.ndarray, np.ndarray]] = []
        self._heads: list[tuple[np.ndarray, np.ndarray]] = []  # [advantages | value] side by side, then Q

    @staticmethod
    def build(model: nn.Module) -> NumpyQ | None:
        """A numpy mirror of ``model``, or ``None`` if it is not a plain MLP QModel on the CPU."""
        if type(model) is not QModel or not isinstance(model.encoder, nn.Flatten):
            return None
        if any(p.device.type != "cpu" for p in model.parameters()):
            return None
        return NumpyQ(model)

    def invalidate(self) -> None:
        """Re-read the parameters at the next call; a plain (not dueling) model's mirror holds only views of them,
        which an in-place update (a fused optimizer step) already changed, so it has nothing to re-read."""
        if self.model.value is not None:  # the folded dueling layer is computed from the weights
            super().invalidate()

    def _read(self) -> None:
        advantage, value = _linears(self.model.advantage), _linears(self.model.value)
        heads = advantage
        if value:  # both heads read the torso's features: their hidden layers side by side, block-diagonal
            (*hidden_a, (w_a, b_a)), (*hidden_v, (w_v, b_v)) = advantage, value
            heads = [(np.concatenate([a[0], v[0]], 1), np.concatenate([a[1], v[1]])) for a, v in
                     zip(hidden_a[:1], hidden_v[:1])]
            heads += [(_block_diag(a[0], v[0]), np.concatenate([a[1], v[1]]))
                      for a, v in zip(hidden_a[1:], hidden_v[1:])]
            # Q = V + A - mean(A) is linear in the last layers' weights: fold it into one [features, A] layer
            w_a, b_a = w_a - w_a.mean(axis=1, keepdims=True), b_a - b_a.mean() + b_v
            w_q = np.concatenate([w_a, np.repeat(w_v, w_a.shape[1], axis=1)]) if hidden_a else w_a + w_v
            heads.append((w_q, b_a))
        self._torso, self._heads = _linears(self.model.torso), heads

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """``Q(obs, .)`` ``[B, A]`` as float32, equal to the model's forward."""
        self._refresh()
        x = _np_dense(np.asarray(obs, np.float32).reshape(len(obs), -1), self._torso, self.activation)
        x = _np_dense(x, self._heads[:-1], _NP_ACTIVATIONS["relu"])  # the heads' hidden layers are ReLU (QModel)
        return _np_dense(x, self._heads[-1:], None)


class ActorModel(nn.Module):
    """``forward(obs) -> outputs [B, num_outputs]``: an MLP (or CNN + MLP) over the observation, a linear head.

    The continuous-control actors: DDPG/TD3 squash the outputs with ``tanh`` into actions in ``[-1, 1]``, SAC
    reads them as the mean and log-std of a Gaussian that it squashes.

    Examples:
        >>> model = ActorModel(gym.spaces.Box(-1, 1, (3,)), 2, ModelConfig(hidden_sizes=(8,), activation="relu"))
        >>> tuple(model(torch.zeros(5, 3)).shape)
        (5, 2)
    """

    def __init__(self, obs_space: gym.spaces.Box, num_outputs: int, config: ModelConfig) -> None:
        super().__init__()
        self.activation_name = config.activation
        self.encoder, in_size = _encoder(obs_space, config)
        sizes = [in_size, *config.hidden_sizes]
        self.trunk = _mlp(sizes, _ACTIVATIONS[config.activation])
        self.head = nn.Linear(sizes[-1], num_outputs)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(self.encoder(obs.float() if obs.dtype != torch.uint8 else obs)))  # type: ignore[no-any-return]


class ContinuousQModel(nn.Module):
    """``forward(obs, actions) -> Q(obs, actions) [B]``: an MLP over ``[features(obs), actions]``, or ``num_q``
    such critics side by side (``[num_q, B]``, TD3's and SAC's twin Q) when ``num_q > 1``.

    The critics' layers are stacked: layer ``i`` is one ``weights[i]`` ``[num_q, in, out]`` and one ``biases[i]``
    ``[num_q, 1, out]``, and all critics go through a layer in one batched matrix product (``torch.baddbmm``)
    instead of one small product each. Each critic is initialised as ``nn.Linear`` initialises its layers, and a
    state dict saved with one ``nn.Linear`` per layer and critic (``critics.<k>.0.<2i>.weight``, ``critics.<k>.1.*``
    for the head) still loads: it is stacked on load.

    Examples:
        >>> q = ContinuousQModel(gym.spaces.Box(-1, 1, (3,)), 2, ModelConfig(hidden_sizes=(8, 8)), num_q=2)
        >>> tuple(q(torch.zeros(5, 3), torch.zeros(5, 2)).shape), tuple(q.weights[0].shape)
        ((2, 5), (2, 5, 8))
        >>> tuple(q.single(torch.zeros(5, 3), torch.zeros(5, 2), 1).shape)  # the second critic alone
        (5,)
    """

    def __init__(self, obs_space: gym.spaces.Box, action_dim: int, config: ModelConfig, *, num_q: int = 1) -> None:
        super().__init__()
        self.num_q = num_q
        self.encoder, in_size = _encoder(obs_space, config)
        sizes = [in_size + action_dim, *config.hidden_sizes, 1]
        self.activation = _INPLACE_FUNCTIONS[config.activation]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for a, b in zip(sizes[:-1], sizes[1:]):
            bound = 1.0 / math.sqrt(a)  # nn.Linear's default initialisation, per critic
            self.weights.append(nn.Parameter(torch.empty(num_q, a, b).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(num_q, 1, b).uniform_(-bound, bound)))
        self._register_load_state_dict_pre_hook(_stack_linear_critics)  # type: ignore[no-untyped-call]

    def _inputs(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.encoder(obs.float() if obs.dtype != torch.uint8 else obs), actions.float()], dim=-1)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        x = self._inputs(obs, actions)
        if self.num_q == 1:
            return self._one(x, 0)
        x = x.expand(self.num_q, *x.shape)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(b, x, w)
            if i < last:
                x = self.activation(x)
        return x.squeeze(-1)

    def single(self, obs: torch.Tensor, actions: torch.Tensor, k: int) -> torch.Tensor:
        """``Q_k(obs, actions)`` ``[B]`` of critic ``k`` alone (DDPG's and TD3's actor loss reads the first)."""
        return self._one(self._inputs(obs, actions), k)

    def _one(self, x: torch.Tensor, k: int) -> torch.Tensor:
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = torch.addmm(b[k], x, w[k])
            if i < last:
                x = self.activation(x)
        return x.squeeze(-1)


def _stack_linear_critics(state_dict: dict[str, torch.Tensor], prefix: str, *_: object) -> None:
    """A load pre-hook of :class:`ContinuousQModel`: rewrites the keys of a state dict saved with one ``nn.Linear``
    per layer and critic (``critics.<k>.0.<2i>.weight`` ``[out, in]``, the head ``critics.<k>.1.weight``) into the
    stacked ``weights.<i>`` ``[num_q, in, out]`` and ``biases.<i>`` ``[num_q, 1, out]``, in place."""
    old = sorted(k for k in state_dict if k.startswith(prefix + "critics."))
    if not old:
        return
    layers: dict[tuple[int, tuple[int, int]], dict[str, torch.Tensor]] = {}
    for key in old:
        parts = key[len(prefix):].split(".")  # critics, k, 0, 2i, weight | critics, k, 1, weight
        order = (0, int(parts[3])) if parts[2] == "0" else (1, 0)
        layers.setdefault((int(parts[1]), order), {})[parts[-1]] = state_dict.pop(key)
    for i, order in enumerate(sorted({order for _, order in layers})):
        per_critic = [layers[(k, order)] for k in sorted({k for k, _ in layers})]
        state_dict[f"{prefix}weights.{i}"] = torch.stack([layer["weight"].t() for layer in per_critic])
        state_dict[f"{prefix}biases.{i}"] = torch.stack([layer["bias"].unsqueeze(0) for layer in per_critic])


class NumpyMLP(_NumpyMirror):
    """An MLP :class:`ActorModel` in numpy, for the few observations a rollout worker acts on at a time (see
    :class:`NumpyActing`); :meth:`build` returns ``None`` for a model it cannot mirror exactly (a CNN, a subclass,
    a GPU).

    Examples:
        >>> model = ActorModel(gym.spaces.Box(-1, 1, (3,)), 2, ModelConfig(hidden_sizes=(8,), activation="relu"))
        >>> obs = np.ones((4, 3), np.float32)
        >>> bool(np.allclose(NumpyMLP.build(model).forward(obs), model(torch.as_tensor(obs)).detach().numpy(),
        ...                  atol=1e-6))
        True
    """

    def __init__(self, model: ActorModel) -> None:
        super().__init__(model)
        self.model = model
        self.activation = _NP_ACTIVATIONS[model.activation_name]
        self._trunk: list[tuple[np.ndarray, np.ndarray]] = []
        self._head: list[tuple[np.ndarray, np.ndarray]] = []

    @staticmethod
    def build(model: nn.Module) -> NumpyMLP | None:
        """A numpy mirror of ``model``, or ``None`` if it is not a plain MLP ActorModel on the CPU."""
        if type(model) is not ActorModel or not isinstance(model.encoder, nn.Flatten):
            return None
        if any(p.device.type != "cpu" for p in model.parameters()):
            return None
        return NumpyMLP(model)

    def _read(self) -> None:
        self._trunk, self._head = _linears(self.model.trunk), _linears(self.model.head)

    def forward(self, obs: np.ndarray) -> np.ndarray:
        """The model's outputs ``[B, num_outputs]`` as float32."""
        self._refresh()
        x = _np_dense(np.asarray(obs, np.float32).reshape(len(obs), -1), self._trunk, self.activation)
        return _np_dense(x, self._head, None)
