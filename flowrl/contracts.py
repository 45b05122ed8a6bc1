"""The contracts the operators rely on, as ``typing.Protocol``s: what a plan's pieces must offer each other.

An operator never needs a concrete class, only these few methods, so a test fake (``flowrl.testing``) or a
user's own buffer stands in for the real thing:

- :class:`WorkerLike`: the local rollout worker, what ``WorkerSet.local_worker()`` returns (a
  :class:`~flowrl.workers.RolloutWorker`, or a fake): it samples, learns and holds the weights.
- :class:`PolicyLike`: what operators call on one of its policies (the target-network and KL hooks).
- :class:`ReplayWriter` / :class:`ReplayReader` / :class:`PriorityUpdater`: storing into replay
  (``StoreToReplayBuffer``), reading from it (``Replay``) and feeding TD errors back (``UpdatePriorities``)
  are three roles; :class:`~flowrl.replay_buffers.LocalReplayBuffer` plays all three.
- :class:`LearnerThreadLike`: a learner thread, as the plans drive it (queues, start and stop) and as the
  weight-broadcast operators read it (the weights flag and lock).

mypy checks the real classes and the fakes against these (a conformance function in the module that owns
each class); the operators that take a user's object check it at construction with :func:`check_conforms`.
This module imports neither torch nor anything above the RL substrate.

Examples:
    >>> from flowrl.replay_buffers import LocalReplayBuffer
    >>> buf = LocalReplayBuffer(learning_starts=0)
    >>> isinstance(buf, ReplayWriter), isinstance(buf, ReplayReader), isinstance(buf, PriorityUpdater)
    (True, True, True)
    >>> check_conforms(buf, ReplayReader, "Replay local_buffer")  # passes: it has replay()
"""

from __future__ import annotations

import inspect
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    import queue

    import numpy as np

    from flowrl.config import RolloutConfig
    from flowrl.envs.base import EpisodeRecord
    from flowrl.sample_batch import AnyBatch, MultiAgentBatch

__all__ = ["WorkerLike", "PolicyLike", "ReplayWriter", "ReplayReader", "PriorityUpdater", "LearnerThreadLike",
           "check_conforms"]


@runtime_checkable
class PolicyLike(Protocol):
    """What operators call on a worker's policy (``worker.get_policy(pid)``): ``UpdateTargetNetwork`` and
    ``UpdateKL``. :class:`~flowrl.policy.Policy` has both (raising where the algorithm has no target network or
    KL coefficient)."""

    def update_target(self) -> None:
        """Copies the online network into the target network."""
        ...

    def update_kl(self, sampled_kl: float) -> None:
        """Adapts the KL coefficient to the KL measured on the last train batch."""
        ...


