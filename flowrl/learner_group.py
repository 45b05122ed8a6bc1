"""A data-parallel learner group: ``num_learners`` learner actors, each with a replica of the trained policy on
its own device, that split every minibatch, all-reduce their gradients and take the same step.

The driver's local worker stays the learner as far as plans can tell: :class:`~flowrl.ops.LearnOnBatch` (and
``TrainOneStep``, and the learner threads of IMPALA) call its ``learn_on_batch``, and a worker with a
:attr:`~flowrl.workers.RolloutWorker.learner_group` hands the step to the group. The driver still draws the
minibatches (its policy's ``np_random``, as a lone learner would); each learner takes its share of every minibatch
(:meth:`~flowrl.policy.Policy.group_shares`: ``numpy.array_split`` of the rows in rank order, or IMPALA's cuts
between trajectory pieces) and weights its gradient by its share of the rows, so the
group's step is the lone learner's step on the whole minibatch, up to float rounding. After the step, rank 0's
weights come back to the driver's policy, which the broadcast to the rollout workers reads as before.

What a policy learns beyond its weights and optimizer must travel too: a policy that can learn in a group says
so (:attr:`~flowrl.policy.Policy.learns_in_groups`) and names that state (:meth:`~flowrl.policy.Policy.
learner_extras`, e.g. PPO's KL coefficient), which the driver sends with every step. Policies with target networks
updated by the driver (DQN, DDPG, SAC, APPO) do not learn in groups yet. IMPALA's learner thread hands each train
batch to the group as one minibatch, cut between its trajectory pieces.

Examples:
    >>> import gymnasium as gym
    >>> from flowrl.algorithms.pg import PGConfig, PGPolicy
    >>> policy = PGPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), PGConfig(seed=0))
    >>> [share.tolist() for share in policy.group_shares(SampleBatch({}), np.arange(5), 2)]  # rank order
    [[0, 1, 2], [3, 4]]
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np
import torch

from flowrl import collective, executor, runtime
from flowrl.callbacks import add_learner_stats, before_learning
from flowrl.collective import Collective, CollectiveMember
from flowrl.policy import NONFINITE_UPDATES_SKIPPED, Policy, flush_denormals
from flowrl.sample_batch import SampleBatch

if TYPE_CHECKING:
    from flowrl.config import TrainerConfig

__all__ = ["LearnerActor", "LearnerGroup"]

#: one learner call's minibatches: per epoch, the row indices of each minibatch
Epochs = Sequence[Sequence[np.ndarray]]


class LearnerActor(CollectiveMember):
    """One learner of a group: a replica of the trained policy on its device, in its own process.

    Args:
        policy_class / observation_space / action_space / config: as the driver's policy was built
            (``config.device`` replaced by this learner's device).
        num_threads: torch's intra-op threads here (the CPUs it asked Ray for).
    """

    def __init__(self, policy_class: type[Policy], observation_space: gym.Space[Any], action_space: gym.Space[Any],
                 config: Any, num_threads: int = 1) -> None:
        torch.set_num_threads(max(1, num_threads))
        self.policy = policy_class(observation_space, action_space, config)
        self.flush_denormal = bool(getattr(config, "flush_denormal", True))

    def on_collective_joined(self, group: Collective) -> None:
        self.policy.collective = group

    def set_learner_state(self, state: Mapping[str, Any]) -> None:
        """Adopts the driver policy's learner state (weights, optimizer, extras)."""
        self.policy.set_learner_state(state)

    def get_learner_state(self) -> dict[str, Any]:
        return self.policy.get_learner_state()

    def learn(self, batch: SampleBatch, epochs: Epochs, extras: Mapping[str, Any],
              send_weights: bool) -> tuple[list[list[tuple[float, dict[str, Any] | None]]], Any, int, int]:
        """Takes one group step per minibatch of ``epochs`` on this learner's share of its rows; returns, per
        epoch, each minibatch's ``(share of the rows, this learner's stats)`` (``None`` stats for an empty share),
        the weights (when ``send_weights``), their version and the count of skipped non-finite updates."""
        policy, group = self.policy, self.collective
        if group is None:
            raise RuntimeError("this learner is in no process group; LearnerGroup forms it")
        policy.set_learner_extras(extras)
        out: list[list[tuple[float, dict[str, Any] | None]]] = []
        with flush_denormals(self.flush_denormal):
            for minibatches in epochs:
                epoch = []
                for rows in minibatches:
                    mine = policy.group_shares(batch, np.asarray(rows), group.world_size)[group.rank].tolist()
                    share = len(mine) / len(rows)
                    policy.collective_weight = share
                    if mine:
                        stats = policy.learn_on_batch(batch.rows(np.asarray(mine, np.int64)))["learner_stats"]
                    else:
                        policy.group_step_without_rows()
                        stats = None
                    epoch.append((share, stats))
                out.append(epoch)
        weights = policy.get_weights() if send_weights else None
        return out, weights, policy.weights_version, policy.num_nonfinite_updates_skipped

    def ping(self) -> str:
        return "ok"


def _weighted_stats(per_learner: Sequence[Sequence[tuple[float, dict[str, Any] | None]]]) -> dict[str, Any]:
    """One epoch's learner stats as a lone learner reports them: per minibatch, the share-weighted sum over the
    learners (a mean over the rows, for a stat that is a mean over the rows), then the mean over minibatches."""
    per_minibatch: list[dict[str, float]] = []
    for parts in zip(*per_learner):
        merged: dict[str, float] = {}
        for share, stats in parts:
            for key, value in (stats or {}).items():
                if key == NONFINITE_UPDATES_SKIPPED or not isinstance(value, (int, float)):
                    continue
                merged[key] = merged.get(key, 0.0) + share * float(value)
        per_minibatch.append(merged)
    keys = list(dict.fromkeys(k for stats in per_minibatch for k in stats))
    return {k: float(np.mean([s[k] for s in per_minibatch if k in s])) for k in keys}


class LearnerGroup:
    """``config.num_learners`` :class:`LearnerActor` s in one process group, learning for the driver's ``policy``.

    Made by :class:`~flowrl.workers.WorkerSet` when ``num_learners > 1``; every learner asks Ray for
    ``num_cpus_per_learner`` CPUs and ``num_gpus_per_learner`` GPUs (gloo between CPU learners, NCCL between GPU
    ones; ``options_for(rank)``, when given, are the learner's actor options: its placement-group bundle) and starts
    from the driver policy's learner state.

    Raises:
        ValueError: a policy that cannot learn in a group (:attr:`~flowrl.policy.Policy.learns_in_groups`).
    """

    def __init__(self, policy: Policy, config: TrainerConfig | Any, *,
                 options_for: Callable[[int], Mapping[str, Any]] | None = None) -> None:
        if not type(policy).learns_in_groups:
            raise ValueError(f"num_learners={config.num_learners}: {type(policy).__name__} cannot learn in a "
                             f"learner group (it keeps learned state the driver updates, such as a target "
                             f"network); set num_learners=1")
        self.config = config
        gpus = config.num_gpus_per_learner
        learner_config = dataclasses.replace(config, device="cuda" if gpus else "cpu")
        if options_for is None:
            def options_for(rank: int) -> Mapping[str, Any]:
                return runtime.actor_options(num_cpus=config.num_cpus_per_learner, num_gpus=gpus)
        def make(rank: int) -> Any:
            return executor.create_actor(LearnerActor, policy_class=type(policy),
                                         observation_space=policy.observation_space,
                                         action_space=policy.action_space, config=learner_config,
                                         num_threads=int(config.num_cpus_per_learner), options=dict(options_for(rank)))

        self._make = make
        self.learners = [make(rank) for rank in range(config.num_learners)]
        self.backend = "nccl" if gpus else "gloo"
        collective.form_group(self.learners, backend=self.backend, timeout_s=config.collective_timeout_s)
        self.push_state(policy)

    def replace(self, dead: Sequence[int], policy: Policy) -> None:
        """Replaces the learners at ranks ``dead`` and re-forms the group; every learner then takes a survivor's
        learner state (its optimizer's moments and steps go on), with ``policy`` (the driver's) taking it too.

        Raises:
            RuntimeError: every learner died: their optimizer state is lost (the message says so).
        """
        if len(dead) == len(self.learners):
            raise RuntimeError(f"all {len(dead)} learners of the learner group died, and their optimizer state with "
                               f"them; restore the last checkpoint to go on")
        survivor = next(rank for rank in range(len(self.learners)) if rank not in dead)
        policy.set_learner_state(executor.get(self.learners[survivor].get_learner_state.remote()))
        for rank in dead:
            executor.kill(self.learners[rank])
            self.learners[rank] = self._make(rank)
        collective.form_group(self.learners, backend=self.backend, timeout_s=self.config.collective_timeout_s)
        self.push_state(policy)

    def push_state(self, policy: Policy) -> None:
        """Every learner adopts ``policy``'s learner state (at the start, and after a restore)."""
        ref = executor.put(policy.get_learner_state())
        executor.get([learner.set_learner_state.remote(ref) for learner in self.learners])

    def pull_state(self, policy: Policy) -> None:
        """``policy`` adopts the group's learner state (rank 0's; every learner holds the same)."""
        policy.set_learner_state(executor.get(self.learners[0].get_learner_state.remote()))

    def learn(self, policy: Policy, batch: SampleBatch, epochs: Epochs, callbacks: Any = None) -> dict[str, Any]:
        """One group step per minibatch of ``epochs`` (row indices into ``batch``); then ``policy`` takes the
        group's weights. Returns ``policy``'s learner info, as :meth:`Policy.learn_on_batch` and
        :func:`~flowrl.ops.train_step.minibatch_sgd` report it (the final epoch's mean stats)."""
        added = before_learning(callbacks, policy, batch) if callbacks is not None else {}
        ref = executor.put(batch)
        extras = policy.learner_extras()
        answers = executor.get([learner.learn.remote(ref, epochs, extras, rank == 0)
                                for rank, learner in enumerate(self.learners)])
        last_epochs = [answer[0][-1] for answer in answers]
        _, weights, version, skipped = answers[0]
        policy.set_weights(weights)
        policy.weights_version, policy.num_nonfinite_updates_skipped = version, skipped
        stats = _weighted_stats(last_epochs)
        if skipped:
            stats[NONFINITE_UPDATES_SKIPPED] = skipped
        return add_learner_stats({"learner_stats": stats}, added)

    def stop(self) -> None:
        """Kills the learners."""
        for learner in self.learners:
            executor.kill(learner)
        self.learners = []
