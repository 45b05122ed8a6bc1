"""Per-operator profile of a running plan: items in and out of every operator, the time spent inside it and the
time spent waiting for its upstream, plus queue depths, requests in flight per shard and the staleness of the
data that learners train on.

Profiling is off by default and costs nothing then: the core builds a plan's stages exactly as always. Turn it on
for a plan before its first pull with :func:`enable` (the :class:`~flowrl.trainer.Trainer` does it when the config
sets ``profile=True``; ``flowrl profile ALGO`` trains that way and prints the table). Read it with
``plan.profile()`` (a table lined up with ``plan.describe()``: one row per operator of
:mod:`flowrl.plan_graph`) or :func:`profile_data` (plain data keyed by the node labels; the trainer puts it in
``result["profile"]``). All numbers are cumulative since the first pull.

How it measures. :func:`enable` builds the plan graph and hands the dataflow a :class:`Profiler`. When the plan
builds its chain (on the first pull), the core passes each built stage to :meth:`Profiler.wrap`, which wraps every
stage that is a node of the graph in a timing wrapper (stages internal to a composite, such as the tags inside
``Concurrently``, stay unwrapped, so their time counts as the composite's). A wrapper counts the real items its
stage emits and splits the wall time of each pull into the time spent in the upstream stages it pulled
(*waiting*) and the rest (*in op*; for a source that includes its waits on actors or queues). The wrappers nest,
so the in-op times add up to the time spent inside the plan, and ``share_of_wall`` is each operator's part of
the wall time since the first pull. ``items_in`` is what the node's inputs emitted (``None`` for a source); for
a learner thread or a bare queue it is what its producers put and ``items_out`` what its readers took.

While the plan is pulled, every ~10 ms (:data:`SAMPLE_INTERVAL_S`) it also samples, per node:

- ``in_flight_per_shard`` (async gathers: ``gather_async``, ``get_shard``): requests submitted to each shard and
  not yet collected, with the gather's ``limit`` (``num_async``);
- ``in_queue_depth`` / ``out_queue_depth`` (learner threads) and ``queue_depth`` (a bare queue), with the
  queue's ``limit`` (its maxsize; ``None`` when unbounded);
- ``buffered`` (``duplicate()`` children): items held for that child (at most 1).

Each is ``{"mean", "max", "limit", "samples"}`` (lists per shard for ``in_flight_per_shard``). An operator or a
learner thread may add entries to its node through a ``profile_info()`` method; those that train add
``staleness``: per trained row, how many learner updates the learner's weights are ahead of the weights that
sampled the row (``{"count", "mean", "min", "max"}``), and learner threads their ``learn_steps``. Staleness
needs rows stamped with ``weights_version``, which rollout workers do when the config sets ``profile``
(:class:`flowrl.testing.FakeWorker` always does). Transforms recorded on a ParallelIterator run in the shard
actors and are not profiled.

Examples:
    >>> it = enable(iter_list(range(6)).filter(lambda x: x % 2 == 0).for_each(lambda x: x * 10))
    >>> it.take(10)
    [0, 20, 40]
    >>> nodes = profile_data(it)["nodes"]
    >>> {label: (node["items_in"], node["items_out"]) for label, node in nodes.items()}
    {'iter_list': (None, 6), 'filter()': (6, 3), 'for_each()': (3, 3)}
    >>> print(it.profile())  # doctest: +ELLIPSIS
    profile: ... s of wall time since the first pull (cumulative)
    named: ...% of the ... s inside pulls is in operators and backoffs (last pull: ...%)
    | operator | in | out | in op s | waiting s | wall % |
    |:...|
    | for_each() | 3 | 3 | ... | ... | ...% |
    | filter() | 6 | 3 | ... |
    | iter_list | - | 6 | ... |
    | (backoff: nothing ready) | | | ... |
    | (between pulls) | | | ... |
    | (unaccounted) | | | ... |
    (backoff: the plan's sleeps inside a pull that found no item ready, ...
"""

from __future__ import annotations

import contextlib
import queue
import textwrap
import time
from collections import Counter
from typing import Any, Callable, Iterator, TypeVar

from flowrl.iter import plan_graph
from flowrl.iter.local import LocalIterator, flow_of, was_pulled
from flowrl.iter.parallel import AsyncSource
from flowrl.iter.pullers import DuplicateChild
from flowrl.iter.stages import END, NOT_READY, Backoff, Puller  # the profiler wraps the core's built stages
from flowrl.metrics import Summary