@runtime_checkable
class WorkerLike(Protocol):
    """The local rollout worker as the operators and the trainer use it (``WorkerSet.local_worker()``).

    Sampling (``ParallelRollouts``), learning (``LearnOnBatch``, ``ComputeGradients``/``ApplyGradients``, the
    learner threads), weights (``WorkerSet`` broadcasts, staleness), the policies' hooks, episode metrics
    (``CollectMetrics``) and checkpoints (``Trainer``). Remote workers are Ray actors of the same class.
    """

    @property
    def config(self) -> RolloutConfig:
        """The worker's rollout config (``LearnOnBatch`` seeds its minibatch order from ``seed``)."""
        ...

    @property
    def policies_to_train(self) -> list[str]:
        """The ids of the policies this worker trains."""
        ...

    def sample(self) -> AnyBatch:
        """One fragment of experience."""
        ...

    def get_metrics(self) -> list[EpisodeRecord]:
        """The episodes finished since the last call."""
        ...

    def learn_on_batch(self, batch: AnyBatch) -> dict[str, dict[str, Any]]:
        """Trains each policy to train on its part of ``batch``; ``{pid: {"learner_stats": ...}}``."""
        ...

    def compute_gradients(self, batch: AnyBatch) -> tuple[dict[str, list[np.ndarray]], dict[str, Any]]:
        """``({pid: gradients}, {pid: info})`` of each policy to train, without applying them."""
        ...

    def apply_gradients(self, grads: Mapping[str, list[np.ndarray]]) -> None:
        """One optimizer step per policy in ``grads``."""
        ...

    def get_policy(self, policy_id: str = ...) -> PolicyLike:
        """The policy ``policy_id`` (default: the single-agent one)."""
        ...

    def weights_version(self, policy_id: str = ...) -> int:
        """The version of a policy's weights (its optimizer steps, or the version it was sent)."""
        ...

    def get_weights(self, policies: Sequence[str] | None = None) -> dict[str, dict[str, np.ndarray]]:
        """Each policy's weights by name (``policies``; ``None``: all)."""
        ...

    def set_weights(self, weights: Mapping[str, Mapping[str, np.ndarray]],
                    global_vars: Mapping[str, Any] | None = None) -> None:
        """Loads the weights of the policies in ``weights``, then ``global_vars`` if given."""
        ...

    def set_global_vars(self, global_vars: Mapping[str, Any]) -> None:
        """Hands ``global_vars`` (``{"timestep": ...}``) to every policy."""
        ...

    def get_state(self) -> dict[str, Any]:
        """Everything a checkpoint holds of the worker, as plain data."""
        ...

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores what :meth:`get_state` returned."""
        ...

    def close_output(self) -> dict[str, Any]:
        """Writes out and closes what the worker recorded (``config.output``); what was written."""
        ...


@runtime_checkable
class ReplayWriter(Protocol):
    """Where ``StoreToReplayBuffer(local_buffer=...)`` stores experience."""

    def add_batch(self, batch: AnyBatch) -> None:
        """Stores ``batch``."""
        ...


@runtime_checkable
class ReplayReader(Protocol):
    """What ``Replay(local_buffer=...)`` polls."""

    def replay(self) -> AnyBatch | None:
        """A training batch, or ``None`` while there is nothing to replay yet (before ``learning_starts``)."""
        ...


@runtime_checkable
class PriorityUpdater(Protocol):
    """Where ``UpdatePriorities`` sends the learner's TD errors (a prioritized buffer)."""

    def update_priorities(self, prio_dict: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """``{pid: (batch_indexes, td_errors)}``: new priorities for the replayed rows."""
        ...


@runtime_checkable
class LearnerThreadLike(Protocol):
    """A learner thread (:class:`~flowrl.ops.LearnerThread` and its kin): plans feed ``inqueue``, drain
    ``outqueue``, start it and stop it on close; ``BroadcastUpdateLearnerWeights``, ``UpdateWorkerWeights`` and
    ``UpdateTargetNetwork`` read its weights under ``weights_lock`` and clear ``weights_updated``;
    ``UpdateReplayShardPriorities`` passes on its ``learner_info``."""

    weights_updated: bool  # set by the thread after each update, cleared by whoever broadcasts the weights

    @property
    def inqueue(self) -> queue.Queue[Any]:
        """What the thread trains on."""
        ...

    @property
    def outqueue(self) -> queue.Queue[Any]:
        """What it reports after each step."""
        ...

    @property
    def weights_lock(self) -> AbstractContextManager[Any]:
        """Held while the thread changes the weights."""
        ...

    @property
    def learner_info(self) -> dict[str, Any]:
        """The last step's ``{pid: learner info}``."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None:
        """Asks the thread to end after its current step."""
        ...

    def join(self, timeout: float | None = None) -> None: ...

    def is_alive(self) -> bool: ...

    def add_learner_metrics(self, result: dict[str, Any]) -> dict[str, Any]:
        """Adds the thread's queue, learner and timing info to a report; returns it."""
        ...


def check_conforms(value: object, protocol: type, what: str, fix: str | None = None) -> None:
    """Refuses ``value`` (given as ``what``, e.g. ``"Replay local_buffer"``) unless it has every method of
    ``protocol``, one of this module's contracts; the error names the first method missing and ``fix`` (default:
    pass an object with the protocol's methods). For operators that take a user's object: the error comes at
    construction, not at the first call inside a running plan.

    Raises:
        ValueError: naming ``what``, the value, the missing method and the fix.

    Examples:
        >>> class Buffer:
        ...     def add_batch(self, batch): pass
        >>> check_conforms(Buffer(), ReplayWriter, "StoreToReplayBuffer local_buffer")
        >>> check_conforms(Buffer(), PriorityUpdater, "UpdatePriorities local_buffer")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: UpdatePriorities local_buffer=<...Buffer object at ...> has no update_priorities() method; pass an
        object with the methods of flowrl.contracts.PriorityUpdater
    """
    missing = [name for name, member in vars(protocol).items()
               if not name.startswith("_") and inspect.isfunction(member) and not callable(getattr(value, name, None))]
    if missing:
        raise ValueError(f"{what}={value!r} has no {missing[0]}() method; "
                         f"{fix or f'pass an object with the methods of flowrl.contracts.{protocol.__name__}'}")
