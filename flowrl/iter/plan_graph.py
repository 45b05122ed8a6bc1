"""Plan inspection: the operator graph of a built plan, as text, Graphviz DOT or Mermaid, and the checks
that catch a miswired plan before launch.

Iterators record at build time where their stream starts (a source, a gather, a union, a duplicate
child, a named composite) next to their stages; :func:`build` walks those records without pulling
anything. The graph is a DAG: a stream read by several consumers (the parent of ``duplicate()``) is one
node, and a learner thread sits between the ``Enqueue`` that feeds it and the ``Dequeue`` that reads it.
``LocalIterator.describe()`` and ``LocalIterator.validate()`` are the short ways in.
An algorithm's plan drawn without running anything (:func:`flowrl.plan_graph.stand_in_plan`) is built above
the core, in :mod:`flowrl.plan_graph`, which also re-exports this module.

Examples:
    >>> import queue
    >>> from flowrl.ops import Concurrently, Dequeue, Enqueue
    >>> q = queue.Queue(maxsize=1)
    >>> plan = Concurrently([iter_list([1, 2]).for_each(Enqueue(q)), Dequeue(q)], mode="async", output_indexes=[1])
    >>> print(plan.describe())
    Concurrently(async, output_indexes=[1])
      [0] for_each(Enqueue(maxsize=1)) @1
          iter_list
      [1] Dequeue
            <~ queue(maxsize=1)
                 <~ for_each(Enqueue(maxsize=1)) @1 (shown above)
    >>> graph = build(plan)
    >>> [(node.kind, node.label) for node in graph.nodes]  # doctest: +NORMALIZE_WHITESPACE
    [('source', 'iter_list'), ('transform', 'for_each(Enqueue(maxsize=1))'), ('source', 'Dequeue'),
     ('union', 'Concurrently(async, output_indexes=[1])'), ('queue', 'queue(maxsize=1)')]
    >>> print(to_mermaid(graph))
    flowchart LR
      n0(["iter_list"])
      n1["for_each(Enqueue(maxsize=1))"]
      n2(["Dequeue"])
      n3{{"Concurrently(async, output_indexes=[1])"}}
      n4[("queue(maxsize=1)")]
      n0 --> n1
      n1 -->|0| n3
      n2 -->|1| n3
      n4 -.-> n2
      n1 -.-> n4
"""

from __future__ import annotations

import queue
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from flowrl.iter.local import LocalIterator, origin_of, stages_of
from flowrl.iter.parallel import ParallelIterator
from flowrl.iter.stages import Origin
from flowrl.metrics import MetricsBinding, MetricsContext

__all__ = ["Node", "Edge", "PlanGraph", "build", "build_with_records", "to_text", "text_rows", "to_dot", "to_mermaid",
           "problems", "operator_names", "summary"]


@dataclass(frozen=True)
class Node:
    """One operator of a plan.

    Attributes:
        id: its index in :attr:`PlanGraph.nodes`.
        kind: ``"source"`` (a local source: ``iter_list``, ``Replay(local)``, ``Dequeue``), ``"parallel"`` (a
            ParallelIterator: ``attrs["shards"]``), ``"gather"`` (``attrs["num_async"]`` for async ones),
            ``"transform"`` (``attrs["method"]`` and ``attrs["op"]``, the callable), ``"named"`` (a composite
            such as ``ParallelRollouts(async)``, over its internals), ``"union"`` (``LocalUnion`` or
            ``Concurrently``: ``attrs["mode"]``, ``["round_robin_weights"]``, ``["output_indexes"]``),
            ``"duplicate"`` (one child: ``attrs["index"]`` of ``attrs["n"]``), ``"thread"`` (a learner thread
            between its in-queue and out-queue) or ``"queue"`` (a bare queue between Enqueue and Dequeue).
        label: the operator as the iterator's repr names it.
        attrs: what its kind records, as above.
    """

    id: int
    kind: str
    label: str
    attrs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Edge:
    """Items flow from node ``src`` to node ``dst``: ``dst`` pulls ``src``, or, with ``via_queue``,
    ``src`` fills a queue that ``dst`` reads. ``index`` is the input's position in a union."""

    src: int
    dst: int
    index: int | None = None
    via_queue: bool = False