__all__ = ["enable", "profile_data", "table", "Profiler", "SAMPLE_INTERVAL_S", "TABLE_WIDTH", "OUTSIDE_NOTE"]

T = TypeVar("T")

#: How often (seconds) the queue depths and requests in flight are sampled while the plan is pulled.
SAMPLE_INTERVAL_S = 0.01


class _Gauge:
    """A quantity sampled while the plan is pulled: ``read()`` gives one value, or one per shard."""

    def __init__(self, read: Callable[[], list[float]], limit: float | None, per_shard: bool = False) -> None:
        self.read, self.limit, self.per_shard = read, limit, per_shard
        self.summaries: list[Summary] = []
        self.samples = 0

    def sample(self) -> None:
        values = self.read()
        self.summaries += [Summary() for _ in range(len(values) - len(self.summaries))]
        for summary, value in zip(self.summaries, values):
            summary.add(value)
        self.samples += 1

    def to_data(self) -> dict[str, Any]:
        means = [s.mean if s.count else None for s in self.summaries]
        maxima = [s.max if s.count else None for s in self.summaries]
        if self.per_shard:
            return {"mean": means, "max": maxima, "limit": self.limit, "samples": self.samples}
        return {"mean": means[0] if means else None, "max": maxima[0] if maxima else None, "limit": self.limit,
                "samples": self.samples}


class _NodeStats:
    """What the wrappers of one node measured."""

    def __init__(self) -> None:
        self.wrapped = False
        self.pulls = 0
        self.items_out = 0
        self.inclusive_s = 0.0  # wall time of its pulls, upstream included
        self.waiting_s = 0.0  # the part spent in the upstream stages it pulled


class _Profiled(Puller):
    """A built stage under the profiler: counts its real items and splits each pull's time into its own and
    its upstream's (a stack of the time the active pulls spent in their upstream)."""

    def __init__(self, inner: Puller, stats: _NodeStats, profiler: Profiler) -> None:
        self.inner, self.stats, self.profiler = inner, stats, profiler

    def pull(self, block: bool) -> Any:
        profiler, stats = self.profiler, self.stats
        stack = profiler.stack
        start = time.perf_counter()
        if profiler.start is None:
            profiler.start = start
        stack.append(0.0)
        try:
            item = self.inner.pull(block)
        finally:
            upstream = stack.pop()
            end = time.perf_counter()
            stats.pulls += 1
            stats.inclusive_s += end - start
            stats.waiting_s += upstream
            if stack:
                stack[-1] += end - start
        if item is not NOT_READY and item is not END:
            stats.items_out += 1
        if end >= profiler.next_sample_at:
            profiler.sample(end)
        return item


