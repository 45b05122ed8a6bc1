"""Scaling: ParallelRollouts throughput from 1 to 16 rollout workers, on one node and on a local two-node cluster.

Every env step sleeps ``--step-ms`` (1 ms) before CartPole-v1 steps, so an env *waits* rather than computes and
N workers can overlap on 2 cores; the workers act with the dummy policy (one scalar, random
actions: ``benchmarks/dummy.py``), so what scales is the sampling and the dataflow, not a model. For each worker
count N the plan is ``ParallelRollouts(workers, mode)`` over the first N workers, pulled for ``--seconds`` (after
a short untimed warm-up); the figure is env steps/s, the median of ``--repeats`` runs, and the efficiency is
``rate(N) / (N x rate(1))`` (1.0 = linear scaling).

Clusters:

- ``one_node``: one Ray instance declaring 16 logical CPUs;
- ``two_nodes``: a local :class:`ray.cluster_utils.Cluster` of two nodes with 8 logical CPUs each (both on
  127.0.0.1: flowrl sets ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` before Ray is imported); the driver runs on the
  head node. The workers are ordered alternately by node, so the first N workers split evenly between the nodes
  (the table gives the split).

Each worker asks for one logical CPU, so 16 workers fill either cluster. The workers of a cluster start once and
serve every N. Modes: ``async`` (``num_async=2``: a worker always has its next request queued) and
``bulk_sync`` (a round waits for its slowest worker).

Run: ``python benchmarks/scaling.py [--quick] [--workers 1,2,4,8,16] [--clusters one_node,two_nodes]``
(``--quick``: ~2.5 minutes, most of it starting 16 workers per cluster). Writes JSON (and a PNG when matplotlib
imports) to ``benchmarks/results/``; the last line is
``scaling_efficiency_16=<async efficiency at the largest N, one node>``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import flowrl  # noqa: E402  (before ray: flowrl.runtime keeps Ray on loopback)
from flowrl import runtime  # noqa: E402
from flowrl.testing.network import keep_traffic_on_loopback  # noqa: E402
from flowrl.metrics import STEPS_SAMPLED_COUNTER  # noqa: E402
from flowrl.ops.rollout import ParallelRollouts  # noqa: E402
from flowrl.workers import WorkerSet  # noqa: E402

import ray  # noqa: E402,I001

keep_traffic_on_loopback()  # Ray's start-up probe of the cloud metadata address stays on this machine

try:  # run as a script (benchmarks/ on the path) or imported as benchmarks.scaling
    import dummy  # type: ignore[import-not-found,no-redef]
except ImportError:
    from benchmarks import dummy  # type: ignore[no-redef]

RESULTS = Path(__file__).resolve().parent / "results"
CLUSTERS = ("one_node", "two_nodes")
MODES = ("async", "bulk_sync")
NUM_ASYNC = 2


def efficiency(rates: dict[int, float]) -> dict[int, float]:
    """``rate(N) / (N x rate(1))`` for every N (the 1-worker rate must be measured).

    Examples:
        >>> efficiency({1: 1000.0, 2: 1900.0, 4: 3000.0})
        {1: 1.0, 2: 0.95, 4: 0.75}
    """
    return {n: round(rate / (n * rates[1]), 3) for n, rate in rates.items()}


def alternate_by_node(workers: list[Any], nodes: list[str]) -> list[Any]:
    """The workers reordered so that consecutive ones sit on different nodes, as far as the nodes allow.

    Examples:
        >>> alternate_by_node(["a1", "a2", "b1", "a3", "b2"], ["A", "A", "B", "A", "B"])
        ['a1', 'b1', 'a2', 'b2', 'a3']
    """
    by_node: dict[str, list[Any]] = {}
    for worker, node in zip(workers, nodes):
        by_node.setdefault(node, []).append(worker)
    queues, ordered = list(by_node.values()), []
    while any(queues):
        for q in queues:
            if q:
                ordered.append(q.pop(0))
    return ordered


def _pull_for(it: Iterator[Any], seconds: float) -> float:
    """Pulls ``it`` for ``seconds``; returns the env steps per second it counted over that window."""
    counters = it.metrics.counters  # type: ignore[attr-defined]  # a flowrl LocalIterator
    next(it)
    start, steps0 = time.perf_counter(), counters[STEPS_SAMPLED_COUNTER]
    while (elapsed := time.perf_counter() - start) < seconds:
        next(it)
    return float((counters[STEPS_SAMPLED_COUNTER] - steps0) / elapsed)


def measure(workers: WorkerSet, ordered: list[Any], counts: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """Env steps/s per mode and worker count over the first N of ``ordered``."""
    out: dict[str, Any] = {}
    for mode in MODES:
        rates: dict[int, float] = {}
        samples: dict[int, list[float]] = {}
        for n in counts:
            workers.reset(ordered[:n])
            samples[n] = []
            for _ in range(args.repeats):
                it = ParallelRollouts(workers, mode=mode, num_async=NUM_ASYNC)
                samples[n].append(_pull_for(it, args.seconds))
                ray.get([w.ping.remote() for w in ordered[:n]])  # drain what is in flight, untimed
            rates[n] = statistics.median(samples[n])
            print(f"  {mode} N={n}: {rates[n]:,.0f} env steps/s", flush=True)
        out[mode] = {"rates": rates, "efficiency": efficiency(rates), "samples": samples}
    workers.reset(ordered)
    return out


def run_cluster(kind: str, counts: list[int], args: argparse.Namespace) -> dict[str, Any]:
    top = max(counts)
    cluster = None
    if kind == "one_node":
        runtime.init(num_cpus=top, log_to_driver=False)
    else:
        from ray.cluster_utils import Cluster

        per_node = (top + 1) // 2
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": per_node, "include_dashboard": False})
        cluster.add_node(num_cpus=per_node)
        cluster.wait_for_nodes()
        runtime.init(address=cluster.address, log_to_driver=False)
    try:
        dummy.ship_by_value()
        start = time.perf_counter()
        workers = WorkerSet(policy_class=dummy.DummyPolicy,
                            config=dummy.rollout_config(num_workers=top, step_ms=args.step_ms, fragment=args.fragment,
                                                        num_cpus_per_worker=1, seed=0))
        try:
            if workers.check_health(timeout_s=300):
                raise RuntimeError(f"{kind}: a rollout worker did not start within 300 s")
            startup_s = time.perf_counter() - start
            remote = workers.remote_workers()
            nodes = ray.get([w.apply.remote(lambda _: ray.get_runtime_context().get_node_id()) for w in remote])
            ordered = alternate_by_node(remote, nodes)
            node_of = dict(zip(remote, nodes))
            node_names = {node: f"node{i}" for i, node in enumerate(dict.fromkeys(node_of[w] for w in ordered))}
            split = {n: {name: sum(node_of[w] == node for w in ordered[:n]) for node, name in node_names.items()}
                     for n in counts}
            alive = [n for n in ray.nodes() if n["Alive"]]
            addresses = sorted({n["NodeManagerAddress"] for n in alive})
            print(f"{kind}: {len(alive)} node(s) at {addresses}; {top} workers started in {startup_s:.1f} s",
                  flush=True)
            result = measure(workers, ordered, counts, args)
        finally:
            workers.stop()
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    return {"nodes": len(alive), "node_addresses": addresses, "startup_s": round(startup_s, 1),
            "workers_per_node": split, **result}


def plot(results: dict[str, Any], counts: list[int], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for kind, r in results.items():
        for mode in MODES:
            ax.plot(counts, [r[mode]["rates"][n] for n in counts], marker="o", label=f"{kind}, {mode}")
    base = max(r["async"]["rates"][1] for r in results.values())
    ax.plot(counts, [n * base for n in counts], "k--", linewidth=1, label="linear")
    ax.set(xscale="log", yscale="log", xlabel="rollout workers", ylabel="env steps/s",
           title="ParallelRollouts scaling (env step sleeps 1 ms)")
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4,8,16", help="worker counts, comma-separated; must include 1")
    parser.add_argument("--clusters", default=",".join(CLUSTERS), help=f"comma-separated, from {','.join(CLUSTERS)}")
    parser.add_argument("--step-ms", type=float, default=1.0, help="sleep per env step")
    parser.add_argument("--fragment", type=int, default=50, help="env steps per sample()")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per point (median)")
    parser.add_argument("--quick", action="store_true", help="1 s runs, 2 repeats")
    parser.add_argument("--out", type=Path, default=None, help="JSON (default benchmarks/results/scaling[_quick].json)")
    args = parser.parse_args()
    counts = sorted({int(n) for n in args.workers.split(",")})
    kinds = args.clusters.split(",")
    if 1 not in counts:
        parser.error(f"--workers={args.workers} must include 1 (efficiency is relative to one worker)")
    if unknown := set(kinds) - set(CLUSTERS):
        parser.error(f"--clusters: unknown {sorted(unknown)}; use {','.join(CLUSTERS)}")
    if args.quick:
        args.seconds, args.repeats = min(args.seconds, 1.0), min(args.repeats, 2)

    results = {kind: run_cluster(kind, counts, args) for kind in kinds}

    print(f"\nParallelRollouts over N workers; dummy policy; CartPole-v1 sleeping {args.step_ms:g} ms per step; "
          f"fragments of {args.fragment} steps; median of {args.repeats} x {args.seconds:g} s\n")
    print("| cluster | workers per node | mode | " + " | ".join(f"N={n}" for n in counts) + " |")
    print("|---|---|---|" + "---:|" * len(counts))
    for kind, r in results.items():
        split = " / ".join(str(v) for v in r["workers_per_node"][max(counts)].values())
        for mode in MODES:
            cells = [f"{r[mode]['rates'][n]:,.0f} ({r[mode]['efficiency'][n]:.2f})" for n in counts]
            print(f"| {kind} | {split} | {mode} | " + " | ".join(cells) + " |")
    print("\n(env steps/s, and in brackets the efficiency against linear scaling from N=1)")
    stem = f"scaling{'_quick' if args.quick else ''}"
    out = args.out or RESULTS / f"{stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    drew = plot(results, counts, png)
    out.write_text(json.dumps({
        "benchmark": "scaling", "results": results,
        "params": {"workers": counts, "clusters": kinds, "step_ms": args.step_ms, "fragment": args.fragment,
                   "seconds": args.seconds, "repeats": args.repeats, "num_async": NUM_ASYNC, "quick": args.quick},
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "load_avg": os.getloadavg(),
                    "python": platform.python_version(), "ray": ray.__version__, "flowrl": flowrl.__version__}},
        indent=2) + "\n")
    print(f"\nwrote {out}" + (f" and {png}" if drew else ""))
    first = results[kinds[0]]["async"]["efficiency"][max(counts)]
    print(f"scaling_efficiency_{max(counts)}={first:.3f}")


if __name__ == "__main__":
    main()
