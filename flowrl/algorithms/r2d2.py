"""R2D2: recurrent Q-learning from replayed sequences as a plan (RLlib Flow, https://arxiv.org/abs/2011.12719; R2D2,
https://openreview.net/forum?id=r1lyTjAqYX; value rescaling, https://arxiv.org/abs/1805.11593).

Dataflow: DQN's two sub-flows (:mod:`flowrl.algorithms.dqn`) over one replay buffer of *sequences*. (1) The
workers sample in lockstep; each batch's sequences (an episode's steps, cut every ``model.max_seq_len``) are
padded to exactly ``max_seq_len`` rows (``PadSequences``) and stored, one sequence per item, each with the
recurrent state the worker acted with at its first step. (2) ``Replay`` draws ``train_batch_size //
max_seq_len`` sequences, the learner takes one step and broadcasts (``TrainOneStep``), each sequence gets R2D2's
priority (``UpdatePriorities``) and the target network is refreshed every ``target_network_update_freq`` sampled
steps. With ``num_workers >= 1`` worker ``i`` of ``N`` explores with Ape-X's fixed epsilon ``0.4 ** (1 + 7 i /
(N - 1))``; the driver alone (``num_workers=0``) anneals epsilon as DQN does.

The policy's Q-network is the recurrent model of ``model.use_lstm`` (LSTM or GRU) with ``Q = V + A - mean(A)``
(``dueling``) or ``Q = A``. The learner unrolls it over each replayed sequence from the stored state (zeros with
``zero_init_states``); a sequence that starts mid-episode spends its first ``burn_in`` steps warming the state up
(no loss there, no gradient into the state before them). The loss is the importance-weighted Huber loss of
n-step double-Q targets within the sequence, in value-rescaled space: ``y = h(sum_k gamma^k r + gamma^m
h^-1(Q_target(s', argmax Q(s'))))`` with ``h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x``; a window that reaches
the sequence's end bootstraps from the state after its last step. A sequence's priority is ``eta max|td| + (1 -
eta) mean|td|`` over its trained steps.

Examples:
    >>> config = R2D2Config(seed=0)
    >>> config.env, config.model.use_lstm, config.model.max_seq_len, config.train_batch_size // 20, config.burn_in
    ('flowrl/StatelessCartPole-v1', True, 20, 32, 0)
    >>> R2D2Config(burn_in=20)
    Traceback (most recent call last):
    ...
    ValueError: burn_in=20 leaves no step to learn from in sequences of model.max_seq_len=20; set burn_in below 20 (e.g. 10) or raise model.max_seq_len
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flowrl.algorithms import Algorithm, dqn
from flowrl.algorithms.apex import set_worker_exploration
from flowrl.algorithms.dqn import DQNConfig, make_replay_buffer
from flowrl.config import ModelConfig, PolicyConfig
from flowrl.envs.base import EnvSpec
from flowrl.envs.memory import STATELESS_CARTPOLE
from flowrl.iter import LocalIterator
from flowrl.models import RecurrentActorCritic
from flowrl.ops import PadSequences
from flowrl.policy import (Policy, PrevInputs, TensorBatch, column_tensor, load_module_weights, make_adam,
                           module_weights)
from flowrl.replay_buffers import LocalReplayBuffer
from flowrl.sample_batch import (ACTIONS, NEXT_OBS, OBS, REWARDS, STATE_IN, STATE_OUT, TD_ERROR, TERMINATEDS, WEIGHTS,
                                 SampleBatch, T)
from flowrl.sequences import SEQ_VALID, pad_batch
from flowrl.validation import bounded
from flowrl.workers import WorkerSet

__all__ = ["R2D2Config", "R2D2Policy", "value_rescale", "inverse_value_rescale", "plan", "make_owned_state",
           "ALGORITHM"]


def _recurrent_model() -> ModelConfig:
    return ModelConfig(hidden_sizes=(64,), use_lstm=True, lstm_cell_size=64, max_seq_len=20)


@dataclass(frozen=True, kw_only=True)
class R2D2Config(DQNConfig):
    """R2D2's config: :class:`~flowrl.algorithms.dqn.DQNConfig` with a recurrent model and sequence replay.

    Attributes:
        env: the velocity-hidden CartPole (``flowrl/StatelessCartPole-v1``), which needs memory.
        model: a recurrent model (``use_lstm`` must be True): MLP (64) -> LSTM (64 cells); ``max_seq_len`` (20) is
            the length of every stored and replayed sequence, burn-in included.
        burn_in: steps at the start of a replayed sequence that starts mid-episode which only warm the stored
            state up (0); below ``model.max_seq_len``. A sequence that starts an episode needs none.
        zero_init_states: unroll every replayed sequence from zeros instead of its stored state (False).
        use_h_function / h_function_epsilon: learn Q in value-rescaled space ``h`` (True, eps 1e-3).
        priority_eta: a sequence's priority is ``eta max|td| + (1 - eta) mean|td|`` (0.9).
        rollout_fragment_length: steps per env per sample (20); at least ``model.max_seq_len``, since sequences
            form within a sample.
        train_batch_size: timesteps per replayed batch (640: 32 sequences of 20).
        buffer_size / learning_starts: in stored rows (sequences padded to ``max_seq_len``).
        hiddens: must stay ``()``: the Q heads are linear on the recurrent cell's output.
        lr (5e-4), n_step (1), target_network_update_freq (500 sampled steps), epsilon schedule (1.0 to 0.02 over
            10000 steps, for ``num_workers=0``): as DQN's.
    """

    trains_recurrent_models: ClassVar[bool] = True  # sequences with their stored states, replayed whole

    env: EnvSpec = STATELESS_CARTPOLE
    model: ModelConfig = field(default_factory=_recurrent_model)
    burn_in: int = bounded(0, ge=0, meaning="steps that only warm the stored state up, e.g. 10")
    zero_init_states: bool = False
    use_h_function: bool = True
    h_function_epsilon: float = bounded(1e-3, ge=0, meaning="the linear term of the value rescaling, e.g. 1e-3")
    priority_eta: float = bounded(0.9, ge=0, le=1, meaning="1: a sequence's max |td|, 0: its mean")
    rollout_fragment_length: int = 20
    train_batch_size: int = 640
    hiddens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        seq = self.model.max_seq_len
        if not self.model.use_lstm:
            raise ValueError("model.use_lstm=False: R2D2 learns a recurrent Q-network; set model.use_lstm=True (or "
                             "use DQN for a feed-forward one)")
        if self.model.lstm_use_prev_action or self.model.lstm_use_prev_reward:
            raise ValueError("model.lstm_use_prev_action / lstm_use_prev_reward: R2D2's Q-network does not read the "
                             "previous action or reward yet; set both to False (PPO, A2C, A3C, IMPALA and APPO read "
                             "them)")
        if self.burn_in >= seq:
            raise ValueError(f"burn_in={self.burn_in} leaves no step to learn from in sequences of model.max_seq_len="
                             f"{seq}; set burn_in below {seq} (e.g. {seq // 2}) or raise model.max_seq_len")
        if self.hiddens:
            raise ValueError(f"hiddens={self.hiddens!r}: R2D2's Q heads are linear on the recurrent cell's output; "
                             f"set hiddens=() and size the model with model.hidden_sizes and model.lstm_cell_size")
        if self.replay_sequence_length != 1:
            raise ValueError(f"replay_sequence_length={self.replay_sequence_length}: R2D2 stores sequences of "
                             f"model.max_seq_len={seq} rows; leave replay_sequence_length at 1 and set "
                             f"model.max_seq_len")
        if self.rollout_fragment_length < seq:
            raise ValueError(f"rollout_fragment_length={self.rollout_fragment_length} is shorter than "
                             f"model.max_seq_len={seq}, and sequences form within a sample; raise "
                             f"rollout_fragment_length to at least {seq}")
        if self.train_batch_size < seq:
            raise ValueError(f"train_batch_size={self.train_batch_size} timesteps holds no sequence of "
                             f"model.max_seq_len={seq}; raise it to a multiple of {seq} (e.g. {32 * seq})")

    @property
    def actual_train_batch_size(self) -> int:
        """``train_batch_size // max_seq_len`` whole sequences of ``max_seq_len`` rows."""
        seq = self.model.max_seq_len
        return self.train_batch_size // seq * seq


