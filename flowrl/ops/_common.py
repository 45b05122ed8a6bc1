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


def check_int(what: str, value: object, low: int, meaning: str = "") -> None:
    """A ValueError unless ``value`` is an int (not a bool) >= ``low``; ``meaning`` explains the field."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{what}={value!r} must be an int >= {low}" + (f" ({meaning})" if meaning else ""))
