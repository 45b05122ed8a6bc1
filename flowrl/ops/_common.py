"""Small checks shared by the operator modules (private)."""

from __future__ import annotations

from typing import Any, Collection

import numpy as np

from flowrl.metrics import Summary
from flowrl.sample_batch import DEFAULT_POLICY_ID, WEIGHTS_VERSION, AnyBatch, MultiAgentBatch, SampleBatch
from flowrl.validation import check_int

__all__ = ["check_batch", "check_int", "record_staleness", "staleness_info"]


def check_batch(item: Any, op: object) -> AnyBatch:
    """``item`` if it is a SampleBatch or MultiAgentBatch; otherwise a ValueError naming ``op``."""
    if not isinstance(item, (SampleBatch, MultiAgentBatch)):
        raise ValueError(f"{op!r} consumes SampleBatch or MultiAgentBatch items, got {type(item).__name__}: "
                         f"{item!r:.80}; put it after a rollout or replay stage that yields batches")
    return item


def record_staleness(staleness: Summary, worker: Any, batch: AnyBatch,
                     policies: Collection[str] | None = None) -> None:
    """Adds to ``staleness``, per row of ``batch`` that carries the ``weights_version`` that sampled it, how many
    learner updates ``worker``'s weights of that policy (of ``policies``; ``None``: all) are ahead: the staleness
    of the data when ``worker`` learns on it now. Rows without a version (profiling off) cost one lookup."""
    if isinstance(batch, SampleBatch):
        if WEIGHTS_VERSION not in batch:
            return
        parts = {DEFAULT_POLICY_ID: batch}
    else:
        parts = {pid: part for pid, part in batch.policy_batches.items() if WEIGHTS_VERSION in part}
    version_of = getattr(worker, "weights_version", None)
    if not callable(version_of):
        return
    for pid, part in parts.items():
        if policies is None or pid in policies:
            staleness.add(version_of(pid) - np.asarray(part[WEIGHTS_VERSION], dtype=np.float64))


def staleness_info(staleness: Summary) -> dict[str, Any]:
    """``{"staleness": ...}`` for an operator's ``profile_info()`` once it measured any; ``{}`` before."""
    return {"staleness": staleness.to_data()} if staleness.count else {}