def plan(workers: WorkerSet, config: R2D2Config, *,
         replay_buffer: LocalReplayBuffer | None = None) -> LocalIterator[dict[str, Any]]:
    """R2D2: DQN's plan whose rollouts are stored as padded sequences: (1) store lockstep rollouts
    as sequences; (2) replay sequences, train + broadcast, update priorities and the target network; report.

    Examples:
        >>> config = R2D2Config(seed=0, learning_starts=100, timesteps_per_iteration=100)
        >>> it = plan(WorkerSet(policy_class=R2D2Policy, config=config), config)
        >>> print(repr(it).replace(").", ") .").replace("])[", "]) [").replace("]].", "]] ."))
        LocalIterator[Concurrently(round_robin, round_robin_weights=[1.0, 1.0], output_indexes=[1])
            [LocalIterator[ParallelRollouts(bulk_sync) .for_each(PadSequences(20)) .for_each(StoreToReplayBuffer(local))],
             LocalIterator[Replay(local) .for_each(TrainOneStep) .for_each(UpdatePriorities)
                           .for_each(UpdateTargetNetwork(500))]]
        .filter(ReportGate(100 steps, 0 s)) .for_each(CollectMetrics)]
        >>> next(it)["info"]["num_steps_trained"] % 640
        0
    """
    if config.num_workers > 0:
        set_worker_exploration(workers, config)  # Ape-X's epsilon per worker
    buf = replay_buffer if replay_buffer is not None else make_owned_state(config)["replay_buffer"]
    return dqn.plan(workers, config, replay_buffer=buf, store_as=PadSequences(config.model.max_seq_len))


