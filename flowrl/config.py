"""The configs of policies, models and rollouts: frozen, validated dataclasses, free of torch.

They live apart from the classes they configure so that a process can build, check and pickle a
config (the CLI, a fake worker actor in tests) without importing torch. :mod:`flowrl.models`,
:mod:`flowrl.policy` and :mod:`flowrl.workers` re-export them.

Examples:
    >>> RolloutConfig(env="CartPole-v1", num_envs_per_worker=4, rollout_fragment_length=50).sample_size
    200
    >>> RolloutConfig(rollout_fragment_length=0)
    Traceback (most recent call last):
    ...
    ValueError: rollout_fragment_length=0 must be a positive int (steps per env per sample / envs per worker)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping

from flowrl.envs.base import EnvSpec
from flowrl.envs.multi_agent import make_policy_mapping
from flowrl.sample_batch import DEFAULT_POLICY_ID

if TYPE_CHECKING:
    from flowrl.policy import Policy

__all__ = ["ModelConfig", "PolicyConfig", "PolicySpec", "RolloutConfig", "TrainerConfig", "ACTIVATIONS"]

ACTIVATIONS = ("tanh", "relu", "elu")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The network of a policy.

    Attributes:
        hidden_sizes: widths of the fully connected layers (after the CNN for images).
        activation: ``"tanh"``, ``"relu"`` or ``"elu"``.
        vf_share_layers: one trunk for policy and value (True) or a separate value network (False).
        conv_filters: ``(out_channels, kernel, stride)`` per conv layer, for image observations.
        free_log_std: Gaussian log-std as a state-independent parameter (True) or a network output.
    """

    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: Literal["tanh", "relu", "elu"] = "tanh"
    vf_share_layers: bool = False
    conv_filters: tuple[tuple[int, int, int], ...] = ((16, 8, 4), (32, 4, 2))
    free_log_std: bool = True

    def __post_init__(self) -> None:
        if not all(isinstance(h, int) and h > 0 for h in self.hidden_sizes):
            raise ValueError(f"ModelConfig.hidden_sizes={self.hidden_sizes!r} must be positive ints, e.g. (64, 64)")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"ModelConfig.activation={self.activation!r}; use one of {list(ACTIVATIONS)}")
        for f in self.conv_filters:
            if len(f) != 3 or not all(isinstance(x, int) and x > 0 for x in f):
                raise ValueError(f"ModelConfig.conv_filters entry {f!r} must be (out_channels, kernel, stride)")


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """Settings every policy has; algorithm configs extend it.

    Attributes:
        model: the network (:class:`flowrl.models.ModelConfig`).
        lr: Adam learning rate.
        grad_clip: max global gradient norm, or ``None`` for no clipping.
        gamma: discount factor.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` for the model and the learner.
        seed: seeds model initialisation, action sampling and minibatch order; ``None`` is random.
        numpy_acting: on the CPU, compute actions through a numpy mirror of an MLP model (the same
            distributions, several times faster for the small batches a rollout worker acts on);
            ``False`` always acts through torch.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    lr: float = 5e-4
    grad_clip: float | None = None
    gamma: float = 0.99
    device: str = "cpu"
    seed: int | None = None
    numpy_acting: bool = True

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr} must be > 0")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip={self.grad_clip} must be > 0, or None to disable clipping")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma={self.gamma} must be in [0, 1]")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device={self.device!r}; use 'cpu', 'cuda' or 'cuda:N'")


@dataclass(frozen=True, kw_only=True)
class PolicySpec:
    """One policy of a multi-agent setup.

    Attributes:
        policy_class: its Policy class (``None``: the worker's ``policy_class``).
        config: its own policy config (``None``: the worker's config).
    """

    policy_class: type[Policy] | None = None
    config: PolicyConfig | None = None


@dataclass(frozen=True, kw_only=True)
class RolloutConfig(PolicyConfig):
    """Where and how experience is collected; algorithm configs extend it.

    Attributes:
        env: a gymnasium id or a callable ``EnvContext -> gymnasium.Env``.
        env_config: keyword arguments for the env (passed to ``gymnasium.make`` for an id).
        num_workers: remote rollout workers (0: sample in the driver).
        num_envs_per_worker: envs stepped together by each worker (one batched policy call per step).
        rollout_fragment_length: steps per env in one ``sample()``.
        batch_mode: ``"truncate_episodes"`` (exactly ``fragment x envs`` steps) or
            ``"complete_episodes"`` (at least that many, ending on episode boundaries).
        num_cpus_per_worker / num_gpus_per_worker: what each remote worker asks Ray for.
        vector_backend: how a worker steps its envs (see :class:`flowrl.envs.VectorEnv`).
        policies: multi-agent only: policy id -> :class:`PolicySpec`; ``env`` must then be a callable
            returning a :class:`flowrl.envs.MultiAgentEnv`. ``None`` is single-agent.
        policy_mapping_fn: agent id -> policy id, as a dict or a callable (see
            :func:`flowrl.envs.make_policy_mapping`).
        policies_to_train: the policies that learn (``None``: all).
    """

    env: EnvSpec = "CartPole-v1"
    env_config: Mapping[str, Any] = field(default_factory=dict)
    num_workers: int = 0
    num_envs_per_worker: int = 1
    rollout_fragment_length: int = 200
    batch_mode: Literal["truncate_episodes", "complete_episodes"] = "truncate_episodes"
    num_cpus_per_worker: float = 1
    num_gpus_per_worker: float = 0
    vector_backend: Literal["auto", "loop", "gymnasium"] = "auto"
    policies: Mapping[str, PolicySpec] | None = None
    policy_mapping_fn: Callable[[str], str] | Mapping[str, str] | None = None
    policies_to_train: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.policies is not None:
            if not self.policies or not all(isinstance(v, PolicySpec) for v in self.policies.values()):
                raise ValueError(f"policies={self.policies!r} must map policy ids to PolicySpec(...) entries")
            if not callable(self.env):
                raise ValueError(f"env={self.env!r}: a multi-agent config needs a callable EnvContext -> "
                                 f"MultiAgentEnv, e.g. MultiAgentCartPole.from_context")
            if self.batch_mode != "truncate_episodes":
                raise ValueError(f"batch_mode={self.batch_mode!r} is not supported with multi-agent policies yet; "
                                 f"use 'truncate_episodes'")
            make_policy_mapping(self.policy_mapping_fn, list(self.policies))  # targets checked now
        if self.policies_to_train is not None:
            known = set(self.policies) if self.policies is not None else {DEFAULT_POLICY_ID}
            unknown = sorted(set(self.policies_to_train) - known)
            if unknown:
                raise ValueError(f"policies_to_train names unknown policies {unknown}; known: {sorted(known)}")
        for name in ("rollout_fragment_length", "num_envs_per_worker"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int (steps per env per sample / envs "
                                 f"per worker)")
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ValueError(f"num_workers={self.num_workers!r} must be an int >= 0 (0 samples in the driver)")
        if self.batch_mode not in ("truncate_episodes", "complete_episodes"):
            raise ValueError(f"batch_mode={self.batch_mode!r}; use 'truncate_episodes' or 'complete_episodes'")
        if self.num_cpus_per_worker < 0 or self.num_gpus_per_worker < 0:
            raise ValueError(f"num_cpus_per_worker={self.num_cpus_per_worker} and num_gpus_per_worker="
                             f"{self.num_gpus_per_worker} must be >= 0")

    @property
    def sample_size(self) -> int:
        """R: one worker's sample size, ``rollout_fragment_length x num_envs_per_worker``."""
        return self.rollout_fragment_length * self.num_envs_per_worker


@dataclass(frozen=True, kw_only=True)
class TrainerConfig(RolloutConfig):
    """What every algorithm's config has beyond rollouts: batch size, learner devices, reporting and
    failure handling (SEMANTICS.md §4, common defaults; §5). Algorithm configs extend it.

    Attributes:
        train_batch_size: steps per train batch (``ConcatBatches``' target).
        count_steps_by: ``"env_steps"`` or ``"agent_steps"`` (multi-agent batch sizing).
        num_gpus: the learner's CUDA devices (checked against what torch sees when the trainer starts).
        _fake_gpus: run the multi-device learner on ``num_gpus`` CPU "devices" (tests, laptops).
        simple_optimizer: ``None`` resolves to ``True`` when ``num_gpus <= 1``; ``False`` selects
            ``MultiGPUTrainOneStep``. See :attr:`use_simple_optimizer`.
        timesteps_per_iteration: a report waits for at least this many new steps.
        min_iter_time_s: a report waits for at least this many seconds (0: no time gate).
        metrics_smoothing_episodes: episode statistics are smoothed over this many episodes.
        collect_metrics_timeout: seconds to wait for workers' episode statistics.
        keep_per_episode_custom_metrics: keep raw per-episode custom metrics in results.
        ignore_worker_failures: drop failed workers and go on (when not recreating them).
        recreate_failed_workers: replace failed workers with the current weights and go on.
        store_buffer_in_checkpoints: checkpoints include trainer-owned replay data.
    """

    num_workers: int = 2
    train_batch_size: int = 200
    count_steps_by: Literal["env_steps", "agent_steps"] = "env_steps"
    num_gpus: float = 0
    _fake_gpus: bool = False
    simple_optimizer: bool | None = None
    timesteps_per_iteration: int = 0
    min_iter_time_s: float = 0
    metrics_smoothing_episodes: int = 100
    collect_metrics_timeout: float = 180
    keep_per_episode_custom_metrics: bool = False
    ignore_worker_failures: bool = False
    recreate_failed_workers: bool = True
    store_buffer_in_checkpoints: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.train_batch_size, int) or self.train_batch_size < 1:
            raise ValueError(f"train_batch_size={self.train_batch_size!r} must be a positive int (steps per "
                             f"train batch)")
        if self.count_steps_by not in ("env_steps", "agent_steps"):
            raise ValueError(f"count_steps_by={self.count_steps_by!r}; use 'env_steps' or 'agent_steps'")
        if self.num_gpus < 0:
            raise ValueError(f"num_gpus={self.num_gpus} must be >= 0 (0 trains on the CPU)")
        for name in ("timesteps_per_iteration", "metrics_smoothing_episodes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r} must be an int >= 0")
        for name in ("min_iter_time_s", "collect_metrics_timeout"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 0 seconds")

    @property
    def use_simple_optimizer(self) -> bool:
        """Whether plans train with ``TrainOneStep`` (True) or ``MultiGPUTrainOneStep`` (False)."""
        if self.simple_optimizer is None:
            return self.num_gpus <= 1
        return self.simple_optimizer