@dataclass(frozen=True)
class PlanGraph:
    """The operator DAG of a plan; ``output`` is the node whose items the plan yields."""

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    output: int

    def inputs(self, node: int) -> list[Edge]:
        """The edges into ``node``, union inputs in order."""
        return [e for e in self.edges if e.dst == node]

    def consumers(self, node: int) -> list[Edge]:
        """The edges out of ``node``."""
        return [e for e in self.edges if e.src == node]


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.edges: list[Edge] = []
        self.seen: dict[int, tuple[object, int]] = {}  # id(record) -> (record, node); holds the record alive

    def add(self, kind: str, label: str, inputs: list[int], **attrs: Any) -> int:
        node = len(self.nodes)
        self.nodes.append(Node(node, kind, label, attrs))
        union = kind == "union"
        self.edges += [Edge(src, node, i if union else None) for i, src in enumerate(inputs)]
        return node

    def once(self, record: object, make: Callable[..., int], *args: Any, **kwargs: Any) -> int:
        """The node of a recorded object (an origin, a stage, ...): ``make(*args, **kwargs)`` the first time."""
        if id(record) not in self.seen:
            self.seen[id(record)] = (record, make(*args, **kwargs))
        return self.seen[id(record)][1]

    def iterator(self, it: LocalIterator[Any]) -> int:
        origin = origin_of(it)
        node = self.once(origin, self.origin, origin)
        for stage in stages_of(it):
            if stage.suffix:  # an empty suffix marks a stage internal to its source
                label = stage.suffix[1:]
                node = self.once(stage, self.add, "transform", label, [node], method=label.split("(")[0], op=stage.fn)
        return node

    def parallel(self, pi: ParallelIterator[Any]) -> int:
        n = pi.num_shards()
        return self.once(pi, self.add, "parallel", f"{pi!r} ({n} shard{'' if n == 1 else 's'})", [], shards=n)

    def origin(self, o: Origin) -> int:
        if o.kind == "gather":
            args = ", ".join(f"{k}={v}" for k, v in o.attrs.items() if not (k == "batch_ms" and v == 0))
            return self.add("gather", f"{o.label}({args})", [self.parallel(o.inputs[0])], **o.attrs)
        inputs = [self.iterator(i) for i in o.inputs]
        if o.kind == "union":
            weights = o.attrs["round_robin_weights"]
            shown = "" if weights is None else f", round_robin_weights={list(weights)!r}"
            label = f"LocalUnion({o.attrs['mode']}{shown})"
            return self.add("union", label, inputs, **o.attrs)
        if o.kind == "named" and len(inputs) > 1:  # a combinator: its name is "<label>[<input reprs>]"
            label = o.label.removesuffix("[" + ", ".join(repr(i) for i in o.inputs) + "]")
            return self.add("union", label, inputs, **o.attrs)
        kind = {"named": "named" if inputs else "source"}.get(o.kind, o.kind)
        return self.add(kind, o.label, inputs, **o.attrs)

    def link_queues(self) -> None:
        """Enqueue -> thread (or queue) -> Dequeue, for every source that records the queue it reads."""
        for reader in [n for n in self.nodes if isinstance(n.attrs.get("queue"), queue.Queue)]:
            producer: Any = reader.attrs.get("producer")
            feed = reader.attrs["queue"]
            if isinstance(getattr(producer, "inqueue", None), queue.Queue):  # a learner thread: inqueue -> outqueue
                hop = self.once(producer, self.add, "thread", type(producer).__name__, [])
                feed = producer.inqueue
            else:
                hop = self.once(feed, self.add, "queue", f"queue(maxsize={feed.maxsize})", [])
            self.edges.append(Edge(hop, reader.id, via_queue=True))
            self.edges += [Edge(n.id, hop, via_queue=True) for n in self.nodes
                           if getattr(n.attrs.get("op"), "queue", None) is feed]


def build(it: LocalIterator[Any]) -> PlanGraph:
    """The operator graph of the plan ``it``; reads what was recorded when the plan was built, pulls nothing.

    Examples:
        >>> graph = build(iter_list([1, 2]).for_each(abs))
        >>> graph.nodes[graph.output].label, graph.edges
        ('for_each()', (Edge(src=0, dst=1, index=None, via_queue=False),))
    """
    return build_with_records(it)[0]


def build_with_records(it: LocalIterator[Any]) -> tuple[PlanGraph, dict[int, tuple[object, int]]]:
    """:func:`build`, plus the node of each recorded object (origins, stages, ...) by ``id()``, each held with
    its object (:mod:`flowrl.iter.profiling` finds the node of a stage as the plan builds it)."""
    builder = _Builder()
    output = builder.iterator(it)
    builder.link_queues()
    return PlanGraph(tuple(builder.nodes), tuple(builder.edges), output), builder.seen