class Profiler:
    """The profile of one plan: its graph, what each node's wrappers measured and the sampled gauges.

    :func:`enable` makes one; the core calls :meth:`wrap` as it builds each stage of the plan.
    """

    def __init__(self, plan: LocalIterator[Any]) -> None:
        self.plan = plan
        self.graph, self._records = plan_graph.build_with_records(plan)
        self.labels = _unique_labels(self.graph)
        self.stats = {node.id: _NodeStats() for node in self.graph.nodes}
        self.gauges: dict[int, dict[str, _Gauge]] = {node.id: {} for node in self.graph.nodes}
        self.threads: dict[int, Any] = {}  # a learner-thread node -> the thread
        self.stack: list[float] = []
        self.start: float | None = None
        self.next_sample_at = 0.0
        self.depth = 0  # next() calls of the flow's iterators under way (a stage may call next() on another)
        self.pulls_s = 0.0  # wall time inside the outermost next() calls
        self.backoff_s = 0.0  # the part of it slept in backoffs, when no item was ready
        self.last_pull: dict[str, float | None] = {"wall_s": 0.0, "attributed_share": None}
        self._watch_queues()

    @contextlib.contextmanager
    def pulling(self) -> Iterator[None]:
        """Brackets one ``next()`` of an iterator of the plan; the outermost ones add up to ``pulls_s``."""
        start = time.perf_counter()
        if self.start is None:
            self.start = start
        before = (self.backoff_s, self._operators_s()) if self.depth == 0 else None
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if before is not None:
                wall = time.perf_counter() - start
                self.pulls_s += wall
                named = self.backoff_s - before[0] + self._operators_s() - before[1]
                self.last_pull = {"wall_s": wall, "attributed_share": min(1.0, named / wall) if wall > 0 else None}

    def timed_wait(self, backoff: Backoff) -> None:
        """Sleeps ``backoff`` (a pull found nothing ready), counted in ``backoff_s`` for the outermost pull."""
        start = time.perf_counter()
        backoff.wait()
        if self.depth == 1:
            self.backoff_s += time.perf_counter() - start

    def _operators_s(self) -> float:
        return sum(s.inclusive_s - s.waiting_s for s in self.stats.values() if s.wrapped)

    def _watch_queues(self) -> None:
        """Gauges for the queues between an Enqueue and a Dequeue, and for learner threads' queues."""
        for reader in self.graph.nodes:
            fifo = reader.attrs.get("queue")
            if not isinstance(fifo, queue.Queue):
                continue
            for edge in self.graph.inputs(reader.id):
                if not edge.via_queue:
                    continue
                if self.graph.nodes[edge.src].kind == "thread":
                    thread = reader.attrs["producer"]
                    self.threads[edge.src] = thread
                    self.gauges[edge.src]["in_queue_depth"] = _queue_gauge(thread.inqueue)
                    self.gauges[edge.src]["out_queue_depth"] = _queue_gauge(fifo)
                else:
                    self.gauges[edge.src]["queue_depth"] = _queue_gauge(fifo)

    def wrap(self, record: object, puller: Puller) -> Puller:
        """``puller`` (the built stage of ``record``, an origin or a stage) in a timing wrapper if ``record`` is a
        node of the graph; otherwise ``puller`` itself."""
        entry = self._records.get(id(record))
        if entry is None or entry[0] is not record:
            return puller
        node = self.graph.nodes[entry[1]]
        stats = self.stats[node.id]
        stats.wrapped = True
        if node.kind == "gather" and isinstance(puller, AsyncSource):  # a barrier's requests live within one pull
            self.gauges[node.id]["in_flight_per_shard"] = _Gauge(puller.in_flight, puller.num_async, per_shard=True)
        elif node.kind == "duplicate" and isinstance(puller, DuplicateChild):
            held = puller.queue
            self.gauges[node.id]["buffered"] = _Gauge(lambda: [len(held)], 1)
        return _Profiled(puller, stats, self)

    def sample(self, now: float) -> None:
        """Samples every gauge; the wrappers call it at most every :data:`SAMPLE_INTERVAL_S`."""
        self.next_sample_at = now + SAMPLE_INTERVAL_S
        for gauges in self.gauges.values():
            for gauge in gauges.values():
                gauge.sample()

    def _items_in(self, node_id: int) -> int | None:
        kind = self.graph.nodes[node_id].kind
        hop = kind in ("thread", "queue")
        inputs = [e.src for e in self.graph.inputs(node_id) if e.via_queue == hop]
        measured = [self.stats[i].items_out for i in inputs if self.stats[i].wrapped]
        return sum(measured) if measured else None

    def _items_out(self, node_id: int) -> int | None:
        if self.graph.nodes[node_id].kind in ("thread", "queue"):
            readers = [self.stats[e.dst] for e in self.graph.consumers(node_id) if e.via_queue]
            return sum(r.items_out for r in readers if r.wrapped) if any(r.wrapped for r in readers) else None
        stats = self.stats[node_id]
        return stats.items_out if stats.wrapped else None

    def data(self) -> dict[str, Any]:
        """``{"wall_s": seconds since the first pull, "nodes": {label: {...}}, "time": {...}}``, in graph order
        (plain data). ``time`` accounts for the wall time: ``pulls_s`` inside the plan's ``next()`` calls, split
        into ``operators_s`` (in the operators), ``backoff_s`` (sleeping while nothing was ready) and
        ``unaccounted_s`` (the rest: the pull loop itself); ``between_pulls_s`` outside them (the caller's work);
        ``attributed_share``, the part of ``pulls_s`` in operators and backoffs, and ``last_pull``, the same for
        the latest ``next()`` alone (a Trainer's report)."""
        wall = time.perf_counter() - self.start if self.start is not None else 0.0
        nodes: dict[str, Any] = {}
        for node in self.graph.nodes:
            stats = self.stats[node.id]
            in_op = stats.inclusive_s - stats.waiting_s if stats.wrapped else None
            entry: dict[str, Any] = {
                "kind": node.kind, "items_in": self._items_in(node.id), "items_out": self._items_out(node.id),
                "pulls": stats.pulls if stats.wrapped else None, "time_in_op_s": in_op,
                "time_waiting_s": stats.waiting_s if stats.wrapped else None,
                "share_of_wall": (in_op / wall if wall > 0 else 0.0) if in_op is not None else None}
            entry.update({name: gauge.to_data() for name, gauge in self.gauges[node.id].items()})
            owner = self.threads.get(node.id, node.attrs.get("op"))
            info = getattr(owner, "profile_info", None)
            if callable(info):
                entry.update(info())
            nodes[self.labels[node.id]] = entry
        operators = self._operators_s()
        named = operators + self.backoff_s
        accounts = {"pulls_s": self.pulls_s, "operators_s": operators, "backoff_s": self.backoff_s,
                    "unaccounted_s": max(0.0, self.pulls_s - named), "between_pulls_s": max(0.0, wall - self.pulls_s),
                    "attributed_share": min(1.0, named / self.pulls_s) if self.pulls_s > 0 else None,
                    "last_pull": dict(self.last_pull)}
        return {"wall_s": wall, "nodes": nodes, "time": accounts}


