"""Lazy iterators over Ray actors: the dataflow core of flowrl.

A :class:`LocalIterator` is a lazy, single-consumer stream in one process; a :class:`ParallelIterator`
describes a sharded stream whose recorded transforms run inside the shard actors, and becomes local
through a gather. Internally every stage answers ``pull(block)`` with an item, ``NOT_READY`` or
``END``; the not-ready signal never leaves this package.

The package, by role (each module's docstring is its reference):

- :mod:`flowrl.iter.stages`: the signals, the built-stage base, what an iterator records (stages, origins) and
  the metrics flow its iterators share;
- :mod:`flowrl.iter.pullers`: the built stages of a local iterator, ``union`` and ``duplicate`` included;
- :mod:`flowrl.iter.local`: :class:`LocalIterator`;
- :mod:`flowrl.iter.shards`: the shard actor protocol (:class:`ParallelIteratorWorker`) and its wire format;
- :mod:`flowrl.iter.parallel`: :class:`ParallelIterator`, its constructors and its gathers;
- :mod:`flowrl.iter.plan_graph`: the operator graph of a plan (also :mod:`flowrl.plan_graph`);
- :mod:`flowrl.iter.profiling`: the per-operator profiler (also :mod:`flowrl.profiling`).

Examples:
    >>> it = from_range(4, num_shards=2)
    >>> it
    ParallelIterator[from_range[4, shards=2]]
    >>> it.gather_sync().take(4)
    [0, 2, 1, 3]
    >>> it.filter(lambda x: x < 3).gather_sync().take(4)
    [0, 2, 1]
    >>> iter_list([1, 2, 3]).union(iter_list([4, 5, 6])).take(6)
    [1, 4, 2, 5, 3, 6]
"""

from __future__ import annotations

from flowrl.iter.local import LocalIterator
from flowrl.iter.parallel import (ParallelIterator, ShardTimeoutError, from_actors, from_items, from_iterators,
                                  from_range)
# (SHARD_END and SHARD_SUPERSEDED, outside __all__, were importable from flowrl.iter before it became a package)
from flowrl.iter.shards import SHARD_END, SHARD_SUPERSEDED, ParallelIteratorWorker, get_shard_worker
from flowrl.iter.stages import RetryLater, get_metrics
from flowrl.metrics import MetricsContext, Timer

__all__ = [
    "LocalIterator", "ParallelIterator", "ParallelIteratorWorker", "RetryLater", "ShardTimeoutError",
    "from_items", "from_range", "from_iterators", "from_actors", "get_metrics", "get_shard_worker",
    "MetricsContext", "Timer",
]
