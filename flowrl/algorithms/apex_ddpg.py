"""Ape-X DDPG: Ape-X's distributed prioritized replay over DDPG's policy (Ape-X, https://arxiv.org/abs/1803.00933;
DDPG, https://arxiv.org/abs/1509.02971; RLlib Flow, https://arxiv.org/abs/2011.12719).

Dataflow: Ape-X's plan, unchanged (:func:`flowrl.algorithms.apex.plan`): (1) workers sample asynchronously with
their own noise scale and each fragment is stored in a random trainer-owned replay shard, the worker getting fresh
weights every ``max_weight_sync_delay`` delivered steps; (2) each shard replays batches into the learner thread,
which takes DDPG's critic and actor steps; (3) new priorities go back to the shards and every trained batch moves
the target networks ``tau`` of the way (``target_network_update_freq=0``). Only the config
(:class:`~flowrl.algorithms.apex.ApexSettings` over :class:`~flowrl.algorithms.ddpg.DDPGConfig`) and the policy
(DDPG's, writing worker-side priorities and taking its worker's noise scale) differ from Ape-X DQN. By
default the sub-flows take turns by ``training_intensity`` (Ape-X's round-robin variant) rather than running fully
asynchronously, so a laptop's learner is not outrun by its samplers.

Examples:
    >>> config = ApexDDPGConfig(seed=0)
    >>> config.env, config.num_workers, config.num_replay_buffer_shards, config.n_step, config.prioritized_replay
    ('Pendulum-v1', 2, 2, 3, True)
    >>> [round(s, 5) for s in config.worker_exploration]  # each worker's noise_scale: 0.4 ** (1 + 7 i / (N - 1))
    [0.4, 0.00066]
    >>> ApexDDPGConfig(tau=0)
    Traceback (most recent call last):
    ...
    ValueError: tau=0 must be a number in (0, 1] (the target networks' step towards the online ones)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from flowrl.algorithms import Algorithm
from flowrl.algorithms.apex import ApexSettings, make_owned_state, per_worker_epsilon, plan
from flowrl.algorithms.ddpg import DDPGConfig, DDPGPolicy
from flowrl.config import PolicyConfig, num_workers_that_fit
from flowrl.sample_batch import PRIORITIES, SampleBatch

__all__ = ["ApexDDPGConfig", "ApexDDPGPolicy", "make_owned_state", "plan", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class ApexDDPGConfig(ApexSettings, DDPGConfig):
    """Ape-X DDPG's config: :class:`~flowrl.algorithms.ddpg.DDPGConfig` (networks, losses, ``tau``, noise) with
    the :class:`~flowrl.algorithms.apex.ApexSettings` (shards, weight-sync delay, worker-side priorities), sized
    for a laptop. RLlib's Ape-X DDPG ran 32 workers with n_step 3, a 2M buffer, learning_starts 50000,
    train_batch_size 512, rollout_fragment_length 50 and hard target copies every 500000 trained steps.

    Attributes:
        num_workers: remote rollout workers (2, capped at the CPUs available); worker ``i`` of ``N`` multiplies
            its exploration noise by ``noise_scale`` = :func:`~flowrl.algorithms.apex.per_worker_epsilon`
            ``(i, N)`` = ``0.4 ** (1 + 7 i / (N - 1))`` (a single worker: 0.4); with zero remote workers the
            driver samples with 0.4; the driver's learner replica otherwise gets 0 (it never samples).
            See :func:`~flowrl.algorithms.apex.worker_exploration_scale`.
        exploration_noise: the Gaussian std before the worker's scale (0.25: worker 0 explores with std 0.1 in
            the ``[-1, 1]`` action scale, DDPG's default, and worker ``N - 1`` nearly greedily).
        num_replay_buffer_shards: 2 (each holds half of ``buffer_size`` and of ``learning_starts``).
        n_step: 3. buffer_size: 100000 (a laptop's run fits it whole). learning_starts: 2000.
        train_batch_size: 256. rollout_fragment_length: 50 (one stored fragment per worker round trip).
        prioritized_replay: True (Ape-X's prioritized replay; DDPG's default is uniform).
        target_network_update_freq: 0 with ``tau=0.005``: a soft update after every trained batch.
        training_intensity: trained rows per sampled step (32): the sub-flows take turns (round robin, see
            :attr:`~flowrl.algorithms.apex.ApexSettings.round_robin_weights`: 6.25 replayed batches of 256 per
            stored fragment of 50), so sampling never runs far ahead of a slow learner; at most that many, fewer
            when the learner's queue is full. ``None``: fully asynchronous, as Ape-X DQN; the learner then trains
            what it can, which on a loaded 2-core laptop was ~7 rows per sampled step and needed ~70k steps to
            reach -320 on Pendulum, against ~43k with 32.
        worker_side_prioritization: each stored row's first priority is ``|td_error| + prioritized_replay_eps``
            from the worker's online networks (``DDPGPolicy.td_error``); not computed without
            ``prioritized_replay``.
    """

    num_workers: int = field(default_factory=num_workers_that_fit(2, "ApexDDPGConfig"))
    num_replay_buffer_shards: int = 2
    n_step: int = 3
    buffer_size: int = 100_000
    learning_starts: int = 2000
    train_batch_size: int = 256
    rollout_fragment_length: int = 50
    prioritized_replay: bool = True
    training_intensity: float | None = 32.0
    exploration_noise: float = 0.25


class ApexDDPGPolicy(DDPGPolicy):
    """DDPG's policy with Ape-X's exploration and priorities: :meth:`set_worker_exploration` fixes its
    ``noise_scale`` (the plan gives each worker its own), and with ``worker_side_prioritization`` (and
    ``prioritized_replay``) each postprocessed row gets its initial priority ``|td_error| + prioritized_replay_eps``
    from this worker's online networks.

    Examples:
        >>> policy = ApexDDPGPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (1,)), ApexDDPGConfig(seed=0))
        >>> policy.noise_scale
        0.4
        >>> policy.set_worker_exploration(0.016); policy.noise_scale
        0.016
    """

    config: ApexDDPGConfig
    config_class = ApexDDPGConfig

    def __init__(self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: PolicyConfig) -> None:
        super().__init__(observation_space, action_space, config)
        self.noise_scale = per_worker_epsilon(0, 1)  # until the plan assigns its worker's scale

    def set_worker_exploration(self, scale: float) -> None:
        """Multiplies the exploration noise by ``scale`` from now on (see
        :class:`~flowrl.algorithms.apex.ExploresPerWorker`)."""
        self.noise_scale = scale

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        batch = super().postprocess_trajectory(batch)
        if self.config.worker_side_prioritization and self.config.prioritized_replay and batch.count:
            batch[PRIORITIES] = (np.abs(self.td_error(batch)) + self.config.prioritized_replay_eps).astype(np.float32)
        return batch


ALGORITHM = Algorithm("apex_ddpg", ApexDDPGConfig, ApexDDPGPolicy, plan, make_owned_state=make_owned_state)
