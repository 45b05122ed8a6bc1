"""DDPG and its TD3 variant: a deterministic actor and a Q critic learned from a replay buffer, as a plan (RLlib
Flow, https://arxiv.org/abs/2011.12719; DDPG, https://arxiv.org/abs/1509.02971; TD3,
https://arxiv.org/abs/1802.09477).

Dataflow: DQN's two sub-flows (:func:`flowrl.algorithms.dqn.plan`, "DDPG analogously"). (1) The workers sample
in lockstep, acting with the actor plus exploration noise, and each fragment is stored in the trainer-owned
``LocalReplayBuffer``. (2) ``Replay`` draws ``train_batch_size`` rows, the learner takes a critic step (and every
``policy_delay`` critic steps an actor step) and broadcasts, the replayed rows get new priorities when replay is
prioritized, and ``UpdateTargetNetwork(0)`` moves the target actor and critic ``tau`` of the way to the online
ones after every train step. ``Concurrently(round_robin)`` joins them with weights from ``training_intensity``.

Examples:
    >>> config = DDPGConfig(seed=0)
    >>> config.env, config.rollout_fragment_length, config.train_batch_size, config.tau, config.twin_q
    ('Pendulum-v1', 1, 256, 0.005, False)
    >>> DDPGConfig(tau=1.5)
    Traceback (most recent call last):
    ...
    ValueError: tau=1.5 must be a number in (0, 1] (the target networks' step towards the online ones)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal, Mapping

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
from flowrl.policy import (NONFINITE_UPDATES_SKIPPED, Policy, TensorBatch, _to_numpy_tree, _to_torch_tree,
                           column_tensor, load_module_weights, make_adam, module_weights, step_adam)
from flowrl.sample_batch import ACTIONS, NEXT_OBS, OBS, REWARDS, TD_ERROR, TERMINATEDS, WEIGHTS, SampleBatch
from flowrl.validation import bounded

__all__ = ["DDPGConfig", "DDPGPolicy", "make_owned_state", "plan", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class DDPGConfig(OffPolicyConfig):
    """DDPG's config: :class:`~flowrl.algorithms.off_policy.OffPolicyConfig` (the replay settings) with DDPG's
    networks, losses and exploration; TD3's three tricks are here too, off (see
    :class:`~flowrl.algorithms.td3.TD3Config`). Names follow RLlib's DDPG where it has them.

    Attributes:
        env: ``"Pendulum-v1"``; the env must have a 1-D ``Box`` action space with finite bounds.
        normalize_actions: must stay ``True``: the actor's ``tanh`` actions lie in ``[-1, 1]`` and are mapped
            onto the space's bounds.
        rollout_fragment_length: env steps per stored fragment (1: one gradient step per env step).
        train_batch_size: rows per replayed train batch (256).
        prioritized_replay: False (uniform replay, as TD3 and SB3; RLlib's DDPG prioritizes).
        target_network_update_freq: 0 (a soft ``tau`` update after every train step).
        lr: Adam's learning rate for both networks unless ``actor_lr``/``critic_lr`` say otherwise (1e-3).
        actor_lr: the actor's learning rate (``None``: ``lr``).
        critic_lr: the critics' learning rate (``None``: ``lr``).
        actor_hiddens: the actor's hidden layers ((64, 64): RLlib's tuned Pendulum sizes, cheap on a laptop;
            RLlib's default for harder envs is (400, 300)).
        critic_hiddens: each critic's hidden layers ((64, 64)).
        activation: the networks' activation (``"relu"``). ``model`` gives only the conv torso for image
            observations: a ``model`` with other ``hidden_sizes`` or ``activation`` than the defaults is refused.
        tau: each target network moves ``tau`` of the way towards its online network per update (0.005; 1: copy).
        twin_q: two critics; the bootstrap takes their minimum (TD3's clipped double Q).
        policy_delay: critic steps per actor step (1; TD3: 2).
        smooth_target_policy: Gaussian noise on the bootstrap action (TD3's target policy smoothing).
        target_noise: the std of that noise, in the ``[-1, 1]`` action scale (0.2).
        target_noise_clip: that noise is clipped to ``+-target_noise_clip`` (0.5).
        exploration_noise: the std of the noise added to the actor's actions, in the ``[-1, 1]`` scale (0.1);
            each policy multiplies it by its ``noise_scale`` (1.0). Noisy actions are clipped to ``[-1, 1]``.
        exploration_noise_type: ``"gaussian"`` (independent per step) or ``"ou"`` (Ornstein-Uhlenbeck, RLlib's
            DDPG default: ``x += -ou_theta x + ou_sigma N(0, 1)`` per step, noise ``exploration_noise * x``).
        ou_theta: the Ornstein-Uhlenbeck noise's pull towards 0 per step (0.15).
        ou_sigma: the Ornstein-Uhlenbeck noise's per-step std (0.2).
        random_timesteps: the first sampled steps act uniformly at random in ``[-1, 1]`` (1000), counted by
            each policy, or by the broadcast global step count once that is larger.
        l2_reg: L2 penalty ``l2_reg * sum(w^2) / 2`` on each network's weight matrices (0).
        use_huber: Huber instead of squared TD errors (False).
        huber_threshold: the Huber loss is linear beyond it (1.0).
        The other replay settings (``learning_starts`` 1000, ``buffer_size``, ``n_step``,
        ``training_intensity`` None: one gradient step per env step, ...) are
        :class:`~flowrl.algorithms.off_policy.OffPolicyConfig`'s.
    """

    env: EnvSpec = "Pendulum-v1"
    rollout_fragment_length: int = 1
    train_batch_size: int = 256
    prioritized_replay: bool = False
    target_network_update_freq: int = 0
    lr: float = 1e-3
    actor_lr: float | None = bounded(None, gt=0, meaning="None: lr")
    critic_lr: float | None = bounded(None, gt=0, meaning="None: lr")
    actor_hiddens: tuple[int, ...] = (64, 64)
    critic_hiddens: tuple[int, ...] = (64, 64)
    activation: Literal["tanh", "relu", "elu"] = "relu"
    tau: float = bounded(0.005, gt=0, le=1, meaning="the target networks' step towards the online ones")
    twin_q: bool = False
    policy_delay: int = bounded(1, ge=1, meaning="critic steps per actor step")
    smooth_target_policy: bool = False
    target_noise: float = bounded(0.2, ge=0, meaning="std of the bootstrap action's smoothing noise")
    target_noise_clip: float = bounded(0.5, ge=0, meaning="the smoothing noise is clipped to +-this")
    exploration_noise: float = bounded(0.1, ge=0, meaning="std of the exploration noise, in the [-1, 1] "
                                       "action scale")
    exploration_noise_type: Literal["gaussian", "ou"] = "gaussian"
    ou_theta: float = bounded(0.15, ge=0, le=1, meaning="the Ornstein-Uhlenbeck noise's pull towards 0 per step")
    ou_sigma: float = bounded(0.2, ge=0, meaning="the Ornstein-Uhlenbeck noise's per-step std")
    random_timesteps: int = bounded(1000, ge=0, meaning="sampled steps of uniform random actions at the start")
    l2_reg: float = bounded(0.0, ge=0, meaning="L2 penalty on the weight matrices")
    use_huber: bool = False
    huber_threshold: float = bounded(1.0, gt=0, meaning="the Huber loss is linear beyond it")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("actor_hiddens", "critic_hiddens"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not value or not all(
                    isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in value):
                raise ValueError(f"{name}={value!r} must be a non-empty tuple of positive ints, e.g. (256, 256)")
        if self.activation not in ("tanh", "relu", "elu"):
            raise ValueError(f"activation={self.activation!r}; use 'relu', 'tanh' or 'elu'")
        if self.exploration_noise_type not in ("gaussian", "ou"):
            raise ValueError(f"exploration_noise_type={self.exploration_noise_type!r}; use 'gaussian' or 'ou'")
        default_model = ModelConfig()
        if (self.model.hidden_sizes, self.model.activation) != (default_model.hidden_sizes, default_model.activation):
            raise ValueError(f"model=ModelConfig(hidden_sizes={self.model.hidden_sizes}, activation="
                             f"{self.model.activation!r}): {type(self).__name__} builds its networks from "
                             f"actor_hiddens, critic_hiddens and activation (model gives only conv_filters); set "
                             f"those and leave model's hidden_sizes and activation at their defaults")
        if not self.normalize_actions:
            raise ValueError(f"normalize_actions=False: {type(self).__name__}'s actor emits tanh-squashed actions "
                             f"in [-1, 1] that must be mapped onto the action space's bounds; set "
                             f"normalize_actions=True (the default)")
        if not self.use_simple_optimizer:
            raise ValueError(f"num_gpus={self.num_gpus}, simple_optimizer={self.simple_optimizer}: "
                             f"{type(self).__name__}'s learner takes a critic and an actor step on one device and "
                             f"has no multi-device path; use num_gpus=0 or 1 (or simple_optimizer=True)")

    def network_config(self, hiddens: tuple[int, ...]) -> ModelConfig:
        """The :class:`~flowrl.config.ModelConfig` of a network with these hidden layers (``model``'s conv
        filters for image observations)."""
        return ModelConfig(hidden_sizes=hiddens, activation=self.activation, conv_filters=self.model.conv_filters)


_NO_GRADIENTS = ("{} takes a critic step and then an actor step on each batch and has no gradient-passing path "
                 "(async gradients, the multi-device learner); train it with learn_on_batch (TrainOneStep)")

# the columns the losses read (those present are converted to tensors, nothing else)
_LOSS_COLUMNS = (OBS, ACTIONS, REWARDS, NEXT_OBS, TERMINATEDS, NSTEP_DISCOUNTS, WEIGHTS)


class DDPGPolicy(Policy):
    """The DDPG/TD3 policy: a ``tanh``-squashed deterministic actor with exploration noise, one or two ``Q(s, a)``
    critics, their target copies, and separate Adam optimizers.

    ``model`` is one ``nn.ModuleDict`` holding ``"actor"`` (:class:`~flowrl.models.ActorModel`, actions
    ``tanh(actor(obs))`` in ``[-1, 1]``) and ``"critic"`` (:class:`~flowrl.models.ContinuousQModel`, two critics
    with ``twin_q``), so the weights that workers receive and the non-finite-gradient check cover both;
    ``target_model`` is its copy without gradients, moved by :meth:`update_target` (``soft_update`` by ``tau``).
    ``optimizer`` is the critic's Adam (``critic_lr``), ``actor_optimizer`` the actor's (``actor_lr``).

    ``compute_actions``: the actor's actions (through :class:`~flowrl.models.NumpyMLP` on the CPU); exploring,
    uniform random ones for the first ``random_timesteps`` steps, then the actor's plus ``noise_scale x
    exploration_noise`` Gaussian (or Ornstein-Uhlenbeck) noise, clipped to ``[-1, 1]``. ``explore=False``: the
    deterministic actor (what evaluation uses).

    ``learn_on_batch`` takes one critic step on ``mean_i w_i sum_k l(Q_k(s_i, a_i) - y_i)`` (``l``: squared / 2 or
    Huber; ``w``: the prioritized-replay weights, 1 without) with ``y = r + nstep_discounts min_k Q'_k(s', a')``,
    ``a' = tanh(actor'(s'))`` (plus clipped noise with ``smooth_target_policy``), and every ``policy_delay``-th
    call an actor step on ``-mean_i Q_1(s_i, tanh(actor(s_i)))``. It returns the per-row ``td_error`` (of
    ``Q_1``) next to ``learner_stats`` for ``UpdatePriorities``. A gradient that is not finite skips that call's
    updates (counted once per call, see ``PolicyConfig.on_nonfinite_update``).

    Args:
        observation_space: a ``Box``. action_space: a 1-D ``Box`` with finite bounds.
        config: a :class:`DDPGConfig` (or :class:`~flowrl.algorithms.td3.TD3Config`).

    Attributes:
        noise_scale: multiplies the exploration noise (1.0; Ape-X DDPG gives each worker its own).
        num_critic_updates / num_actor_updates: the steps each network has taken.

    Raises:
        TypeError: a config that is not a :class:`DDPGConfig`.
        ValueError: an action space that is not a 1-D ``Box`` with finite bounds.

    Examples:
        >>> policy = DDPGPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (1,)), DDPGConfig(seed=0))
        >>> actions, extras = policy.compute_actions(np.zeros((5, 3), np.float32))  # random for the first steps
        >>> actions.shape, bool(np.all(np.abs(actions) <= 1)), extras
        ((5, 1), True, {})
        >>> policy.env_actions(np.array([[0.5]], np.float32)).tolist()  # [-1, 1] onto the bounds [-2, 2]
        [[1.0]]
    """

    config: DDPGConfig
    config_class = DDPGConfig
    model: nn.ModuleDict  # type: ignore[assignment]  # the actor and the critic(s), not the base actor-critic

    postprocess_spans_episodes = True  # n-step postprocessing restarts at every episode boundary

    def __init__(self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: PolicyConfig) -> None:
        if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
            raise ValueError(f"{type(self).__name__} needs a 1-D Box action space, got {action_space}; DDPG and TD3 "
                             f"act in continuous spaces: use DQN (or PPO) for discrete actions, or flatten the env's "
                             f"Box actions")
        if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
            raise ValueError(f"{type(self).__name__} needs finite action bounds, got {action_space}: its tanh "
                             f"actions in [-1, 1] are mapped onto the bounds; give the env finite bounds (e.g. "
                             f"wrap it in gymnasium.wrappers.ClipAction over a bounded Box)")
        if not isinstance(observation_space, gym.spaces.Box):
            raise ValueError(f"{type(self).__name__} needs a Box observation space, got {observation_space}; wrap "
                             f"the env, e.g. with gymnasium.wrappers.FlattenObservation")
        super().__init__(observation_space, action_space, config)
        cfg = self.config  # a DDPGConfig: Policy.__init__ checked it
        self.action_dim = int(action_space.shape[0])
        with torch.random.fork_rng(devices=[]):
            if cfg.seed is not None:
                torch.manual_seed(cfg.seed)
            self.actor = ActorModel(observation_space, self.action_dim, cfg.network_config(cfg.actor_hiddens))
            self.critic = ContinuousQModel(observation_space, self.action_dim, cfg.network_config(cfg.critic_hiddens),
                                           num_q=2 if cfg.twin_q else 1)
        self.model = nn.ModuleDict({"actor": self.actor, "critic": self.critic}).to(self.device)
        self.target_model = copy.deepcopy(self.model).requires_grad_(False)
        self.target_actor: ActorModel = self.target_model["actor"]  # type: ignore[assignment]  # ModuleDict's item
        self.target_critic: ContinuousQModel = self.target_model["critic"]  # type: ignore[assignment]  # likewise
        self.optimizer = make_adam(self.critic.parameters(), lr=cfg.critic_lr or cfg.lr)
        self.actor_optimizer = make_adam(self.actor.parameters(), lr=cfg.actor_lr or cfg.lr)
        self.numpy_acting = None  # the base class's actor-critic fast path; DDPG acts through numpy_actor
        self.numpy_actor = NumpyMLP.build(self.actor) if cfg.numpy_acting else None
        self.noise_scale = 1.0
        self.ou_state = np.zeros((0, self.action_dim), np.float32)
        self.num_explore_steps = 0  # exploring steps this policy acted (for random_timesteps)
        self.num_critic_updates = self.num_actor_updates = 0
        self._actor_loss = 0.0
        self._actor_params, self._critic_params = list(self.actor.parameters()), list(self.critic.parameters())
        self._weight_matrices = {"actor": [p for p in self._actor_params if p.dim() >= 2],  # no biases
                                 "critic": [p for n, p in self.critic.named_parameters() if not n.startswith("biases")
                                            and p.dim() >= 2]}

    # -- acting -----------------------------------------------------------------------------------
    @torch.no_grad()
    def deterministic_actions(self, obs: np.ndarray) -> np.ndarray:
        """``tanh(actor(obs))`` ``[B, A]`` as float32 (through :class:`NumpyMLP` on the CPU)."""
        fast = self.numpy_actor
        if fast is not None and fast.model is self.actor:
            actions: np.ndarray = np.tanh(fast.forward(obs))
            return actions
        return torch.tanh(self.actor(self._obs_tensor(obs))).cpu().numpy()

    def compute_actions(self, obs: np.ndarray, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions ``[B, A]`` in ``[-1, 1]`` for observations ``[B, ...]``; no extra columns."""
        if not explore:
            return self.deterministic_actions(obs), {}
        size, rng = len(obs), self.act_random
        random_phase = max(self.num_explore_steps, self.global_timestep) < self.config.random_timesteps
        self.num_explore_steps += size
        if random_phase:
            return rng.uniform(-1.0, 1.0, (size, self.action_dim)).astype(np.float32), {}
        actions = self.deterministic_actions(obs)
        scale = self.config.exploration_noise * self.noise_scale
        if scale > 0:
            actions = np.clip(actions + scale * self._noise(size), -1.0, 1.0).astype(np.float32, copy=False)
        return actions, {}

    def _noise(self, size: int) -> np.ndarray:
        """Unit noise ``[size, A]``: standard normal draws, or the Ornstein-Uhlenbeck state after one step."""
        draw = self.act_random.standard_normal((size, self.action_dim), dtype=np.float32)
        if self.config.exploration_noise_type == "gaussian":
            return draw
        if self.ou_state.shape != draw.shape:  # a new number of envs: restart the process
            self.ou_state = np.zeros_like(draw)
        self.ou_state += -self.config.ou_theta * self.ou_state + self.config.ou_sigma * draw
        return self.ou_state

    def q_values(self, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """``Q_k(obs, actions)`` of the online critic(s): ``[B]``, or ``[2, B]`` with ``twin_q``."""
        with torch.no_grad():
            q = self.critic(self._obs_tensor(obs), torch.as_tensor(actions, device=self.device))
        return q.cpu().numpy()  # type: ignore[no-any-return]  # torch's numpy() is untyped

    def value(self, obs: np.ndarray) -> np.ndarray:
        """``Q_1(obs, tanh(actor(obs)))``, the first critic's value of the deterministic action."""
        q = self.q_values(obs, self.deterministic_actions(obs))
        return q if q.ndim == 1 else q[0]

    # -- postprocessing ---------------------------------------------------------------------------
    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        return nstep_postprocess(batch, n_step=self.config.n_step, gamma=self.config.gamma)

    # -- learning ---------------------------------------------------------------------------------
    def to_tensors(self, batch: SampleBatch) -> TensorBatch:
        """Only the columns the losses read."""
        return {k: column_tensor(batch[k], self.device) for k in _LOSS_COLUMNS if k in batch}

    def _discounts(self, batch: TensorBatch) -> torch.Tensor:
        if NSTEP_DISCOUNTS in batch:
            return batch[NSTEP_DISCOUNTS].float()
        return self.config.gamma * (~batch[TERMINATEDS].bool()).float()  # a batch that skipped postprocessing

    def _targets(self, batch: TensorBatch, *, online: bool = False) -> torch.Tensor:
        """``r + nstep_discounts min_k Q'_k(s', a')`` ``[B]`` without gradients (``online``: the online networks,
        no smoothing)."""
        cfg = self.config
        actor, critic = (self.actor, self.critic) if online else (self.target_actor, self.target_critic)
        with torch.no_grad():
            next_obs = batch[NEXT_OBS]
            next_actions = torch.tanh(actor(next_obs))
            if cfg.smooth_target_policy and not online:
                noise = torch.randn(next_actions.shape, generator=self.generator, device=self.device)
                clip = cfg.target_noise_clip
                next_actions = (next_actions + (cfg.target_noise * noise).clamp(-clip, clip)).clamp(-1.0, 1.0)
            next_q = critic(next_obs, next_actions)
            if next_q.dim() == 2:
                next_q = next_q.min(dim=0).values
            return batch[REWARDS].float() + self._discounts(batch) * next_q  # type: ignore[no-any-return]

    def _l2(self, network: str) -> torch.Tensor | float:
        if not self.config.l2_reg:
            return 0.0
        return self.config.l2_reg * 0.5 * sum(w.pow(2).sum() for w in self._weight_matrices[network])

    def critic_loss(self, batch: TensorBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, td_error [B] of Q_1, Q_1(s, a) [B])`` on a batch of tensors (see the class docstring)."""
        cfg = self.config
        targets = self._targets(batch)
        q = self.critic(batch[OBS], batch[ACTIONS])
        q_KB = q.unsqueeze(0) if q.dim() == 1 else q
        errors_KB = q_KB - targets
        if cfg.use_huber:
            per_row = nn.functional.huber_loss(q_KB, targets.expand_as(q_KB), reduction="none",
                                               delta=cfg.huber_threshold).sum(0)
        else:
            per_row = 0.5 * errors_KB.pow(2).sum(0)
        if WEIGHTS in batch:
            per_row = per_row * batch[WEIGHTS].float()
        return per_row.mean() + self._l2("critic"), errors_KB[0].detach(), q_KB[0].detach()

    def actor_loss(self, batch: TensorBatch) -> torch.Tensor:
        """``-mean Q_1(s, tanh(actor(s)))`` (plus the L2 penalty); gradients reach the actor's parameters."""
        obs = batch[OBS]
        actions = torch.tanh(self.actor(obs))
        return -self.critic.single(obs, actions, 0).mean() + self._l2("actor")

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The critic's loss and its stats (``learn_on_tensors`` takes the critic and the actor steps)."""
        loss, td_error, q = self.critic_loss(batch)
        return loss, {"critic_loss": float(loss.detach()), "mean_q": float(q.mean())}

    def _clip_and_check(self, params: list[nn.Parameter]) -> tuple[bool, float | None]:
        """Clips the gradients of ``params`` to ``grad_clip``; ``(all finite, the norm before clipping or None)``."""
        if self.config.grad_clip is not None:
            norm = nn.utils.clip_grad_norm_(params, self.config.grad_clip)
            return bool(torch.isfinite(norm)), float(norm)
        grads = [p.grad for p in params if p.grad is not None]
        return not grads or bool(torch.isfinite(torch.stack(torch._foreach_norm(grads))).all()), None

    def learn_on_tensors(self, tensors: TensorBatch) -> dict[str, Any]:
        """A critic step, and an actor step every ``policy_delay``-th call; ``{"learner_stats": ...,
        "td_error": [B]}``. A non-finite gradient skips the call's remaining steps (counted once); its TD errors
        are reported as 0 where not finite (the lowest replay priority, not a NaN one)."""
        if not self.model.training:
            self.model.train()
        loss, td_error_B, q_B = self.critic_loss(tensors)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch's backward is untyped
        finite, critic_norm = self._clip_and_check(self._critic_params)
        stats: dict[str, Any] = {}
        applied = False
        if finite:
            step_adam(self.optimizer)
            self.num_critic_updates += 1
            applied = True
            if self.num_critic_updates % self.config.policy_delay == 0:
                actor_params = self._actor_params
                actor_loss = self.actor_loss(tensors)
                grads = torch.autograd.grad(actor_loss, actor_params)
                for p, g in zip(actor_params, grads):
                    p.grad = g
                finite, actor_norm = self._clip_and_check(actor_params)
                if finite:
                    step_adam(self.actor_optimizer)
                    self.num_actor_updates += 1
                    self._actor_loss = float(actor_loss.detach())
                    if actor_norm is not None:
                        stats["actor_grad_gnorm"] = actor_norm
                if self.numpy_actor is not None:
                    self.numpy_actor.invalidate()  # a fused step leaves the version counters alone
        if not finite:
            self.actor_optimizer.zero_grad(set_to_none=True)
            self._skip_nonfinite_update()
        if applied:
            self.weights_version += 1
        parts = torch.stack([loss.detach(), q_B.mean(), q_B.min(), q_B.max(), td_error_B.abs().mean()]).tolist()
        stats.update(zip(("critic_loss", "mean_q", "min_q", "max_q", "mean_abs_td_error"), parts))
        stats.update(actor_loss=self._actor_loss, num_actor_updates=self.num_actor_updates)
        if critic_norm is not None:
            stats["critic_grad_gnorm"] = critic_norm
        if self.num_nonfinite_updates_skipped:
            stats[NONFINITE_UPDATES_SKIPPED] = self.num_nonfinite_updates_skipped
        td_error = td_error_B.cpu().numpy()
        if not np.isfinite(td_error).all():
            td_error = np.where(np.isfinite(td_error), td_error, 0.0).astype(td_error.dtype)
        return {"learner_stats": stats, TD_ERROR: td_error}

    def td_error(self, batch: SampleBatch) -> np.ndarray:
        """The per-row TD error ``Q_1(s, a) - (r + nstep_discounts min_k Q_k(s', tanh(actor(s'))))`` ``[B]`` of a
        postprocessed batch, with the online networks (a worker's targets are not kept current), as numpy."""
        tensors = self.to_tensors(batch)
        with torch.no_grad():
            q = self.critic(tensors[OBS], tensors[ACTIONS])
            q1 = q if q.dim() == 1 else q[0]
            return (q1 - self._targets(tensors, online=True)).cpu().numpy()  # type: ignore[no-any-return]

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, Any]]:
        """Refused: see :meth:`apply_gradients`."""
        raise NotImplementedError(_NO_GRADIENTS.format(type(self).__name__))

    def apply_gradients(self, gradients: Any) -> None:
        """Refused: the learner takes a critic step and then an actor step on each batch, which one list of
        gradients cannot carry."""
        raise NotImplementedError(_NO_GRADIENTS.format(type(self).__name__))

    def update_target(self) -> None:
        """Moves the target actor and critic ``tau`` of the way towards the online ones (``tau=1``: a copy)."""
        soft_update(self.target_model, self.model, self.config.tau)

    # -- state ------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """The base state (the critic's optimizer as ``optimizer``) plus the target networks, the actor's optimizer,
        the exploration noise's state and the update counters."""
        target = module_weights(self.target_model)
        base = super().get_state()
        return {**base, "target_weights": target,
                "actor_optimizer": _to_numpy_tree(self.actor_optimizer.state_dict()),
                "noise_scale": self.noise_scale, "ou_state": self.ou_state.copy(),
                "num_explore_steps": self.num_explore_steps, "num_critic_updates": self.num_critic_updates,
                "num_actor_updates": self.num_actor_updates, "actor_loss": self._actor_loss,
                "weights_version": self.weights_version}

    def set_state(self, state: Mapping[str, Any]) -> None:
        missing = sorted({"target_weights", "actor_optimizer", "ou_state"} - set(state))
        if missing:
            raise ValueError(f"{type(self).__name__}.set_state: the state has no {missing} (keys {sorted(state)}); "
                             f"restore a state saved by a DDPGPolicy")
        super().set_state(state)
        load_module_weights(self.target_model, state["target_weights"], self.device)
        self.actor_optimizer.load_state_dict(_to_torch_tree(state["actor_optimizer"]))
        self.noise_scale = float(state["noise_scale"])
        self.ou_state = np.array(state["ou_state"], np.float32)
        self.num_explore_steps = int(state["num_explore_steps"])
        self.num_critic_updates, self.num_actor_updates = int(state["num_critic_updates"]), int(
            state["num_actor_updates"])
        self._actor_loss = float(state["actor_loss"])
        self.weights_version = int(state.get("weights_version", self.weights_version))
        if self.numpy_actor is not None:
            self.numpy_actor.invalidate()



ALGORITHM = Algorithm("ddpg", DDPGConfig, DDPGPolicy, plan, make_owned_state=make_owned_state)