def _unique_labels(graph: plan_graph.PlanGraph) -> dict[int, str]:
    """Each node's label; a label that repeats gets `` #2``, `` #3``, ... in graph order."""
    seen: Counter[str] = Counter()
    labels = {}
    for node in graph.nodes:
        seen[node.label] += 1
        labels[node.id] = node.label if seen[node.label] == 1 else f"{node.label} #{seen[node.label]}"
    return labels


def _queue_gauge(fifo: queue.Queue[Any]) -> _Gauge:
    return _Gauge(lambda: [fifo.qsize()], fifo.maxsize if fifo.maxsize > 0 else None)


def enable(plan: LocalIterator[T]) -> LocalIterator[T]:
    """Turns on per-operator profiling for ``plan`` and returns it; call it before the plan's first pull.

    It records the plan graph now; the stages are wrapped when the plan builds its chain. Enabling a plan that is
    already profiled changes nothing.

    Raises:
        TypeError: ``plan`` is not a LocalIterator.
        ValueError: ``plan`` has already been pulled (its chain is built, unwrapped).
    """
    if not isinstance(plan, LocalIterator):
        raise TypeError(f"enable() profiles a plan (a LocalIterator), got {type(plan).__name__}")
    if was_pulled(plan):
        raise ValueError(f"{plan!r:.120} has already been pulled, so its stages are built without the profiler; "
                         f"enable profiling right after building the plan, before its first pull")
    flow = flow_of(plan)
    if not isinstance(flow.profiler, Profiler) or flow.profiler.plan is not plan:
        flow.profiler = Profiler(plan)
    return plan


def _profiler_of(plan: LocalIterator[Any]) -> Profiler:
    profiler = flow_of(plan).profiler
    if not isinstance(profiler, Profiler):
        raise ValueError(f"profiling is off for {plan!r:.120}; turn it on before the first pull with "
                         f"flowrl.profiling.enable(plan), or TrainerConfig(profile=True) for a trainer")
    return profiler


def profile_data(plan: LocalIterator[Any]) -> dict[str, Any]:
    """The profile as plain data: ``{"wall_s": float, "nodes": {label: {...}}}`` (see the module docstring).

    Raises:
        ValueError: profiling is off for ``plan``.
    """
    return _profiler_of(plan).data()


def _number(value: Any, spec: str = "d") -> str:
    return "-" if value is None else format(value, spec)


def _gauge_note(name: str, gauge: dict[str, Any]) -> str:
    of = f" of {gauge['limit']:g}" if gauge.get("limit") is not None else ""
    if isinstance(gauge["mean"], list):
        means = [m for m in gauge["mean"] if m is not None]
        if not means:
            return ""
        if len(means) <= 4:
            return f"{name} {', '.join(f'{m:.1f}' for m in means)}{of}"
        return f"{name} {sum(means) / len(means):.1f} (max {max(m for m in gauge['max'] if m is not None):g}){of}"
    return "" if gauge["mean"] is None else f"{name} {gauge['mean']:.1f} (max {gauge['max']:g}){of}"


_GAUGE_NAMES = {"in_flight_per_shard": "in flight/shard", "queue_depth": "queue", "in_queue_depth": "in-queue",
                "out_queue_depth": "out-queue", "buffered": "buffered"}


