"""flowrl: distributed reinforcement learning as a dataflow (RLlib Flow, arXiv:2011.12719).

An algorithm is a short *plan* that wires operators over lazy iterators; the iterators run over
sets of Ray actors. Start with :mod:`flowrl.iter`.
"""

from __future__ import annotations

from flowrl import runtime  # first: sets Ray's loopback variable before anything imports ray
from flowrl.iter import LocalIterator, ParallelIterator, from_actors, from_items, from_iterators, from_range
from flowrl.metrics import MetricsContext

__all__ = ["runtime", "LocalIterator", "ParallelIterator", "MetricsContext",
           "from_items", "from_range", "from_iterators", "from_actors"]
__version__ = "0.1.0"
