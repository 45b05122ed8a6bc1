"""flowrl's segment trees against a plain recursive Python segment tree (the OpenAI-baselines design).

The reference keeps its nodes in a Python list, reduces a range recursively from the root and sets a leaf by
recomputing its ancestors; flowrl keeps a numpy array (for its batched paths) and walks it through a memoryview.
Both trees hold the same leaves: ``2**20`` of them, every 97th set to a random value. Measured, per operation:

- ``sum(5, 60000)`` and ``min(5, 60000)``, 10,000 times (the reduction every prioritized sample does);
- 10,000 single writes ``tree[i] = v`` at random leaves, on a sum tree and a min tree;
- ``find_prefixsum_idx`` 10,000 times at random masses;
- the batched paths of the prioritized buffer, which the reference does one item at a time: ``set_many`` of
  64 and 1,024 leaves (priority updates) and ``find_prefixsum_idxes`` of 512 masses (one sample's draws).

Each round times flowrl and the reference back to back, alternating which goes first, in CPU seconds of this
process (``time.process_time``: other processes on a busy machine count less than in wall time); the table shows
medians over ``--repeats`` rounds and the ratio flowrl / reference (below 1: flowrl is faster). JSON goes to ``--out``
(default ``benchmarks/results/segment_tree.json``), with the load average before and after.

Run: ``python benchmarks/segment_tree.py [--quick] [--repeats 7]`` (``--quick``: 3 rounds, a few seconds).
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from flowrl.segment_tree import MinSegmentTree, SegmentTree, SumSegmentTree

OUT = Path(__file__).resolve().parent / "results" / "segment_tree.json"
CAPACITY = 1 << 20
CALLS = 10_000


class ReferenceTree:
    """A plain recursive segment tree over a Python list (OpenAI baselines' ``SegmentTree``)."""

    def __init__(self, capacity: int, operation: Callable[[Any, Any], Any], neutral_element: float) -> None:
        self.capacity, self.operation = capacity, operation
        self.value = [neutral_element] * (2 * capacity)

    def _reduce(self, start: int, end: int, node: int, node_start: int, node_end: int) -> Any:
        if start == node_start and end == node_end:
            return self.value[node]
        mid = (node_start + node_end) // 2
        if end <= mid:
            return self._reduce(start, end, 2 * node, node_start, mid)
        if mid + 1 <= start:
            return self._reduce(start, end, 2 * node + 1, mid + 1, node_end)
        return self.operation(self._reduce(start, mid, 2 * node, node_start, mid),
                              self._reduce(mid + 1, end, 2 * node + 1, mid + 1, node_end))

    def reduce(self, start: int, end: int) -> Any:
        """``operation`` over the leaves ``[start, end)`` (end > start)."""
        return self._reduce(start, end - 1, 1, 0, self.capacity - 1)

    def __setitem__(self, idx: int, val: float) -> None:
        idx += self.capacity
        self.value[idx] = val
        idx //= 2
        while idx >= 1:
            self.value[idx] = self.operation(self.value[2 * idx], self.value[2 * idx + 1])
            idx //= 2

    def find_prefixsum_idx(self, prefixsum: float) -> int:
        idx = 1
        while idx < self.capacity:
            if self.value[2 * idx] > prefixsum:
                idx = 2 * idx
            else:
                prefixsum -= self.value[2 * idx]
                idx = 2 * idx + 1
        return idx - self.capacity


def build(seed: int) -> dict[str, Any]:
    """flowrl's and the reference's sum and min trees over the same leaves."""
    rng = np.random.default_rng(seed)
    idx = np.arange(0, CAPACITY, 97)
    vals = rng.random(idx.size)
    trees: dict[str, Any] = {"flowrl_sum": SumSegmentTree(CAPACITY), "flowrl_min": MinSegmentTree(CAPACITY),
                             "ref_sum": ReferenceTree(CAPACITY, operator.add, 0.0),
                             "ref_min": ReferenceTree(CAPACITY, min, float("inf"))}
    for name in ("flowrl_sum", "flowrl_min"):
        trees[name].set_many(idx, vals)
    for name in ("ref_sum", "ref_min"):
        for i, v in zip(idx.tolist(), vals.tolist()):
            trees[name][i] = v
    assert trees["flowrl_sum"].sum(5, 60000) == trees["ref_sum"].reduce(5, 60000)
    assert trees["flowrl_min"].min(5, 60000) == trees["ref_min"].reduce(5, 60000)
    return trees


def cases(trees: dict[str, Any], rng: np.random.Generator) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """Per operation, (flowrl, reference) closures doing the same work."""
    fs, fm, rs, rm = trees["flowrl_sum"], trees["flowrl_min"], trees["ref_sum"], trees["ref_min"]
    leaves = rng.integers(0, CAPACITY, CALLS).tolist()
    values = rng.random(CALLS).tolist()
    masses = (rng.random(CALLS) * fs.sum()).tolist()
    batch64, batch1k = rng.integers(0, CAPACITY, 64), rng.integers(0, CAPACITY, 1024)
    vals64, vals1k = rng.random(64), rng.random(1024)
    draws = rng.random(512) * fs.sum()

    def reduce_loop(fn: Callable[[int, int], Any]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(CALLS):
                fn(5, 60000)
        return run

    def write_loop(tree: Any) -> Callable[[], None]:
        def run() -> None:
            for i, v in zip(leaves, values):
                tree[i] = v
        return run

    def descend_loop(fn: Callable[[float], int]) -> Callable[[], None]:
        def run() -> None:
            for m in masses:
                fn(m)
        return run

    def set_many(tree: SegmentTree, idx: np.ndarray, vals: np.ndarray) -> Callable[[], None]:
        return lambda: tree.set_many(idx, vals)

    def ref_set_many(tree: ReferenceTree, idx: np.ndarray, vals: np.ndarray) -> Callable[[], None]:
        def run() -> None:
            for i, v in zip(idx.tolist(), vals.tolist()):
                tree[i] = v
        return run

    def ref_descend_many() -> None:
        for m in draws.tolist():
            rs.find_prefixsum_idx(m)

    return {
        f"{CALLS:,} x sum(5, 60000)": (reduce_loop(fs.sum), reduce_loop(rs.reduce)),
        f"{CALLS:,} x min(5, 60000)": (reduce_loop(fm.min), reduce_loop(rm.reduce)),
        f"{CALLS:,} single writes, sum tree": (write_loop(fs), write_loop(rs)),
        f"{CALLS:,} single writes, min tree": (write_loop(fm), write_loop(rm)),
        f"{CALLS:,} x find_prefixsum_idx": (descend_loop(fs.find_prefixsum_idx), descend_loop(rs.find_prefixsum_idx)),
        "set_many of 64 leaves (sum)": (set_many(fs, batch64, vals64), ref_set_many(rs, batch64, vals64)),
        "set_many of 1,024 leaves (sum)": (set_many(fs, batch1k, vals1k), ref_set_many(rs, batch1k, vals1k)),
        "find_prefixsum_idxes of 512 masses": (lambda: fs.find_prefixsum_idxes(draws), ref_descend_many),
    }


def timed(fn: Callable[[], Any]) -> float:
    """CPU seconds of ``fn()``: this process's own time, so other processes on a busy machine count less."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="rounds (medians over them); >= 1")
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument("--out", type=Path, default=OUT, help=f"JSON path (default {OUT})")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    if repeats < 1:
        parser.error(f"--repeats={repeats} must be >= 1")
    load_before = os.getloadavg()
    trees = build(seed=0)
    ops = cases(trees, np.random.default_rng(1))
    times: dict[str, dict[str, list[float]]] = {name: {"flowrl": [], "reference": []} for name in ops}
    for rnd in range(repeats):
        for name, (flowrl_fn, ref_fn) in ops.items():
            order = [("flowrl", flowrl_fn), ("reference", ref_fn)]
            for side, fn in order if rnd % 2 == 0 else order[::-1]:
                times[name][side].append(timed(fn))
    rows: list[dict[str, Any]] = []
    print(f"\n{CAPACITY:,}-leaf trees; medians of {repeats} rounds (CPU seconds); load average before "
          f"{load_before[0]:.2f}\n")
    print("| operation | flowrl CPU s | reference CPU s | flowrl / reference |")
    print("|---|---:|---:|---:|")
    for name, sides in times.items():
        flowrl_s, ref_s = statistics.median(sides["flowrl"]), statistics.median(sides["reference"])
        rows.append({"operation": name, "flowrl_s": flowrl_s, "reference_s": ref_s, "ratio": flowrl_s / ref_s,
                     "flowrl_runs_s": sides["flowrl"], "reference_runs_s": sides["reference"]})
        print(f"| {name} | {flowrl_s:.4f} | {ref_s:.4f} | {flowrl_s / ref_s:.2f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "capacity": CAPACITY, "repeats": repeats, "rows": rows,
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "numpy": np.__version__, "load_avg_before": load_before, "load_avg_after": os.getloadavg()},
    }, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    print(f"worst_ratio={max(r['ratio'] for r in rows):.3f}")


if __name__ == "__main__":
    main()
