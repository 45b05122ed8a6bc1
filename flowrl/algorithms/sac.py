"""SAC: soft actor-critic from a replay buffer as a plan (RLlib Flow, https://arxiv.org/abs/2011.12719; SAC,
https://arxiv.org/abs/1801.01290; automatic entropy tuning, https://arxiv.org/abs/1812.05905).

Dataflow: DQN's two sub-flows over one trainer-owned ``LocalReplayBuffer`` (:func:`flowrl.algorithms.dqn.plan`).
(1) The workers sample in lockstep and each fragment is stored. (2) ``Replay`` draws ``train_batch_size`` rows,
the learner takes one step on the critics, the actor and the entropy temperature and broadcasts
(``TrainOneStep``), and the target critics move ``tau`` of the way towards the online ones after every train
step (``UpdateTargetNetwork(0)``, a soft update). With the defaults one env step is stored per replayed batch:
one gradient step per env step. Actions are tanh-squashed into ``[-1, 1]`` and mapped onto the action space's
bounds (``normalize_actions``).

Examples:
    >>> config = SACConfig(seed=0)
    >>> config.env, config.train_batch_size, config.rollout_fragment_length, config.round_robin_weights
    ('Pendulum-v1', 256, 1, [1.0, 1.0])
    >>> SACConfig(tau=1.5)
    Traceback (most recent call last):
    ...
    ValueError: tau=1.5 must be a number in (0, 1] (the target critics' soft-update rate; 1: a copy)
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, fields
from typing import Any, Literal, Mapping, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flowrl.algorithms import Algorithm
from flowrl.algorithms.dqn import make_owned_state, plan
from flowrl.algorithms.off_policy import NSTEP_DISCOUNTS, OffPolicyConfig, nstep_postprocess, soft_update
from flowrl.config import ModelConfig, PolicyConfig
from flowrl.envs.base import EnvSpec
from flowrl.models import ActorModel, ContinuousQModel, NumpyMLP
from flowrl.policy import (NONFINITE_UPDATES_SKIPPED, Policy, TensorBatch, column_tensor, load_module_weights,
                           make_adam, module_weights)
from flowrl.sample_batch import ACTIONS, NEXT_OBS, OBS, REWARDS, TD_ERROR, TERMINATEDS, WEIGHTS, SampleBatch
from flowrl.validation import bounded

__all__ = ["SACConfig", "SACModel", "SACPolicy", "SACLosses", "squashed_gaussian_sample", "squashed_gaussian_logp",
           "plan", "make_owned_state", "ALGORITHM"]

#: the actor's log-std is clamped to this range before it is exponentiated (as SB3 and RLlib do)
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


@dataclass(frozen=True, kw_only=True)
class SACConfig(OffPolicyConfig):
    """SAC's config: :class:`~flowrl.algorithms.off_policy.OffPolicyConfig` (the replay settings) with the SAC
    paper's (and RLlib's) defaults for continuous control.

    Attributes:
        env: a gymnasium id with a bounded ``Box`` action space ("Pendulum-v1").
        actor_hiddens: widths of the actor's hidden layers ((256, 256)): an ``ActorModel`` with
            ``ModelConfig(hidden_sizes=actor_hiddens, activation=activation)`` and a linear head of the mean and
            log-std of each action dimension.
        critic_hiddens: widths of each critic's hidden layers ((256, 256)): a ``ContinuousQModel`` over
            ``[obs, action]`` with ``ModelConfig(hidden_sizes=critic_hiddens, activation=activation)``.
        activation: the hidden layers' activation, actor and critics ("relu").
        model: only ``model.conv_filters`` is read (the torso for image observations); the MLP widths and
            activation are ``actor_hiddens``, ``critic_hiddens`` and ``activation``, and any other
            ``model.hidden_sizes`` or ``model.activation`` is refused.
        lr: unused: SAC's learning rates are ``actor_lr``, ``critic_lr`` and ``entropy_lr``, and any other
            ``lr`` is refused.
        actor_lr / critic_lr / entropy_lr: Adam learning rates of the actor, the critics and the entropy
            temperature ``log_alpha`` (3e-4 each).
        tau: the target critics move ``tau`` of the way towards the online ones at each update (5e-3).
        target_network_update_freq: sampled env steps between soft target updates (0: after every train step).
        twin_q: two critics, the smaller estimate bootstraps and trains the actor (clipped double Q).
        initial_alpha: the entropy temperature at the start (1.0).
        target_entropy: the entropy that the temperature steers the policy's towards; "auto" is
            ``-action_dim``, or give a number.
        use_huber: the critics' loss is the Huber loss (True) or ``0.5 x`` the squared error (False).
        huber_threshold: the Huber loss is quadratic for ``|td_error| < huber_threshold`` (1.0).
        grad_clip: each network's gradients (actor, critics, temperature) are clipped to this norm (None: not).
        train_batch_size: rows per replayed train batch (256).
        rollout_fragment_length: steps per env per stored fragment (1: one gradient step per env step).
        buffer_size: timesteps the replay buffer holds (100000: a 30k-step Pendulum run never evicts).
        learning_starts: timesteps stored (sampled by the untrained actor) before the first replay (1000).
        prioritized_replay: proportional prioritized replay (False: uniform).
    """

    env: EnvSpec = "Pendulum-v1"
    actor_hiddens: tuple[int, ...] = (256, 256)
    critic_hiddens: tuple[int, ...] = (256, 256)
    activation: Literal["tanh", "relu", "elu"] = "relu"
    actor_lr: float = bounded(3e-4, gt=0, meaning="the actor's Adam learning rate")
    critic_lr: float = bounded(3e-4, gt=0, meaning="the critics' Adam learning rate")
    entropy_lr: float = bounded(3e-4, gt=0, meaning="the entropy temperature's Adam learning rate")
    tau: float = bounded(5e-3, gt=0, le=1, meaning="the target critics' soft-update rate; 1: a copy")
    target_network_update_freq: int = 0
    twin_q: bool = True
    initial_alpha: float = bounded(1.0, gt=0, meaning="the entropy temperature at the start")
    target_entropy: float | Literal["auto"] = "auto"
    use_huber: bool = False
    huber_threshold: float = bounded(1.0, gt=0, meaning="the Huber loss is linear beyond it")
    train_batch_size: int = 256
    rollout_fragment_length: int = 1
    buffer_size: int = 100_000
    learning_starts: int = 1000
    prioritized_replay: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("actor_hiddens", "critic_hiddens"):
            value = getattr(self, name)
            if not value or not all(isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in value):
                raise ValueError(f"{name}={value!r} must be one or more positive ints, e.g. (256, 256)")
        if isinstance(self.target_entropy, str):
            if self.target_entropy != "auto":
                raise ValueError(f"target_entropy={self.target_entropy!r}; use 'auto' (-action_dim) or a number "
                                 f"such as -1.0")
        elif isinstance(self.target_entropy, bool) or not isinstance(self.target_entropy, (int, float)) \
                or not math.isfinite(self.target_entropy):
            raise ValueError(f"target_entropy={self.target_entropy!r} must be a finite number; pass a finite value "
                             f"such as -1.0, or 'auto' (-action_dim)")
        if not self.normalize_actions:
            raise ValueError("normalize_actions=False: SAC's tanh-squashed actions lie in [-1, 1] and reach the "
                             "env only through the linear map onto the action space's bounds; set "
                             "normalize_actions=True (the default)")
        default_model, lr_default = ModelConfig(), next(f.default for f in fields(PolicyConfig) if f.name == "lr")
        if (self.model.hidden_sizes, self.model.activation) != (default_model.hidden_sizes, default_model.activation):
            raise ValueError(f"model.hidden_sizes={self.model.hidden_sizes!r} / model.activation="
                             f"{self.model.activation!r} are not read by SAC; set actor_hiddens, critic_hiddens and "
                             f"activation instead (and leave model at its defaults)")
        if self.lr != lr_default:
            raise ValueError(f"lr={self.lr!r} is not read by SAC, which has three learning rates; set actor_lr, "
                             f"critic_lr and entropy_lr instead")
        if not self.use_simple_optimizer:
            raise ValueError(f"SAC trains with one learner device (TrainOneStep): num_gpus={self.num_gpus}, "
                             f"simple_optimizer={self.simple_optimizer} asks for the multi-device learner, which "
                             f"has no three-network update; set num_gpus <= 1 and simple_optimizer=None")


def squashed_gaussian_sample(dist_inputs: torch.Tensor,
                             noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(actions, logp)`` of a tanh-squashed diagonal Gaussian: ``actions = tanh(u)``, ``u = mean + std * noise``
    (``noise=None``: ``u = mean``), ``logp = log N(u; mean, std) - sum log(1 - tanh(u)^2)``, the correction
    written ``2 (log 2 - u - softplus(-2u))`` so that it stays finite where ``tanh(u)`` rounds to 1.

    ``dist_inputs`` ``[B, 2A]`` holds the means and then the log-stds (clamped to [-20, 2]); ``noise`` ``[B, A]``.

    Examples:
        >>> actions, logp = squashed_gaussian_sample(torch.zeros(1, 2), torch.zeros(1, 1))
        >>> actions.tolist(), round(logp.item(), 4)  # tanh(0) = 0 and the density of N(0, 1) at 0
        ([[0.0]], -0.9189)
    """
    mean, log_std = dist_inputs.chunk(2, dim=-1)
    log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
    if noise is None:
        u, gauss_logp = mean, -log_std
    else:
        u, gauss_logp = mean + log_std.exp() * noise, -0.5 * noise * noise - log_std
    correction = 2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))
    logp = (gauss_logp - correction).sum(dim=-1) - 0.5 * math.log(2 * math.pi) * mean.shape[-1]
    return torch.tanh(u), logp