def _notes(entry: dict[str, Any]) -> str:
    notes = []
    staleness = entry.get("staleness")
    if isinstance(staleness, dict) and staleness.get("count"):
        notes.append(f"staleness {staleness['mean']:.1f} (max {staleness['max']:g})")
    for key, name in _GAUGE_NAMES.items():
        if isinstance(entry.get(key), dict):
            notes.append(_gauge_note(name, entry[key]))
    return "; ".join(n for n in notes if n)


#: :func:`table` fits its lines in this many columns (a longer operator line is cut; notes wrap).
TABLE_WIDTH = 100

#: What the table's last rows count, said under the table.
OUTSIDE_NOTE = ("(backoff: the plan's sleeps inside a pull that found no item ready, as an async plan waits for "
                "its workers or learner; between pulls: the caller's own work, such as a Trainer's result "
                "handling, logging and checkpoints between train() calls; unaccounted: the rest of the time "
                "inside pulls, the pull loop itself)")


def table(plan: LocalIterator[Any]) -> str:
    """The profile as a markdown-like table, one row per line of ``plan.describe()`` (``LocalIterator.profile()``),
    within :data:`TABLE_WIDTH` columns.

    Columns: items in and out, seconds in the operator and waiting for its upstream, and its share of the wall
    time. Three last rows hold the rest of the wall time: the backoff sleeps inside pulls, the time between pulls
    and the time inside pulls that no operator or backoff accounts for, explained under the table
    (:data:`OUTSIDE_NOTE`); the first line says which share of the time inside pulls is named; then the notes of the operators that have some (staleness, queue depths, requests in
    flight per shard).

    Raises:
        ValueError: profiling is off for ``plan``.
    """
    profiler = _profiler_of(plan)
    data = profiler.data()
    wall, nodes = data["wall_s"], data["nodes"]
    rows = [("operator", "in", "out", "in op s", "waiting s", "wall %")]
    notes: list[tuple[str, str]] = []
    for node_id, line, repeat in plan_graph.text_rows(profiler.graph):
        entry = nodes[profiler.labels[node_id]]
        if repeat:
            rows.append((line, "", "", "", "", ""))
            continue
        share = entry["share_of_wall"]
        rows.append((line, _number(entry["items_in"]), _number(entry["items_out"]),
                     _number(entry["time_in_op_s"], ".3f"), _number(entry["time_waiting_s"], ".3f"),
                     "-" if share is None else f"{100 * share:.1f}%"))
        if note := _notes(entry):
            notes.append((profiler.labels[node_id], note))
    accounts = data["time"]

    def percent(seconds: float) -> str:
        return f"{100 * seconds / wall:.1f}%" if wall > 0 else "-"

    for name, key in (("(backoff: nothing ready)", "backoff_s"), ("(between pulls)", "between_pulls_s"),
                      ("(unaccounted)", "unaccounted_s")):
        rows.append((name, "", "", f"{accounts[key]:.3f}", "", percent(accounts[key])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    widths[0] = min(widths[0], TABLE_WIDTH - sum(w + 3 for w in widths[1:]) - 4)
    right = [False, True, True, True, True, True]

    def render(cells: tuple[str, ...]) -> str:
        first = cells[0] if len(cells[0]) <= widths[0] else cells[0][:widths[0] - 3] + "..."
        return "| " + " | ".join(c.rjust(w) if r else c.ljust(w)
                                 for c, w, r in zip((first, *cells[1:]), widths, right)) + " |"

    def wrap(text: str, indent: str = "") -> list[str]:
        return textwrap.wrap(text, width=TABLE_WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                             break_on_hyphens=False)

    rule = "|" + "|".join((("-" * (w + 1)) + ":" if r else ":" + "-" * (w + 1)) for w, r in zip(widths, right)) + "|"
    attributed, last = accounts["attributed_share"], accounts["last_pull"]["attributed_share"]
    lines = [f"profile: {wall:.3f} s of wall time since the first pull (cumulative)",
             f"named: {'-' if attributed is None else f'{100 * attributed:.1f}%'} of the {accounts['pulls_s']:.3f} s "
             f"inside pulls is in operators and backoffs (last pull: {'-' if last is None else f'{100 * last:.1f}%'})",
             render(rows[0]), rule,
             *[render(row) for row in rows[1:]], *wrap(OUTSIDE_NOTE)]
    if notes:
        lines += ["notes:", *[line for label, note in notes for line in wrap(f"{label}: {note}", "  ")]]
    return "\n".join(lines)
