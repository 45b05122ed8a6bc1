"""flowrl: distributed reinforcement learning as a dataflow (RLlib Flow, arXiv:2011.12719).

An algorithm is a short *plan* that wires operators over lazy iterators; the iterators run over
sets of Ray actors. Start with :mod:`flowrl.iter`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from flowrl import runtime  # first: sets Ray's loopback variable before anything imports ray
from flowrl.iter import LocalIterator, ParallelIterator, from_actors, from_items, from_iterators, from_range
from flowrl.metrics import MetricsContext

if TYPE_CHECKING:
    from flowrl.inference import TrainedPolicy

__all__ = ["runtime", "LocalIterator", "ParallelIterator", "MetricsContext",
           "from_items", "from_range", "from_iterators", "from_actors", "load"]
__version__ = "0.1.0"


def load(path: str | Path, policy_id: str | None = None, *, device: str = "cpu",
         env: str | None = None) -> TrainedPolicy:
    """A trained policy from a checkpoint (or a run directory's latest), built without Ray or workers, with
    ``compute_single_action(obs, explore=False)`` and ``compute_actions(obs_batch, explore=False)``:
    :func:`flowrl.inference.load` (imported on first use, so ``import flowrl`` stays light)."""
    from flowrl.inference import load as load_policy

    return load_policy(path, policy_id, device=device, env=env)