def make_owned_state(config: R2D2Config) -> dict[str, Any]:
    """What the trainer keeps across plan rebuilds: the replay buffer of sequences (``replay_sequence_length =
    model.max_seq_len``)."""
    return {"replay_buffer": make_replay_buffer(config, sequence_length=config.model.max_seq_len)}


def value_rescale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """R2D2's ``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x``.

    Examples:
        >>> value_rescale(torch.tensor([-3.0, 0.0, 8.0]), 0.0).tolist()
        [-1.0, 0.0, 2.0]
    """
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def inverse_value_rescale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``h^-1``, the inverse of :func:`value_rescale`.

    Examples:
        >>> x = torch.tensor([-50.0, -0.5, 0.0, 2.0, 400.0])
        >>> torch.allclose(inverse_value_rescale(value_rescale(x, 1e-3), 1e-3), x, rtol=1e-4)
        True
    """
    if eps == 0:
        return torch.sign(x) * ((x.abs() + 1.0) ** 2 - 1.0)
    root = (torch.sqrt(1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return torch.sign(x) * (root ** 2 - 1.0)


class R2D2Policy(Policy):
    """The R2D2 policy: epsilon-greedy acting with a carried recurrent state, and the sequence Q-loss above.

    The rollout worker keeps one state per env (``state_in_*`` per row); ``epsilon`` is the worker's fixed Ape-X
    value once :meth:`set_worker_exploration` gave one, else DQN's schedule of the global timestep. ``loss`` reads
    a replayed batch of ``B x max_seq_len`` rows (``PadSequences``' layout) and leaves each sequence's priority
    ``td_error`` for ``UpdatePriorities``. :meth:`update_target` copies the online network into the target
    network, which is part of :meth:`get_state`.

    Raises:
        ValueError: an action space that is not ``Discrete``.
    """

    config: R2D2Config
    config_class = R2D2Config
    model: RecurrentActorCritic

    def __init__(self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: PolicyConfig) -> None:
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"R2D2 needs a Discrete action space, got {action_space}; for continuous actions use "
                             f"PPO or IMPALA with model.use_lstm=True")
        super().__init__(observation_space, action_space, config)
        self.num_actions = int(action_space.n)
        self.target_model = copy.deepcopy(self.model).requires_grad_(False)
        self.optimizer = make_adam(self.model.parameters(), lr=self.config.lr, eps=self.config.adam_epsilon)
        self.numpy_acting = None  # it acts epsilon-greedily on Q-values, with a state (through numpy_recurrent)
        self.exploration_epsilon: float | None = None
        self._td_error: np.ndarray = np.zeros(0, np.float32)

    # -- acting -----------------------------------------------------------------------------------
    @property
    def epsilon(self) -> float:
        """The worker's fixed exploration epsilon, or DQN's annealed one (``config.epsilon_at``)."""
        if self.exploration_epsilon is not None:
            return self.exploration_epsilon
        return self.config.epsilon_at(self.global_timestep)

    def set_worker_exploration(self, scale: float) -> None:
        """Explores with epsilon ``scale`` from now on (Ape-X's per-worker epsilon)."""
        self.exploration_epsilon = scale

    def q_values(self, obs: torch.Tensor, state: tuple[torch.Tensor, ...], model: nn.Module | None = None
                 ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """``(Q [B, T, A], state after)`` of ``B`` sequences ``obs [B, T, ...]`` unrolled from ``state``."""
        advantages, values, new_state = (self.model if model is None else model)(obs, state)
        if not self.config.dueling:
            return advantages, new_state
        return values.unsqueeze(-1) + advantages - advantages.mean(dim=-1, keepdim=True), new_state

    @torch.no_grad()
    def compute_actions_with_state(self, obs: np.ndarray, state: tuple[np.ndarray, ...], explore: bool = True,
                                   prev: PrevInputs = None
                                   ) -> tuple[np.ndarray, dict[str, np.ndarray], tuple[np.ndarray, ...]]:
        """Epsilon-greedy actions ``[B]`` from ``state``; the extras are the states before and after each step."""
        fast = self.numpy_recurrent
        if fast is not None and fast.model is self.model:  # a few envs per step: numpy beats torch's dispatch
            advantages, values, new_state = fast.step(obs, state)
            q_np = values[:, None] + advantages - advantages.mean(axis=1, keepdims=True) if self.config.dueling \
                else advantages
            actions = q_np.argmax(axis=1).astype(np.int64)
        else:
            state_t = tuple(torch.as_tensor(s, device=self.device) for s in state)
            q, new_state_t = self.q_values(self._obs_tensor(obs)[:, None], state_t)
            actions = q[:, 0].argmax(dim=-1).cpu().numpy().astype(np.int64)
            new_state = tuple(s.cpu().numpy() for s in new_state_t)
        if explore:
            rng = self.act_random
            explore_B = rng.random(len(actions)) < self.epsilon
            actions = np.where(explore_B, rng.integers(self.num_actions, size=len(actions)), actions)
        extras: dict[str, np.ndarray] = {}
        for k, (before, after) in enumerate(zip(state, new_state)):
            extras[STATE_IN.format(k)], extras[STATE_OUT.format(k)] = np.asarray(before, np.float32), after
        return actions, extras, new_state

    @torch.no_grad()
    def value_with_state(self, obs: np.ndarray, state: tuple[np.ndarray, ...], prev: PrevInputs = None
                         ) -> np.ndarray:
        """``max_a Q(obs, a)`` ``[B]`` from the states ``[B, ...]`` the observations are reached with."""
        state_t = tuple(torch.as_tensor(np.asarray(s, np.float32), device=self.device) for s in state)
        q = self.q_values(self._obs_tensor(obs)[:, None], state_t)[0]
        return q[:, 0].amax(-1).cpu().numpy()

    # -- loss -------------------------------------------------------------------------------------
    def to_tensors(self, batch: SampleBatch) -> TensorBatch:
        """The columns the sequence loss reads, from a replayed batch of padded sequences; a batch of rows (a
        worker's sample) is padded first (:func:`~flowrl.sequences.pad_batch`)."""
        if SEQ_VALID not in batch:
            batch = pad_batch(batch, self.config.model.max_seq_len)
        keys = [OBS, ACTIONS, REWARDS, NEXT_OBS, TERMINATEDS, T, SEQ_VALID, WEIGHTS,
                *(STATE_IN.format(k) for k in range(self.num_state_tensors))]
        return {k: column_tensor(batch[k], self.device) for k in keys if k in batch}

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        steps = cfg.model.max_seq_len
        if SEQ_VALID not in batch:
            raise ValueError(f"R2D2's loss reads padded sequences (a {SEQ_VALID!r} column); convert the batch with "
                             f"R2D2Policy.to_tensors")
        valid = batch[SEQ_VALID].view(-1, steps).bool()  # [B, T]
        num_seq = valid.shape[0]
        lens = valid.sum(dim=1)  # [B], each >= 1
        rows = torch.arange(num_seq, device=valid.device)

        def seq(column: torch.Tensor) -> torch.Tensor:  # [B * T, ...] -> [B, T, ...]
            return column.view(num_seq, steps, *column.shape[1:])

        obs = seq(batch[OBS])
        # the inputs: each sequence's observations, then the observation after its last step (its bootstrap)
        inputs = torch.cat([obs, torch.zeros_like(obs[:, :1])], dim=1)
        inputs[rows, lens] = seq(batch[NEXT_OBS])[rows, lens - 1]
        if cfg.zero_init_states:
            state = self.model.initial_state(num_seq)
        else:
            state = tuple(seq(batch[STATE_IN.format(k)])[:, 0] for k in range(self.num_state_tensors))
        mid_episode = seq(batch[T])[:, 0] > 0  # the sequences that need the burn-in
        burn = cfg.burn_in
        if burn:  # no gradient into the state before the burn-in's end of a sequence that starts mid-episode
            warm_q, warm_state = self.q_values(inputs[:, :burn], state)
            kept = tuple(torch.where(mid_episode[:, None], s.detach(), s) for s in warm_state)
            q = torch.cat([warm_q, self.q_values(inputs[:, burn:], kept)[0]], dim=1)  # [B, T + 1, A]
        else:
            q = self.q_values(inputs, state)[0]
        trained = valid.clone()
        if burn:
            trained[:, :burn] &= ~mid_episode[:, None]
        q_taken = q[:, :steps].gather(2, seq(batch[ACTIONS]).long().unsqueeze(2)).squeeze(2)  # [B, T]
        with torch.no_grad():
            targets = self._targets(batch, q.detach(), inputs, state, lens, seq)
        td = torch.where(trained, q_taken.detach() - targets, torch.zeros_like(targets))
        huber = nn.functional.huber_loss(q_taken, targets, reduction="none", delta=cfg.huber_delta) * trained
        counts = trained.sum(dim=1)
        per_sequence = huber.sum(dim=1) / counts.clamp(min=1)
        weights = seq(batch[WEIGHTS])[:, 0].float() if WEIGHTS in batch else torch.ones_like(per_sequence)
        loss = (weights * per_sequence).sum() / (counts > 0).sum().clamp(min=1)
        abs_td = td.abs()
        priority = cfg.priority_eta * abs_td.amax(dim=1) + (1 - cfg.priority_eta) * abs_td.sum(dim=1) / counts.clamp(
            min=1)
        self._td_error = priority.cpu().numpy().astype(np.float32)
        q_trained = q_taken.detach()[trained]
        stats = {"mean_q": float(q_trained.mean()) if q_trained.numel() else 0.0,
                 "mean_abs_td_error": float(abs_td.sum() / trained.sum().clamp(min=1)),
                 "cur_epsilon": self.epsilon, "trained_steps_fraction": float(trained.float().mean())}
        return loss, stats

    def _targets(self, batch: TensorBatch, q: torch.Tensor, inputs: torch.Tensor, state: tuple[torch.Tensor, ...],
                 lens: torch.Tensor, seq: Any) -> torch.Tensor:
        """The n-step double-Q targets ``[B, T]`` within each sequence (in h-space with ``use_h_function``)."""
        cfg = self.config
        steps = cfg.model.max_seq_len
        eps = cfg.h_function_epsilon
        target_q = self.q_values(inputs, state, self.target_model)[0]  # [B, T + 1, A]
        rewards = seq(batch[REWARDS]).float()
        t = torch.arange(steps, device=rewards.device)
        window = (lens[:, None] - t).clamp(min=0, max=cfg.n_step)  # steps in each row's window (0: padding)
        padded = torch.cat([rewards, rewards.new_zeros(rewards.shape[0], cfg.n_step)], dim=1)
        returns = torch.zeros_like(rewards)
        for k in range(cfg.n_step):
            returns += (cfg.gamma ** k) * padded[:, k:k + steps] * (k < window)
        boot = (t + window).clamp(max=steps)  # the input position each window bootstraps from
        at_boot = boot.unsqueeze(2).expand(-1, -1, q.shape[2])
        target_at_boot = target_q.gather(1, at_boot)  # [B, T, A]
        greedy = (q.gather(1, at_boot) if cfg.double_q else target_at_boot).argmax(dim=2, keepdim=True)
        next_q = target_at_boot.gather(2, greedy).squeeze(2)
        rows = torch.arange(rewards.shape[0], device=rewards.device)
        terminated = seq(batch[TERMINATEDS]).bool()[rows, lens - 1]
        ends = (boot == lens[:, None]) & terminated[:, None]  # a window through the terminal step: no bootstrap
        discounts = torch.pow(torch.tensor(cfg.gamma, device=rewards.device), window.float()) * (~ends)
        if cfg.use_h_function:
            return value_rescale(returns + discounts * inverse_value_rescale(next_q, eps), eps)
        targets: torch.Tensor = returns + discounts * next_q
        return targets

    def learn_on_tensors(self, tensors: TensorBatch) -> dict[str, Any]:
        """One optimizer step; ``{"learner_stats": ..., "td_error": [B]}``: each sequence's priority (0 where the
        update was skipped as non-finite, see ``on_nonfinite_update``)."""
        info = super().learn_on_tensors(tensors)
        td_error = self._td_error
        if not np.isfinite(td_error).all():
            td_error = np.where(np.isfinite(td_error), td_error, 0.0).astype(np.float32)
        return {**info, TD_ERROR: td_error}

    def update_target(self) -> None:
        """Copies the online network's weights into the target network."""
        self.target_model.load_state_dict(self.model.state_dict())

    # -- state ------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """The base state plus the target network's weights."""
        return {**super().get_state(), "target_weights": module_weights(self.target_model)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        if "target_weights" not in state:
            raise ValueError(f"R2D2Policy.set_state: the state has no 'target_weights' (keys {sorted(state)}); "
                             f"restore a state saved by an R2D2Policy")
        load_module_weights(self.target_model, state["target_weights"], self.device)


ALGORITHM = Algorithm("r2d2", R2D2Config, R2D2Policy, plan, make_owned_state=make_owned_state)
