"""DQN: deep Q-learning from a replay buffer as a plan (RLlib Flow, https://arxiv.org/abs/2011.12719; DQN,
https://www.nature.com/articles/nature14236; double Q, https://arxiv.org/abs/1509.06461; dueling,
https://arxiv.org/abs/1511.06581; prioritized replay, https://arxiv.org/abs/1511.05952).

Dataflow: two sub-flows share one trainer-owned ``LocalReplayBuffer``. (1) The workers
sample in lockstep (``ParallelRollouts(bulk_sync)``) and each fragment is stored (``StoreToReplayBuffer``).
(2) ``Replay`` draws ``train_batch_size`` rows, the learner takes one step and broadcasts (``TrainOneStep``),
the replayed rows get their new priorities (``UpdatePriorities``) and the target network is refreshed every
``target_network_update_freq`` sampled steps (``UpdateTargetNetwork``). ``Concurrently(round_robin)`` joins
them with weights from ``training_intensity``; before ``learning_starts`` the replay branch is not ready.

Examples:
    >>> config = DQNConfig(seed=0)
    >>> config.num_workers, config.rollout_fragment_length, config.train_batch_size, config.round_robin_weights
    (0, 4, 32, [1.0, 1.0])
    >>> DQNConfig(training_intensity=64).round_robin_weights  # 64 trained per sampled step: 8 x 32 per 4 stored
    [1.0, 8.0]
    >>> DQNConfig(n_step=8)
    Traceback (most recent call last):
    ...
    ValueError: rollout_fragment_length=4 is shorter than n_step=8; raise rollout_fragment_length to at least 8
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flowrl.algorithms import Algorithm
from flowrl.algorithms.off_policy import NSTEP_DISCOUNTS, OffPolicyConfig, nstep_postprocess
from flowrl.config import PolicyConfig
from flowrl.iter import LocalIterator
from flowrl.models import NumpyQ, QModel
from flowrl.ops import (Concurrently, ParallelRollouts, Replay, StandardMetricsReporting, StoreToReplayBuffer,
                        UpdatePriorities, UpdateTargetNetwork, train_one_step)
from flowrl.policy import (NONFINITE_UPDATES_SKIPPED, Policy, TensorBatch, column_tensor, load_module_weights,
                           make_adam, module_weights)
from flowrl.q_gradients import QGradients
from flowrl.replay_buffers import LocalReplayBuffer
from flowrl.sample_batch import (ACTIONS, NEXT_OBS, OBS, REWARDS, TD_ERROR, TERMINATEDS, TRUNCATEDS, WEIGHTS,
                                 AnyBatch, SampleBatch)
from flowrl.validation import bounded
from flowrl.workers import WorkerSet

__all__ = ["DQNConfig", "QModel", "NumpyQ", "DQNPolicy", "NSTEP_DISCOUNTS", "make_replay_buffer", "make_owned_state",
           "plan", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class DQNConfig(OffPolicyConfig):
    """DQN's config: :class:`~flowrl.algorithms.off_policy.OffPolicyConfig` (the replay settings) with RLlib's
    DQN defaults.

    Attributes:
        lr: Adam learning rate (5e-4). adam_epsilon: Adam's epsilon (1e-8). grad_clip: max gradient norm (40).
        double_q: the bootstrap action is chosen by the online network, valued by the target one.
        dueling: ``Q = V + A - mean(A)`` from separate value and advantage heads.
        hiddens: widths of each head's hidden layers, after the ``model.hidden_sizes`` torso ((256,)).
        huber_delta: the Huber loss is quadratic for ``|td_error| < huber_delta`` and linear beyond (1.0).
        manual_gradients: on the CPU, a plain MLP Q-network learns through :class:`~flowrl.q_gradients.QGradients`
            (the loss's gradients derived by hand: autograd's numbers to float32 rounding, in ~40% of its time on
            small batches); ``False`` always learns through autograd.
        target_network_update_freq: sampled env steps between target-network copies (500).
        initial_epsilon / final_epsilon / epsilon_timesteps: epsilon-greedy exploration anneals linearly from
            1.0 to 0.02 over the first 10000 sampled steps, then stays.
        The replay settings (``buffer_size``, ``learning_starts``, ``prioritized_replay``, ``n_step``,
        ``training_intensity``, ...) are :class:`~flowrl.algorithms.off_policy.OffPolicyConfig`'s.
    """

    lr: float = 5e-4
    adam_epsilon: float = bounded(1e-8, gt=0, meaning="Adam's epsilon")
    grad_clip: float | None = 40
    double_q: bool = True
    dueling: bool = True
    hiddens: tuple[int, ...] = (256,)
    huber_delta: float = bounded(1.0, gt=0, meaning="the Huber loss is linear beyond it")
    manual_gradients: bool = True
    initial_epsilon: float = bounded(1.0, ge=0, le=1, meaning="the exploration probability at the start")
    final_epsilon: float = bounded(0.02, ge=0, le=1, meaning="the exploration probability after the anneal")
    epsilon_timesteps: int = bounded(10000, ge=0, meaning="sampled steps over which epsilon anneals")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not all(isinstance(h, int) and h > 0 for h in self.hiddens):
            raise ValueError(f"hiddens={self.hiddens!r} must be positive ints, e.g. (256,), or () for linear heads")

    def epsilon_at(self, timestep: int) -> float:
        """The exploration epsilon after ``timestep`` sampled steps: linear from initial to final, then final."""
        if timestep >= self.epsilon_timesteps:
            return self.final_epsilon
        return self.initial_epsilon + (self.final_epsilon - self.initial_epsilon) * timestep / self.epsilon_timesteps


def plan(workers: WorkerSet, config: OffPolicyConfig, *, replay_buffer: LocalReplayBuffer | None = None,
         store_as: Callable[[AnyBatch], AnyBatch] | None = None) -> LocalIterator[dict[str, Any]]:
    """DQN: (1) store lockstep rollouts; (2) replay, train + broadcast, update priorities and
    the target network; round robin by training intensity, emitting (2); report. DDPG, TD3 and SAC run it too;
    R2D2 with ``store_as``, an operator each rollout goes through before it is stored (``PadSequences``).

    Examples:
        >>> config = DQNConfig(seed=0, learning_starts=64, timesteps_per_iteration=100, min_iter_time_s=0)
        >>> it = plan(WorkerSet(policy_class=DQNPolicy, config=config), config)
        >>> print(repr(it).replace(").", ") .").replace("])[", "]) [").replace("]].", "]] ."))
        LocalIterator[Concurrently(round_robin, round_robin_weights=[1.0, 1.0], output_indexes=[1])
            [LocalIterator[ParallelRollouts(bulk_sync) .for_each(StoreToReplayBuffer(local))],
             LocalIterator[Replay(local) .for_each(TrainOneStep) .for_each(UpdatePriorities)
                           .for_each(UpdateTargetNetwork(500))]]
        .filter(ReportGate(100 steps, 0 s)) .for_each(CollectMetrics)]
        >>> result = next(it)
        >>> result["info"]["num_steps_sampled"] >= 100, result["info"]["num_steps_trained"] % 32
        (True, 0)
    """
    buf = replay_buffer if replay_buffer is not None else make_replay_buffer(config)
    # (1) store rollouts
    rollouts = ParallelRollouts(workers, mode="bulk_sync")
    if store_as is not None:
        rollouts = rollouts.for_each(store_as)
    store_op = rollouts.for_each(StoreToReplayBuffer(local_buffer=buf))
    # (2) replay into the learner
    replay_op = Replay(local_buffer=buf)
    if (hook := config.before_learn_on_batch) is not None:
        replay_op = replay_op.for_each(lambda batch: hook(batch, workers, config))
    train_op: LocalIterator[Any] = replay_op.for_each(train_one_step(workers, config))
    if config.prioritized_replay:
        train_op = train_op.for_each(UpdatePriorities(buf))
    train_op = train_op.for_each(UpdateTargetNetwork(workers, config.target_network_update_freq))
    rounds = Concurrently([store_op, train_op], mode="round_robin", output_indexes=[1],
                          round_robin_weights=config.round_robin_weights)
    return StandardMetricsReporting(rounds, workers, config)


def make_owned_state(config: OffPolicyConfig) -> dict[str, Any]:
    """What the trainer keeps across plan rebuilds: ``{"replay_buffer": make_replay_buffer(config)}``."""
    return {"replay_buffer": make_replay_buffer(config)}


def make_replay_buffer(config: OffPolicyConfig, *, sequence_length: int | None = None) -> LocalReplayBuffer:
    """The replay buffer that sub-flow (1) stores into and (2) replays from (seeded from ``config.seed``);
    ``sequence_length`` stores items of that many rows instead of ``config.replay_sequence_length`` (R2D2)."""
    return LocalReplayBuffer(
        num_shards=1, learning_starts=config.learning_starts, capacity=config.buffer_size,
        replay_batch_size=config.train_batch_size,
        prioritized_replay_alpha=config.prioritized_replay_alpha if config.prioritized_replay else 0.0,
        prioritized_replay_beta=config.prioritized_replay_beta, prioritized_replay_eps=config.prioritized_replay_eps,
        replay_mode=config.replay_mode, seed=config.seed, compress=config.compress_replay,
        replay_sequence_length=config.replay_sequence_length if sequence_length is None else sequence_length)


# the columns the Q-loss reads (those present are converted to tensors, nothing else)
_LOSS_COLUMNS = (OBS, ACTIONS, REWARDS, NEXT_OBS, TERMINATEDS, NSTEP_DISCOUNTS, WEIGHTS)


class DQNPolicy(Policy):
    """The DQN policy: epsilon-greedy acting, n-step postprocessing and the (double) Q-learning Huber loss.

    ``compute_actions`` is one forward pass over the batch: greedy actions, each replaced with probability
    ``epsilon`` by a uniform one (``explore=False``: greedy). ``epsilon`` follows ``DQNConfig.epsilon_at`` of
    the global timestep that every weight broadcast carries (:meth:`on_global_var_update`).

    ``postprocess_trajectory`` rewrites each piece with n-step windows (:func:`~flowrl.postprocessing.
    compute_nstep`): ``rewards`` become ``sum_{k<m} gamma^k r_{t+k}``, ``new_obs`` the observation after the
    window, ``terminateds`` whether the window ended in a terminal state, and the column ``nstep_discounts``
    holds ``gamma^m`` (0 when terminated). A window stops at the episode's end: a terminated episode does not
    bootstrap, a truncated one (time limit) or a fragment cut mid-episode does.

    ``loss`` is ``mean_i w_i huber(Q(s_i, a_i) - y_i)`` with ``y = rewards + nstep_discounts * Q_target(s', a')``,
    ``a' = argmax_a Q(s', a)`` with ``double_q`` (else ``argmax_a Q_target(s', a)``), and ``w`` the ``weights``
    column of a prioritized replay (1 without). :meth:`learn_on_batch` returns the per-row ``td_error`` next to
    ``learner_stats`` for ``UpdatePriorities``. :meth:`update_target` copies the online network into the
    target network, which is part of :meth:`get_state` (not of the weights that workers receive).

    Args:
        observation_space: a ``Box``. action_space: a ``Discrete``.
        config: a :class:`DQNConfig`.

    Raises:
        TypeError: a config that is not a :class:`DQNConfig`.
        ValueError: an action space that is not ``Discrete``.

    Examples:
        >>> policy = DQNPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), DQNConfig(gamma=0.5, n_step=2))
        >>> piece = SampleBatch({OBS: np.zeros((3, 4), np.float32), NEXT_OBS: np.arange(12, dtype=np.float32
        ...                      ).reshape(3, 4), REWARDS: np.ones(3, np.float32), TERMINATEDS: np.zeros(3, bool),
        ...                      TRUNCATEDS: np.array([False, False, True])})  # a time limit: bootstrap
        >>> out = policy.postprocess_trajectory(piece)
        >>> out[REWARDS].tolist(), out[NSTEP_DISCOUNTS].tolist(), out[NEXT_OBS][:, 0].tolist()
        ([1.5, 1.5, 1.0], [0.25, 0.25, 0.5], [4.0, 8.0, 8.0])
        >>> policy.on_global_var_update({"timestep": 5000})  # halfway through the 10000-step anneal
        >>> round(policy.epsilon, 2)
        0.51
    """

    config: DQNConfig
    config_class = DQNConfig
    model: QModel  # type: ignore[assignment]  # DQN replaces the base actor-critic model by a Q-network

    postprocess_spans_episodes = True  # its postprocessing restarts at every episode boundary

    def __init__(self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: PolicyConfig) -> None:
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"DQN needs a Discrete action space, got {action_space}; for continuous actions use "
                             f"SAC, TD3 or DDPG (flowrl train sac), or PPO, or discretize the env's actions")
        if not isinstance(observation_space, gym.spaces.Box):
            raise ValueError(f"DQNPolicy needs a Box observation space, got {observation_space}")
        super().__init__(observation_space, action_space, config)
        self.num_actions = int(action_space.n)
        config = self.config  # a DQNConfig: Policy.__init__ checked it
        with torch.random.fork_rng(devices=[]):
            if config.seed is not None:
                torch.manual_seed(config.seed)
            self.model = QModel(observation_space, self.num_actions, config.model, hiddens=config.hiddens,
                                dueling=config.dueling).to(self.device)
        self.target_model = copy.deepcopy(self.model).requires_grad_(False)
        self.optimizer = make_adam(self.model.parameters(), lr=config.lr, eps=config.adam_epsilon)
        self.numpy_acting = None  # the base class's fast path samples an actor-critic; DQN acts epsilon-greedily
        self.numpy_q = NumpyQ.build(self.model) if config.numpy_acting else None  # the Q-values it acts on
        self._td_error: np.ndarray = np.zeros(0, np.float32)
        self._params = list(self.model.parameters())
        self.q_gradients = QGradients.build(self.model, self.target_model) if config.manual_gradients else None
        self._grads_known_finite = False  # set by a clipped step whose norm proved every gradient finite

    # -- acting -----------------------------------------------------------------------------------
    @property
    def epsilon(self) -> float:
        """The current exploration epsilon (``DQNConfig.epsilon_at(global_timestep)``)."""
        return self.config.epsilon_at(self.global_timestep)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """``Q(obs, .)`` of the online network, ``[B, A]`` (through :class:`NumpyQ` on the CPU, see
        ``PolicyConfig.numpy_acting``)."""
        fast = self.numpy_q
        if fast is not None and fast.model is self.model:  # a subclass may have swapped the model
            return fast.q_values(obs)
        with torch.no_grad():
            return self.model(self._obs_tensor(obs)).cpu().numpy()  # type: ignore[no-any-return]

    def compute_actions(self, obs: np.ndarray, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Epsilon-greedy actions ``[B]`` for observations ``[B, ...]``; no extra columns."""
        actions_B = self.q_values(obs).argmax(axis=-1).astype(np.int64)
        if explore:
            size, rng = len(actions_B), self.act_random
            uniform_B = rng.integers(self.num_actions, size=size)
            explore_B = rng.random(size) < self.epsilon
            if explore_B.any():  # (np.where's copy only when an action changes: the same actions)
                actions_B = np.where(explore_B, uniform_B, actions_B)
        return actions_B, {}

    def value(self, obs: np.ndarray) -> np.ndarray:
        """``max_a Q(obs, a)``."""
        return self.q_values(obs).max(axis=-1)  # type: ignore[no-any-return]

    # -- postprocessing ---------------------------------------------------------------------------
    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        return nstep_postprocess(batch, n_step=self.config.n_step, gamma=self.config.gamma)

    # -- loss -------------------------------------------------------------------------------------
    def to_tensors(self, batch: SampleBatch) -> TensorBatch:
        """Only the columns the loss reads."""
        return {k: column_tensor(batch[k], self.device) for k in _LOSS_COLUMNS if k in batch}

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        # A train step on a small batch is dispatch-bound (each torch op costs more than its arithmetic): the loss
        # takes as few ops as the math allows, and its stats are read on the CPU copy of two columns.
        cfg = self.config
        if cfg.double_q:  # the online network on obs and next_obs in one pass
            q_BA, online_next_q_BA = self.model(torch.cat([batch[OBS], batch[NEXT_OBS]])).chunk(2)
        else:
            q_BA = self.model(batch[OBS])
        q_B = q_BA.gather(1, batch[ACTIONS].long().unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            target_q_BA = self.target_model(batch[NEXT_OBS])
            if cfg.double_q:
                next_q_B = target_q_BA.gather(1, online_next_q_BA.argmax(dim=1, keepdim=True)).squeeze(1)
            else:  # the target network's own greedy action: its value is the row's max
                next_q_B = target_q_BA.amax(dim=1)
            targets_B = batch[REWARDS].float() + self._discounts(batch) * next_q_B
        huber_B = nn.functional.huber_loss(q_B, targets_B, reduction="none", delta=cfg.huber_delta)
        loss = (batch[WEIGHTS].float() * huber_B).mean() if WEIGHTS in batch else huber_B.mean()  # x 1: exact
        return loss, self._td_stats(q_B.detach(), q_B.detach() - targets_B)

    def _discounts(self, batch: TensorBatch) -> torch.Tensor:
        """Each row's bootstrap factor: ``nstep_discounts``, or for a batch that skipped postprocessing one-step
        windows, ``gamma`` where the episode did not terminate."""
        if NSTEP_DISCOUNTS in batch:
            return batch[NSTEP_DISCOUNTS].float()
        return self.config.gamma * (~batch[TERMINATEDS].bool()).float()

    def _td_stats(self, q_B: torch.Tensor, td_error_B: torch.Tensor) -> dict[str, float]:
        """Keeps the TD errors for ``learn_on_tensors``; the loss's stats, read on the CPU copy of ``Q(s, a)``."""
        self._td_error = td_error_B.numpy() if td_error_B.device.type == "cpu" else td_error_B.cpu().numpy()
        q = q_B.cpu().numpy()
        return {"mean_q": float(q.mean()), "min_q": float(q.min()), "max_q": float(q.max()),
                "mean_abs_td_error": float(np.abs(self._td_error).mean()), "cur_epsilon": self.epsilon}

    def _loss_and_gradients(self, batch: TensorBatch) -> tuple[float, dict[str, float]]:
        """The loss's value and stats, with every parameter's ``.grad`` set to the loss's gradient: through
        :attr:`q_gradients` when it applies (``DQNConfig.manual_gradients``, this class's own loss, the models it
        was built for), else through autograd."""
        kernel = self.q_gradients
        if (kernel is None or type(self).loss is not DQNPolicy.loss or kernel.model is not self.model
                or kernel.target_model is not self.target_model):
            loss, stats = self.loss(batch)
            for p in self._params:  # optimizer.zero_grad(set_to_none=True)
                p.grad = None
            loss.backward()  # type: ignore[no-untyped-call]  # torch's backward is untyped
            return float(loss.detach()), stats
        step = kernel(batch[OBS], batch[ACTIONS], batch[REWARDS], self._discounts(batch), batch[NEXT_OBS],
                      double_q=self.config.double_q, huber_delta=self.config.huber_delta, weights=batch.get(WEIGHTS))
        for p, grad in zip(self._params, step.grads):
            p.grad = grad
        return step.loss, self._td_stats(step.q, step.td_error)

    def _backward(self, tensors: TensorBatch) -> dict[str, float]:
        if not self.model.training:
            self.model.train()
        loss, stats = self._loss_and_gradients(tensors)
        norm = self._finish_gradients(self.collective_weight)
        if norm is not None:
            stats["grad_gnorm"] = norm
        return {"loss": loss, **stats}

    def learn_on_tensors(self, tensors: TensorBatch) -> dict[str, Any]:
        """One optimizer step; ``{"learner_stats": ..., "td_error": [B]}``. A TD error that is not finite (the
        update was then skipped, see ``on_nonfinite_update``) is reported as 0, so its row gets the lowest
        replay priority instead of a NaN one.

        The step is :class:`~flowrl.policy.Policy`'s (loss, backward, gradient clipping, a skipped update on a
        non-finite gradient, the optimizer step) with less per-op overhead: the gradients come from
        :attr:`q_gradients` where it applies (no autograd graph), the parameter list is kept, the gradients are
        clipped as ``clip_grad_norm_`` clips them (the same bits, multiplied only when the factor is below 1), a
        clipped norm that is finite proves every gradient finite (a NaN or inf in any makes the norm so), so the
        per-gradient check runs only when it is not, and a fused Adam steps without its wrapper
        (:func:`~flowrl.policy.step_adam`).
        """
        if self.config.grad_clip is None or self.device.type != "cpu":
            info = Policy.learn_on_tensors(self, tensors)
        else:
            info = {"learner_stats": self._lean_step(tensors, float(self.config.grad_clip))}
        td_error = self._td_error
        if not np.isfinite(td_error).all():
            td_error = np.where(np.isfinite(td_error), td_error, 0.0).astype(td_error.dtype)
        return {**info, TD_ERROR: td_error}

    def _lean_step(self, tensors: TensorBatch, max_norm: float) -> dict[str, Any]:
        if not self.model.training:
            self.model.train()
        loss, stats = self._loss_and_gradients(tensors)
        grads = [p.grad for p in self._params if p.grad is not None]
        norm = 0.0
        if grads:  # torch.nn.utils.clip_grad_norm_ on one device and dtype (its foreach path), bit for bit:
            norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0))
            # its factor min(max_norm * (1 / (norm + 1e-6)), 1) in float32 arithmetic (as torch computes it), and
            # the multiply only where the factor is below 1 (x 1 changes nothing; a NaN norm fails the check below)
            factor = np.float32(max_norm) * (np.float32(1.0) / (np.float32(norm) + np.float32(1e-6)))
            if factor < 1.0:
                torch._foreach_mul_(grads, float(factor))
        self._grads_known_finite = math.isfinite(norm)
        stats["grad_gnorm"] = norm
        out = {"loss": loss, **stats}
        self.optimizer_step()
        if self.num_nonfinite_updates_skipped:
            out[NONFINITE_UPDATES_SKIPPED] = self.num_nonfinite_updates_skipped
        return out

    def _gradients_finite(self) -> bool:
        known, self._grads_known_finite = self._grads_known_finite, False
        return known or super()._gradients_finite()

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, Any]]:
        grads, info = super().compute_gradients(batch)
        return grads, {**info, TD_ERROR: self._td_error}

    def optimizer_step(self) -> None:
        super().optimizer_step()
        if self.numpy_q is not None:
            self.numpy_q.invalidate()

    def update_target(self) -> None:
        """Copies the online network's weights into the target network."""
        self.target_model.load_state_dict(self.model.state_dict())

    # -- state ------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """The base state plus the target network's weights."""
        target = module_weights(self.target_model)
        return {**super().get_state(), "target_weights": target}

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        if "target_weights" not in state:
            raise ValueError(f"DQNPolicy.set_state: the state has no 'target_weights' (keys {sorted(state)}); "
                             f"restore a state saved by a DQNPolicy")
        load_module_weights(self.target_model, state["target_weights"], self.device)


ALGORITHM = Algorithm("dqn", DQNConfig, DQNPolicy, plan, make_owned_state=make_owned_state)