def to_text(graph: PlanGraph) -> str:
    """An indented tree: the output on top; a chain's upstream stages below it at the same indent; a union's
    inputs (``[i]``), a composite's internals and a queue's producers (``<~``) indented one step. A node read by
    several consumers is shown once, tagged ``@k``, and referred to by the tag afterwards.

    Examples:
        >>> print(to_text(build(iter_list([1]).union(iter_list([2]), round_robin_weights=[2, 1]))))
        LocalUnion(round_robin, round_robin_weights=[2, 1])
          [0] iter_list
          [1] iter_list
    """
    return "\n".join(line for _, line, _ in text_rows(graph))


def text_rows(graph: PlanGraph) -> list[tuple[int, str, bool]]:
    """The lines of :func:`to_text`, each as ``(node id, line, whether it refers to a node shown above)``
    (:func:`flowrl.iter.profiling.table` lines its rows up with them)."""
    shared = {n.id for n in graph.nodes if len(graph.consumers(n.id)) > 1}
    tags: dict[int, int] = {}
    lines: list[tuple[int, str, bool]] = []

    def show(node_id: int, indent: int, prefix: str) -> None:
        node, line = graph.nodes[node_id], " " * indent + prefix + graph.nodes[node_id].label
        if node_id in tags:
            lines.append((node_id, f"{line} @{tags[node_id]} (shown above)", True))
            return
        if node_id in shared:
            tags[node_id] = len(tags) + 1
            line += f" @{tags[node_id]}"
        lines.append((node_id, line, False))
        inner = indent + len(prefix)
        for edge in graph.inputs(node_id):
            if edge.via_queue:
                show(edge.src, inner + 2, "<~ ")
            elif node.kind == "union":
                show(edge.src, inner + 2, f"[{edge.index}] ")
            else:
                show(edge.src, inner + 2 if node.kind == "named" else inner, "")

    show(graph.output, 0, "")
    return lines


_DOT_SHAPES = {"source": "ellipse", "parallel": "box3d", "gather": "invtrapezium", "union": "hexagon",
               "duplicate": "trapezium", "thread": "component", "queue": "cylinder"}
_MERMAID_SHAPES = {"source": '(["{}"])', "parallel": '[["{}"]]', "gather": '[/"{}"\\]', "union": '{{{{"{}"}}}}',
                   "duplicate": '[\\"{}"/]', "thread": '>"{}"]', "queue": '[("{}")]'}


