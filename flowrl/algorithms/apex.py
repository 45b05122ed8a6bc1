"""Ape-X DQN: distributed prioritized replay as a plan (RLlib Flow, https://arxiv.org/abs/2011.12719; Ape-X,
https://arxiv.org/abs/1803.00933).

Dataflow: three sub-flows share ``num_replay_buffer_shards`` trainer-owned ``ReplayShard``\\ s
and one ``ApexLearnerThread``. (1) Workers sample asynchronously, each fragment is stored in a random shard, and a
worker gets fresh weights once it has delivered ``max_weight_sync_delay`` steps. (2) Each shard replays batches
into the learner's in-queue, paired with the shard. (3) The learner's out-queue sends new priorities back to that
shard, is counted, and drives the target network. ``Concurrently(async)`` joins them, emitting (3).

The plan and the shards serve any replay policy: a config mixes in :class:`ApexSettings`, and a policy that
:class:`ExploresPerWorker` gets its worker's exploration scale. :mod:`flowrl.algorithms.apex_ddpg` runs this plan
over DDPG's policy.

Examples:
    >>> from flowrl.config import available_cpus
    >>> config = ApexConfig(seed=0)  # 32 workers, or as many as there are CPUs
    >>> config.num_workers == min(32, available_cpus()), config.num_replay_buffer_shards, config.n_step
    (True, 4, 3)
    >>> [round(e, 4) for e in ApexConfig(num_workers=3).worker_epsilons]  # 0.4 ** (1 + 7 i / (N - 1))
    [0.4, 0.0162, 0.0007]
    >>> ApexConfig(num_gpus=2)
    Traceback (most recent call last):
    ...
    ValueError: num_gpus=2: Ape-X trains on one learner device; use num_gpus=0 (CPU) or num_gpus=1
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sequence, runtime_checkable

import gymnasium as gym
import numpy as np
import torch

from flowrl.algorithms import Algorithm
from flowrl.algorithms.dqn import NSTEP_DISCOUNTS, DQNConfig, DQNPolicy
from flowrl.config import PolicyConfig, TrainerConfig, check_finite_fields, num_workers_that_fit
from flowrl.iter import LocalIterator
from flowrl.ops import (AddReplayShardStats, ApexLearnerThread, Concurrently, Dequeue, Enqueue, ParallelRollouts,
                        RecordLearnerOutput, Replay, StandardMetricsReporting, StoreToReplayBuffer,
                        UpdateTargetNetwork, UpdateWorkerWeights)
from flowrl.ops.replay import UpdateReplayShardPriorities
from flowrl.ops.shutdown import shut_down
from flowrl import executor, replay_buffers
from flowrl.sample_batch import ACTIONS, NEXT_OBS, OBS, PRIORITIES, REWARDS, SampleBatch
from flowrl.validation import bounded
from flowrl.workers import RolloutWorker, WorkerSet, unresponsive_actors


if TYPE_CHECKING:  # ApexSettings is only ever mixed into a replay config: the type checker sees that config's fields
    from flowrl.algorithms.off_policy import OffPolicyConfig as _ReplayConfig
else:
    _ReplayConfig = object

__all__ = ["ApexSettings", "ApexConfig", "ApexPolicy", "ExploresPerWorker", "per_worker_epsilon",
           "worker_exploration_scale", "set_worker_exploration", "set_worker_epsilons", "ReplayShards",
           "make_replay_shards", "make_owned_state", "plan", "ALGORITHM"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ApexSettings(_ReplayConfig):
    """What Ape-X adds to a replay config, whatever its policy: a frozen ``kw_only`` mixin, listed first.

    ``ApexConfig(ApexSettings, DQNConfig)`` is Ape-X DQN and ``ApexDDPGConfig(ApexSettings, DDPGConfig)`` Ape-X
    DDPG: the second base (an :class:`~flowrl.algorithms.off_policy.OffPolicyConfig`) keeps its fields and
    defaults, this mixin adds the fields below, refuses ``num_gpus > 1`` and counts one async store item as one
    worker's fragment (:attr:`round_robin_weights`). Each config sets its own defaults for the shared fields
    (``num_workers``, ``n_step``, ``buffer_size``, ...). To the type checker it is an ``OffPolicyConfig`` (it is
    only ever mixed into one); at run time it adds just these fields.

    Attributes:
        num_replay_buffer_shards: ``ReplayShard`` actors (4), each with ``1/shards`` of ``buffer_size`` and
            ``learning_starts``.
        max_weight_sync_delay: steps a worker delivers between two weight syncs (400).
        worker_side_prioritization: workers compute each row's initial priority ``|td_error|`` with their
            own network (True), instead of the shard's max priority.
        replay_buffer_shards_colocated_with_driver: pin the shards to the driver's node (True).
        learner_queue_size: replayed batches waiting for the learner (16).
    """

    num_replay_buffer_shards: int = bounded(4, ge=1, meaning="replay shard actors")
    max_weight_sync_delay: int = bounded(400, ge=1, meaning="steps a worker delivers between weight syncs")
    worker_side_prioritization: bool = True
    replay_buffer_shards_colocated_with_driver: bool = True
    learner_queue_size: int = bounded(16, ge=1, meaning="replayed batches waiting for the learner")

    def __post_init__(self) -> None:
        check_finite_fields(self)  # before the num_gpus check below, which runs ahead of the inherited checks
        if self.num_gpus > 1:
            raise ValueError(f"num_gpus={self.num_gpus}: Ape-X trains on one learner device; use num_gpus=0 (CPU) "
                             f"or num_gpus=1")
        super().__post_init__()

    @property
    def worker_exploration(self) -> list[float]:
        """Each sampling worker's :func:`per_worker_epsilon`, in order (``[0.4]`` with zero remote workers): its
        epsilon (Ape-X DQN) or noise scale (Ape-X DDPG). See :func:`set_worker_exploration`."""
        n = self.num_workers
        return [per_worker_epsilon(i, n) for i in range(max(n, 1))]

    @property
    def round_robin_weights(self) -> list[float]:
        """The ``[store, replay]`` pulls per round-robin turn when ``training_intensity`` is set; the plan adds
        ``"*"`` for the update sub-flow.

        ``[1, training_intensity / native_ratio]`` with ``native_ratio = train_batch_size / (rollout_fragment_length
        x num_envs_per_worker)``: one async store item is **one** worker's fragment, whatever ``num_workers``.
        ``[1, 1]`` without ``training_intensity`` (the plan then runs asynchronously and ignores it).

        Examples:
            >>> ApexConfig(train_batch_size=32, rollout_fragment_length=4, training_intensity=16).round_robin_weights
            [1.0, 2.0]
        """
        if self.training_intensity is None:
            return [1.0, 1.0]
        native_ratio = self.train_batch_size / (self.rollout_fragment_length * self.num_envs_per_worker)
        return [1.0, self.training_intensity / native_ratio]


@dataclass(frozen=True, kw_only=True)
class ApexConfig(ApexSettings, DQNConfig):
    """Ape-X's config: :class:`~flowrl.algorithms.dqn.DQNConfig` with the :class:`ApexSettings` and RLlib's Ape-X
    defaults.

    Attributes:
        num_workers: remote rollout workers (32, capped at the CPUs available, see
            :func:`~flowrl.config.num_workers_that_fit`); worker ``i`` of ``N`` explores with
            :func:`per_worker_epsilon` ``(i, N)`` (see :attr:`worker_epsilons`); 0: the driver samples, ε = 0.4.
        num_gpus: the learner's devices: 0 (CPU, the default) or 1.
        num_replay_buffer_shards (4), max_weight_sync_delay (400), worker_side_prioritization (True),
            replay_buffer_shards_colocated_with_driver (True), learner_queue_size (16): see :class:`ApexSettings`.
        n_step (3), buffer_size (2,000,000), learning_starts (50000), train_batch_size (512),
            rollout_fragment_length (50): as in DQN, with Ape-X's values.
        target_network_update_freq: **trained** steps between target-network copies (500000).
        timesteps_per_iteration: a report waits for 1000 new env steps, as DQN's (RLlib's cluster-sized 25000
            steps and 30 s made one report span ~60k steps on a laptop); no wall-time gate. Reports come with
            trained batches, so the first one waits for ``learning_starts`` stored steps.
        training_intensity: ``None``: the three sub-flows run asynchronously; otherwise trained steps per sampled
            step, turned into round-robin weights (:attr:`round_robin_weights`).
    """

    num_workers: int = field(default_factory=num_workers_that_fit(32, "ApexConfig"))
    n_step: int = 3
    buffer_size: int = 2_000_000
    learning_starts: int = 50000
    train_batch_size: int = 512
    rollout_fragment_length: int = 50
    target_network_update_freq: int = 500000
    timesteps_per_iteration: int = 1000

    @property
    def worker_epsilons(self) -> list[float]:
        """The exploration epsilon of each remote worker, in order (``[0.4]`` with zero remote workers)."""
        return self.worker_exploration


def per_worker_epsilon(index: int, num_workers: int) -> float:
    """Ape-X's exploration epsilon of sampling worker ``index`` of ``num_workers``: ``0.4 ** (1 + 7 i / (N - 1))``.

    A single sampling worker (``num_workers <= 1``) gets 0.4, so the formula never divides by zero.

    Examples:
        >>> per_worker_epsilon(0, 1), per_worker_epsilon(0, 8), round(per_worker_epsilon(7, 8), 6)
        (0.4, 0.4, 0.000655)
    """
    if num_workers <= 1:
        return 0.4
    return float(0.4 ** (1 + 7 * min(max(index, 0), num_workers - 1) / (num_workers - 1)))


def plan(workers: WorkerSet, config: ApexSettings, *,
         replay_actors: list[Any] | None = None) -> LocalIterator[dict[str, Any]]:
    """Ape-X: (1) store async rollouts in the shards, syncing each worker's weights every
    ``max_weight_sync_delay`` steps; (2) replay from the shards into the learner thread; (3) priorities back to
    the shards, count, update the target network; async (or round robin by training intensity), emitting (3).
    Each report adds the learner's metrics and ``info["replay_shard_0"]``, shard 0's ``stats()``. Any policy
    runs it (its ``learn_on_batch`` reports ``td_error``); :func:`set_worker_exploration` sets each worker's
    exploration at build time.

    Examples:
        >>> config = ApexConfig(seed=0, num_workers=0, num_replay_buffer_shards=1, learning_starts=64,
        ...                     train_batch_size=32, buffer_size=1000, timesteps_per_iteration=100, min_iter_time_s=0)
        >>> it = plan(WorkerSet(policy_class=ApexPolicy, config=config), config)
        >>> import re
        >>> print(re.sub(r"\\.(?=(combine|for_each|filter|zip_with_source_actor)\\()", "\\n  .", repr(it)))
        LocalIterator[Concurrently(async, output_indexes=[2])[LocalIterator[ParallelRollouts(async)
          .for_each(StoreToReplayBuffer(actors=1))], LocalIterator[Replay(actors=1)
          .zip_with_source_actor()
          .for_each(Enqueue(maxsize=16))], LocalIterator[Dequeue
          .for_each(UpdateReplayShardPriorities)
          .for_each(RecordLearnerOutput)
          .for_each(UpdateTargetNetwork(500000))]]
          .filter(ReportGate(100 steps, 0 s))
          .for_each(CollectMetrics)
          .for_each()
          .for_each(AddReplayShardStats(replay_shard_0))]
        >>> result = next(it)
        >>> result["info"]["num_steps_trained"] % 32, result["info"]["replay_shard_0"]["num_added"] >= 64
        (0, True)
        >>> it.close()
    """
    own = make_replay_shards(config) if replay_actors is None else []
    shards = list(replay_actors) if replay_actors is not None else own
    learner = ApexLearnerThread(workers.local_worker(), learner_queue_size=config.learner_queue_size)
    set_worker_exploration(workers, config)
    # (1) store rollouts in a shard; sync each delivering worker's weights every max_weight_sync_delay steps
    store_op = ParallelRollouts(workers, mode="async", num_async=2).for_each(
        StoreToReplayBuffer(actors=shards, seed=config.seed))
    if workers.remote_workers():
        store_op = store_op.zip_with_source_actor().for_each(
            UpdateWorkerWeights(learner, workers, config.max_weight_sync_delay))
    # (2) replay from the shards into the learner, each batch paired with its shard
    replay_op = Replay(actors=shards, num_async=4)
    if (hook := config.before_learn_on_batch) is not None:
        replay_op = replay_op.for_each(lambda batch: hook(batch, workers, config))
    enqueue_op = replay_op.zip_with_source_actor().for_each(Enqueue(learner.inqueue))
    # (3) new priorities back to the shards, count what was trained, update the target network
    update_op = (Dequeue(learner.outqueue, check=learner.is_alive)
                 .for_each(UpdateReplayShardPriorities(learner, prioritized=config.prioritized_replay))
                 .for_each(RecordLearnerOutput())
                 .for_each(UpdateTargetNetwork(workers, config.target_network_update_freq, by_steps_trained=True,
                                               learner_thread=learner)))
    if config.training_intensity is None:
        merged = Concurrently([store_op, enqueue_op, update_op], mode="async", output_indexes=[2])
    else:
        merged = Concurrently([store_op, enqueue_op, update_op], mode="round_robin", output_indexes=[2],
                              round_robin_weights=[*config.round_robin_weights, "*"])
    n = len(workers.remote_workers())
    selected = workers.remote_workers()[-math.ceil(n / 3):] if n else None
    learner.start()
    return (StandardMetricsReporting(merged, workers, config, selected_workers=selected)
            .for_each(learner.add_learner_metrics)
            .for_each(AddReplayShardStats(shards[0]))
            .on_close(lambda: shut_down(learner, own)))


@runtime_checkable
class ExploresPerWorker(Protocol):
    """A policy whose exploration Ape-X fixes per worker: :class:`ApexPolicy` takes the value as its epsilon,
    :class:`~flowrl.algorithms.apex_ddpg.ApexDDPGPolicy` as its noise scale."""

    def set_worker_exploration(self, scale: float) -> None:
        """Explores with ``scale`` (:func:`worker_exploration_scale`) from now on, whatever the timestep."""


def worker_exploration_scale(worker_index: int, num_workers: int) -> float:
    """The exploration scale of worker ``worker_index`` (0: the local worker) when ``num_workers`` remote workers
    sample: remote worker ``i`` (index ``i + 1``) gets :func:`per_worker_epsilon` ``(i, num_workers)``; the local
    worker gets 0.4 when it samples (zero remote workers), else 0 (it is the learner's replica and never samples).

    Examples:
        >>> worker_exploration_scale(0, 0), worker_exploration_scale(0, 2), worker_exploration_scale(1, 2)
        (0.4, 0.0, 0.4)
    """
    if worker_index == 0:
        return per_worker_epsilon(0, 1) if num_workers == 0 else 0.0
    return per_worker_epsilon(worker_index - 1, num_workers)


def set_worker_exploration(workers: WorkerSet, config: TrainerConfig) -> None:
    """Gives each policy of each worker that :class:`ExploresPerWorker` its :func:`worker_exploration_scale`
    (``worker_index``, ``config.num_workers``); other policies are left alone.

    A blocking ``foreach_worker`` call at plan build, so a recreated worker (same index) gets its scale back when
    the trainer rebuilds the plan.
    """
    workers.foreach_worker(functools.partial(_set_exploration, num_workers=config.num_workers))


set_worker_epsilons = set_worker_exploration  # its name from when Ape-X ran only DQN


def _set_exploration(worker: RolloutWorker, num_workers: int) -> None:
    scale = worker_exploration_scale(worker.worker_index, num_workers)
    for policy in worker.policy_map.values():
        if isinstance(policy, ExploresPerWorker):
            policy.set_worker_exploration(scale)


def make_owned_state(config: ApexSettings) -> dict[str, Any]:
    """What the trainer keeps across plan rebuilds: ``{"replay_actors": make_replay_shards(config)}``."""
    return {"replay_actors": make_replay_shards(config)}


def make_replay_shards(config: ApexSettings) -> ReplayShards:
    """The ``num_replay_buffer_shards`` replay shards the plan's sub-flows share (``num_cpus=0``, seeded from
    ``seed``), able to replace a shard that dies (:meth:`ReplayShards.recreate`)."""
    start = functools.partial(
        replay_buffers.make_replay_shards,
        config.num_replay_buffer_shards, colocated_with_driver=config.replay_buffer_shards_colocated_with_driver,
        learning_starts=config.learning_starts, capacity=config.buffer_size, replay_batch_size=config.train_batch_size,
        prioritized_replay_alpha=config.prioritized_replay_alpha if config.prioritized_replay else 0.0,
        prioritized_replay_beta=config.prioritized_replay_beta, prioritized_replay_eps=config.prioritized_replay_eps,
        replay_mode=config.replay_mode, replay_sequence_length=config.replay_sequence_length, seed=config.seed,
        compress=config.compress_replay)
    return ReplayShards(start(), start=lambda indices: start(shard_indices=indices),
                        capacity=config.buffer_size // config.num_replay_buffer_shards)


class ReplayShards(list[Any]):
    """The trainer-owned replay shard actors: a plain list of handles that a checkpoint can also hold.

    With ``store_buffer_in_checkpoints`` the trainer saves :meth:`get_state` (every shard's contents, priorities
    and RNG state, fetched with ``ray.get``) and restores it with :meth:`set_state`. Adds still in flight from
    the store sub-flow at save time are not included.

    A shard that died is found by :meth:`check_health` and replaced in place, empty, by :meth:`recreate` (which
    needs ``start``): the :class:`~flowrl.trainer.Trainer` does both when ``recreate_failed_workers`` is on.

    Args:
        shards: the shard actor handles, in shard order.
        start: starts the listed shards again, as they were first started
            (``flowrl.replay_buffers.make_replay_shards`` with ``shard_indices=``); ``None``: a dead shard cannot be
            replaced.
        capacity: what one shard holds, in env steps (for the warning of :meth:`recreate`).
    """

    def __init__(self, shards: Iterable[Any] = (), *, start: Callable[[Sequence[int]], list[Any]] | None = None,
                 capacity: int | None = None) -> None:
        super().__init__(shards)
        self.start, self.capacity = start, capacity

    def check_health(self, timeout_s: float = 30.0) -> list[int]:
        """The shards (positions) that died or did not answer a ping within ``timeout_s`` seconds."""
        return unresponsive_actors(self, timeout_s)

    def recreate(self, indices: Sequence[int]) -> None:
        """Replaces those shards with new, empty ones (same seeds and placement); what they held is lost, and a
        warning says so.

        Raises:
            ValueError: no ``start`` to start them with.
        """
        if not indices:
            return
        if self.start is None:
            raise ValueError(f"replay shards {list(indices)} cannot be recreated: these ReplayShards were built "
                             f"without start=; build them with make_replay_shards(config)")
        new = self.start(list(indices))
        for i, shard in zip(indices, new):
            executor.kill(self[i])
            self[i] = shard
        held = "" if self.capacity is None else f" (up to {self.capacity} env steps each)"
        logger.warning("replay shard(s) %s of %d died and were recreated empty: what they held%s is lost, and "
                       "each fills up again to learning_starts before it replays", list(indices), len(self), held)

    def get_state(self) -> dict[str, Any]:
        return {"shards": executor.get([shard.get_state.remote() for shard in self])}

    def set_state(self, state: dict[str, Any]) -> None:
        """Raises ``ValueError`` when the state holds another number of shards."""
        shards = state["shards"]
        if len(shards) != len(self):
            raise ValueError(f"the checkpoint holds {len(shards)} replay shards but this trainer has {len(self)}; "
                             f"restore with num_replay_buffer_shards={len(shards)}")
        executor.get([shard.set_state.remote(s) for shard, s in zip(self, shards)])

    def close(self) -> None:
        """Terminates the shard actors (``Trainer.stop()`` calls it)."""
        for shard in self:
            executor.kill(shard)
        self.clear()


class ApexPolicy(DQNPolicy):
    """The Ape-X policy: a :class:`~flowrl.algorithms.dqn.DQNPolicy` whose exploration epsilon is fixed per worker
    and which, with ``worker_side_prioritization``, writes each sampled row's initial priority.

    ``epsilon`` is :attr:`exploration_epsilon` (0.4 until :func:`set_worker_exploration` assigns the worker's value);
    DQN's annealing schedule is not used. The ``priorities`` column is ``|Q(s, a) - y| + eps`` with the n-step
    target ``y`` bootstrapped from the worker's online network (its target network is never synced).

    Examples:
        >>> import gymnasium as gym
        >>> policy = ApexPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), ApexConfig(seed=0))
        >>> policy.epsilon
        0.4
        >>> policy.exploration_epsilon = 0.01; policy.on_global_var_update({"timestep": 10**6}); policy.epsilon
        0.01
    """

    config: ApexConfig

    def __init__(self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: PolicyConfig) -> None:
        super().__init__(observation_space, action_space, config)
        self.exploration_epsilon = per_worker_epsilon(0, 1)

    @property
    def epsilon(self) -> float:
        """The worker's fixed exploration epsilon."""
        return self.exploration_epsilon

    def set_worker_exploration(self, scale: float) -> None:
        """Explores with epsilon ``scale`` (see :class:`ExploresPerWorker`)."""
        self.exploration_epsilon = scale

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        batch = super().postprocess_trajectory(batch)
        if getattr(self.config, "worker_side_prioritization", False) and batch.count:
            with torch.no_grad():
                obs, next_obs = self._obs_tensor(batch[OBS]), self._obs_tensor(batch[NEXT_OBS])
                q_B = self.model(obs).gather(1, torch.as_tensor(batch[ACTIONS], device=self.device).long()
                                             .unsqueeze(1)).squeeze(1)
                next_q_B = self.model(next_obs).max(dim=1).values
            targets_B = np.asarray(batch[REWARDS], np.float32) + np.asarray(batch[NSTEP_DISCOUNTS], np.float32) * \
                next_q_B.cpu().numpy()
            batch[PRIORITIES] = np.abs(q_B.cpu().numpy() - targets_B) + self.config.prioritized_replay_eps
        return batch


ALGORITHM = Algorithm("apex", ApexConfig, ApexPolicy, plan, make_owned_state=make_owned_state)
