"""Ending what a plan started: the ``on_close`` of a plan that runs a learner thread and actors of its own.

A plan with a learner thread (IMPALA, Ape-X) starts it while it is built and may start actors that only it
uses (IMPALA's aggregators, Ape-X's replay shards when the trainer owns none); closing the plan's iterator
must stop and kill them, or they outlive the plan. :func:`shut_down` is that one step, registered with
``.on_close(lambda: shut_down(learner, actors))``.

Examples:
    >>> import threading
    >>> class Learner(threading.Thread):
    ...     def __init__(self) -> None:
    ...         super().__init__(daemon=True)
    ...         self.stopping = threading.Event()
    ...     def run(self) -> None:
    ...         self.stopping.wait()
    ...     def stop(self) -> None:
    ...         self.stopping.set()
    >>> learner = Learner()
    >>> learner.start()
    >>> shut_down(learner, [])
    >>> learner.is_alive()
    False
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol

from flowrl import executor

__all__ = ["shut_down"]


class _StoppableThread(Protocol):
    def stop(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


def shut_down(learner: _StoppableThread, actors: Iterable[Any] = (), *, timeout_s: float = 30.0) -> None:
    """Stops ``learner`` (``stop()``, then ``join`` for at most ``timeout_s`` seconds) and kills ``actors``
    (Ray actor handles, not restarted).

    Args:
        learner: a learner thread (``LearnerThread``, ``MultiGPULearnerThread``, ``ApexLearnerThread``).
        actors: the actors the plan started for itself alone; actors the trainer owns are not passed.
        timeout_s: how long to wait for the learner's current step to end.
    """
    learner.stop()
    learner.join(timeout=timeout_s)
    for actor in actors:
        executor.kill(actor)
