"""Small checks shared by the operator modules (private)."""

from __future__ import annotations

from typing import Any

from flowrl.sample_batch import AnyBatch, MultiAgentBatch, SampleBatch


def check_batch(item: Any, op: object) -> AnyBatch:
    """``item`` if it is a SampleBatch or MultiAgentBatch; otherwise a ValueError naming ``op``."""
    if not isinstance(item, (SampleBatch, MultiAgentBatch)):
        raise ValueError(f"{op!r} consumes SampleBatch or MultiAgentBatch items, got {type(item).__name__}: "
                         f"{item!r:.80}; put it after a rollout or replay stage that yields batches")
    return item
