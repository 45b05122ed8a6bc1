"""Plan inspection: the operator graph of a plan (:mod:`flowrl.iter.plan_graph`, re-exported here), and an
algorithm's plan built over stand-ins so that its graph can be drawn without Ray, actors, envs or models
(:func:`stand_in_plan`, which ``flowrl plan show ALGO`` uses).

The graph itself (:class:`PlanGraph`, :func:`build`, :func:`to_text`, :func:`to_dot`, :func:`to_mermaid`,
:func:`problems`, :func:`operator_names`, :func:`summary`) is part of the iterator core; the stand-ins need the
algorithms, the workers and the test fakes, so they live here, above the core.

Examples:
    >>> print(to_text(build(iter_list([1, 2]).for_each(abs))))
    for_each()
    iter_list
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from flowrl.iter import LocalIterator, ParallelIterator
from flowrl.iter.plan_graph import (Edge, Node, PlanGraph, build, operator_names, problems, summary, to_dot,
                                    to_mermaid, to_text)

if TYPE_CHECKING:
    from flowrl.algorithms import Algorithm
    from flowrl.config import TrainerConfig

__all__ = ["Node", "Edge", "PlanGraph", "build", "to_text", "to_dot", "to_mermaid", "problems", "stand_in_plan",
           "operator_names", "summary"]


class _StandInActor:
    """An actor handle that is never called: a plan keeps it (a rollout worker, a replay shard) and the graph
    counts it, but pulling the plan would call ``.remote`` on it, which raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, method: str) -> _StandInMethod:
        if method.startswith("__"):
            raise AttributeError(method)
        return _StandInMethod(f"{self._name}.{method}")

    def __repr__(self) -> str:
        return self._name


class _StandInMethod:
    def __init__(self, name: str) -> None:
        self._name = name

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name}.remote(): this plan was built over stand-in actors to draw its graph "
                           f"(flowrl.plan_graph.stand_in_plan) and cannot run; build a Trainer to run it")


def _stand_in_workers(config: TrainerConfig) -> Any:
    """A WorkerSet of ``config.num_workers`` stand-in actors and a :class:`~flowrl.testing.FakeWorker` (no env,
    no model) as the local worker; weight broadcasts and ``foreach_worker`` calls do nothing."""
    from flowrl.testing import FakeWorker
    from flowrl.workers import WorkerSet

    class StandInWorkers(WorkerSet):
        def __init__(self) -> None:  # no super().__init__(): it would make real workers
            self.config, self.policy_class, self.worker_class = config, None, FakeWorker
            self._local = FakeWorker(config=config)
            self._remote = [_StandInActor(f"worker_{i + 1}") for i in range(config.num_workers)]
            self._outstanding = []

        def put_weights(self, policies: Sequence[str] | None = None) -> Any:
            return None

        def send_weights(self, ref: Any, to: Sequence[Any] | None = None,
                         global_vars: Mapping[str, Any] | None = None) -> None:
            pass

        def sync_weights(self, policies: Sequence[str] | None = None,
                         global_vars: Mapping[str, Any] | None = None) -> None:
            pass

        def foreach_worker(self, fn: Callable[[Any], Any]) -> list[Any]:
            return []

        def stop(self) -> None:
            self._remote = []

    return StandInWorkers()


def _no_process_group(workers: Any, **settings: Any) -> None:
    """DD-PPO's :func:`~flowrl.ops.decentralized.form_process_group` over stand-in workers: nothing to form."""


@contextlib.contextmanager
def _stand_in_aggregators() -> Iterator[None]:
    """While a plan is built: IMPALA's tree aggregation gets stand-in ``Aggregator`` actors (after the same checks
    of its settings) instead of Ray actors, and DD-PPO's stand-in workers form no process group. The plan draws them; the list it would kill on close is emptied on
    exit, since there is nothing to kill."""
    from unittest import mock

    from flowrl.algorithms import ddppo, impala
    from flowrl.ops.aggregation import aggregator_groups

    made: list[list[Any]] = []

    def make_stand_ins(raw: ParallelIterator[Any], num_aggregators: int, **settings: Any) -> list[Any]:
        groups = aggregator_groups(raw, num_aggregators, **settings)
        made.append([_StandInActor(f"aggregator_{g}") for g in range(len(groups))])
        return made[-1]

    with mock.patch.object(impala, "make_aggregators", make_stand_ins), \
            mock.patch.object(ddppo, "form_process_group", _no_process_group):
        yield
    for aggregators in made:
        aggregators.clear()


def _stand_in_owned_state(algorithm: Algorithm, config: TrainerConfig) -> dict[str, Any]:
    """The trainer-owned state a plan takes: Ape-X's replay shard actors as stand-ins, anything else (a local
    replay buffer: memory only) as the algorithm makes it."""
    from flowrl.algorithms import apex

    if algorithm.make_owned_state is apex.make_owned_state and isinstance(config, apex.ApexSettings):
        return {"replay_actors": [_StandInActor(f"replay_shard_{i}") for i in range(config.num_replay_buffer_shards)]}
    return dict(algorithm.make_owned_state(config)) if algorithm.make_owned_state is not None else {}


@contextlib.contextmanager
def stand_in_plan(algorithm: Algorithm, config: TrainerConfig) -> Iterator[LocalIterator[dict[str, Any]]]:
    """``algorithm``'s plan for ``config``, built as a :class:`~flowrl.trainer.Trainer` builds it but over stand-in
    workers (and Ape-X replay shards) that never run, so nothing starts: no Ray, no actors, no env, no model.
    Its graph is the one the trainer runs, with as many shards; only pulling it fails. Closed on exit (a plan's
    learner thread, started over the stand-in local worker, stops).

    Examples:
        >>> import ray
        >>> from flowrl.algorithms import get_algorithm
        >>> from flowrl.algorithms.apex import ApexConfig
        >>> with stand_in_plan(get_algorithm("apex"), ApexConfig(num_workers=4)) as plan:
        ...     graph = build(plan)
        >>> [node.label for node in graph.nodes if node.kind == "parallel"]
        ['ParallelIterator[from_actors[shards=4]] (4 shards)', 'ParallelIterator[from_actors[shards=4]] (4 shards)']
    """
    from flowrl.evaluation import evaluation_config, with_evaluation

    workers = _stand_in_workers(config)
    with _stand_in_aggregators():
        plan = algorithm.plan(workers, config, **_stand_in_owned_state(algorithm, config))
    evaluation = _stand_in_workers(evaluation_config(config)) if config.evaluation_interval else None
    plan = with_evaluation(plan, workers, evaluation, config, lambda: 1)
    try:
        yield plan
    finally:
        plan.close()