def to_dot(graph: PlanGraph) -> str:
    """Graphviz DOT text of the graph (render it with ``dot -Tsvg``); queue hand-offs are dashed.

    Examples:
        >>> print(to_dot(build(iter_list([1]).for_each(abs))))
        digraph plan {
          rankdir=LR;
          node [shape=box, fontname="monospace"];
          n0 [label="iter_list", shape=ellipse];
          n1 [label="for_each()", shape=box];
          n0 -> n1;
        }
    """
    def quoted(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = ["digraph plan {", "  rankdir=LR;", '  node [shape=box, fontname="monospace"];']
    lines += [f"  n{n.id} [label={quoted(n.label)}, shape={_DOT_SHAPES.get(n.kind, 'box')}];" for n in graph.nodes]
    for e in graph.edges:
        attrs = ([f'label="{e.index}"'] if e.index is not None else []) + (["style=dashed"] if e.via_queue else [])
        lines.append(f"  n{e.src} -> n{e.dst}{' [' + ', '.join(attrs) + ']' if attrs else ''};")
    return "\n".join(lines + ["}"])


def to_mermaid(graph: PlanGraph) -> str:
    """Mermaid ``flowchart`` text of the graph (GitHub renders it in a ```` ```mermaid ```` block); queue
    hand-offs are dotted. See the module example."""
    lines = ["flowchart LR"]
    for n in graph.nodes:
        label = n.label.replace('"', "#quot;")
        lines.append(f"  n{n.id}" + _MERMAID_SHAPES.get(n.kind, '["{}"]').format(label))
    for e in graph.edges:
        arrow = "-.->" if e.via_queue else "-->" if e.index is None else f"-->|{e.index}|"
        lines.append(f"  n{e.src} {arrow} n{e.dst}")
    return "\n".join(lines)


def problems(graph: PlanGraph, metrics: MetricsContext) -> list[str]:
    """What would go wrong once the plan runs, each with its fix (``LocalIterator.validate()`` raises them).

    It finds:
    - a ``duplicate()`` child that the plan never consumes: its siblings stall after one item;
    - a stream read by several consumers without ``duplicate()``: each would build its own copy (two gathers
      over the same shards fail at the first pull);
    - a union whose round-robin weights are all ``"*"``: no input sets the pace (``Concurrently`` rejects it
      at construction, as it rejects weights in async mode and output indexes that name no op);
    - an operator bound to a metrics context other than the plan's ``metrics`` (it already ran in another plan).

    A ParallelIterator that is never gathered cannot occur in a plan: a LocalIterator reads one only through a
    gather, and ``union``/``Concurrently`` refuse one with a ``TypeError`` that says to gather it.

    Examples:
        >>> plan = iter_list([1]).union(iter_list([2]), round_robin_weights=["*", "*"])
        >>> problems(build(plan), plan.metrics)  # doctest: +ELLIPSIS
        ["LocalUnion(round_robin, round_robin_weights=['*', '*']): the round_robin_weights are all '*', ..."]
    """
    found: list[str] = []
    for node in graph.nodes:
        readers = [graph.nodes[e.dst] for e in graph.consumers(node.id) if not e.via_queue]
        children = [r for r in readers if r.kind == "duplicate"]
        if children and (missing := sorted(set(range(children[0].attrs["n"])) - {c.attrs["index"] for c in children})):
            found += [f"duplicate[{i}] of {node.label} is never consumed by the plan: its siblings stall after the "
                      f"first item, since a child ahead of another waits for it; consume every "
                      f"child, e.g. each in a Concurrently branch, or duplicate into fewer" for i in missing]
        if len(readers) > 1 and (len(children) < len(readers) or len(children) > children[0].attrs["n"]):
            found.append(f"{node.label} is read by {len(readers)} consumers ({', '.join(r.label for r in readers)}) "
                         f"without duplicate(): each builds its own copy of the stream (two gathers over the same "
                         f"shards fail at the first pull); call .duplicate({len(readers)}) on it and give each "
                         f"consumer one child")
        weights = node.attrs.get("round_robin_weights")
        if node.kind == "union" and weights and all(w == "*" for w in weights):
            found.append(f"{node.label}: the round_robin_weights are all '*', so no input sets the pace and the "
                         f"union only polls; give at least one input a numeric weight (pulls per turn)")
        op = node.attrs.get("op")
        if isinstance(op, MetricsBinding) and op.bound_metrics is not None and op.bound_metrics is not metrics:
            found.append(f"{node.label} is bound to another dataflow's metrics context (the instance already ran "
                         f"in another plan); an operator instance belongs to one dataflow, so build a new "
                         f"{type(op).__name__}(...) for this plan")
    return found


def operator_names(graph: PlanGraph) -> list[str]:
    """The plan's operators by name, upstream first, each once: the callable's name for a stage (``TrainOneStep``),
    the head of the label otherwise (``ParallelRollouts``, ``Concurrently``, ``ApexLearnerThread``). A composite's
    internals, anonymous stages (``for_each()``) and plumbing (gathers, ``duplicate``, ``zip_with_source_actor``,
    bare queues) are left out.

    Examples:
        >>> from flowrl.ops import ConcatBatches, ParallelRollouts, TrainOneStep
        >>> from flowrl.testing import make_fake_workers
        >>> workers = make_fake_workers(0, rollout_fragment_length=10)
        >>> plan = ParallelRollouts(workers).combine(ConcatBatches(20)).for_each(TrainOneStep(workers)).for_each(abs)
        >>> operator_names(build(plan))
        ['ParallelRollouts', 'ConcatBatches', 'TrainOneStep']
    """
    internal: set[int] = set()
    frontier = [e.src for n in graph.nodes if n.kind == "named" for e in graph.inputs(n.id) if not e.via_queue]
    while frontier:
        upstream = frontier.pop()
        if upstream not in internal:
            internal.add(upstream)
            frontier += [e.src for e in graph.inputs(upstream) if not e.via_queue]
    names: list[str] = []
    for node in graph.nodes:
        if node.id in internal or node.kind in ("parallel", "gather", "duplicate", "queue"):
            continue
        label = node.label
        if node.kind == "transform":
            label = label.partition("(")[2].removesuffix(")")
        name = label.split("(")[0].split("[")[0]
        if name and name.isidentifier() and name not in names:
            names.append(name)
    return names


def summary(plan: LocalIterator[Any], algorithm: str, width: int = 100) -> str:
    """One short paragraph for a run's log: ``plan:`` and its :func:`operator_names`, wrapped to ``width`` columns,
    and the command that draws the whole graph.

    Examples:
        >>> print(summary(iter_list([1]).for_each(abs), "pg"))
        plan: iter_list (`flowrl plan show pg` draws the graph)
    """
    hint = f"(`flowrl plan show {algorithm}` draws the graph)".replace(" ", "\0")  # kept on one line
    text = f"plan: {', '.join(operator_names(build(plan)))} {hint}"
    return textwrap.fill(text, width=width, subsequent_indent="      ", break_on_hyphens=False).replace("\0", " ")
