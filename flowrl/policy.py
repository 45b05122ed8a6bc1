"""The torch Policy: the numerical part of an algorithm (model, acting, postprocessing, loss, optimizer).

An algorithm subclasses :class:`Policy` and overrides :meth:`Policy.loss` (and usually
:meth:`Policy.postprocess_trajectory`). Everything that crosses a process boundary — weights,
gradients, state — is numpy on the CPU; the model itself lives on ``config.device``.

Examples:
    >>> import gymnasium as gym
    >>> policy = Policy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), PolicyConfig(seed=0))
    >>> actions, extra = policy.compute_actions(np.zeros((3, 4), np.float32))
    >>> actions.shape, sorted(extra)
    ((3,), ['action_dist_inputs', 'logp', 'vf_preds'])
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, ClassVar, Iterable, Iterator, Mapping, Sequence

import gymnasium as gym
import numpy as np
import torch
import torch.optim.optimizer as _torch_optimizer  # its global step hooks (step_adam)

from flowrl.collective import Collective
from flowrl.config import PolicyConfig
from flowrl.models import (ActionDistribution, ActorCriticModel, NumpyActing, NumpyRecurrent, RecurrentActorCritic,
                           dist_class_for, encode_prev_actions, make_model)
from flowrl.postprocessing import add_advantages
from flowrl.sample_batch import (ACTION_DIST_INPUTS, ACTIONS, LOGP, NEXT_OBS, OBS, PREV_ACTIONS, PREV_REWARDS, REWARDS,
                                 STATE_IN, STATE_OUT, VF_PREDS, SampleBatch)
from flowrl.sequences import batch_sequence_lengths, pad, sequence_mask, sequence_starts

#: the keys of :meth:`Policy.sequence_tensors` that hold the padded observations and their mask
SEQ_OBS, SEQ_MASK = "_seq_obs", "_seq_mask"
#: ... and, for a model that reads the previous action and reward, those read at each padded step
#: (``SEQ_PREV.format("actions")``, encoded) and those read after each row (its own action and reward)
SEQ_PREV, NEXT_PREV = "_seq_prev_{}", "_next_prev_{}"

__all__ = ["PolicyConfig", "Policy", "TensorBatch", "column_tensor", "make_adam", "step_adam", "space_to_data", "space_from_data",
           "env_action_map", "flush_denormals", "denormals_flushed_now", "module_weights", "load_module_weights",
           "restart_states", "next_prev_inputs", "AgentStates", "PrevInputs"]

TensorBatch = dict[str, torch.Tensor]
Weights = dict[str, np.ndarray]
#: a recurrent model's previous-step inputs: ``(prev_actions, prev_rewards)`` ``[B, ...]``, or ``None``
PrevInputs = tuple[np.ndarray, np.ndarray] | None

#: The learner stat that counts the updates a policy skipped for a non-finite gradient (present once one was).
NONFINITE_UPDATES_SKIPPED = "num_nonfinite_updates_skipped"

logger = logging.getLogger(__name__)


#: the entries of :meth:`Policy.get_state` that hold random generators' states
_RNG_STATE_KEYS = ("torch_rng", "numpy_rng", "act_rng")


def _check_device(device: str) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0 or (dev.index or 0) >= count:
            raise ValueError(f"device={device!r} but torch sees {count} CUDA device(s); use device='cpu' "
                             f"or run where a GPU is visible")
    return dev


def make_adam(params: Iterable[torch.nn.Parameter], **kwargs: Any) -> torch.optim.Adam:
    """Adam with torch's fused kernel where this torch has one for the parameters' device (a small MLP's step
    takes about a third of the default's time on the CPU), else torch's default Adam; ``kwargs`` as Adam's.

    Examples:
        >>> make_adam(torch.nn.Linear(2, 1).parameters(), lr=1e-3).defaults["lr"]
        0.001
    """
    params = list(params)
    try:
        return torch.optim.Adam(params, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):  # no fused kernel here (torch < 2.4 on the CPU, say)
        return torch.optim.Adam(params, **kwargs)


def step_adam(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()``; for a fused CPU Adam past its first step, the fused kernel called directly.

    ``Optimizer.step``'s wrapper (hooks, profiling, regrouping the tensors by device and dtype on every call) costs
    more than the fused update itself on a small model: ~110 us against ~40 us for a 64-64-256 MLP in a learner
    step. Where the optimizer is a single-group ``Adam(fused=True)`` on float32 CPU parameters without weight
    decay, amsgrad, maximize, step hooks or a patched ``step``, and every parameter has a gradient and its state,
    this takes the same update as ``step()`` does: each state step counted up, then ``torch._fused_adam_`` (pinned
    equal bit for bit in ``tests/test_policy.py``). Anything else goes through ``optimizer.step()``.

    Examples:
        >>> layer = torch.nn.Linear(2, 1)
        >>> adam = make_adam(layer.parameters(), lr=0.1)
        >>> for _ in range(2):
        ...     layer(torch.ones(1, 2)).sum().backward()
        ...     step_adam(adam)
        >>> [float(adam.state[p]["step"]) for p in layer.parameters()]
        [2.0, 2.0]
    """
    if not _adam_step_direct(optimizer):
        optimizer.step()


def _adam_step_direct(optimizer: torch.optim.Optimizer) -> bool:
    fused = getattr(torch, "_fused_adam_", None)
    if (fused is None or type(optimizer) is not torch.optim.Adam or "step" in vars(optimizer)
            or getattr(optimizer, "_optimizer_step_pre_hooks", True)
            or getattr(optimizer, "_optimizer_step_post_hooks", True)
            or getattr(_torch_optimizer, "_global_optimizer_pre_hooks", True)
            or getattr(_torch_optimizer, "_global_optimizer_post_hooks", True)):
        return False
    updates = []  # every group is checked before any is stepped: never half a step, then step() again
    for group in optimizer.param_groups:
        if (not group.get("fused") or group.get("amsgrad") or group.get("maximize") or group.get("capturable")
                or group.get("differentiable") or group.get("decoupled_weight_decay") or group.get("weight_decay")
                or not isinstance(group["lr"], float) or not all(isinstance(b, float) for b in group["betas"])):
            return False
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in group["params"]:
            grad = p.grad
            if grad is None:  # step() leaves a parameter without a gradient alone
                continue
            s = optimizer.state.get(p)
            if not s or p.device.type != "cpu" or p.dtype != torch.float32 or grad.dtype != p.dtype or grad.is_sparse:
                return False
            params.append(p)
            grads.append(grad)
            exp_avgs.append(s["exp_avg"])
            exp_avg_sqs.append(s["exp_avg_sq"])
            steps.append(s["step"])
        if params:
            updates.append((group, params, grads, exp_avgs, exp_avg_sqs, steps))
    for group, params, grads, exp_avgs, exp_avg_sqs, steps in updates:
        beta1, beta2 = group["betas"]
        torch._foreach_add_(steps, 1)
        fused(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=group["lr"], beta1=beta1,
              beta2=beta2, weight_decay=0.0, eps=group["eps"], maximize=False, grad_scale=None, found_inf=None)
    return True


def column_tensor(column: np.ndarray, device: torch.device) -> torch.Tensor:
    """A batch column as a tensor on ``device``, sharing memory when it can; a read-only column (one that came
    through Ray's object store) is copied first, as torch must not wrap memory it may not write.

    Examples:
        >>> column = np.arange(3.0)
        >>> column.flags.writeable = False
        >>> column_tensor(column, torch.device("cpu")).tolist()
        [0.0, 1.0, 2.0]
    """
    return torch.as_tensor(column if column.flags.writeable else column.copy(), device=device)


def _to_numpy_tree(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().copy()  # state_dict() tensors are live: never alias them
    if isinstance(value, Mapping):
        return {k: _to_numpy_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_numpy_tree(v) for v in value]
    return value


def _to_torch_tree(value: Any) -> Any:
    """numpy arrays back to CPU tensors (read-only ones, e.g. a state sent through Ray, copied as in
    :func:`column_tensor`); ``Optimizer.load_state_dict`` moves them to the params' device."""
    if isinstance(value, np.ndarray):
        return column_tensor(value, torch.device("cpu"))
    if isinstance(value, Mapping):
        return {k: _to_torch_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_torch_tree(v) for v in value]
    return value


def space_to_data(space: gym.Space[Any]) -> dict[str, Any] | None:
    """A ``Box`` or ``Discrete`` space as plain data (numpy arrays and numbers) for a checkpoint; ``None``
    for other spaces, which a checkpoint then does not hold.

    Examples:
        >>> space_from_data(space_to_data(gym.spaces.Box(-1.0, 1.0, (2,))))
        Box(-1.0, 1.0, (2,), float32)
        >>> space_from_data(space_to_data(gym.spaces.Discrete(3, start=1)))
        Discrete(3, start=1)
    """
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "low": space.low.copy(), "high": space.high.copy(), "dtype": space.dtype.name}
    return None


def space_from_data(data: Mapping[str, Any]) -> gym.Space[Any]:
    """The space :func:`space_to_data` wrote.

    Raises:
        ValueError: data of an unknown space type.
    """
    if data.get("type") == "Discrete":
        return gym.spaces.Discrete(int(data["n"]), start=int(data["start"]))
    if data.get("type") == "Box":
        return gym.spaces.Box(np.asarray(data["low"]), np.asarray(data["high"]), dtype=np.dtype(data["dtype"]))
    raise ValueError(f"unknown space data {dict(data)!r:.120}; it was written by another version of flowrl")


def env_action_map(space: gym.Space[Any], *, normalize: bool,
                   clip: bool) -> Callable[[np.ndarray], np.ndarray] | None:
    """How a policy's actions ``[B, ...]`` become the actions an env with action space ``space`` takes, or
    ``None`` when they go as they are (a space other than ``Box``, or neither option set).

    ``normalize``: the policy acts in ``[-1, 1]``; each action is clipped to that and mapped linearly onto
    ``[low, high]``. ``clip`` (without ``normalize``): each action is clipped to ``[low, high]``.

    Raises:
        ValueError: ``normalize`` with a bound that is infinite (the message names the space).

    Examples:
        >>> to_env = env_action_map(gym.spaces.Box(-2.0, 2.0, (1,)), normalize=True, clip=True)
        >>> to_env(np.array([[-1.0], [0.25], [3.0]], np.float32)).ravel().tolist()
        [-2.0, 0.5, 2.0]
        >>> env_action_map(gym.spaces.Box(-np.inf, np.inf, (2,)), normalize=True, clip=True)
        Traceback (most recent call last):
        ...
        ValueError: action space Box(-inf, inf, (2,), float32) has infinite bounds, so normalize_actions=True cannot map the policy's [-1, 1] onto it; set normalize_actions=False (and clip_actions as the env needs), or give the env finite bounds
    """
    if not isinstance(space, gym.spaces.Box):
        return None
    low, high, dtype = space.low.astype(np.float32), space.high.astype(np.float32), space.dtype
    if normalize:
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ValueError(f"action space {space} has infinite bounds, so normalize_actions=True cannot map the "
                             f"policy's [-1, 1] onto it; set normalize_actions=False (and clip_actions as the env "
                             f"needs), or give the env finite bounds")
        half_range = (high - low) / 2
        return lambda actions: (low + (np.clip(actions, -1.0, 1.0) + 1.0) * half_range).astype(dtype, copy=False)
    if clip:
        return lambda actions: np.clip(actions, low, high).astype(dtype, copy=False)
    return None


_TINY = np.float32(1e-39)  # below float32's smallest normal number (1.2e-38): a denormal


def denormals_flushed_now() -> bool:
    """Whether this thread computes with denormal floats flushed to zero (a denormal times 1 gives 0).

    Examples:
        >>> with flush_denormals():
        ...     denormals_flushed_now()
        True
    """
    return bool(_TINY * np.float32(1.0) == 0)


@contextlib.contextmanager
def flush_denormals(enabled: bool = True) -> Iterator[None]:
    """Inside the block this thread flushes denormal floats to zero (``torch.set_flush_denormal``); after it, the
    thread is as it was. A learner runs its steps inside it (``RolloutConfig.flush_denormal``): on x86 an
    operation on a denormal costs up to ~100 times a normal one, and Adam's moment estimates for a dead ReLU unit
    decay through the denormal range. ``enabled=False``, or a thread that flushes already: nothing changes."""
    if not enabled or denormals_flushed_now() or not torch.set_flush_denormal(True):
        yield
        return
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def module_weights(module: torch.nn.Module) -> dict[str, np.ndarray]:
    """``module``'s state dict as CPU numpy copies (never aliases of the live tensors), by name.

    Examples:
        >>> sorted(module_weights(torch.nn.Linear(2, 1)))
        ['bias', 'weight']
    """
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def load_module_weights(module: torch.nn.Module, weights: Mapping[str, Any], device: torch.device) -> None:
    """Loads :func:`module_weights` output (numpy arrays or lists, by name) into ``module`` on ``device``."""
    module.load_state_dict({k: torch.as_tensor(np.array(v), device=device) for k, v in weights.items()})


def restart_states(state: tuple[np.ndarray, ...], ended: np.ndarray,
                   start: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """A recurrent policy's per-env ``state`` with the rows of the envs whose episode ``ended`` ``[N]`` back at
    ``start`` (the :meth:`Policy.initial_state` an episode begins from); ``state`` itself when none ended.

    Examples:
        >>> restart_states((np.ones((2, 3)),), np.array([False, True]), (np.zeros((2, 3)),))[0].tolist()
        [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    """
    if not ended.any():
        return state
    return tuple(np.where(ended.reshape(-1, *[1] * (s.ndim - 1)), s0, s) for s, s0 in zip(state, start))


def next_prev_inputs(actions: np.ndarray, rewards: np.ndarray, ended: np.ndarray, start: PrevInputs) -> PrevInputs:
    """The previous inputs of a recurrent policy's next step: this step's ``actions`` and ``rewards``, back at
    ``start`` (:meth:`Policy.initial_prev_inputs`) for the envs whose episode ``ended``; ``None`` for a model that
    reads neither (``start`` is ``None``).

    Examples:
        >>> start = (np.zeros(2, np.int64), np.zeros(2, np.float32))
        >>> [x.tolist() for x in next_prev_inputs(np.array([1, 1]), np.array([0.5, 2.0]), np.array([False, True]),
        ...                                       start)]
        [[1, 0], [0.5, 0.0]]
    """
    if start is None:
        return None
    actions, rewards = restart_states((actions, np.asarray(rewards, np.float32)), ended, start)
    return actions, rewards


class AgentStates:
    """The recurrent states of the agents of a multi-agent vector env, one per ``(env index, agent id)``: an agent
    acting for the first time in an episode starts from its policy's initial state.

    Examples:
        >>> states = AgentStates()
        >>> zeros = (np.zeros((1, 2), np.float32),)
        >>> states.gather([(0, "a"), (1, "a")], zeros)[0].shape
        (2, 2)
        >>> states.scatter([(0, "a"), (1, "a")], (np.ones((2, 2), np.float32),))
        >>> states.end(env_index=0)  # env 0's episode ended: its agents start over
        >>> states.gather([(0, "a"), (1, "a")], zeros)[0].tolist()
        [[0.0, 0.0], [1.0, 1.0]]
    """

    def __init__(self) -> None:
        self.states: dict[tuple[int, Any], tuple[np.ndarray, ...]] = {}

    def gather(self, keys: Sequence[tuple[int, Any]], initial: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        """The states ``[len(keys), ...]`` of the agents ``keys``; ``initial`` (a policy's ``initial_state(1)``)
        for an agent without one."""
        start = tuple(s[0] for s in initial)
        rows = [self.states.get(key, start) for key in keys]
        return tuple(np.stack([row[j] for row in rows]) for j in range(len(initial)))

    def scatter(self, keys: Sequence[tuple[int, Any]], new_state: tuple[np.ndarray, ...]) -> None:
        """Keeps row ``r`` of ``new_state`` as agent ``keys[r]``'s state."""
        for row, key in enumerate(keys):
            self.states[key] = tuple(np.array(s[row]) for s in new_state)

    def end(self, env_index: int, agent: Any = None) -> None:
        """Forgets an agent's state (its part of the episode is over), or every agent's of the env."""
        if agent is not None:
            self.states.pop((env_index, agent), None)
        else:
            for key in [k for k in self.states if k[0] == env_index]:
                del self.states[key]

    def after_step(self, terminateds: Sequence[Mapping[Any, bool]], truncateds: Sequence[Mapping[Any, bool]]) -> None:
        """Forgets, after a vector step, the states of every agent of an env whose episode ended (``"__all__"``)
        and of each agent whose own part ended."""
        for i, (terms, truncs) in enumerate(zip(terminateds, truncateds)):
            if terms.get("__all__", False) or truncs.get("__all__", False):
                self.end(i)
                continue
            for aid in {*terms, *truncs} - {"__all__"}:
                if terms.get(aid, False) or truncs.get(aid, False):
                    self.end(i, aid)

    def get_state(self) -> list[list[Any]]:
        """The states as plain data: ``[[env index, agent id, [arrays]], ...]``."""
        return [[i, aid, [s.copy() for s in state]] for (i, aid), state in self.states.items()]

    def set_state(self, data: Sequence[Sequence[Any]]) -> None:
        self.states = {(int(i), aid): tuple(np.array(s, np.float32) for s in state) for i, aid, state in data}


class Policy:
    """A torch actor-critic policy with acting, learning and state hooks.

    Args:
        observation_space: the (single-env) observation space.
        action_space: the action space.
        config: :class:`PolicyConfig` or an algorithm config that extends it.

    Subclasses override :meth:`loss` and may override :meth:`postprocess_trajectory`,
    :meth:`update_target` and :meth:`update_kl`.

    Attributes:
        weights_version: the version of the weights, the number of optimizer steps taken (one per
            :meth:`learn_on_tensors` or :meth:`apply_gradients`); a rollout worker that is sent weights adopts
            the sender's version (when its config sets ``profile``), so the staleness of sampled data is a
            difference of versions.
        num_nonfinite_updates_skipped: optimizer steps not taken because a gradient held NaN or inf (see
            ``PolicyConfig.on_nonfinite_update``); :meth:`learn_on_tensors` reports it in its stats once it is
            above 0.
    """

    #: ``True`` when :meth:`postprocess_trajectory` accepts one env's time-ordered rows spanning several
    #: episodes (it restarts at every ``terminateds``/``truncateds`` row, as :func:`~flowrl.postprocessing.
    #: compute_gae`, :func:`~flowrl.postprocessing.discounted_returns` and :func:`~flowrl.postprocessing.
    #: compute_nstep` do). The rollout worker then calls it once per env and fragment instead of once per
    #: episode, with the same result. ``False`` (the safe default for a new hook): one call per episode piece.
    postprocess_spans_episodes: ClassVar[bool] = False

    #: the config class this policy's settings come from; :meth:`__init__` refuses any other config with a
    #: ``TypeError`` that names it (a subclass sets its algorithm's config, e.g. ``config_class = PPOConfig``).
    config_class: ClassVar[type[PolicyConfig]] = PolicyConfig

    #: whether this policy can learn in a learner group (``num_learners > 1``, :mod:`flowrl.learner_group`): all it
    #: learns is its weights, its optimizer state and :meth:`learner_extras`; ``False`` for a policy with state the
    #: driver updates between steps (a target network)
    learns_in_groups: ClassVar[bool] = False

    #: the process group this policy's gradients are averaged over before every optimizer step (clipping comes
    #: after), or ``None``; set by the actor that joins the group (:class:`~flowrl.collective.CollectiveMember`)
    collective: Collective | None = None
    #: this member's weight in that average (``None``: ``1 / world_size``); a learner group member training on a
    #: share of ``n`` of a minibatch's ``N`` rows sets ``n / N``
    collective_weight: float | None = None

    def __init__(self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: PolicyConfig) -> None:
        if not isinstance(config, self.config_class):
            wanted = self.config_class.__name__
            raise TypeError(f"{type(self).__name__} needs {'an' if wanted[0] in 'AEIOU' else 'a'} {wanted} for its "
                            f"settings, got {type(config).__name__}; build the workers with {wanted}(...) or a "
                            f"config that extends it")
        self.observation_space, self.action_space, self.config = observation_space, action_space, config
        self.device = _check_device(config.device)
        self.dist_class, _ = dist_class_for(action_space)
        self._to_env = env_action_map(action_space, normalize=config.normalize_actions, clip=config.clip_actions)
        with torch.random.fork_rng(devices=[]):
            if config.seed is not None:
                torch.manual_seed(config.seed)
            self.model = make_model(observation_space, action_space, config.model).to(self.device)
        self.optimizer = make_adam(self.model.parameters(), lr=config.lr)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(config.seed if config.seed is not None else int(torch.seed() % 2**63))
        self.np_random = np.random.default_rng(config.seed)  # minibatch order and other numpy draws
        self.act_random = np.random.default_rng(None if config.seed is None else [config.seed, 1])  # numpy acting
        self.numpy_acting = NumpyActing.build(self.model, self.dist_class) if config.numpy_acting else None
        self.numpy_recurrent = NumpyRecurrent.build(self.model, self.dist_class) if config.numpy_acting else None
        self.global_timestep = 0
        self.weights_version = 0
        self.num_nonfinite_updates_skipped = 0

    # -- acting -----------------------------------------------------------------------------------
    def _obs_tensor(self, obs: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(obs, device=self.device)

    def compute_actions(self, obs: np.ndarray, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions for a batch of observations ``[B, ...]``, in one forward pass and one sampling call.

        An MLP model on the CPU acts through its numpy mirror (see ``PolicyConfig.numpy_acting``).

        Returns:
            ``(actions [B, ...], extras)`` with ``logp``, ``vf_preds`` and ``action_dist_inputs`` per row.
        """
        fast = self.numpy_acting
        if fast is not None and fast.model is self.model:  # a subclass may have swapped the model
            actions, logp, values, dist_inputs = fast.compute_actions(obs, self.act_random, explore)
            return actions, {LOGP: logp, VF_PREDS: values, ACTION_DIST_INPUTS: dist_inputs}
        return self._compute_actions_torch(obs, explore)

    def sample_actions(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """:meth:`compute_actions` (exploring) for a rollout worker's step loop: the extras may leave out
        columns that :meth:`complete_fragment` adds for a whole fragment at once (``logp`` on the numpy
        path, a quarter of the acting cost per step)."""
        fast = self._deferring_numpy_acting()
        if fast is None:
            return self.compute_actions(obs)
        actions, values, dist_inputs = fast.sample(obs, self.act_random, True)
        return actions, {VF_PREDS: values, ACTION_DIST_INPUTS: dist_inputs}

    def complete_fragment(self, columns: dict[str, np.ndarray]) -> None:
        """Adds, in place, what :meth:`sample_actions` or :meth:`sample_actions_with_state` left out to env-major
        fragment columns ``[N, T, ...]``."""
        fast = self._deferring_numpy_acting() or self._deferring_numpy_recurrent()
        if fast is not None and LOGP not in columns:
            columns[LOGP] = fast.logp(columns[ACTION_DIST_INPUTS], columns[ACTIONS])

    def _deferring_numpy_recurrent(self) -> NumpyRecurrent | None:
        """The recurrent numpy mirror when :meth:`sample_actions_with_state` uses it."""
        fast = self.numpy_recurrent
        if fast is None or fast.model is not self.model or \
                type(self).compute_actions_with_state is not Policy.compute_actions_with_state:
            return None
        return fast

    def _deferring_numpy_acting(self) -> NumpyActing | None:
        """The numpy mirror when :meth:`sample_actions` uses it (not swapped out, compute_actions not overridden)."""
        fast = self.numpy_acting
        if fast is None or fast.model is not self.model or type(self).compute_actions is not Policy.compute_actions:
            return None
        return fast

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        """The policy's actions as the env takes them (see :func:`env_action_map` and ``PolicyConfig.
        normalize_actions``): what rollout workers, evaluation and :mod:`flowrl.inference` step the env with, while
        sampled batches keep the policy's own actions."""
        to_env = self._to_env
        return actions if to_env is None else to_env(actions)

    @torch.no_grad()
    def _compute_actions_torch(self, obs: np.ndarray, explore: bool) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        if isinstance(self.model, RecurrentActorCritic):
            raise TypeError(f"{type(self).__name__}'s model is recurrent: act with compute_actions_with_state(obs, "
                            f"state), starting from initial_state(len(obs))")
        dist_inputs, values = self.model(self._obs_tensor(obs))
        dist = self.dist_class(dist_inputs)
        actions = dist.sample(self.generator) if explore else dist.deterministic_sample()
        extras = {LOGP: dist.logp(actions).cpu().numpy(), VF_PREDS: values.cpu().numpy(),
                  ACTION_DIST_INPUTS: dist_inputs.cpu().numpy()}
        return actions.cpu().numpy(), extras

    # -- recurrent acting ---------------------------------------------------------------------------
    @property
    def num_state_tensors(self) -> int:
        """How many state tensors the model carries (an LSTM: 2, a GRU: 1, a feed-forward model: 0)."""
        model = self.model
        return (2 if model.cell == "lstm" else 1) if isinstance(model, RecurrentActorCritic) else 0

    @property
    def is_recurrent(self) -> bool:
        """Whether the model carries a state from step to step (a :class:`~flowrl.models.RecurrentActorCritic`):
        rollout workers then act through :meth:`sample_actions_with_state` and keep a state per env."""
        return isinstance(self.model, RecurrentActorCritic)

    def initial_state(self, batch_size: int) -> tuple[np.ndarray, ...]:
        """The state ``batch_size`` episodes start from, as float32 numpy arrays ``[B, ...]`` (zeros); ``()`` for a
        feed-forward model."""
        if not isinstance(self.model, RecurrentActorCritic):
            return ()
        return tuple(s.cpu().numpy() for s in self.model.initial_state(batch_size))

    @property
    def uses_prev_inputs(self) -> bool:
        """Whether the recurrent model also reads the previous action or reward (``model.lstm_use_prev_action`` /
        ``lstm_use_prev_reward``): callers then pass ``prev=(prev_actions, prev_rewards)`` when acting."""
        model = self.model
        return isinstance(model, RecurrentActorCritic) and bool(model.prev_action_dim or model.prev_reward)

    def initial_prev_inputs(self, batch_size: int) -> PrevInputs:
        """``(prev_actions, prev_rewards)`` at ``batch_size`` episodes' first steps (zeros; actions in the action
        space's shape, ints for a Discrete space), or ``None`` when the model reads neither."""
        if not self.uses_prev_inputs:
            return None
        shape = tuple(self.action_space.shape or ())
        dtype = np.int64 if isinstance(self.action_space, gym.spaces.Discrete) else np.float32
        return np.zeros((batch_size, *shape), dtype), np.zeros(batch_size, np.float32)

    def _prev_arrays(self, prev: PrevInputs) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The encoded previous actions ``[B, D]`` and rewards ``[B]`` (float32) the model reads, ``None`` for what
        it does not read."""
        model = self.model
        if not self.uses_prev_inputs or not isinstance(model, RecurrentActorCritic):
            return None, None
        if prev is None:
            raise ValueError(f"{type(self).__name__}'s model reads the previous action or reward "
                             f"(model.lstm_use_prev_action / lstm_use_prev_reward): pass prev=(prev_actions, "
                             f"prev_rewards), initial_prev_inputs(B) at the episodes' first steps")
        actions, rewards = prev
        encoded = encode_prev_actions(actions, self.action_space) if model.prev_action_dim else None
        return encoded, (np.asarray(rewards, np.float32).reshape(-1) if model.prev_reward else None)

    def _prev_tensors(self, prev: PrevInputs) -> dict[str, torch.Tensor]:
        """The model's ``prev_actions`` / ``prev_rewards`` keyword arguments for one step ``[B, 1, ...]``."""
        actions, rewards = self._prev_arrays(prev)
        out = {}
        if actions is not None:
            out["prev_actions"] = torch.as_tensor(actions, device=self.device)[:, None]
        if rewards is not None:
            out["prev_rewards"] = torch.as_tensor(rewards, device=self.device)[:, None]
        return out

    def _prev_numpy(self, prev: PrevInputs) -> np.ndarray | None:
        """The same inputs side by side ``[B, D (+ 1)]``, as :class:`~flowrl.models.NumpyRecurrent` takes them."""
        actions, rewards = self._prev_arrays(prev)
        parts = [p for p in (actions, None if rewards is None else rewards[:, None]) if p is not None]
        return np.concatenate(parts, axis=1) if parts else None

    @staticmethod
    def _recurrent_extras(extras: dict[str, np.ndarray], state: tuple[np.ndarray, ...],
                          new_state: tuple[np.ndarray, ...], prev: PrevInputs) -> dict[str, np.ndarray]:
        for k, (before, after) in enumerate(zip(state, new_state)):
            extras[STATE_IN.format(k)], extras[STATE_OUT.format(k)] = np.asarray(before, np.float32), after
        if prev is not None:
            extras[PREV_ACTIONS], extras[PREV_REWARDS] = prev[0], np.asarray(prev[1], np.float32)
        return extras

    @torch.no_grad()
    def compute_actions_with_state(self, obs: np.ndarray, state: tuple[np.ndarray, ...], explore: bool = True,
                                   prev: PrevInputs = None
                                   ) -> tuple[np.ndarray, dict[str, np.ndarray], tuple[np.ndarray, ...]]:
        """One step of a recurrent policy for observations ``[B, ...]`` from ``state`` (``[B, ...]`` arrays, one per
        state tensor): ``(actions, extras, new_state)``. The extras are :meth:`compute_actions`'s plus the state
        acted with (``state_in_<k>``) and the state after (``state_out_<k>``), one row per observation, and the
        previous actions and rewards read (``prev_actions``, ``prev_rewards``) when the model reads them
        (:attr:`uses_prev_inputs`; ``prev``: the last step's actions and rewards, :meth:`initial_prev_inputs` at
        an episode's start).

        Raises:
            TypeError: the policy's model is not recurrent (use :meth:`compute_actions`).
            ValueError: a model that reads the previous action or reward, and no ``prev``.
        """
        model = self.model
        if not isinstance(model, RecurrentActorCritic):
            raise TypeError(f"{type(self).__name__}'s model ({type(model).__name__}) carries no state; use "
                            f"compute_actions(obs)")
        prev = prev if self.uses_prev_inputs else None
        fast = self.numpy_recurrent
        if fast is not None and fast.model is model:  # a few envs per step: numpy beats torch's per-op dispatch
            actions_np, logp, values_np, dist_np, new_state = fast.compute_actions(
                obs, state, self.act_random, explore, self._prev_numpy(prev))
            extras = {LOGP: logp, VF_PREDS: values_np, ACTION_DIST_INPUTS: dist_np}
            return actions_np, self._recurrent_extras(extras, state, new_state, prev), new_state
        state_t = tuple(torch.as_tensor(s, device=self.device) for s in state)
        dist_inputs, values, new_state_t = model(self._obs_tensor(obs)[:, None], state_t, **self._prev_tensors(prev))
        dist = self.dist_class(dist_inputs[:, 0])
        actions = dist.sample(self.generator) if explore else dist.deterministic_sample()
        new_state = tuple(s.cpu().numpy() for s in new_state_t)
        extras = {LOGP: dist.logp(actions).cpu().numpy(), VF_PREDS: values[:, 0].cpu().numpy(),
                  ACTION_DIST_INPUTS: dist_inputs[:, 0].cpu().numpy()}
        return actions.cpu().numpy(), self._recurrent_extras(extras, state, new_state, prev), new_state

    @torch.no_grad()
    def value_with_state(self, obs: np.ndarray, state: tuple[np.ndarray, ...], prev: PrevInputs = None
                         ) -> np.ndarray:
        """``V(obs)`` ``[B]`` of a recurrent policy from the states ``[B, ...]`` it reaches those observations with
        (and the actions and rewards just before them, for a model that reads them)."""
        model = self.model
        if not isinstance(model, RecurrentActorCritic):
            raise TypeError(f"{type(self).__name__}'s model ({type(model).__name__}) carries no state; use value(obs)")
        state_t = tuple(torch.as_tensor(np.asarray(s, np.float32), device=self.device) for s in state)
        values = model(self._obs_tensor(obs)[:, None], state_t, **self._prev_tensors(prev))[1]
        return values[:, 0].cpu().numpy()  # type: ignore[no-any-return]

    def sequence_tensors(self, batch: SampleBatch, columns: Sequence[str]) -> TensorBatch:
        """A recurrent policy's learner input: the ``columns`` as row tensors ``[N, ...]`` (the losses read them
        as they are), the observations as padded sequences (``SEQ_OBS`` ``[S, T, ...]``, :mod:`flowrl.sequences`:
        sequences from ``eps_id`` and ``t``, at most ``model.max_seq_len`` steps), their mask (``SEQ_MASK``
        ``[S, T]``, whose True entries in row-major order are the batch's rows in order) and each sequence's
        initial state (``state_in_<k>`` ``[S, ...]``, read at its first row)."""
        max_len = self.config.model.max_seq_len
        lens = batch_sequence_lengths(batch, max_len)
        starts = sequence_starts(lens)
        out = {k: column_tensor(batch[k], self.device) for k in columns if k in batch}
        out[SEQ_OBS] = torch.as_tensor(pad(batch[OBS], lens, max_len), device=self.device)
        out[SEQ_MASK] = torch.as_tensor(sequence_mask(lens, max_len), device=self.device)
        for k in range(self.num_state_tensors):
            out[STATE_IN.format(k)] = torch.as_tensor(batch[STATE_IN.format(k)][starts], device=self.device)
        if self.uses_prev_inputs:  # what the model read at each row, and what it reads after each row's step
            for key, prev in ((SEQ_PREV, (batch[PREV_ACTIONS], batch[PREV_REWARDS])),
                              (NEXT_PREV, (batch[ACTIONS], batch[REWARDS]))):
                actions, rewards = self._prev_arrays(prev)
                for name, value in (("actions", actions), ("rewards", rewards)):
                    if value is not None:
                        rows = pad(value, lens, max_len) if key == SEQ_PREV else value
                        out[key.format(name)] = torch.as_tensor(rows, device=self.device)
        return out

    @staticmethod
    def _prev_kwargs(batch: TensorBatch, key: str, rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        out = {}
        for name in ("actions", "rewards"):
            value = batch.get(key.format(name))
            if value is not None:
                out[f"prev_{name}"] = value if rows is None else value[rows][:, None]
        return out

    def forward_rows(self, batch: TensorBatch, model: torch.nn.Module | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(dist_inputs [N, ...], values [N])`` for the batch's rows, in row order: the model on ``obs``, or for
        a recurrent policy on the padded sequences of :meth:`sequence_tensors`, padding dropped. ``model``: another
        network of the same architecture (a target network); the policy's own by default."""
        model = self.model if model is None else model
        if SEQ_MASK not in batch:
            return model(batch[OBS])  # type: ignore[no-any-return]
        mask = batch[SEQ_MASK]
        state = tuple(batch[STATE_IN.format(k)] for k in range(self.num_state_tensors))
        dist_inputs, values, _ = model(batch[SEQ_OBS], state, **self._prev_kwargs(batch, SEQ_PREV))
        return dist_inputs[mask], values[mask]

    def next_values(self, batch: TensorBatch, rows: torch.Tensor) -> torch.Tensor:
        """``V(new_obs)`` ``[len(rows)]`` at the given rows of a learner batch: for a recurrent policy from the
        state the worker reached each row's ``new_obs`` with (``state_out_<k>``, which
        :meth:`sequence_tensors` keeps per row when asked for)."""
        next_obs = batch[NEXT_OBS][rows]
        if not self.is_recurrent:
            return self.model(next_obs)[1]  # type: ignore[no-any-return]
        state = tuple(batch[STATE_OUT.format(k)][rows] for k in range(self.num_state_tensors))
        return self.model(next_obs[:, None], state, **self._prev_kwargs(batch, NEXT_PREV, rows))[1][:, 0]  # type: ignore[no-any-return]

    def add_advantages(self, batch: SampleBatch, *, gamma: float, lambda_: float, use_gae: bool = True
                       ) -> SampleBatch:
        """:func:`flowrl.postprocessing.add_advantages` on one trajectory piece with this policy's value function:
        :meth:`value`, or for a recurrent policy :meth:`value_with_state` from the stored ``state_out_<k>``."""
        if not self.is_recurrent:
            return add_advantages(batch, self.value, gamma=gamma, lambda_=lambda_, use_gae=use_gae)
        k = self.num_state_tensors
        outs = [STATE_OUT.format(i) for i in range(k)]
        if not self.uses_prev_inputs:
            return add_advantages(batch, self.value_with_state, gamma=gamma, lambda_=lambda_, use_gae=use_gae,
                                  state_columns=outs)

        def value_fn(obs: np.ndarray, columns: tuple[np.ndarray, ...]) -> np.ndarray:  # after a row: its a and r
            return self.value_with_state(obs, columns[:k], prev=(columns[k], columns[k + 1]))

        return add_advantages(batch, value_fn, gamma=gamma, lambda_=lambda_, use_gae=use_gae,
                              state_columns=[*outs, ACTIONS, REWARDS])

    def sample_actions_with_state(self, obs: np.ndarray, state: tuple[np.ndarray, ...], prev: PrevInputs = None
                                  ) -> tuple[np.ndarray, dict[str, np.ndarray], tuple[np.ndarray, ...]]:
        """:meth:`compute_actions_with_state` (exploring) for a rollout worker's step loop; on the numpy path the
        extras leave ``logp`` to :meth:`complete_fragment`, as :meth:`sample_actions` does."""
        fast = self._deferring_numpy_recurrent()
        if fast is None:
            return self.compute_actions_with_state(obs, state, True, prev)
        prev = prev if self.uses_prev_inputs else None
        dist_inputs, values, new_state = fast.step(obs, state, self._prev_numpy(prev))
        actions = fast.sample(dist_inputs, self.act_random, True)
        extras = {VF_PREDS: values, ACTION_DIST_INPUTS: dist_inputs}
        return actions, self._recurrent_extras(extras, state, new_state, prev), new_state

    @torch.no_grad()
    def action_log_likelihoods(self, obs: np.ndarray, actions: np.ndarray) -> np.ndarray | None:
        """``log pi(actions | obs)`` under the policy's (exploring) action distribution, one per row, or ``None``
        for a model that has no such distribution (Q-networks, deterministic actors, recurrent models), which
        off-policy estimation then skips."""
        if not isinstance(self.model, ActorCriticModel):
            return None
        dist = self.dist_class(self.model(column_tensor(np.asarray(obs), self.device))[0])
        return dist.logp(column_tensor(np.asarray(actions), self.device)).cpu().numpy()

    @torch.no_grad()
    def value(self, obs: np.ndarray) -> np.ndarray:
        """``V(obs)`` for a batch of observations."""
        return self.model(self._obs_tensor(obs))[1].cpu().numpy()  # type: ignore[no-any-return]

    def action_distribution(self, dist_inputs: torch.Tensor) -> ActionDistribution:
        return self.dist_class(dist_inputs)

    # -- hooks ------------------------------------------------------------------------------------
    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        """Called by the rollout worker on each trajectory piece: one env's rows of one episode, or of several
        consecutive episodes when :attr:`postprocess_spans_episodes` is set; identity here."""
        return batch

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The training loss on a batch of tensors and its stats; algorithms override this."""
        raise NotImplementedError(f"{type(self).__name__} defines no loss(); subclass Policy and override "
                                  f"loss(batch) -> (loss, stats), as the algorithms in flowrl.algorithms do")

    def update_target(self) -> None:
        """Copies the online network into the target network (target-network policies override)."""
        raise NotImplementedError(f"{type(self).__name__} has no target network")

    def update_kl(self, sampled_kl: float) -> None:
        """Adapts a KL coefficient (KL-penalised policies override)."""
        raise NotImplementedError(f"{type(self).__name__} has no KL coefficient")

    # -- learning ---------------------------------------------------------------------------------
    def to_tensors(self, batch: SampleBatch) -> TensorBatch:
        """The batch's numeric columns as tensors on the policy's device (other columns are skipped)."""
        return {k: column_tensor(v, self.device) for k, v in batch.items() if v.dtype.kind in "biuf"}

    def _backward(self, tensors: TensorBatch) -> dict[str, float]:
        if not self.model.training:  # (a walk over every module: not once per minibatch)
            self.model.train()
        loss, stats = self.loss(tensors)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch's backward is untyped
        norm = self._finish_gradients(self.collective_weight)
        if norm is not None:
            stats["grad_gnorm"] = norm
        return {"loss": float(loss.detach()), **stats}

    def _finish_gradients(self, weight: float | None) -> float | None:
        """After ``backward``: in a process group, each gradient becomes the group's average (this member's
        counting ``weight``, :attr:`collective_weight`), then clipping to ``grad_clip``; the norm before clipping,
        or ``None`` without clipping."""
        if self.collective is not None:  # DD-PPO, a learner group: every member steps on the same gradient
            self.collective.average_gradients(self.model.parameters(), weight)
        if self.config.grad_clip is None:
            return None
        return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip))

    def learn_on_tensors(self, tensors: TensorBatch) -> dict[str, Any]:
        """One optimizer step on already-converted tensors; returns ``{"learner_stats": ...}``."""
        stats = self._backward(tensors)
        self.optimizer_step()
        if self.num_nonfinite_updates_skipped:
            stats[NONFINITE_UPDATES_SKIPPED] = self.num_nonfinite_updates_skipped
        return {"learner_stats": stats}

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, Any]:
        """One optimizer step on ``batch``; returns ``{"learner_stats": {...}}``."""
        return self.learn_on_tensors(self.to_tensors(batch))

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, Any]]:
        """Gradients of the loss (clipped as configured) as CPU numpy arrays, in parameter order."""
        stats = self._backward(self.to_tensors(batch))
        grads = [np.zeros(tuple(p.shape), np.float32) if p.grad is None else p.grad.detach().cpu().numpy()
                 for p in self.model.parameters()]
        return grads, {"learner_stats": stats}

    def apply_gradients(self, gradients: Sequence[np.ndarray | torch.Tensor]) -> None:
        """Takes one optimizer step with the given gradients (from :meth:`compute_gradients`)."""
        params = list(self.model.parameters())
        if len(gradients) != len(params):
            raise ValueError(f"apply_gradients got {len(gradients)} arrays for {len(params)} parameters; pass "
                             f"the list compute_gradients returned for the same model")
        for p, g in zip(params, gradients):
            grad = g.detach().clone() if isinstance(g, torch.Tensor) else torch.tensor(g)  # g may be read-only
            p.grad = grad.to(self.device).reshape(p.shape)
        self.optimizer_step()

    def optimizer_step(self) -> None:
        """``self.optimizer.step()`` as every learning path takes it: counts the new weights' version and tells the
        numpy acting mirror to re-read them (a fused optimizer updates them without moving their version counters).
        A subclass that steps its optimizer itself calls this instead.

        A gradient that holds NaN or inf is never applied: the step is skipped and counted in
        :attr:`num_nonfinite_updates_skipped` (with one warning), or, with ``on_nonfinite_update="raise"``, it raises.

        Raises:
            FloatingPointError: a non-finite gradient with ``on_nonfinite_update="raise"`` (the weights are unchanged).
        """
        if not self._gradients_finite():
            self._skip_nonfinite_update()
            return
        step_adam(self.optimizer)
        self.weights_version += 1
        for fast in (self.numpy_acting, self.numpy_recurrent):
            if fast is not None:
                fast.invalidate()

    def _gradients_finite(self) -> bool:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            return True
        # A NaN or inf in a gradient makes its norm NaN or inf: one fused norm per gradient and one device sync.
        # A finite gradient whose norm overflows float32 also lands here, so only then is every element checked.
        if bool(torch.stack(torch._foreach_norm(grads)).isfinite().all()):
            return True
        return bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())

    def _skip_nonfinite_update(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.num_nonfinite_updates_skipped += 1
        what = (f"{type(self).__name__}: a gradient holds NaN or inf (after {self.weights_version} applied updates), "
                f"so the update was not applied; a NaN or inf in the training batch, or a learning rate that "
                f"makes the model diverge, are the usual causes")
        if self.config.on_nonfinite_update == "raise":
            raise FloatingPointError(f"{what}; set on_nonfinite_update='skip' to skip such updates and go on")
        if self.num_nonfinite_updates_skipped == 1:
            logger.warning("%s; skipping such updates and counting them in the learner stat %s (this warning is "
                           "shown once; on_nonfinite_update='raise' stops instead)", what, NONFINITE_UPDATES_SKIPPED)

    # -- weights and state ------------------------------------------------------------------------
    def get_weights(self) -> Weights:
        """The model's parameters and buffers as CPU numpy arrays, by name."""
        return module_weights(self.model)

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Loads weights from :meth:`get_weights` (of a policy with the same model)."""
        expected = self.model.state_dict()
        if set(weights) != set(expected):
            missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
            raise ValueError(f"set_weights: names differ from this model's (missing {missing}, unexpected "
                             f"{unexpected}); weights must come from a policy with the same ModelConfig and spaces")
        for name, tensor in expected.items():
            given = np.shape(weights[name])
            if given != tuple(tensor.shape):
                raise ValueError(f"set_weights: layer {name!r} has shape {given} in the given weights and "
                                 f"{tuple(tensor.shape)} in this model; weights must come from a policy with the same "
                                 f"ModelConfig (hidden_sizes) and spaces")
        # np.array copies: arrays from Ray's object store are read-only
        load_module_weights(self.model, weights, self.device)

    def get_state(self) -> dict[str, Any]:
        """Weights, optimizer state, RNG states and the global timestep, as numpy and plain data, and the
        spaces (:func:`space_to_data`) that :func:`flowrl.inference.load` rebuilds the policy with."""
        return {"weights": self.get_weights(), "optimizer": _to_numpy_tree(self.optimizer.state_dict()),
                "torch_rng": self.generator.get_state().numpy().copy(),
                "numpy_rng": self.np_random.bit_generator.state, "act_rng": self.act_random.bit_generator.state,
                "global_timestep": self.global_timestep,
                "spaces": {"observation": space_to_data(self.observation_space),
                           "action": space_to_data(self.action_space)}}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`get_state` output (its spaces are not read: the policy keeps its own)."""
        self.set_weights(state["weights"])
        self._check_optimizer_state(state["optimizer"])
        self.optimizer.load_state_dict(_to_torch_tree(state["optimizer"]))
        self.generator.set_state(torch.from_numpy(np.array(state["torch_rng"], dtype=np.uint8)))  # a writable copy
        self.np_random.bit_generator.state = state["numpy_rng"]
        self.act_random.bit_generator.state = state["act_rng"]
        self.global_timestep = int(state["global_timestep"])

    def learner_extras(self) -> dict[str, Any]:
        """What this policy learns or adapts beyond its weights and optimizer, which the driver sends to a learner
        group with every step (PPO's KL coefficient); none here."""
        return {}

    def set_learner_extras(self, extras: Mapping[str, Any]) -> None:
        """Adopts :meth:`learner_extras` output."""

    def group_shares(self, batch: SampleBatch, rows: np.ndarray, num_learners: int) -> list[np.ndarray]:
        """Each learner's share of a minibatch's ``rows`` (indices into ``batch``), in rank order: contiguous runs
        of sizes that differ by one at most. A loss that is not a mean over independent rows cuts elsewhere
        (IMPALA's, between trajectory pieces); the group weights each share's gradient by its share of the rows."""
        return list(np.array_split(np.asarray(rows), num_learners))

    def group_step_without_rows(self) -> None:
        """A learner group's step for a member whose share of a minibatch has no rows: it adds nothing to the
        group's gradient (weight 0) but takes the all-reduce and the step with the others."""
        if self.collective is None:
            raise RuntimeError(f"{type(self).__name__} is in no process group")
        self.optimizer.zero_grad(set_to_none=True)
        self._finish_gradients(0.0)
        self.optimizer_step()

    def get_learner_state(self) -> dict[str, Any]:
        """:meth:`get_state` without the random generators' states: what members of a process group that learn
        together must share (each keeps its own draws, so its actions and minibatch order stay its own)."""
        return {k: v for k, v in self.get_state().items() if k not in _RNG_STATE_KEYS}

    def set_learner_state(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`get_learner_state` output, keeping this policy's random generators' states."""
        own = self.get_state()
        self.set_state({**state, **{k: own[k] for k in _RNG_STATE_KEYS}})

    def _check_optimizer_state(self, saved: Mapping[str, Any]) -> None:
        """Refuses a saved optimizer state whose per-parameter tensors (Adam's moments, say) have other shapes
        than this policy's parameters, which ``Optimizer.load_state_dict`` would accept and the next step
        would fail on (or broadcast)."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        names = {id(p): name for name, p in self.model.named_parameters()}
        for index, entry in dict(saved.get("state", {})).items():
            if not isinstance(index, int) or not 0 <= index < len(params):
                raise ValueError(f"set_state: the optimizer state names parameter {index!r}, and this policy's "
                                 f"optimizer has {len(params)}; the state must come from a policy with the same model")
            param = params[index]
            for key, value in dict(entry).items():
                shape = np.shape(value)
                if shape and shape != tuple(param.shape):
                    raise ValueError(f"set_state: the optimizer's {key!r} for layer "
                                     f"{names.get(id(param), index)!r} has shape {shape} in the given state and "
                                     f"{tuple(param.shape)} in this model; the state must come from a policy with "
                                     f"the same ModelConfig (hidden_sizes) and spaces")

    def on_global_var_update(self, global_vars: Mapping[str, Any]) -> None:
        """Receives ``{"timestep": ...}`` with every weight broadcast (schedules read it)."""
        self.global_timestep = int(global_vars.get("timestep", self.global_timestep))