def squashed_gaussian_logp(dist_inputs: torch.Tensor, actions: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``log pi(actions)`` ``[B]`` of given actions in ``[-1, 1]`` ``[B, A]`` under the tanh-squashed Gaussian of
    ``dist_inputs`` (:func:`squashed_gaussian_sample`'s): ``u = atanh(a)``, with ``a`` clipped to
    ``[-1 + eps, 1 - eps]`` so that recorded actions on the bounds keep a finite likelihood.

    Examples:
        >>> actions, logp = squashed_gaussian_sample(torch.tensor([[0.3, -0.5]]), torch.tensor([[0.7]]))
        >>> torch.allclose(squashed_gaussian_logp(torch.tensor([[0.3, -0.5]]), actions), logp, atol=1e-5)
        True
    """
    mean, log_std = dist_inputs.chunk(2, dim=-1)
    log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
    u = torch.atanh(actions.clamp(-1 + eps, 1 - eps))
    noise = (u - mean) / log_std.exp()
    correction = 2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))
    return (-0.5 * noise * noise - log_std - correction).sum(dim=-1) - 0.5 * math.log(2 * math.pi) * mean.shape[-1]


class SACModel(nn.Module):
    """SAC's networks in one module: ``actor`` (an :class:`~flowrl.models.ActorModel` whose ``2 x action_dim``
    outputs are the mean and log-std of each action dimension), ``critics`` (a
    :class:`~flowrl.models.ContinuousQModel` with one or two Q-functions) and the scalar parameter ``log_alpha``,
    the log of the entropy temperature. Its state dict is what workers receive and checkpoints hold.

    Examples:
        >>> model = SACModel(gym.spaces.Box(-1, 1, (3,)), 1, SACConfig(actor_hiddens=(8,), critic_hiddens=(8,)))
        >>> obs = torch.zeros(4, 3)
        >>> tuple(model.actor(obs).shape), tuple(model.critics(obs, torch.zeros(4, 1)).shape)
        ((4, 2), (2, 4))
    """

    def __init__(self, obs_space: gym.spaces.Box, action_dim: int, config: SACConfig) -> None:
        super().__init__()
        conv = config.model.conv_filters
        self.actor = ActorModel(obs_space, 2 * action_dim, ModelConfig(
            hidden_sizes=config.actor_hiddens, activation=config.activation, conv_filters=conv))
        self.critics = ContinuousQModel(obs_space, action_dim, ModelConfig(
            hidden_sizes=config.critic_hiddens, activation=config.activation, conv_filters=conv),
            num_q=2 if config.twin_q else 1)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(config.initial_alpha), dtype=torch.float32))


class SACLosses(NamedTuple):
    """SAC's three losses on one batch (:meth:`SACPolicy.losses`) and what a variant builds on: the critics'
    ``Q_k(s, a)`` of the batch's actions ``[K, B]``, the actor's ``log pi(a|s)`` of its own sampled actions ``[B]``
    and the temperature ``alpha`` (a constant)."""

    critic: torch.Tensor
    actor: torch.Tensor
    alpha: torch.Tensor
    stats: dict[str, float]
    q_KB: torch.Tensor
    logp: torch.Tensor
    alpha_value: torch.Tensor


# the columns the losses read (those present are converted to tensors, nothing else)
_LOSS_COLUMNS = (OBS, ACTIONS, REWARDS, NEXT_OBS, TERMINATEDS, NSTEP_DISCOUNTS, WEIGHTS)


class SACPolicy(Policy):
    """The SAC policy: a tanh-squashed Gaussian actor, twin Q critics with soft-updated targets and an
    automatically tuned entropy temperature ``alpha``.

    ``compute_actions``: ``tanh(mean + std * noise)`` (``explore=False``: ``tanh(mean)``, deterministic, for
    evaluation), in ``[-1, 1]``; an MLP actor acts through its numpy mirror (:class:`~flowrl.models.NumpyMLP`).
    ``postprocess_trajectory`` adds n-step windows (:func:`~flowrl.algorithms.off_policy.nstep_postprocess`).

    One learner step on a replayed batch, all three losses from the same (pre-step) networks:

    - critics: ``mean_i w_i l(Q_k(s_i, a_i) - y_i)`` summed over the critics, with ``l`` half the squared error (or
      Huber), ``y = r + nstep_discounts * (min_k Q'_k(s', a') - alpha log pi(a'|s'))``, ``a' ~ pi(.|s')``, ``Q'``
      the target critics, ``w`` the ``weights`` of a prioritized replay (1 without);
    - actor: ``mean(alpha log pi(a|s) - min_k Q_k(s, a))``, ``a ~ pi(.|s)`` reparameterised; the critics' weights
      are constants here, so the actor's loss moves only the actor;
    - temperature: ``-mean(log_alpha (log pi(a|s) + target_entropy))``.

    The actor runs once over ``[obs, next_obs]``, the three losses are summed into one backward pass (each network
    gets only its own loss's gradient), and one fused Adam step with three parameter groups (``actor_lr``,
    ``critic_lr``, ``entropy_lr``; per parameter the same as three Adams) updates all of it. A non-finite gradient
    skips the whole step (``on_nonfinite_update``). :meth:`learn_on_batch` returns the per-row ``td_error`` (the
    mean of the critics' ``|Q_k - y|``) next to ``learner_stats`` when ``prioritized_replay`` is on.
    :meth:`update_target` is the soft update ``Q' <- (1 - tau) Q' + tau Q``.

    Args:
        observation_space: a ``Box``. action_space: a ``Box`` with finite bounds.
        config: a :class:`SACConfig`.

    Raises:
        TypeError: a config that is not a :class:`SACConfig`.
        ValueError: an action space that is not a ``Box`` or has an infinite bound; an observation space that is
            not a ``Box``.

    Examples:
        >>> config = SACConfig(seed=0, actor_hiddens=(8,), critic_hiddens=(8,))
        >>> policy = SACPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (1,)), config)
        >>> actions, _ = policy.compute_actions(np.zeros((4, 3), np.float32))
        >>> actions.shape, bool(np.all(np.abs(actions) <= 1)), policy.target_entropy, policy.alpha
        ((4, 1), True, -1.0, 1.0)
    """

    config: SACConfig
    config_class = SACConfig
    model: SACModel  # type: ignore[assignment]  # SAC replaces the base actor-critic model by its three networks

    postprocess_spans_episodes = True  # n-step postprocessing restarts at every episode boundary

    def __init__(self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: PolicyConfig) -> None:
        if not isinstance(action_space, gym.spaces.Box):
            raise ValueError(f"SAC needs a Box (continuous) action space, got {action_space}; use DQN or PPO for "
                             f"discrete actions")
        if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
            raise ValueError(f"SAC needs finite action bounds, got {action_space}: its tanh-squashed actions in "
                             f"[-1, 1] are mapped onto the bounds; wrap the env so that its action space is bounded")
        if not isinstance(observation_space, gym.spaces.Box):
            raise ValueError(f"SACPolicy needs a Box observation space, got {observation_space}")
        super().__init__(observation_space, action_space, config)
        config = self.config  # a SACConfig: Policy.__init__ checked it
        self.action_shape = tuple(action_space.shape)
        self.action_dim = int(np.prod(self.action_shape))
        with torch.random.fork_rng(devices=[]):
            if config.seed is not None:
                torch.manual_seed(config.seed)
            self.model = SACModel(observation_space, self.action_dim, config).to(self.device)
        self.target_critics = copy.deepcopy(self.model.critics).requires_grad_(False)
        self._critic_params = list(self.model.critics.parameters())
        self._groups = (list(self.model.actor.parameters()), self._critic_params, [self.model.log_alpha])
        self.optimizer = make_adam(self._groups[0], lr=config.actor_lr)
        self.optimizer.add_param_group({"params": self._groups[1], "lr": config.critic_lr})
        self.optimizer.add_param_group({"params": self._groups[2], "lr": config.entropy_lr})
        self.target_entropy = float(-self.action_dim if config.target_entropy == "auto" else config.target_entropy)
        self.numpy_acting = None  # the base class's mirror is of an actor-critic; SAC's actor has its own
        self.numpy_actor = NumpyMLP.build(self.model.actor) if config.numpy_acting else None
        self._td_error: np.ndarray = np.zeros(0, np.float32)

    # -- acting -----------------------------------------------------------------------------------
    @property
    def alpha(self) -> float:
        """The current entropy temperature ``exp(log_alpha)``."""
        return float(self.model.log_alpha.detach().exp())

    def compute_actions(self, obs: np.ndarray, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Squashed actions ``[B, *action_shape]`` in ``[-1, 1]`` for observations ``[B, ...]``; no extra columns."""
        fast = self.numpy_actor
        if fast is not None and fast.model is self.model.actor:  # a subclass may have swapped the model
            mean, log_std = np.split(fast.forward(obs), 2, axis=1)
            if explore:
                std = np.exp(np.clip(log_std, LOG_STD_MIN, LOG_STD_MAX))
                mean = mean + std * self.act_random.standard_normal(mean.shape, dtype=np.float32)
            actions = np.tanh(mean)
        else:
            with torch.no_grad():
                dist_inputs = self.model.actor(self._obs_tensor(obs))
                noise = torch.randn(dist_inputs.shape[0], self.action_dim, generator=self.generator,
                                    device=self.device) if explore else None
                actions = squashed_gaussian_sample(dist_inputs, noise)[0].cpu().numpy()
        return actions.reshape(len(actions), *self.action_shape), {}

    @torch.no_grad()
    def value(self, obs: np.ndarray) -> np.ndarray:
        """``min_k Q_k(obs, tanh(mean))``: the critics' value of the deterministic action."""
        obs_t = self._obs_tensor(obs)
        actions = squashed_gaussian_sample(self.model.actor(obs_t), None)[0]
        q = self.model.critics(obs_t, actions).view(-1, len(obs_t))
        return q.min(dim=0).values.cpu().numpy()  # type: ignore[no-any-return]

    # -- postprocessing ---------------------------------------------------------------------------
    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        return nstep_postprocess(batch, n_step=self.config.n_step, gamma=self.config.gamma)

    # -- losses -----------------------------------------------------------------------------------
    def to_tensors(self, batch: SampleBatch) -> TensorBatch:
        """Only the columns the losses read."""
        return {k: column_tensor(batch[k], self.device) for k in _LOSS_COLUMNS if k in batch}

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The sum of the critics', the actor's and the temperature's losses (see the class docstring) and the
        stats; each network's gradient comes from its own loss only."""
        losses = self.losses(batch)
        return losses.critic + losses.actor + losses.alpha, losses.stats

    def losses(self, batch: TensorBatch) -> SACLosses:
        """The three losses apart, with what they were computed from (:class:`SACLosses`): what a variant changes
        (CQL's conservative critics, its behaviour-cloning actor) starts from here."""
        cfg, model = self.config, self.model
        obs, next_obs = batch[OBS], batch[NEXT_OBS]
        size = len(obs)
        noise, next_noise = torch.randn(2 * size, self.action_dim, generator=self.generator,
                                        device=self.device).chunk(2)
        pi_actions, logp = squashed_gaussian_sample(model.actor(obs), noise)
        log_alpha = model.log_alpha
        alpha = log_alpha.detach().exp()
        with torch.no_grad():  # (a pass over [obs, next_obs] would backpropagate through next_obs's rows too)
            next_actions, next_logp = squashed_gaussian_sample(model.actor(next_obs), next_noise)
            next_q_B = self.target_critics(next_obs, next_actions).view(-1, size).min(dim=0).values
            if NSTEP_DISCOUNTS in batch:
                discounts_B = batch[NSTEP_DISCOUNTS].float()
            else:  # a batch that skipped postprocessing: one-step windows
                discounts_B = cfg.gamma * (~batch[TERMINATEDS].bool()).float()
            targets_B = batch[REWARDS].float() + discounts_B * (next_q_B - alpha * next_logp)
        q_KB = model.critics(obs, batch[ACTIONS].reshape(size, -1)).view(-1, size)
        td_error_KB = q_KB - targets_B
        if cfg.use_huber:
            per_row_KB = nn.functional.huber_loss(q_KB, targets_B.expand_as(q_KB), reduction="none",
                                                  delta=cfg.huber_threshold)
        else:
            per_row_KB = 0.5 * td_error_KB.square()
        if WEIGHTS in batch:
            per_row_KB = per_row_KB * batch[WEIGHTS].float()
        critic_loss = per_row_KB.mean(dim=1).sum()
        for p in self._critic_params:  # the actor's loss treats the critics' weights as constants
            p.requires_grad_(False)
        try:
            pi_q_B = model.critics(obs, pi_actions).view(-1, size).min(dim=0).values
        finally:
            for p in self._critic_params:
                p.requires_grad_(True)
        actor_loss = (alpha * logp - pi_q_B).mean()
        alpha_loss = -(log_alpha * (logp.detach() + self.target_entropy)).mean()
        if cfg.prioritized_replay:
            self._td_error = td_error_KB.detach().abs().mean(dim=0).cpu().numpy()
        parts = torch.stack([actor_loss, critic_loss, alpha_loss, alpha, -logp.mean(), q_KB.mean(), q_KB.min(),
                             q_KB.max(), td_error_KB.abs().mean(), targets_B.mean()]).detach().tolist()
        stats = dict(zip(("actor_loss", "critic_loss", "alpha_loss", "alpha", "entropy", "mean_q", "min_q",
                          "max_q", "mean_abs_td_error", "mean_target_q"), parts))
        return SACLosses(critic_loss, actor_loss, alpha_loss, stats, q_KB, logp, alpha)

    # -- learning ---------------------------------------------------------------------------------
    def learn_on_tensors(self, tensors: TensorBatch) -> dict[str, Any]:
        """One step of all three networks (:meth:`Policy.optimizer_step`: counts ``weights_version``, skips a
        non-finite gradient); ``{"learner_stats": ...}``, plus ``"td_error": [B]`` with prioritized replay (0 for
        a row whose error is not finite: the step was skipped, and the row gets the lowest priority instead of
        a NaN one)."""
        stats = self._sac_backward(tensors)
        self.optimizer_step()
        if self.num_nonfinite_updates_skipped:
            stats[NONFINITE_UPDATES_SKIPPED] = self.num_nonfinite_updates_skipped
        if not self.config.prioritized_replay:
            return {"learner_stats": stats}
        td_error = self._td_error
        if not np.isfinite(td_error).all():
            td_error = np.where(np.isfinite(td_error), td_error, 0.0).astype(td_error.dtype)
        return {"learner_stats": stats, TD_ERROR: td_error}

    def _sac_backward(self, tensors: TensorBatch) -> dict[str, float]:
        """The summed losses' gradients; with ``grad_clip``, each network's clipped to that norm on its own."""
        loss, stats = self.loss(tensors)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch's backward is untyped
        if self.config.grad_clip is not None:
            for name, params in zip(("actor", "critic", "alpha"), self._groups):
                stats[f"{name}_grad_gnorm"] = float(torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip))
        return {"loss": stats["actor_loss"] + stats["critic_loss"] + stats["alpha_loss"], **stats}

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, Any]]:
        """The summed losses' gradients (clipped as configured) as numpy arrays, in parameter order."""
        stats = self._sac_backward(self.to_tensors(batch))
        grads = [np.zeros(tuple(p.shape), np.float32) if p.grad is None else p.grad.detach().cpu().numpy()
                 for p in self.model.parameters()]
        info: dict[str, Any] = {"learner_stats": stats}
        return grads, ({**info, TD_ERROR: self._td_error} if self.config.prioritized_replay else info)

    def optimizer_step(self) -> None:
        super().optimizer_step()
        if self.numpy_actor is not None:
            self.numpy_actor.invalidate()

    def update_target(self) -> None:
        """The soft update ``Q' <- (1 - tau) Q' + tau Q`` of the target critics."""
        soft_update(self.target_critics, self.model.critics, self.config.tau)

    # -- state ------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """The base state (all three networks' weights, the one optimizer with its three parameter groups, the
        RNGs) plus the target critics' weights."""
        target = module_weights(self.target_critics)
        return {**super().get_state(), "target_weights": target}

    def set_state(self, state: Mapping[str, Any]) -> None:
        if "target_weights" not in state:
            raise ValueError(f"SACPolicy.set_state: the state has no 'target_weights' (keys {sorted(state)}); "
                             f"restore a state saved by a SACPolicy")
        super().set_state(state)
        load_module_weights(self.target_critics, state["target_weights"], self.device)


ALGORITHM = Algorithm("sac", SACConfig, SACPolicy, plan, make_owned_state=make_owned_state)
