"""What evolution strategies run on: a shared noise table, deterministic MLP policies perturbed row by row, and
the workers that evaluate perturbations and send back only noise indices and returns.

ES (Salimans et al. 2017, https://arxiv.org/abs/1703.03864) and ARS (Mania et al. 2018,
https://arxiv.org/abs/1803.07055) never backpropagate. The driver holds the policy's flat parameters ``theta``; a
:class:`PerturbationWorker` draws offsets into one big table of standard normal noise that every process shares
(one copy in Ray's object store, read in place), runs an antithetic pair of episodes with ``theta + sigma * eps``
and ``theta - sigma * eps``, and answers with :class:`Evaluations`: the offsets and the two returns of each pair,
a few dozen bytes however large the model is. The driver rebuilds each ``eps`` from the same table.

Examples:
    >>> noise = NoiseTable(size=1000, seed=0)
    >>> eps = noise.get(10, 4)
    >>> eps.dtype, eps.shape, bool(np.array_equal(eps, NoiseTable(size=1000, seed=0).get(10, 4)))
    (dtype('float32'), (4,), True)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flowrl import executor
from flowrl.config import ModelConfig, PolicyConfig, RolloutConfig, TrainerConfig
from flowrl.envs import VectorEnv
from flowrl.models import _NP_ACTIVATIONS, ActorModel, NumpyMLP
from flowrl.policy import Policy, TensorBatch
from flowrl.sample_batch import DEFAULT_POLICY_ID
from flowrl.validation import bounded
from flowrl.workers import RolloutWorker

__all__ = ["EvolutionConfig", "NoiseTable", "noise_table_state", "Evaluations", "EvolutionPolicy", "PerturbationWorker",
           "PerturbedMLP"]


@dataclass(frozen=True, kw_only=True)
class EvolutionConfig(TrainerConfig):
    """What ES and ARS share: the noise, the perturbations per iteration, and a deterministic MLP policy.

    Attributes:
        noise_size: float32 draws in the shared noise table (25M: 100 MB, one copy for all processes); it must
            hold at least the policy's parameter count.
        noise_seed: the table's seed (``None``: ``seed``, or 0 without one).
        noise_stdev: ``sigma``, the scale of each perturbation.
        stepsize: the step size of the parameter update.
        eval_prob: the chance that an env, between perturbations, runs one episode of the unperturbed policy; those
            episodes (and the ones run while a worker waits for its last perturbations) make ``episode_reward_mean``
            (0.1: a tenth of the env steps, so that the last ``metrics_smoothing_episodes=10`` of them span about
            two updates; 0.03 and a window of 20 lagged 13 updates behind on CartPole).
        num_workers: 2 (as the CPUs allow, as every config). With 0 the driver evaluates the perturbations itself.
        observation_filter: ``"MeanStdFilter"``: observations normalised by running statistics that every worker
            merges and receives with the weights.
        timesteps_per_iteration: 1000: a report comes at the first update after that many env steps.
        model: an MLP (no conv layers, no LSTM): its outputs are the action scores (argmax for ``Discrete``) or,
            ``tanh``-squashed, the actions in ``[-1, 1]`` for a ``Box``.
    """

    noise_size: int = bounded(25_000_000, ge=1, meaning="float32 draws in the shared noise table")
    noise_seed: int | None = None
    noise_stdev: float = bounded(0.02, gt=0, meaning="sigma, the scale of each perturbation")
    stepsize: float = bounded(0.01, gt=0, meaning="the update's step size")
    eval_prob: float = bounded(0.1, ge=0, lt=1, meaning="the chance of an unperturbed episode between perturbations")
    observation_filter: Any = "MeanStdFilter"
    timesteps_per_iteration: int = 1000
    metrics_smoothing_episodes: int = 10

    def __post_init__(self) -> None:
        if self.policies is not None:  # before the parent's checks, which would ask for a multi-agent filter
            raise ValueError("policies: ES and ARS train one policy; leave policies=None (multi-agent evolution "
                             "strategies are not supported)")
        for name in ("output", "input"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name}={getattr(self, name)!r}: ES and ARS evaluate perturbed policies by whole "
                                 f"episodes and never sample experience to record or read; drop {name}")
        super().__post_init__()
        if self.model.use_lstm or self.model.conv_filters:
            raise ValueError(f"model: ES and ARS perturb MLP policies; got use_lstm={self.model.use_lstm}, "
                             f"conv_filters={self.model.conv_filters}; set use_lstm=False and conv_filters=None")

    @property
    def actual_train_batch_size(self) -> int | None:
        """``None``: an update holds whole episodes, as many steps as they took."""
        return None

    def train_batch_size_warning(self) -> str | None:
        """``None``: an update collects whole rounds of episodes, not fragments, so no sample size divides it."""
        return None

    @property
    def pairs_per_iteration(self) -> int:
        """Antithetic pairs (two episodes each) that one update needs at least."""
        raise NotImplementedError

    @property
    def pairs_per_worker(self) -> int:
        """Pairs each worker evaluates per round (a round: every worker once)."""
        return math.ceil(self.pairs_per_iteration / max(1, self.num_workers))

    @property
    def noise_table_seed(self) -> int:
        return self.noise_seed if self.noise_seed is not None else (self.seed if self.seed is not None else 0)


class NoiseTable:
    """``size`` float32 draws from a standard normal (seeded), from which every perturbation is a slice.

    Pickled (for a Ray actor), a table travels as a reference to one copy in the object store, put there once,
    and the actor reads that copy in place on first use: workers on one node share one table.

    Examples:
        >>> table = NoiseTable(size=100, seed=1)
        >>> index = table.sample_index(np.random.default_rng(0), dim=10)
        >>> 0 <= index <= 90, table.get(index, 10).shape
        (True, (10,))
        >>> table.check_fits(200, "ESConfig")
        Traceback (most recent call last):
        ...
        ValueError: ESConfig noise_size=100 is smaller than the policy's 200 parameters: a perturbation is one slice of the noise table; set noise_size to at least 2000 (10x the parameters) or shrink model.hidden_sizes
    """

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed = int(size), int(seed)
        self._noise: np.ndarray | None = None
        self._ref: Any = None

    @property
    def noise(self) -> np.ndarray:
        """The draws: made here on first use, or read from the object store in a process that got a reference."""
        if self._noise is None:
            if self._ref is not None:
                self._noise = executor.get(self._ref)
            else:
                self._noise = np.random.default_rng(self.seed).standard_normal(self.size, dtype=np.float32)
        return self._noise

    def __reduce__(self) -> tuple[Any, ...]:
        if self._ref is None:
            self._ref = executor.put(self.noise)
        return _table_from_ref, (self._ref, self.size, self.seed)

    def check_fits(self, dim: int, where: str) -> None:
        """Raises ``ValueError`` when a ``dim``-parameter perturbation does not fit in the table."""
        if dim > self.size:
            raise ValueError(f"{where} noise_size={self.size} is smaller than the policy's {dim} parameters: a "
                             f"perturbation is one slice of the noise table; set noise_size to at least {10 * dim} "
                             f"(10x the parameters) or shrink model.hidden_sizes")

    def get(self, index: int, dim: int) -> np.ndarray:
        """The perturbation at ``index``: ``dim`` draws (a read-only view)."""
        return self.noise[index:index + dim]

    def sample_index(self, rng: np.random.Generator, dim: int) -> int:
        """A uniform offset at which ``dim`` draws fit."""
        return int(rng.integers(0, self.size - dim + 1))

    def weighted_sum(self, weights: np.ndarray, indices: np.ndarray, dim: int) -> np.ndarray:
        """``sum_k weights[k] * get(indices[k], dim)`` in float64, 500 perturbations at a time."""
        total = np.zeros(dim, np.float64)
        for start in range(0, len(indices), 500):
            block = np.stack([self.get(int(i), dim) for i in indices[start:start + 500]])
            total += np.asarray(weights[start:start + 500], np.float64) @ block
        return total


def noise_table_state(config: EvolutionConfig) -> dict[str, Any]:
    """ES's and ARS's trainer-owned state: the noise table, made once per trainer (deterministic in
    ``noise_seed``, so a resumed run draws the same)."""
    return {"noise": NoiseTable(config.noise_size, config.noise_table_seed)}


def _table_from_ref(ref: Any, size: int, seed: int) -> NoiseTable:
    table = NoiseTable(size, seed)
    table._ref = ref
    return table


@dataclass(frozen=True)
class Evaluations:
    """What a worker sends back for a round: per antithetic pair, the noise offset and both returns.

    Attributes:
        noise_indices: int64 ``[K]``, each pair's offset in the :class:`NoiseTable`.
        returns: float64 ``[K, 2]``: the episode return with ``theta + sigma * eps`` and with ``theta - sigma * eps``.
        lengths: int64 ``[K, 2]``: those episodes' lengths.
        num_steps: env steps taken for them (and for unperturbed episodes and unfinished ones).
        weights_version: the version of ``theta`` they perturbed.

    Examples:
        >>> a = Evaluations(np.array([3]), np.array([[1.0, 2.0]]), np.array([[5, 6]]), 11, 0)
        >>> both = Evaluations.concat([a, a])
        >>> both.count, both.num_steps, both.returns.shape
        (2, 22, (2, 2))
    """

    noise_indices: np.ndarray
    returns: np.ndarray
    lengths: np.ndarray
    num_steps: int
    weights_version: int

    @property
    def count(self) -> int:
        """The pairs."""
        return len(self.noise_indices)

    @property
    def num_episodes(self) -> int:
        """The perturbed episodes (two a pair)."""
        return 2 * self.count

    @staticmethod
    def concat(items: Sequence[Evaluations]) -> Evaluations:
        """One :class:`Evaluations` of all ``items``, in order (the highest weights version)."""
        return Evaluations(np.concatenate([e.noise_indices for e in items]),
                           np.concatenate([e.returns for e in items]), np.concatenate([e.lengths for e in items]),
                           sum(e.num_steps for e in items), max(e.weights_version for e in items))


class EvolutionPolicy(Policy):
    """A deterministic MLP policy (:class:`~flowrl.models.ActorModel`) whose parameters move by estimated
    gradients, not by a loss.

    The output layer starts at 1% of its usual initial weights and zero biases (as OpenAI's ES), so the first
    perturbations already change which action wins. ``compute_actions``: the argmax of the outputs for a ``Discrete`` space, ``tanh`` of them (in ``[-1, 1]``,
    mapped onto the bounds when stepping the env) for a ``Box``; ``explore`` changes nothing. :meth:`flat_weights`
    is ``theta``; :meth:`apply_flat_gradient` takes one step of the policy's optimizer (Adam with ``stepsize`` by
    default; a subclass picks its own in :meth:`make_optimizer`) and counts a weights version.

    Examples:
        >>> policy = EvolutionPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2),
        ...                          TrainerConfig(model=ModelConfig(hidden_sizes=(4,)), seed=0))
        >>> policy.num_params, policy.compute_actions(np.zeros((5, 3), np.float32))[0].shape
        (26, (5,))
        >>> before = policy.flat_weights()
        >>> policy.apply_flat_gradient(np.ones(26, np.float32))
        >>> bool(np.all(policy.flat_weights() < before)), policy.weights_version
        (True, 1)
    """

    config_class: ClassVar[type[PolicyConfig]] = PolicyConfig
    model: ActorModel  # type: ignore[assignment]  # a deterministic MLP, not the base actor-critic

    def __init__(self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: PolicyConfig) -> None:
        if not isinstance(observation_space, gym.spaces.Box):
            raise ValueError(f"{type(self).__name__} needs a Box observation space, got {observation_space}; wrap "
                             f"the env, e.g. with gymnasium.wrappers.FlattenObservation")
        if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)) or \
                (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) != 1):
            raise ValueError(f"{type(self).__name__} acts in a Discrete or a 1-D Box action space, got {action_space}")
        super().__init__(observation_space, action_space, config)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        outputs = int(action_space.n) if isinstance(action_space, gym.spaces.Discrete) else int(action_space.shape[0])
        with torch.random.fork_rng(devices=[]):
            if config.seed is not None:
                torch.manual_seed(config.seed)
            model = ActorModel(observation_space, outputs, config.model)
        with torch.no_grad():  # small outputs at the start, so that perturbations change the actions
            model.head.weight.mul_(0.01)
            model.head.bias.zero_()
        self.model = model.to(self.device)
        self.optimizer = self.make_optimizer(list(self.model.parameters()))  # type: ignore[assignment]
        self.numpy_acting = self.numpy_recurrent = None  # the base actor-critic's mirrors; this one acts below
        self.numpy_mlp = NumpyMLP.build(self.model) if config.numpy_acting else None
        self.num_params = sum(p.numel() for p in self.model.parameters())

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        """Adam with ``stepsize`` (the config's, else ``lr``)."""
        return torch.optim.Adam(params, lr=getattr(self.config, "stepsize", self.config.lr))

    def outputs_to_actions(self, outputs: np.ndarray) -> np.ndarray:
        """The actions for the model's outputs ``[B, A]``: argmax (``Discrete``) or ``tanh`` (``Box``)."""
        actions: np.ndarray = outputs.argmax(axis=1) if self.discrete else np.tanh(outputs).astype(np.float32)
        return actions

    @torch.no_grad()
    def compute_actions(self, obs: np.ndarray, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Deterministic actions for observations ``[B, ...]``; no extra columns."""
        fast = self.numpy_mlp
        if fast is not None and fast.model is self.model:
            return self.outputs_to_actions(fast.forward(obs)), {}
        return self.outputs_to_actions(self.model(self._obs_tensor(obs)).cpu().numpy()), {}

    def value(self, obs: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} has no value function")

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError(f"{type(self).__name__} is trained from perturbation returns (ES, ARS), not from "
                                  f"a loss on a batch; run it with the es or ars algorithm")

    def flat_weights(self) -> np.ndarray:
        """``theta``: every parameter, flattened in ``model.parameters()`` order, float32 ``[num_params]``."""
        theta: np.ndarray = nn.utils.parameters_to_vector(self.model.parameters()).detach().cpu().numpy()
        return theta

    def apply_flat_gradient(self, gradient: np.ndarray) -> None:
        """One optimizer step down ``gradient`` (flat, as :meth:`flat_weights`); one weights version. A gradient
        holding NaN or inf is not applied (see ``PolicyConfig.on_nonfinite_update``)."""
        flat = torch.as_tensor(np.asarray(gradient, np.float32), device=self.device)
        offset = 0
        for p in self.model.parameters():
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        self.optimizer_step()  # a NaN or inf gradient is skipped and counted, as every learning path does
        self.optimizer.zero_grad(set_to_none=True)
        if self.numpy_mlp is not None:
            self.numpy_mlp.invalidate()


class PerturbedMLP:
    """The forward pass of an MLP :class:`~flowrl.models.ActorModel` with a different flat parameter vector per
    row: ``forward(obs [N, ...], params [N, D]) -> outputs [N, A]``, one batched matmul per layer.

    Examples:
        >>> model = ActorModel(gym.spaces.Box(-1, 1, (3,)), 2, ModelConfig(hidden_sizes=(4,), activation="relu"))
        >>> theta = nn.utils.parameters_to_vector(model.parameters()).detach().numpy()
        >>> obs = np.ones((2, 3), np.float32)
        >>> out = PerturbedMLP(model).forward(obs, np.stack([theta, 2 * theta]))
        >>> bool(np.allclose(out[0], model(torch.as_tensor(obs[:1])).detach().numpy()[0], atol=1e-6))
        True
    """

    def __init__(self, model: ActorModel) -> None:
        if not isinstance(model.encoder, nn.Flatten):
            raise ValueError("PerturbedMLP: the model has a conv encoder; evolution strategies here perturb MLPs")
        self.activation = _NP_ACTIVATIONS[model.activation_name]
        linears = [m for m in (*model.trunk, model.head) if isinstance(m, nn.Linear)]
        self.layers: list[tuple[int, int, int]] = []  # (offset, in, out) of each weight; its bias follows it
        offset = 0
        for layer in linears:
            self.layers.append((offset, layer.in_features, layer.out_features))
            offset += layer.in_features * layer.out_features + layer.out_features
        self.num_params = offset

    def forward(self, obs: np.ndarray, params: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, np.float32).reshape(len(obs), -1)
        n = len(x)
        for k, (offset, fan_in, fan_out) in enumerate(self.layers):
            w = params[:, offset:offset + fan_in * fan_out].reshape(n, fan_out, fan_in)
            b = params[:, offset + fan_in * fan_out:offset + fan_in * fan_out + fan_out]
            x = np.einsum("noi,ni->no", w, x) + b
            if k < len(self.layers) - 1:
                x = self.activation(x)
        return x


_EVAL = -1  # a slot's job: an unperturbed episode


class PerturbationWorker(RolloutWorker):
    """A rollout worker whose stream is :class:`Evaluations`, not sample batches: each item is one round of
    ``config.pairs_per_worker`` antithetic pairs, evaluated with the policy's current ``theta`` (from the
    last weights it was sent) and the :class:`NoiseTable` given to :meth:`set_noise`.

    The round starts every env on a new episode; an env whose episode ends takes the next perturbation (or,
    with probability ``eval_prob``, an unperturbed episode first); once every perturbation has been handed out,
    free envs run unperturbed episodes until the last perturbed one ends. Unperturbed episodes that finish are
    this worker's episode statistics (``get_metrics``); every env step counts in ``num_steps``. Observations go
    through the worker's filter, which learns from all of them.
    """

    config: EvolutionConfig

    def __init__(self, *, policy_class: type[Policy], config: RolloutConfig, worker_index: int = 0) -> None:
        if not isinstance(config, EvolutionConfig):
            raise TypeError(f"PerturbationWorker needs an EvolutionConfig (ESConfig, ARSConfig), got "
                            f"{type(config).__name__}")
        super().__init__(policy_class=policy_class, config=config, worker_index=worker_index)
        policy = self.policy_map[DEFAULT_POLICY_ID]
        if not isinstance(policy, EvolutionPolicy):
            raise TypeError(f"PerturbationWorker evaluates an EvolutionPolicy, got {type(policy).__name__}")
        self.policy = policy
        self.perturbed = PerturbedMLP(policy.model)
        self.noise: NoiseTable | None = None
        self.rng = np.random.default_rng(None if config.seed is None else [config.seed, worker_index, 17])

    def set_noise(self, noise: NoiseTable) -> None:
        """The table this worker draws perturbations from (the driver's, shared through the object store)."""
        noise.check_fits(self.policy.num_params, type(self.config).__name__)
        self.noise = noise

    def _shard_items(self) -> Iterator[Any]:
        while True:
            yield self.evaluate()

    def evaluate(self, num_pairs: int | None = None) -> Evaluations:
        """One round: ``num_pairs`` (default ``config.pairs_per_worker``) antithetic pairs."""
        if self.noise is None:
            raise RuntimeError("PerturbationWorker.evaluate: no noise table yet; the plan's ParallelEvaluations "
                               "hands it to every worker (set_noise)")
        env, noise, rng, cfg = self.env, self.noise, self.rng, self.config
        assert isinstance(env, VectorEnv)  # a single-agent config, checked by EvolutionConfig
        pairs = cfg.pairs_per_worker if num_pairs is None else num_pairs
        theta = self.policy.flat_weights()
        dim = len(theta)
        indices = np.array([noise.sample_index(rng, dim) for _ in range(pairs)], np.int64)
        jobs = deque((k, sign) for k in range(pairs) for sign in (0, 1))
        returns, lengths = np.zeros((pairs, 2), np.float64), np.zeros((pairs, 2), np.int64)
        n = env.num_envs
        params = np.empty((n, dim), np.float32)
        slot_job: list[tuple[int, int]] = [(_EVAL, 0)] * n

        def assign(slot: int) -> None:
            if not jobs or rng.random() < cfg.eval_prob:
                slot_job[slot], params[slot] = (_EVAL, 0), theta
                return
            k, sign = slot_job[slot] = jobs.popleft()
            eps = noise.get(int(indices[k]), dim)
            params[slot] = theta + cfg.noise_stdev * eps if sign == 0 else theta - cfg.noise_stdev * eps

        for slot in range(n):
            assign(slot)
        obs = self._filtered(env.reset())
        remaining, steps = 2 * pairs, 0
        while remaining:
            actions = self.policy.outputs_to_actions(self.perturbed.forward(obs, params))
            step = env.step(self.policy.env_actions(actions))
            steps += n
            for episode in step.episodes:
                k, sign = slot_job[episode.env_index]
                if k == _EVAL:
                    self._episodes.append(episode)
                else:
                    returns[k, sign], lengths[k, sign] = episode.episode_return, episode.episode_length
                    remaining -= 1
                assign(episode.env_index)
            obs = self._filtered(step.obs)
        return Evaluations(indices, returns, lengths, steps, self.policy.weights_version)

