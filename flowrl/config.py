"""The configs of policies, models and rollouts: frozen, validated dataclasses, free of torch.

They live apart from the classes they configure so that a process can build, check and pickle a
config (the CLI, a fake worker actor in tests) without importing torch. :mod:`flowrl.models`,
:mod:`flowrl.policy` and :mod:`flowrl.workers` re-export them. :func:`config_to_data` and
:func:`config_from_data` turn a config into plain JSON data and back (checkpoints store it, so the CLI can
resume and evaluate from a path alone), reading each field's type through :mod:`flowrl._config_hints` (the
walker the command line's ``--config`` parsing uses too); :func:`config_field_types` is re-exported from there.

Examples:
    >>> RolloutConfig(env="CartPole-v1", num_envs_per_worker=4, rollout_fragment_length=50).sample_size
    200
    >>> RolloutConfig(rollout_fragment_length=0)
    Traceback (most recent call last):
    ...
    ValueError: rollout_fragment_length=0 must be an int >= 1 (steps per env per sample)
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal, Mapping, TypeVar

from flowrl._config_hints import Hint, config_field_types, field_hints
from flowrl.callbacks import Callbacks, resolve_callbacks
from flowrl.envs.base import EnvSpec, check_seed
from flowrl.envs.policy_mapping import make_policy_mapping
from flowrl.filters import OBSERVATION_FILTERS, ObservationFilterName
from flowrl.sample_batch import DEFAULT_POLICY_ID
from flowrl.validation import bounded, check_bounds

if TYPE_CHECKING:
    from flowrl.policy import Policy

__all__ = ["ModelConfig", "PolicyConfig", "PolicySpec", "RolloutConfig", "TrainerConfig", "ACTIVATIONS",
           "available_cpus", "num_workers_that_fit", "config_field_types", "config_to_data", "config_from_data",
           "check_finite_fields"]

ACTIVATIONS = ("tanh", "relu", "elu")

C = TypeVar("C")

logger = logging.getLogger(__name__)


def available_cpus() -> int:
    """The CPUs rollout workers can use: the running Ray instance's (a joined cluster's total), or this
    machine's logical CPUs when Ray has not started."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return max(int(ray.cluster_resources().get("CPU", 0)), 1)
    return os.cpu_count() or 1


