"""Decentralized learning (DD-PPO, Wijmans et al., https://arxiv.org/abs/1911.00357): every rollout worker learns
on its own samples, with its gradients averaged over a process group of all workers, so that no central learner
exists and the weights stay identical everywhere.

:func:`form_process_group` joins the remote workers into one ``torch.distributed`` group when the plan is built;
:class:`AllReduceTrainOneStep` runs inside each worker (``ParallelIterator.for_each``): its batch in, minibatch
SGD with all-reduced gradients, a :class:`GroupStep` out; :class:`RecordGroupTraining` runs in the driver over
the gathered steps of one round: it counts them and keeps the driver's copy of the weights (for evaluation,
checkpoints and ``get_policy``) equal to the group's.

Examples:
    >>> from flowrl.testing import make_fake_workers
    >>> record = RecordGroupTraining(workers := make_fake_workers(0))
    >>> record.bind(metrics := MetricsContext())
    >>> steps = [GroupStep(rank=r, count=100, agent_steps=100, info={"default_policy": {"learner_stats": {"kl": 0.01}}},
    ...                    weights=None, weights_version=3, learn_s=0.1) for r in range(2)]
    >>> record(steps)["default_policy"]["learner_stats"], metrics.counters["num_steps_sampled"]
    ({'kl': 0.01}, 200)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

from flowrl import collective
from flowrl.iter import get_shard_worker
from flowrl.metrics import (AGENT_STEPS_SAMPLED_COUNTER, AGENT_STEPS_TRAINED_COUNTER, LEARN_ON_BATCH_TIMER,
                            LEARNER_INFO, STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER,
                            STEPS_TRAINED_THIS_ITER_COUNTER, MetricsBinding, MetricsContext)
from flowrl.ops._common import LearnerInfo, check_batch, check_workers, weight_update_vars
from flowrl.ops.rollout import StandardizeFields
from flowrl.ops.train_step import minibatch_sgd
from flowrl.sample_batch import AnyBatch, WEIGHTS_VERSION
from flowrl.validation import check_int, check_number
from flowrl.workers import WorkerSet

__all__ = ["form_process_group", "AllReduceTrainOneStep", "GroupStep", "RecordGroupTraining"]


def form_process_group(workers: WorkerSet, *, backend: str = "gloo", timeout_s: float = 60.0) -> None:
    """Joins ``workers``' remote workers into one process group (rank = position), replacing any group they were
    in: a plan over a rebuilt worker set forms it again. Each worker's trained policies average their gradients
    over the group from then on, and agree on one learner state before their next update
    (:meth:`~flowrl.workers.RolloutWorker.agree_with_group`).

    Raises:
        ValueError: fewer than two remote workers, the local executor, or an unknown backend.
        TimeoutError: the workers did not all join within ``timeout_s``.
    """
    remote = check_workers(workers, "form_process_group").remote_workers()
    check_number("form_process_group timeout_s", timeout_s, gt=0, meaning="seconds a member waits for its peers")
    if len(remote) < 2:
        raise ValueError(f"form_process_group needs at least 2 remote workers to learn together, got {len(remote)}; "
                         f"set num_workers >= 2")
    collective.form_group(remote, backend=backend, timeout_s=timeout_s)


@dataclass(frozen=True)
class GroupStep:
    """What one member of a process group reports of one update: its rank, the env and agent steps it sampled and
    trained on, its learner info, its weights (rank 0 only, when asked for; else ``None``) and their version, and
    the seconds its update took."""

    rank: int
    count: int
    agent_steps: int
    info: LearnerInfo
    weights: Any
    weights_version: int
    learn_s: float


class AllReduceTrainOneStep:
    """TrainOneStep inside each rollout worker of a process group: consumes the worker's own sample batch; emits a
    :class:`GroupStep`.

    Use with ``ParallelIterator.for_each()`` over workers in a group (:func:`form_process_group`). Per batch, in
    this order: the group agrees on one learner state once after forming; every member checks that all batches
    hold the same number of rows (each gradient step is one all-reduce, so they must take the same number of
    steps); ``standardize_fields`` are standardized over this worker's batch; ``num_sgd_iter`` epochs of
    ``sgd_minibatch_size`` minibatches run through the worker's ``learn_on_batch``, each gradient averaged over
    the group before it is clipped and applied (:attr:`flowrl.policy.Policy.collective`); a policy whose stats
    hold ``kl`` and that has ``update_kl`` adapts its KL coefficient with the group's mean KL; the observation
    filters merge. Rank 0 adds its weights to the step when ``send_weights`` (the driver's copy).

    Raises (in the worker, surfacing in the driver):
        ValueError: the members' batches differ in size (``batch_mode="complete_episodes"``, say).
        RuntimeError: the worker is in no process group.
    """

    def __init__(self, *, num_sgd_iter: int, sgd_minibatch_size: int, standardize_fields: Sequence[str] = (),
                 send_weights: bool = True) -> None:
        name = type(self).__name__
        check_int(f"{name} num_sgd_iter", num_sgd_iter, 1, "epochs over each batch")
        check_int(f"{name} sgd_minibatch_size", sgd_minibatch_size, 0, "0: the whole batch is one minibatch")
        self.num_sgd_iter, self.sgd_minibatch_size = num_sgd_iter, sgd_minibatch_size
        self.standardize = StandardizeFields(list(standardize_fields)) if standardize_fields else None
        self.send_weights = send_weights

    def __call__(self, batch: AnyBatch) -> GroupStep:
        check_batch(batch, self)
        worker = get_shard_worker()
        if worker is None or not callable(getattr(worker, "agree_with_group", None)):
            raise RuntimeError(f"{self!r} runs inside rollout workers: use it with ParallelIterator.for_each over "
                               f"ParallelRollouts(workers, mode='raw')")
        group = worker._group()
        start = time.perf_counter()
        if not worker._group_agreed:
            worker.agree_with_group()
        counts = group.gather(batch.count)
        if len(set(counts)) > 1:
            raise ValueError(f"the workers of a process group sampled batches of different sizes {counts}; each "
                             f"takes one all-reduced step per minibatch, so they must be equal: use "
                             f"batch_mode='truncate_episodes' (rollout_fragment_length x num_envs_per_worker rows)")
        if self.standardize is not None:
            self.standardize(batch)
        policies = worker.policies_to_train
        info = minibatch_sgd(worker, batch, policies, num_sgd_iter=self.num_sgd_iter,
                             sgd_minibatch_size=self.sgd_minibatch_size,
                             rng_for=lambda pid: worker.get_policy(pid).np_random)
        self._update_kl(worker, group, info)
        worker.sync_filter_with_group()
        send = self.send_weights and group.rank == 0
        return GroupStep(rank=group.rank, count=batch.count, agent_steps=batch.agent_steps(), info=info,
                         weights=worker.get_weights(policies) if send else None,
                         weights_version=worker.weights_version(policies[0]) if policies else 0,
                         learn_s=time.perf_counter() - start)

    @staticmethod
    def _update_kl(worker: Any, group: collective.Collective, info: LearnerInfo) -> None:
        adapting = [pid for pid in sorted(info) if "kl" in info[pid].get("learner_stats", {})
                    and callable(getattr(worker.get_policy(pid), "update_kl", None))]
        if not adapting:
            return
        means = group.mean([info[pid]["learner_stats"]["kl"] for pid in adapting])
        for pid, kl in zip(adapting, means):
            worker.get_policy(pid).update_kl(kl)
            info[pid]["learner_stats"]["group_kl"] = kl

    def __repr__(self) -> str:
        return "AllReduceTrainOneStep"


class RecordGroupTraining(MetricsBinding):
    """Records one round of a process group's updates in the driver: consumes the list of :class:`GroupStep` that
    ``batch_across_shards()`` gathers; emits rank 0's learner info.

    Use with ``.for_each()``. Every member sampled and trained on its own rows, so the counts are the sums. When
    rank 0 sent its weights, the local worker loads them (with the version they have, the group's observation
    filter statistics, and the global vars), so evaluation, checkpoints and ``get_policy`` see the group's.

    Metrics: ``num_steps_sampled`` and ``num_steps_trained`` (and their agent-step and this-iteration
    counterparts) += the sums; the ``learn`` timer gets the slowest member's update time; ``info["learner"]``.
    """

    def __init__(self, workers: WorkerSet) -> None:
        self.workers = check_workers(workers, type(self).__name__)

    def __call__(self, steps: Sequence[GroupStep]) -> LearnerInfo:
        if not steps or not all(isinstance(s, GroupStep) for s in steps):
            raise ValueError(f"{self!r} consumes the list of GroupStep that AllReduceTrainOneStep's "
                             f"batch_across_shards() emits, got {steps!r:.80}")
        counters = self.metrics.counters
        count, agent_steps = sum(s.count for s in steps), sum(s.agent_steps for s in steps)
        counters[STEPS_SAMPLED_COUNTER] += count
        counters[AGENT_STEPS_SAMPLED_COUNTER] += agent_steps
        counters[STEPS_TRAINED_COUNTER] += count
        counters[AGENT_STEPS_TRAINED_COUNTER] += agent_steps
        counters[STEPS_TRAINED_THIS_ITER_COUNTER] += count
        timer = self.metrics.timers[LEARN_ON_BATCH_TIMER]
        timer.push(max(s.learn_s for s in steps))
        timer.push_units_processed(count)
        first = min(steps, key=lambda s: s.rank)
        self.metrics.info[LEARNER_INFO] = first.info
        local = self.workers.local_worker()
        if first.weights is not None:
            weights = {pid: {**w, WEIGHTS_VERSION: first.weights_version} for pid, w in first.weights.items()}
            if callable(take := getattr(local, "take_filter_delta", None)):
                take()  # the driver's copy filters nothing of its own: the group's statistics, exactly
            local.set_weights(weights, global_vars=weight_update_vars(self.metrics))
        return first.info

    def __repr__(self) -> str:
        return "RecordGroupTraining"


