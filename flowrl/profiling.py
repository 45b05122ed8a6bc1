"""Per-operator profiling of a running plan, under its established import path: :mod:`flowrl.iter.profiling`
(the profiler, part of the iterator core) re-exported, with :class:`~flowrl.metrics.Summary`, which the profile's
staleness entries use and which lives in :mod:`flowrl.metrics`.

Examples:
    >>> it = enable(iter_list([1, 2, 3]).for_each(abs))
    >>> it.take(3), profile_data(it)["nodes"]["for_each()"]["items_out"]
    ([1, 2, 3], 3)
"""

from __future__ import annotations

from flowrl.iter.profiling import (OUTSIDE_NOTE, SAMPLE_INTERVAL_S, TABLE_WIDTH, Profiler, enable, profile_data,
                                   table)
from flowrl.metrics import Summary

__all__ = ["enable", "profile_data", "table", "Profiler", "Summary", "SAMPLE_INTERVAL_S", "TABLE_WIDTH",
           "OUTSIDE_NOTE"]