def num_workers_that_fit(preferred: int, owner: str) -> Callable[[], int]:
    """A ``default_factory`` for ``num_workers``: ``preferred`` workers, capped at :func:`available_cpus` when
    the config is built, and saying so in one warning line when it caps. A ``num_workers`` the user sets is
    never changed.

    Examples:
        >>> num_workers_that_fit(1, "PPOConfig")()
        1
        >>> num_workers_that_fit(10_000, "ApexConfig")() == available_cpus()
        True
    """
    def default() -> int:
        cpus = available_cpus()
        if preferred <= cpus:
            return preferred
        logger.warning("%s.num_workers defaults to %d here: its %d workers capped to the %d CPUs available; set "
                       "num_workers yourself (--config num_workers=N) to choose another count", owner, cpus,
                       preferred, cpus)
        return cpus

    default.__qualname__ = f"num_workers_that_fit({preferred})"
    return default


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The network of a policy.

    Attributes:
        hidden_sizes: widths of the fully connected layers (after the CNN for images).
        activation: ``"tanh"``, ``"relu"`` or ``"elu"``.
        vf_share_layers: one trunk for policy and value (True) or a separate value network (False).
        conv_filters: ``(out_channels, kernel, stride)`` per conv layer, for image observations (HWC); ``None``
            (the default) picks by the image's size: the Nature CNN from 36x36 up (84x84 Atari frames), MinAtar's
            one 3x3 layer below (:func:`flowrl.models.default_conv_filters`).
        free_log_std: Gaussian log-std as a state-independent parameter (True) or a network output.
        use_lstm: a recurrent model (:class:`flowrl.models.RecurrentActorCritic`): the encoder and MLP feed a
            cell whose state a rollout worker carries per env from step to step (restarted at every episode end)
            and stores per row; the learner trains on sequences of at most ``max_seq_len`` steps. The policy and
            value heads share the cell (``vf_share_layers`` is not read). Only algorithms whose configs say they
            train recurrent models accept it (PPO, A2C, A3C, IMPALA, APPO, R2D2).
        lstm_cell_size: the cell's state size (256).
        lstm_cell: ``"lstm"`` or ``"gru"``.
        max_seq_len: the longest sequence the learner trains on (20): an episode is cut into sequences of this
            many steps, each starting from the state the worker acted with.
        lstm_use_prev_action / lstm_use_prev_reward: the cell also reads the previous step's action (one-hot for
            a Discrete space) / reward, zeros at an episode's first step (False); the worker stores what it fed
            (``prev_actions``, ``prev_rewards``).
    """

    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: Literal["tanh", "relu", "elu"] = "tanh"
    vf_share_layers: bool = False
    conv_filters: tuple[tuple[int, int, int], ...] | None = None
    free_log_std: bool = True
    use_lstm: bool = False
    lstm_cell_size: int = 256
    lstm_cell: Literal["lstm", "gru"] = "lstm"
    max_seq_len: int = 20
    lstm_use_prev_action: bool = False
    lstm_use_prev_reward: bool = False

    def __post_init__(self) -> None:
        if not all(isinstance(h, int) and h > 0 for h in self.hidden_sizes):
            raise ValueError(f"ModelConfig.hidden_sizes={self.hidden_sizes!r} must be positive ints, e.g. (64, 64)")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"ModelConfig.activation={self.activation!r}; use one of {list(ACTIVATIONS)}")
        for f in self.conv_filters or ():
            if len(f) != 3 or not all(isinstance(x, int) and x > 0 for x in f):
                raise ValueError(f"ModelConfig.conv_filters entry {f!r} must be (out_channels, kernel, stride)")
        for name, example in (("lstm_cell_size", 256), ("max_seq_len", 20)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelConfig.{name}={value!r} must be an int >= 1, e.g. {example}")
        if self.lstm_cell not in ("lstm", "gru"):
            raise ValueError(f"ModelConfig.lstm_cell={self.lstm_cell!r}; use 'lstm' or 'gru'")
        for name in ("lstm_use_prev_action", "lstm_use_prev_reward"):
            if getattr(self, name) and not self.use_lstm:
                raise ValueError(f"ModelConfig.{name}=True feeds the recurrent cell, and use_lstm=False has none; set "
                                 f"use_lstm=True or {name}=False")


_FLOAT_FIELDS: dict[type, tuple[tuple[str, bool], ...]] = {}


def check_finite_fields(config: Any) -> None:
    """Refuses a NaN or infinite value in any ``float`` field of the config dataclass ``config``, except the
    fields its class names in ``infinite_ok_fields`` (where infinity has a documented meaning, such as PPO's
    ``vf_clip_param``; NaN is refused there too). Every config that extends :class:`PolicyConfig` runs it
    first in ``__post_init__``, so a new float field is covered without a check of its own.

    Raises:
        TypeError: a float field holds something that is not a real number (a bool, a string).
        ValueError: a float field holds NaN or an infinity (the message names the field, the value and the
            default to use instead).

    Examples:
        >>> check_finite_fields(PolicyConfig(lr=3e-4))
        >>> PolicyConfig(lr=float("inf"))
        Traceback (most recent call last):
        ...
        ValueError: lr=inf must be a finite number; pass a finite value such as the default lr=0.0005
    """
    cls = type(config)
    if cls not in _FLOAT_FIELDS:
        _FLOAT_FIELDS[cls] = tuple((name, hint.optional) for name, hint in field_hints(cls).items()
                                   if hint.kind == "float")
    infinite_ok: frozenset[str] = getattr(config, "infinite_ok_fields", frozenset())
    for name, optional in _FLOAT_FIELDS[cls]:
        value = getattr(config, name)
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name}={value!r} must be a number{' or None' if optional else ''}")
        if math.isnan(value) or (math.isinf(value) and name not in infinite_ok):
            default = next(f.default for f in dataclasses.fields(config) if f.name == name)
            if default is None:
                raise ValueError(f"{name}={value!r} must be a finite number, or None (the default)")
            instead = f"the default {name}={default!r}" if default is not dataclasses.MISSING else "1.0"
            raise ValueError(f"{name}={value!r} must be a finite number; pass a finite value such as {instead}"
                             + (f" (or {name}=None to turn it off)" if optional else ""))


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """Settings every policy has; algorithm configs extend it.

    Attributes:
        model: the network (:class:`flowrl.models.ModelConfig`).
        lr: Adam learning rate.
        grad_clip: max global gradient norm, or ``None`` for no clipping.
        gamma: discount factor.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` for the model and the learner.
        seed: seeds model initialisation, action sampling and minibatch order (an int in ``[0, 2**63)``);
            ``None`` is random.
        numpy_acting: on the CPU, compute actions through a numpy mirror of an MLP model (the same
            distributions, or for DQN the same Q-values; several times faster for the small batches a
            rollout worker acts on); ``False`` always acts through torch.
        on_nonfinite_update: what a learner does with a gradient that holds NaN or inf (a NaN loss, a diverging
            model): ``"skip"`` drops that update (the weights stay as they were), counts it in the learner stat
            ``num_nonfinite_updates_skipped`` and warns once; ``"raise"`` raises ``FloatingPointError``. Such an
            update is never applied.
        normalize_actions: for a ``Box`` action space, the policy acts in ``[-1, 1]`` per dimension and each action
            is mapped linearly onto the space's bounds (after clipping to ``[-1, 1]``) before the env sees it;
            the sampled batch keeps the policy's own actions. Needs finite bounds; ``False`` sends the policy's
            actions as they are (then see ``clip_actions``).
        clip_actions: with ``normalize_actions=False``, clip each action to the space's bounds before the env
            sees it (the sampled batch keeps the unclipped one).

    Every ``float`` field must be finite (:func:`check_finite_fields`) unless the class lists it in
    ``infinite_ok_fields``.
    """

    #: float fields where ``inf`` is a meaningful setting (a subclass adds its own); NaN is never accepted.
    infinite_ok_fields: ClassVar[frozenset[str]] = frozenset()
    #: whether this config's algorithm trains recurrent models (``model.use_lstm``); the others refuse them
    trains_recurrent_models: ClassVar[bool] = False

    model: ModelConfig = field(default_factory=ModelConfig)
    lr: float = bounded(5e-4, gt=0)
    grad_clip: float | None = bounded(None, gt=0, meaning="None: no clipping")
    gamma: float = bounded(0.99, ge=0, le=1, meaning="discount factor")
    device: str = "cpu"
    seed: int | None = None
    numpy_acting: bool = True
    on_nonfinite_update: Literal["skip", "raise"] = "skip"
    normalize_actions: bool = True
    clip_actions: bool = True

    def __post_init__(self) -> None:
        check_finite_fields(self)
        check_bounds(self)
        check_seed(self.seed)
        if self.seed is not None and self.seed >= 2**63:
            raise ValueError(f"seed={self.seed} must be below 2**63 (torch seeds take 64-bit ints); pass e.g. seed=0")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device={self.device!r}; use 'cpu', 'cuda' or 'cuda:N'")
        if self.on_nonfinite_update not in ("skip", "raise"):
            raise ValueError(f"on_nonfinite_update={self.on_nonfinite_update!r}; use 'skip' (drop the update and "
                             f"count it) or 'raise'")
        if self.model.use_lstm and not type(self).trains_recurrent_models:
            raise ValueError(f"model.use_lstm=True: {type(self).__name__}'s algorithm trains feed-forward models only; "
                             f"PPO, A2C, A3C, IMPALA and APPO train recurrent ones, or set use_lstm=False")


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
        profile: profile the run: workers stamp each sampled row with the version of the weights that sampled
            it (the ``weights_version`` column, so learners measure staleness) and send that version with their
            weights, and the :class:`~flowrl.trainer.Trainer` profiles its plan per operator
            (:mod:`flowrl.profiling`) and puts the profile in ``result["profile"]``. Off: none of it runs.
        sample_timeout_s: the longest the driver waits for one sample request to a remote worker (600 s; a
            request may first wait for the requests sent to that worker before it), so that an ``env.step``
            that hangs ends in an error naming the worker instead of a silent hang; the
            :class:`~flowrl.trainer.Trainer` replaces that worker when ``recreate_failed_workers`` is on, and
            raises otherwise. ``None`` waits forever. It does not apply to the local worker: with
            ``num_workers=0`` the driver samples itself, and nothing can interrupt an ``env.step`` hanging in
            the driver.
        observation_filter: ``"NoFilter"`` (observations as the env gives them) or ``"MeanStdFilter"``: each
            worker normalizes what its policy sees by the running mean and std of the observations (clipped to
            [-10, 10]; :mod:`flowrl.filters`); the sampled batches hold the normalized observations, the driver
            merges the workers' new statistics whenever it sends weights and sends the merged ones with them,
            checkpoints keep them and evaluation and :mod:`flowrl.inference` apply them, frozen. Single-agent,
            float observations only.
        flush_denormal: learning (a worker's ``learn_on_batch``, ``compute_gradients``, ``apply_gradients``, and
            the multi-device learner's steps) computes with denormal (subnormal) floats flushed to zero
            (:func:`flowrl.policy.flush_denormals`), as TensorFlow does by default. On x86 an operation on a
            denormal costs up to ~100 times a normal one, and Adam's moment estimates for a dead ReLU unit decay
            through the denormal range: a SAC step on Pendulum spent about 1/7 of its time there. The thread's
            floating-point mode is restored after each call, so code outside learning (the user's, in the same
            process) sees IEEE denormals as usual. ``False``: learning leaves the mode as it is.
        executor: ``"ray"`` runs the remote workers (and a plan's other actors: replay shards, aggregators) as Ray
            actors; ``"local"`` runs every one of them in this process with no Ray started (:mod:`flowrl.executor`):
            remote calls run one at a time in a fixed order and learner threads become steps of the driver, so a
            run is deterministic, a ``breakpoint()`` in an env, a loss or an operator stops in this process, and a
            synchronous plan gives the same weights and counters as under ``"ray"`` with the same seed.
        clip_rewards: ``None`` (the default): the batches hold the env's rewards; a number ``c``: each reward is
            clipped to ``[-c, c]`` in the sampled batches (what the learner trains on, and what a recurrent model
            reads as the previous reward), while the episode statistics (``episode_reward_mean``, evaluation) keep
            the env's own rewards: ``clip_rewards=1.0`` is the Atari clipping of Mnih et al. 2015 with the game
            score still reported.
        compress_observations: LZ4 compression of image columns (``uint8``/``bool`` frames of at least 1 KiB a row,
            such as Atari's 84x84x4 stacks; :mod:`flowrl.compression`), exact and reversed where they are read.
            ``None`` (the default): replay buffers keep them compressed (a Pong stack shrinks about 40x), while
            sampled batches cross Ray as they are (on one machine Ray's shared memory moves them for less than
            LZ4 costs; ``benchmarks/atari.py`` measures both ways). ``True``: the rollout workers' batches cross
            Ray compressed too (for clusters, where they cross a network); ``False``: nothing is compressed.
        callbacks: user hooks (:mod:`flowrl.callbacks`): a :class:`~flowrl.callbacks.Callbacks` subclass or its
            import path ``"package.module:ClassName"`` (the path is what a checkpoint keeps and what
            ``--config callbacks=...`` takes). Each worker and the trainer make their own instance. ``None``:
            no hooks, and no cost.
        custom_resources_per_worker: Ray custom resources each remote worker asks for beyond its CPUs and GPUs
            (``{"accelerator": 1}``: only nodes started with that resource take it); ``None``: none.
        placement_strategy: ``None`` lets Ray place each remote worker (and learner) on its own; ``"PACK"``,
            ``"SPREAD"``, ``"STRICT_PACK"`` or ``"STRICT_SPREAD"`` reserves one Ray placement group for them
            first, a bundle of the resources each asks for, placed with that strategy (packed onto few nodes,
            spread over many, or strictly so), and fails within a minute, naming the bundles and the cluster's
            resources, when the cluster cannot hold it. A replaced worker takes its predecessor's bundle.
        output: a directory (created if missing): every worker that samples records what it sampled there as
            Parquet files of whole episodes (:mod:`flowrl.offline`): observations, actions, rewards, episode ends
            and, for policies that sample from a distribution, each action's ``logp`` and ``action_prob`` for
            off-policy estimation. The rows are the env's (before any algorithm's postprocessing; rewards after
            ``clip_rewards``). ``None``: nothing is recorded.
        output_compress_columns: recorded columns stored as one LZ4 block per row (image observations: ``("obs",
            "new_obs")``); read back exactly.
        output_max_file_bytes: a worker closes its file and starts the next once it holds about this many bytes.
        input: where the plan's experience comes from instead of the env: a dataset recorded with ``output`` (a
            directory, a Parquet file, or any path Ray Data reads), read by ``ParallelRollouts`` in items of the
            size it would sample, each episode postprocessed by the learning policy, the rows shuffled. ``None``:
            the workers sample the env.
        input_mix: with ``input``, the fraction of items that come from the dataset, the rest sampled by the
            workers (RLlib's mixed input); ``None``: all of them.
        input_shuffle_rows: rows shuffled together before they are cut into items (a window over the dataset,
            which is read in a new random file order every epoch); 1 keeps the recorded order.
        input_epochs: passes over the dataset before the experience ends (and the run with it); ``None`` repeats
            it for ever.
        off_policy_estimation: with ``input`` whose data holds the behaviour policy's ``logp``, every report
            estimates the learning policy's return on the last 100 episodes read, without running it
            (:func:`flowrl.offline.off_policy_estimates`: ``"is"``, ``"wis"``), under
            ``result["off_policy_estimation"]``; ``()``: none.
    """

    env: EnvSpec = "CartPole-v1"
    env_config: Mapping[str, Any] = field(default_factory=dict)
    num_workers: int = bounded(0, ge=0, meaning="0 samples in the driver")
    num_envs_per_worker: int = bounded(1, ge=1, meaning="envs stepped together by one worker")
    rollout_fragment_length: int = bounded(200, ge=1, meaning="steps per env per sample")
    batch_mode: Literal["truncate_episodes", "complete_episodes"] = "truncate_episodes"
    num_cpus_per_worker: float = bounded(1, ge=0, meaning="CPUs each remote worker asks Ray for")
    num_gpus_per_worker: float = bounded(0, ge=0, meaning="GPUs each remote worker asks Ray for")
    vector_backend: Literal["auto", "loop", "gymnasium", "async", "envpool"] = "auto"
    policies: Mapping[str, PolicySpec] | None = None
    policy_mapping_fn: Callable[[str], str] | Mapping[str, str] | None = None
    policies_to_train: tuple[str, ...] | None = None
    profile: bool = False
    sample_timeout_s: float | None = bounded(600.0, gt=0, meaning="seconds the driver waits for a remote "
                                             "worker's sample; None waits forever")
    observation_filter: ObservationFilterName = "NoFilter"
    flush_denormal: bool = True
    executor: Literal["ray", "local"] = "ray"
    clip_rewards: float | None = bounded(None, gt=0, meaning="clip the batches' rewards to [-c, c]; None keeps them")
    compress_observations: bool | None = None
    callbacks: str | type[Callbacks] | None = None
    custom_resources_per_worker: Mapping[str, float] | None = None
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] | None = None
    output: str | None = None
    output_compress_columns: tuple[str, ...] = ()
    output_max_file_bytes: int = bounded(64 * 2**20, ge=1, meaning="bytes per recorded file")
    input: str | None = None
    input_mix: float | None = bounded(None, gt=0, lt=1, meaning="the dataset's share of the items; None: all")
    input_shuffle_rows: int = bounded(10_000, ge=1, meaning="rows shuffled together; 1 keeps the recorded order")
    input_epochs: int | None = bounded(None, ge=1, meaning="passes over the dataset; None repeats it")
    off_policy_estimation: tuple[str, ...] = ("is", "wis")

    def __post_init__(self) -> None:
        super().__post_init__()
        resolve_callbacks(self.callbacks)
        if self.compress_observations not in (None, True, False):
            raise ValueError(f"compress_observations={self.compress_observations!r} must be None (replay "
                             f"compressed, batches not), True (both) or False (neither)")
        if self.executor not in ("ray", "local"):
            raise ValueError(f"executor={self.executor!r}; use 'ray' (remote workers are Ray actors) or 'local' "
                             f"(every actor runs in this process, for debugging and deterministic runs)")
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
        if self.observation_filter not in OBSERVATION_FILTERS:
            raise ValueError(f"observation_filter={self.observation_filter!r}; use one of {list(OBSERVATION_FILTERS)}")
        if self.observation_filter != "NoFilter" and self.policies is not None:
            raise ValueError(f"observation_filter={self.observation_filter!r} is not supported with multi-agent "
                             f"policies yet; use 'NoFilter'")
        if self.batch_mode not in ("truncate_episodes", "complete_episodes"):
            raise ValueError(f"batch_mode={self.batch_mode!r}; use 'truncate_episodes' or 'complete_episodes'")
        self._check_placement()
        self._check_offline()

    def _check_offline(self) -> None:
        """``output``/``input`` settings fit together (the dataset itself is checked when a plan reads it)."""
        if self.output is not None or self.input is not None:
            which = "output" if self.output is not None else "input"
            if self.policies is not None:
                raise ValueError(f"{which}={getattr(self, which)!r} with multi-agent policies: recorded experience "
                                 f"is single-agent; drop {which} or the policies")
            if self.observation_filter != "NoFilter":
                raise ValueError(f"{which}={getattr(self, which)!r} with observation_filter="
                                 f"{self.observation_filter!r}: the filter's statistics change as the run goes, so "
                                 f"recorded observations would not match what a reader's policy sees; use "
                                 f"observation_filter='NoFilter'")
        if self.output is not None and self.input is not None and self.input_mix is None:
            raise ValueError(f"output={self.output!r} with input={self.input!r}: nothing is sampled from the env to "
                             f"record; drop output, or set input_mix to sample part of the experience")
        if self.output is not None and self.input is not None and \
                Path(self.output).expanduser().resolve() == Path(self.input).expanduser().resolve():
            raise ValueError(f"output={self.output!r} and input={self.input!r} are one directory: the run would read "
                             f"what it writes; record into another directory")
        if self.input_mix is not None and self.input is None:
            raise ValueError(f"input_mix={self.input_mix:g} without input: set input=DIR (a recorded dataset) to mix "
                             f"its items with sampled ones, or drop input_mix")
        from flowrl.sample_batch import NEXT_OBS, OBS
        from flowrl.offline import ESTIMATORS, RECORDED_COLUMNS
        if isinstance(self.off_policy_estimation, str) or set(self.off_policy_estimation) - set(ESTIMATORS):
            raise ValueError(f"off_policy_estimation={self.off_policy_estimation!r}: name estimators from "
                             f"{list(ESTIMATORS)}, e.g. ('is', 'wis'), or () for none")
        unknown = [c for c in self.output_compress_columns if c not in RECORDED_COLUMNS]
        if unknown or isinstance(self.output_compress_columns, str):
            raise ValueError(f"output_compress_columns={self.output_compress_columns!r}: name recorded columns "
                             f"({list(RECORDED_COLUMNS)}), e.g. ({OBS!r}, {NEXT_OBS!r}) for image observations")

    def _check_placement(self) -> None:
        strategies = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
        if self.placement_strategy is not None and self.placement_strategy not in strategies:
            raise ValueError(f"placement_strategy={self.placement_strategy!r}; use one of {list(strategies)}, or None "
                             f"to let Ray place each actor on its own")
        custom = self.custom_resources_per_worker
        if custom is None:
            return
        if not isinstance(custom, Mapping):
            raise ValueError(f"custom_resources_per_worker={custom!r} must map resource names to amounts, e.g. "
                             f"{{'accelerator': 1}}")
        for name, amount in custom.items():
            if not isinstance(name, str) or name in ("CPU", "GPU"):
                raise ValueError(f"custom_resources_per_worker has the key {name!r}; name a custom resource (CPU and "
                                 f"GPU are num_cpus_per_worker and num_gpus_per_worker)")
            if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not 0 <= amount < math.inf:
                raise ValueError(f"custom_resources_per_worker[{name!r}]={amount!r} must be a finite number >= 0")

    @property
    def sample_size(self) -> int:
        """R: one worker's sample size, ``rollout_fragment_length x num_envs_per_worker``."""
        return self.rollout_fragment_length * self.num_envs_per_worker

    @property
    def compress_replay(self) -> bool:
        """Whether replay buffers keep image columns LZ4-compressed: ``compress_observations`` unset or true."""
        return self.compress_observations is not False

    @property
    def compress_batches(self) -> bool:
        """Whether rollout workers' batches cross Ray with image columns LZ4-compressed: only when asked (true)."""
        return self.compress_observations is True


@dataclass(frozen=True, kw_only=True)
class TrainerConfig(RolloutConfig):
    """What every algorithm's config has beyond rollouts: batch size, learner devices, reporting and
    failure handling. Algorithm configs extend it.

    Reporting cadence: one ``Trainer.train()`` (one report, one ``training_iteration``) ends at the first train
    step (or, for IMPALA, APPO and Ape-X, learner output) at which at least ``timesteps_per_iteration`` env
    steps have been sampled since the last report, and ``min_iter_time_s`` seconds have passed. Every
    algorithm's default gates on env steps only, so that reports, and step budgets such as ``--stop-timesteps``,
    do not depend on the machine's speed: 1000 env steps (PG, A2C, A3C, DQN, Ape-X, IMPALA, APPO), or one train
    batch where that is larger (PPO: 4000). A plan emits no report before its learner has trained once (Ape-X
    and DQN: not before ``learning_starts``).

    Attributes:
        num_workers: remote rollout workers: 2 by default, capped at the CPUs available
            (:func:`num_workers_that_fit`); a value you set is kept.
        train_batch_size: steps per train batch (``ConcatBatches``' target).
        count_steps_by: ``"env_steps"`` or ``"agent_steps"`` (multi-agent batch sizing).
        num_gpus: the learner's CUDA devices (checked against what torch sees when the trainer starts).
        fake_gpus: run the multi-device learner on ``num_gpus`` CPU "devices" (tests, laptops).
        simple_optimizer: ``None`` resolves to ``True`` when ``num_gpus <= 1``; ``False`` selects
            ``MultiGPUTrainOneStep``. See :attr:`use_simple_optimizer`.
        num_learners: learner actors that split each minibatch, all-reduce their gradients and take the same step
            (:mod:`flowrl.learner_group`); 1 (the default): the driver learns. For policies that learn in groups
            (PG, PPO).
        num_cpus_per_learner / num_gpus_per_learner: what each learner actor asks Ray for; with a GPU each (a
            whole one) the learners train on CUDA and all-reduce over NCCL, else on the CPU over gloo.
        collective_timeout_s: how long a member of a process group (a learner, a DD-PPO worker) waits for its
            peers, forming the group and in each all-reduce, before it fails.
        timesteps_per_iteration: a report waits for at least this many new env steps (0 here: every train step
            reports; algorithms set their own, see "Reporting cadence" above).
        min_iter_time_s: a report waits for at least this many seconds (0: no time gate, every default).
        metrics_smoothing_episodes: the episode statistics of a result (``episode_reward_mean``/``min``/``max``,
            ``episode_len_mean``, ``policy_reward_*``) are over the last this many finished episodes, across
            reports (a moving window, kept in checkpoints); 0: over each report's episodes only.
        collect_metrics_timeout: seconds to wait for workers' episode statistics.
        keep_per_episode_custom_metrics: keep raw per-episode custom metrics in results.
        ignore_worker_failures: drop failed workers and go on (when not recreating them).
        recreate_failed_workers: replace failed workers with the current weights and go on.
        store_buffer_in_checkpoints: checkpoints include trainer-owned replay data.
        record: a path: the :class:`~flowrl.trainer.Trainer` writes the run's nondeterministic decisions there
            (which requests each gather found done, the learner thread's progress at each look of the driver;
            :mod:`flowrl.decisions`), so that ``replay`` can re-run it exactly. ``None``: nothing is recorded.
        replay: the path of a log written by ``record``: the run forces the recorded decisions, under either
            executor, and gives the recorded run's weights and counters bit for bit; it must have the recorded
            run's algorithm and config (checked at start) and raises ``ReplayDivergence`` at the first decision
            that differs.
        evaluation_interval: evaluate the policy every this many reports (``Trainer.train()`` calls), on
            evaluation workers of its own whose episodes never reach the learner or the training counters, and
            report it under ``result["evaluation"]`` (``episode_reward_mean``/``min``/``max``,
            ``episode_len_mean``, ``episodes_this_iter``, ``timesteps_this_iter``). 0: never.
        evaluation_duration: how much each evaluation runs: complete episodes, or (with
            ``evaluation_duration_unit="timesteps"``) at least this many env steps of complete episodes.
        evaluation_duration_unit: ``"episodes"`` or ``"timesteps"``.
        evaluation_num_workers: remote evaluation workers sharing each evaluation's episodes; 0: one evaluation
            worker in the driver.
        evaluation_explore: evaluate with sampled actions (``True``) or the most likely ones (``False``, greedy,
            as ``flowrl evaluate``).
        evaluation_parallel_to_training: run each evaluation on the remote evaluation workers while the
            training of its report goes on, with the weights the report before it ended with (RLlib's
            ``evaluation_parallel_to_training``); needs ``evaluation_num_workers >= 1``. ``False``: evaluate after
            the report's training, with its weights, while training waits.
    """

    num_workers: int = bounded(default_factory=num_workers_that_fit(2, "TrainerConfig"), ge=0,
                               meaning="0 samples in the driver")
    train_batch_size: int = bounded(200, ge=1, meaning="steps per train batch")
    count_steps_by: Literal["env_steps", "agent_steps"] = "env_steps"
    num_gpus: float = bounded(0, ge=0, meaning="the learner's GPUs; 0 trains on the CPU")
    fake_gpus: bool = False
    num_learners: int = bounded(1, ge=1, meaning="learner actors sharing each step; 1: the driver learns")
    num_cpus_per_learner: float = bounded(1, ge=0, meaning="CPUs each learner actor asks Ray for")
    num_gpus_per_learner: float = bounded(0, ge=0, meaning="GPUs each learner actor asks Ray for; 0: CPU learners")
    collective_timeout_s: float = bounded(60.0, gt=0, meaning="seconds a process group member waits for its peers")
    simple_optimizer: bool | None = None
    timesteps_per_iteration: int = bounded(0, ge=0, meaning="env steps between reports")
    min_iter_time_s: float = bounded(0, ge=0, meaning="seconds between reports")
    metrics_smoothing_episodes: int = bounded(100, ge=0, meaning="episodes in the result statistics' window")
    collect_metrics_timeout: float = bounded(180, ge=0, meaning="seconds to wait for workers' episode statistics")
    keep_per_episode_custom_metrics: bool = False
    ignore_worker_failures: bool = False
    recreate_failed_workers: bool = True
    store_buffer_in_checkpoints: bool = False
    record: str | None = None
    replay: str | None = None
    evaluation_interval: int = bounded(0, ge=0, meaning="reports between evaluations; 0 never evaluates")
    evaluation_duration: int = bounded(10, ge=1, meaning="episodes (or env steps) per evaluation")
    evaluation_duration_unit: Literal["episodes", "timesteps"] = "episodes"
    evaluation_num_workers: int = bounded(0, ge=0, meaning="remote evaluation workers; 0 evaluates in the driver")
    evaluation_explore: bool = False
    evaluation_parallel_to_training: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.record is not None and self.replay is not None:
            raise ValueError(f"record={self.record!r} and replay={self.replay!r}: a run either records its decisions "
                             f"or replays recorded ones; drop one")
        if (self.record is not None or self.replay is not None) and self.seed is None:
            raise ValueError(f"{'record' if self.record is not None else 'replay'}= needs a seed: an unseeded run "
                             f"draws its weights and envs afresh, which no log can repeat; set seed (e.g. seed=0)")
        if (self.record is not None or self.replay is not None) and self.min_iter_time_s > 0:
            raise ValueError(f"min_iter_time_s={self.min_iter_time_s:g} ends reports by the clock, which a replay "
                             f"cannot repeat; set min_iter_time_s=0 (timesteps_per_iteration gates reports by steps) "
                             f"to record or replay a run")
        if self.evaluation_duration_unit not in ("episodes", "timesteps"):
            raise ValueError(f"evaluation_duration_unit={self.evaluation_duration_unit!r}; use 'episodes' or "
                             f"'timesteps'")
        if self.evaluation_parallel_to_training and not self.evaluation_num_workers:
            raise ValueError("evaluation_parallel_to_training=True evaluates on remote evaluation workers while the "
                             "driver trains, but evaluation_num_workers=0; set evaluation_num_workers >= 1")
        if self.count_steps_by not in ("env_steps", "agent_steps"):
            raise ValueError(f"count_steps_by={self.count_steps_by!r}; use 'env_steps' or 'agent_steps'")
        if self.model.use_lstm and not self.use_simple_optimizer:
            raise ValueError(f"model.use_lstm=True trains with one learner device, whose minibatches keep sequences "
                             f"whole: num_gpus={self.num_gpus}, simple_optimizer={self.simple_optimizer} asks for the "
                             f"multi-device learner; set num_gpus <= 1 and simple_optimizer=None")
        self._check_learners()

    def _check_learners(self) -> None:
        """A learner group's settings (``num_learners > 1``) fit together."""
        gpus = self.num_gpus_per_learner
        if gpus and not float(gpus).is_integer():
            raise ValueError(f"num_gpus_per_learner={gpus:g}: learners that share a GPU cannot all-reduce over NCCL; "
                             f"give each a whole GPU (1) or none (0: CPU learners)")
        if self.num_learners == 1:
            if gpus:
                raise ValueError(f"num_gpus_per_learner={gpus:g} with num_learners=1: one learner is the driver, "
                                 f"whose GPUs num_gpus sets; set num_gpus={gpus:g} instead, or num_learners >= 2")
            return
        fix = "or set num_learners=1 (the driver learns)"
        if self.num_gpus:
            raise ValueError(f"num_learners={self.num_learners} with num_gpus={self.num_gpus:g}: the learners, not "
                             f"the driver, train; give them GPUs with num_gpus_per_learner=1 and set num_gpus=0, {fix}")
        if self.executor == "local":
            raise ValueError(f"num_learners={self.num_learners} with executor='local': the learners form a process "
                             f"group, one process each; use executor='ray', {fix}")
        if self.policies is not None:
            raise ValueError(f"num_learners={self.num_learners} with multi-agent policies: a learner group trains "
                             f"one policy; {fix}")
        if self.model.use_lstm:
            raise ValueError(f"num_learners={self.num_learners} with model.use_lstm=True: a learner group splits "
                             f"minibatches by rows, which would cut sequences; {fix}")
        if self.simple_optimizer is False:
            raise ValueError(f"num_learners={self.num_learners} with simple_optimizer=False: the learner group "
                             f"replaces the multi-device learner; set simple_optimizer=None, {fix}")

    @property
    def sample_item_size(self) -> int:
        """Steps in one item that the plan concatenates into train batches: ``ParallelRollouts(bulk_sync)`` yields
        one fragment from every remote worker at once, ``sample_size x max(num_workers, 1)`` steps. Async plans
        (IMPALA, APPO) override it with one worker's ``sample_size``."""
        return self.sample_size * max(self.num_workers, 1)

    @property
    def actual_train_batch_size(self) -> int | None:
        """The steps each train batch really holds, or ``None`` where no fixed size follows from the settings.

        ``ConcatBatches`` concatenates whole items of :attr:`sample_item_size` steps until it holds at least
        ``train_batch_size``, so a batch holds ``ceil(train_batch_size / item) x item`` steps: more than asked
        whenever the item does not divide ``train_batch_size``. ``None`` with ``batch_mode="complete_episodes"``
        or ``count_steps_by="agent_steps"`` (items vary in size). Replay-based configs (DQN, Ape-X) sample
        exactly ``train_batch_size`` rows; A3C's gradients are one fragment each (``None``: the field is unused).

        Examples:
            >>> TrainerConfig(num_workers=0, num_envs_per_worker=20, train_batch_size=512).actual_train_batch_size
            4000
            >>> TrainerConfig(num_workers=2, rollout_fragment_length=100, train_batch_size=400).actual_train_batch_size
            400
        """
        if self.batch_mode != "truncate_episodes" or self.count_steps_by != "env_steps":
            return None
        item = self.sample_item_size
        return -(-self.train_batch_size // item) * item

    def train_batch_size_warning(self) -> str | None:
        """One line saying that the train batches will not hold ``train_batch_size`` steps and what to change, or
        ``None`` when they will (:class:`~flowrl.trainer.Trainer` logs it when it builds the plan).

        Examples:
            >>> print(TrainerConfig(num_workers=0, num_envs_per_worker=20, train_batch_size=512)
            ...       .train_batch_size_warning())  # doctest: +NORMALIZE_WHITESPACE
            train_batch_size=512 cannot be met: each train batch will hold 4000 steps, whole samples of
            rollout_fragment_length x num_envs_per_worker x max(num_workers, 1) = 200 x 20 x 1 = 4000 steps each;
            set train_batch_size=4000, or change those fields so that one sample divides 512
        """
        actual = self.actual_train_batch_size
        if actual is None or actual == self.train_batch_size:
            return None
        item = self.sample_item_size
        if item == self.sample_size * max(self.num_workers, 1):
            product = (f"rollout_fragment_length x num_envs_per_worker x max(num_workers, 1) = "
                       f"{self.rollout_fragment_length} x {self.num_envs_per_worker} x {max(self.num_workers, 1)}")
        else:
            product = (f"rollout_fragment_length x num_envs_per_worker = {self.rollout_fragment_length} x "
                       f"{self.num_envs_per_worker}")
        return (f"train_batch_size={self.train_batch_size} cannot be met: each train batch will hold {actual} steps, "
                f"whole samples of {product} = {item} steps each; set train_batch_size={actual}, or change those "
                f"fields so that one sample divides {self.train_batch_size}")

    @property
    def use_simple_optimizer(self) -> bool:
        """Whether plans train with ``TrainOneStep`` (True) or ``MultiGPUTrainOneStep`` (False)."""
        if self.simple_optimizer is None:
            return self.num_gpus <= 1 or self.num_learners > 1
        return self.simple_optimizer


# -- configs as plain data (checkpoints) ----------------------------------------------------------

_MISSING = object()


def _plain(value: Any) -> Any:
    """``value`` as JSON data (tuples as lists), or ``_MISSING`` when it is not plain data."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        items = [_plain(v) for v in value]
        return _MISSING if any(v is _MISSING for v in items) else items
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        entries = {k: _plain(v) for k, v in value.items()}
        return _MISSING if any(v is _MISSING for v in entries.values()) else entries
    return _MISSING


def _fields_to_data(config: Any, prefix: str, not_stored: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out[f.name] = _fields_to_data(value, f"{prefix}{f.name}.", not_stored)
            continue
        data = _plain(value)
        if data is _MISSING:
            not_stored[prefix + f.name] = {"callable": callable(value),
                                           "value": getattr(value, "__qualname__", None) or f"{value!r:.80}"}
        else:
            out[f.name] = data
    return out


def config_to_data(config: Any) -> dict[str, Any]:
    """A config dataclass as plain JSON data that :func:`config_from_data` rebuilds.

    Fields become a dict (nested config dataclasses as dicts, tuples as lists). A field that holds a
    callable or a class (an env callable, ``APPOConfig.after_train_step``, a multi-agent ``policies``
    map) cannot be stored; it is recorded under ``"not_stored"``. When rebuilding the config without
    those fields (so their defaults, and what ``__post_init__`` derives from them, apply) gives an equal
    config, ``"not_stored_are_defaults"`` is true and the data rebuilds anyway; otherwise
    :func:`config_from_data` refuses it, naming the fields whose values the defaults do not give back.

    Examples:
        >>> data = config_to_data(RolloutConfig(env="CartPole-v1", model=ModelConfig(hidden_sizes=(32, 32))))
        >>> data["class"], data["fields"]["model"]["hidden_sizes"], data["not_stored"]
        ('flowrl.config.RolloutConfig', [32, 32], {})
        >>> config_from_data(RolloutConfig, data).model.hidden_sizes
        (32, 32)
        >>> data = config_to_data(RolloutConfig(env=make_policy_mapping))  # any callable env
        >>> data["not_stored"], data["not_stored_are_defaults"]
        ({'env': {'callable': True, 'value': 'make_policy_mapping', 'default': False}}, False)
    """
    not_stored: dict[str, dict[str, Any]] = {}
    cls = type(config)
    data: dict[str, Any] = {"class": f"{cls.__module__}.{cls.__qualname__}",
                            "fields": _fields_to_data(config, "", not_stored), "not_stored": not_stored,
                            "not_stored_are_defaults": True}
    if not_stored:
        try:
            rebuilt = config_from_data(cls, data)
        except Exception:  # a probe only: whatever fails to rebuild is simply not restorable
            rebuilt = None
        for path, entry in not_stored.items():
            entry["default"] = rebuilt is not None and _at(rebuilt, path) == _at(config, path)
        data["not_stored_are_defaults"] = rebuilt == config
    return data


def _at(config: Any, path: str) -> Any:
    for name in path.split("."):
        config = getattr(config, name)
    return config


def _from_plain(value: Any, hint: Hint) -> Any:
    """JSON ``value`` back to what a field of ``hint`` holds: lists to tuples, dicts to nested config dataclasses."""
    if value is None:
        return None
    if hint.kind == "union":  # the one member of the value's shape, if only one has it
        kinds = ("tuple",) if isinstance(value, list) else ("config",) if isinstance(value, dict) else None
        members = [m for m in hint.items if kinds is None or m.kind in kinds]
        return _from_plain(value, members[0]) if len(members) == 1 else value
    if hint.kind == "tuple" and isinstance(value, list):
        if hint.variadic:
            return tuple(_from_plain(v, hint.items[0]) for v in value)
        return tuple(_from_plain(v, h) for v, h in zip(value, hint.items, strict=False))
    if hint.kind == "config" and hint.config_class is not None and isinstance(value, dict):
        return _from_fields(hint.config_class, value)
    return value


#: fields renamed since checkpoints were first written: old name -> new name (the old data still restores).
RENAMED_FIELDS = {"_fake_gpus": "fake_gpus"}


def _from_fields(config_class: type, fields: Mapping[str, Any]) -> Any:
    hints = field_hints(config_class)
    fields = {RENAMED_FIELDS.get(name, name) if name not in hints else name: value for name, value in fields.items()}
    unknown = sorted(set(fields) - set(hints))
    if unknown:
        raise ValueError(f"{config_class.__name__} has no fields {unknown}; the data was written by another "
                         f"version of flowrl (its fields: {sorted(hints)})")
    return config_class(**{name: _from_plain(value, hints[name]) for name, value in fields.items()})


def config_from_data(config_class: type[C], data: Mapping[str, Any]) -> C:
    """Rebuilds a config of ``config_class`` from :func:`config_to_data` output; its own validation runs.

    Raises:
        ValueError: the data is of another config class or has unknown fields, or it holds a callable
            (or other non-data) field that the config's defaults do not rebuild.
    """
    wanted = f"{config_class.__module__}.{config_class.__qualname__}"
    if data.get("class") != wanted:
        raise ValueError(f"the saved config is a {data.get('class')!r}, not a {wanted!r}; rebuild it with its own class")
    not_stored = data.get("not_stored") or {}
    if not_stored and not data.get("not_stored_are_defaults"):
        custom = {path: entry for path, entry in not_stored.items() if not entry.get("default")} or not_stored
        described = ", ".join(f"{'a callable' if entry.get('callable') else 'a non-data'} field {path} "
                              f"({entry.get('value')})" for path, entry in custom.items())
        raise ValueError(f"this config holds {described}, which cannot be stored as data; restore it from "
                         f"Python with Trainer(...).restore(path)")
    config: C = _from_fields(config_class, data["fields"])
    return config
