"""IMPALA: importance-weighted actor-learner architecture as a plan (RLlib Flow, https://arxiv.org/abs/2011.12719;
IMPALA, https://arxiv.org/abs/1802.01561).

Dataflow: the workers sample asynchronously (``ParallelRollouts(async)``, a bounded number of
requests in flight each) and each delivering worker gets the learner's latest weights; fragments are mixed with
replayed ones, concatenated to ``train_batch_size`` steps and enqueued for a learner thread. A second branch
dequeues what the learner trained and counts it; ``Concurrently(async)`` runs both, and the learner's output
drives the reports. Sampling is throttled by the learner's bounded in-queue, never dropped.

With tree aggregation (``num_aggregation_workers = G > 0``) the sampling branch moves into G ``Aggregator`` actors
on the driver's node, each over the workers ``i ≡ g (mod G)``: an aggregator gathers its group, keeps its workers
on the weights it was last sent, mixes in replay and concatenates; the driver gathers finished train batches,
counts only their freshly sampled steps, sends each aggregator the learner's weights and enqueues the batch.

The policy's loss is the V-trace actor-critic loss (:mod:`flowrl.algorithms.vtrace`), computed per contiguous
(episode, env) piece of the train batch.

Examples:
    >>> config = IMPALAConfig(env="CartPole-v1")
    >>> config.rollout_fragment_length, config.train_batch_size, config.timesteps_per_iteration, config.min_iter_time_s
    (50, 500, 1000, 0)
    >>> IMPALAConfig(batch_mode="complete_episodes")
    Traceback (most recent call last):
    ...
    ValueError: batch_mode='complete_episodes': V-trace learns from fragments; use batch_mode='truncate_episodes'
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import gymnasium as gym
import numpy as np
import torch

from flowrl.algorithms import Algorithm
from flowrl.algorithms.vtrace import VTraceReturns, vtrace
from flowrl.config import TrainerConfig
from flowrl.iter import LocalIterator, from_actors
from flowrl.ops import (BroadcastUpdateLearnerWeights, ConcatBatches, Concurrently, CountFreshSteps, Dequeue, Enqueue,
                        LearnerThread, MixInReplay, MultiGPULearnerThread, ParallelRollouts, RecordLearnerOutput,
                        StandardMetricsReporting, make_aggregators)
from flowrl.ops.shutdown import shut_down
from flowrl.policy import Policy, TensorBatch
from flowrl.sample_batch import (ACTIONS, ENV_ID, EPS_ID, LOGP, NEXT_OBS, OBS, REWARDS, STATE_OUT, TERMINATEDS,
                                 TRUNCATEDS, T, AnyBatch, SampleBatch)
from flowrl.sequences import shuffled_sequence_minibatches
from flowrl.validation import bounded, check_int
from flowrl.workers import WorkerSet

__all__ = ["IMPALAConfig", "IMPALAPolicy", "PieceMinibatches", "plan", "ALGORITHM"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class IMPALAConfig(TrainerConfig):
    """IMPALA's config: :class:`~flowrl.config.TrainerConfig` with RLlib's IMPALA defaults.

    Attributes:
        rollout_fragment_length: 50 steps per env per sample (V-trace's sequence length).
        train_batch_size: 500 steps per learner update.
        timesteps_per_iteration: 1000; a report comes at the first learner output after that many new env steps
            (no wall-time gate: RLlib's 10 s made one report span ~100k env steps on a laptop).
        num_multi_gpu_tower_stacks: batches the multi-GPU learner holds loaded (1); it also bounds the
            effective ``minibatch_buffer_size`` there (:attr:`effective_minibatch_buffer_size`).
        minibatch_buffer_size: train batches the learner thread cycles through (1).
        num_sgd_iter: passes over each train batch (1).
        sgd_minibatch_size: rows per learner update within a train batch (0: each pass learns on the whole batch).
            Each pass cuts the batch anew, in a seeded random order, into minibatches of whole trajectory pieces
            (V-trace runs over pieces), each taking pieces until it holds at least this many rows; so with
            ``train_batch_size=1024, sgd_minibatch_size=256, num_sgd_iter=4`` a batch gives 16 updates, as PPO's
            Atari settings. The single-device learner only (``simple_optimizer``), single-policy batches only.
        replay_proportion: expected replayed fragments mixed in per fresh one (0.0); needs slots.
        replay_buffer_num_slots: fragments held for replay (0).
        learner_queue_size: train batches waiting for the learner (16); a full queue throttles sampling.
        learner_queue_timeout: seconds of one wait of the learner on its empty queue (300); it then waits again.
        max_sample_requests_in_flight_per_worker: sample requests outstanding per worker (2).
        broadcast_interval: fragments (train batches, with tree aggregation) between re-reads of the learner
            weights (1).
        num_aggregation_workers: G, the aggregator actors of tree aggregation (0: none, the driver gathers the
            workers itself). Each aggregator (``num_cpus=0``, on the driver's node) gathers the workers
            ``i ≡ g (mod G)``, keeps them on its cached weights, mixes in replay and concatenates train batches.
            At most ``num_workers`` (each needs a worker; so ``num_workers >= 1``); more than half of them logs
            a warning, as the aggregators then hardly aggregate.
        after_train_step: ``None``, or a factory ``(workers, config) -> stage`` applied to each learner output.
        vtrace_clip_rho_threshold: ``rho_bar``, V-trace's clip of the importance weights (1.0).
        vtrace_clip_pg_rho_threshold: the clip of the policy gradient's importance weights (1.0).
        vtrace_lambda: the traces' lambda, ``c_i = lambda min(1, pi / mu)`` (1.0: the paper's V-trace; below 1 cuts
            the traces as GAE's lambda does, e.g. 0.95 as PPO's Atari settings).
        vf_loss_coeff: weight of the value loss ``0.5 * mean((V - vs)^2)`` (0.5).
        entropy_coeff: weight of the entropy bonus (0.01).
        normalize_advantages: standardise the policy gradient's V-trace advantages over each batch learned on (the
            train batch, or each minibatch with ``sgd_minibatch_size``; mean 0, std 1), as PPO does and Sample
            Factory's APPO by default (False: RLlib's IMPALA and APPO).
        grad_clip: max global gradient norm (40).
        lr: Adam learning rate (5e-4).
    """

    rollout_fragment_length: int = 50
    train_batch_size: int = 500
    timesteps_per_iteration: int = 1000
    num_multi_gpu_tower_stacks: int = bounded(1, ge=1, meaning="batches the multi-GPU learner holds loaded")
    minibatch_buffer_size: int = bounded(1, ge=1, meaning="train batches the learner thread cycles through")
    num_sgd_iter: int = bounded(1, ge=1, meaning="passes over each train batch")
    sgd_minibatch_size: int = bounded(0, ge=0, meaning="0: each pass learns on the whole train batch")
    replay_proportion: float = bounded(0.0, ge=0, meaning="expected replays per fragment")
    replay_buffer_num_slots: int = bounded(0, ge=0, meaning="fragments held for replay")
    learner_queue_size: int = bounded(16, ge=1, meaning="train batches waiting for the learner")
    learner_queue_timeout: float = bounded(300, gt=0, meaning="seconds of one wait of the learner on its empty queue")
    max_sample_requests_in_flight_per_worker: int = bounded(2, ge=1, meaning="sample requests outstanding per worker")
    broadcast_interval: int = bounded(1, ge=1, meaning="fragments between re-reads of the learner weights")
    num_aggregation_workers: int = bounded(0, ge=0, meaning="0: no tree aggregation")
    after_train_step: Callable[[WorkerSet, IMPALAConfig], Callable[[Any], Any]] | None = None
    trains_recurrent_models: ClassVar[bool] = True  # model.use_lstm: V-trace over sequences with stored states

    vtrace_clip_rho_threshold: float = bounded(1.0, gt=0, meaning="1.0 is the paper's choice")
    vtrace_clip_pg_rho_threshold: float = bounded(1.0, gt=0, meaning="1.0 is the paper's choice")
    vtrace_lambda: float = bounded(1.0, ge=0, le=1, meaning="1.0: the paper's V-trace, 0.95: GAE-like traces")
    vf_loss_coeff: float = bounded(0.5, ge=0, meaning="0 leaves the value head untrained")
    entropy_coeff: float = bounded(0.01, ge=0, meaning="0 turns the entropy bonus off")
    normalize_advantages: bool = False
    grad_clip: float | None = 40.0
    lr: float = 0.0005

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.normalize_advantages, bool):
            raise TypeError(f"normalize_advantages={self.normalize_advantages!r} must be a bool")
        if self.normalize_advantages and self.num_learners > 1:
            raise ValueError(f"normalize_advantages=True with num_learners={self.num_learners}: each learner would "
                             f"standardize its share of the batch, not the batch; set normalize_advantages=False or "
                             f"num_learners=1")
        if self.batch_mode != "truncate_episodes":
            raise ValueError(f"batch_mode={self.batch_mode!r}: V-trace learns from fragments; use "
                             f"batch_mode='truncate_episodes'")
        n = self.num_aggregation_workers
        if n > 0 and self.num_workers == 0:
            raise ValueError(f"num_aggregation_workers={n} with num_workers=0: tree aggregation gathers remote "
                             f"rollout workers and there are none; set num_workers >= {n} or num_aggregation_workers=0")
        if n > self.num_workers:
            raise ValueError(f"num_aggregation_workers={n} exceeds num_workers={self.num_workers}; each aggregator "
                             f"needs at least one rollout worker, so lower num_aggregation_workers")
        if n > 0 and self.observation_filter != "NoFilter":
            raise ValueError(f"observation_filter={self.observation_filter!r} with num_aggregation_workers={n}: the "
                             f"aggregators send the weights to their workers and do not gather the workers' filter "
                             f"statistics yet; set num_aggregation_workers=0 or observation_filter='NoFilter'")
        if 2 * n > self.num_workers:
            logger.warning("num_aggregation_workers=%d is more than half of num_workers=%d, so most aggregators "
                           "serve a single worker and only add a hop; use num_aggregation_workers <= %d (0: the "
                           "driver gathers the workers itself)", n, self.num_workers, self.num_workers // 2)
        if self.replay_proportion > 0 and self.replay_buffer_num_slots == 0:
            raise ValueError(f"replay_proportion={self.replay_proportion} needs stored fragments, but "
                             f"replay_buffer_num_slots=0; raise replay_buffer_num_slots or set replay_proportion=0")
        if self.after_train_step is not None and not callable(self.after_train_step):
            raise ValueError(f"after_train_step={self.after_train_step!r} must be a factory (workers, config) -> "
                             f"stage, or None")
        if self.sgd_minibatch_size and not self.use_simple_optimizer:
            raise ValueError(f"sgd_minibatch_size={self.sgd_minibatch_size} cuts train batches in the single-device "
                             f"learner, but num_gpus={self.num_gpus} with simple_optimizer={self.simple_optimizer} "
                             f"asks for the multi-device one; set simple_optimizer=True or sgd_minibatch_size=0")
        if self.sgd_minibatch_size and self.policies is not None:
            raise ValueError(f"sgd_minibatch_size={self.sgd_minibatch_size} cuts single-policy train batches, and "
                             f"this config has policies={sorted(self.policies)}; set sgd_minibatch_size=0")
        if not self.use_simple_optimizer and self.num_multi_gpu_tower_stacks < self.minibatch_buffer_size:
            warnings.warn(f"minibatch_buffer_size={self.minibatch_buffer_size} exceeds num_multi_gpu_tower_stacks="
                          f"{self.num_multi_gpu_tower_stacks}; the multi-GPU learner buffers "
                          f"{self.num_multi_gpu_tower_stacks} batches", stacklevel=3)

    @property
    def sample_item_size(self) -> int:
        """One worker's ``sample_size``: fragments arrive one by one (``ParallelRollouts(async)``), so a train batch
        is ``ceil(train_batch_size / sample_size)`` of them (replayed fragments are the same size)."""
        return self.sample_size

    @property
    def updates_per_pass(self) -> int:
        """Learner updates one pass over a train batch of ``train_batch_size`` rows makes: about
        ``train_batch_size / sgd_minibatch_size`` (whole pieces can make the last minibatch short, or absorb it), 1
        without minibatches."""
        size = self.sgd_minibatch_size
        return max(1, round(self.train_batch_size / size)) if 0 < size < self.train_batch_size else 1

    @property
    def effective_minibatch_buffer_size(self) -> int:
        """The learner's buffer: ``minibatch_buffer_size``, at most the tower stacks with the multi-GPU learner."""
        if self.use_simple_optimizer:
            return self.minibatch_buffer_size
        return min(self.minibatch_buffer_size, self.num_multi_gpu_tower_stacks)


def plan(workers: WorkerSet, config: IMPALAConfig) -> LocalIterator[dict[str, Any]]:
    """IMPALA: async rollouts -> weights to each delivering worker -> replay mix-in -> concat
    -> learner thread; its output counted and reported.

    With ``num_aggregation_workers = G > 0`` (tree aggregation) the rollout branch is G ``Aggregator`` actors, one
    per round-robin group of workers, that each sync their workers' weights, mix in replay and concatenate; the
    driver gathers their train batches, counts only the freshly sampled steps as sampled, sends each aggregator
    the learner's weights and enqueues the batch. The plan kills the aggregators when it is closed.

    Raises:
        ValueError: tree aggregation without remote workers, or with fewer remote workers than aggregators.

    Examples:
        >>> config = IMPALAConfig(seed=0, num_workers=0, train_batch_size=100, timesteps_per_iteration=0)
        >>> it = plan(WorkerSet(policy_class=IMPALAPolicy, config=config), config)
        >>> import re
        >>> print(re.sub(r"\\.(?=(combine|for_each|filter)\\()", "\\n  .", repr(it)))
        LocalIterator[Concurrently(async, output_indexes=[1])[LocalIterator[ParallelRollouts(async)
          .combine(MixInReplay(0, 0.0))
          .combine(ConcatBatches(100))
          .for_each(Enqueue(maxsize=16))], LocalIterator[Dequeue
          .for_each(RecordLearnerOutput)]]
          .filter(ReportGate(0 steps, 0 s))
          .for_each(CollectMetrics)
          .for_each()]
        >>> next(it)["info"]["num_steps_trained"] >= 100
        True
        >>> it.close()
    """
    learner = _make_learner(workers, config)
    aggregators: list[Any] = []
    if config.num_aggregation_workers > 0:
        # (1) tree aggregation: each aggregator gathers its group of workers, syncs their weights, mixes in replay
        # and concatenates; the driver counts the fresh steps and sends the aggregator the learner's weights
        if not workers.remote_workers():
            raise ValueError(f"num_aggregation_workers={config.num_aggregation_workers} needs remote workers, but "
                             f"the WorkerSet has none; build it with num_workers >= 1 or set num_aggregation_workers=0")
        aggregators = make_aggregators(
            ParallelRollouts(workers, mode="raw"), config.num_aggregation_workers,
            train_batch_size=config.train_batch_size, count_steps_by=config.count_steps_by,
            replay_buffer_num_slots=config.replay_buffer_num_slots, replay_proportion=config.replay_proportion,
            num_async=config.max_sample_requests_in_flight_per_worker, seed=config.seed)
        train_batches = (from_actors(aggregators, name=f"Aggregators[{len(aggregators)}]").gather_async()
                         .zip_with_source_actor().for_each(CountFreshSteps())
                         .for_each(BroadcastUpdateLearnerWeights(learner, workers, config.broadcast_interval)))
    else:
        # (1) sample asynchronously, send each delivering worker the learner's weights, mix in replay, concat
        frags = ParallelRollouts(workers, mode="async", num_async=config.max_sample_requests_in_flight_per_worker)
        if workers.remote_workers():
            frags = frags.zip_with_source_actor().for_each(
                BroadcastUpdateLearnerWeights(learner, workers, config.broadcast_interval))
        train_batches = (frags
                         .combine(MixInReplay(config.replay_buffer_num_slots, config.replay_proportion,
                                              seed=config.seed))
                         .combine(ConcatBatches(config.train_batch_size, config.count_steps_by)))
    enqueue_op = train_batches.for_each(Enqueue(learner.inqueue))
    # (2) count what the learner trained, from its out-queue
    dequeue_op = Dequeue(learner.outqueue, check=learner.is_alive).for_each(RecordLearnerOutput())
    merged = Concurrently([enqueue_op, dequeue_op], mode="async", output_indexes=[1])
    if config.after_train_step is not None:
        merged = merged.for_each(config.after_train_step(workers, config))
    learner.start()
    return (StandardMetricsReporting(merged, workers, config)
            .for_each(learner.add_learner_metrics)
            .on_close(lambda: shut_down(learner, aggregators)))


def _make_learner(workers: WorkerSet, config: IMPALAConfig) -> LearnerThread | MultiGPULearnerThread:
    """The learner thread (not started): the multi-GPU variant unless ``simple_optimizer``."""
    if config.use_simple_optimizer:
        cut = PieceMinibatches(config.sgd_minibatch_size, seed=config.seed) if config.sgd_minibatch_size else None
        return LearnerThread(workers.local_worker(), minibatch_buffer_size=config.minibatch_buffer_size,
                             num_sgd_iter=config.num_sgd_iter, learner_queue_size=config.learner_queue_size,
                             learner_queue_timeout=config.learner_queue_timeout, minibatches=cut)
    return MultiGPULearnerThread(
        workers.local_worker(), num_gpus=config.num_gpus, train_batch_size=config.train_batch_size,
        num_multi_gpu_tower_stacks=config.num_multi_gpu_tower_stacks, num_sgd_iter=config.num_sgd_iter,
        learner_queue_size=config.learner_queue_size, learner_queue_timeout=config.learner_queue_timeout)


class IMPALAPolicy(Policy):
    """The IMPALA policy: an actor-critic trained with V-trace targets.

    ``loss`` cuts the batch into trajectory pieces (:func:`sequence_layout`), computes V-trace over them with
    the sampling policy's ``logp`` as the behaviour policy (a terminated step has discount 0; a piece's last
    step otherwise bootstraps from ``V(new_obs)``), and returns
    ``-mean(logp(a) * pg_advantages) + vf_loss_coeff * 0.5 * mean((V(s) - vs)^2) - entropy_coeff * mean(H)``;
    ``grad_clip`` clips the gradients.

    Args:
        observation_space / action_space: as for :class:`~flowrl.policy.Policy`.
        config: an :class:`IMPALAConfig`.

    Raises:
        TypeError: a config that is not an :class:`IMPALAConfig`.

    Examples:
        >>> policy = IMPALAPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), IMPALAConfig(seed=0))
        >>> batch = SampleBatch({OBS: np.zeros((4, 4), np.float32), NEXT_OBS: np.zeros((4, 4), np.float32),
        ...                      ACTIONS: np.zeros(4, np.int64), LOGP: np.full(4, np.log(0.5), np.float32),
        ...                      REWARDS: np.ones(4, np.float32), TERMINATEDS: np.array([False, True, False, False]),
        ...                      TRUNCATEDS: np.zeros(4, bool), EPS_ID: np.array([0, 0, 1, 1]),
        ...                      T: np.array([0, 1, 0, 1])})
        >>> sorted(policy.learn_on_batch(batch)["learner_stats"])
        ['entropy', 'grad_gnorm', 'loss', 'mean_rho', 'policy_loss', 'vf_loss']
    """

    config: IMPALAConfig
    config_class = IMPALAConfig
    learns_in_groups = True  # V-trace runs per trajectory piece: a learner group's shares cut between pieces

    def group_shares(self, batch: SampleBatch, rows: np.ndarray, num_learners: int) -> list[np.ndarray]:
        """Contiguous runs of whole trajectory pieces (:func:`piece_ends`), each cut at the piece boundary nearest
        to an even split of the rows; V-trace over each share is then what it is over the whole batch."""
        rows = np.asarray(rows)
        columns = {c: np.asarray(batch[c])[rows] for c in (REWARDS, TERMINATEDS, TRUNCATEDS, EPS_ID, ENV_ID, T)
                   if c in batch}
        boundaries = np.flatnonzero(piece_ends(columns)) + 1  # a share may end after any of these rows
        cuts: list[int] = []
        for i in range(1, num_learners):
            target = i * len(rows) / num_learners
            cut = int(boundaries[np.argmin(np.abs(boundaries - target))])
            cuts.append(max(cut, cuts[-1] if cuts else 0))
        return np.split(rows, cuts)

    @torch.no_grad()
    def vtrace_targets(self, batch: TensorBatch, logp: torch.Tensor, values: torch.Tensor) -> VTraceReturns:
        """V-trace over the batch's trajectory pieces, returned per row (``[N]`` each).

        Args:
            batch: the train batch's tensors (``rewards``, ``logp``, ``new_obs``, ``terminateds``, and the
                ``eps_id``/``env_id``/``t`` columns that :func:`sequence_layout` cuts on).
            logp: ``log pi(a|s)`` of the batch's actions under the current policy.
            values: ``V(s)`` of the batch's observations under the current value function.
        """
        cfg = self.config
        time_index, piece_index, last_rows, L, P = sequence_layout(batch)
        bootstrap = self.next_values(batch, last_rows).to(values.dtype)  # V(x') after each piece

        def layout(x: torch.Tensor) -> torch.Tensor:  # [N] -> [L, P], zeros before each piece starts
            out = torch.zeros(L, P, dtype=values.dtype, device=values.device)
            out[time_index, piece_index] = x.to(values.dtype)
            return out

        terminated = batch[TERMINATEDS].to(values.dtype) if TERMINATEDS in batch else torch.zeros_like(values)
        out = vtrace(behaviour_logp=layout(batch[LOGP]), target_logp=layout(logp), rewards=layout(batch[REWARDS]),
                     values=layout(values), bootstrap_value=bootstrap, discounts=layout(cfg.gamma * (1.0 - terminated)),
                     clip_rho_threshold=cfg.vtrace_clip_rho_threshold,
                     clip_pg_rho_threshold=cfg.vtrace_clip_pg_rho_threshold, lambda_=cfg.vtrace_lambda)
        return VTraceReturns(*(x[time_index, piece_index] for x in (out.vs, out.pg_advantages, out.clipped_rhos)))

    def policy_advantages(self, targets: VTraceReturns) -> torch.Tensor:
        """The advantages the policy gradient weighs: V-trace's, standardised with ``normalize_advantages``."""
        adv = targets.pg_advantages
        if not self.config.normalize_advantages or adv.numel() < 2:
            return adv
        return (adv - adv.mean()) / (adv.std() + 1e-8)

    def to_tensors(self, batch: SampleBatch) -> TensorBatch:
        """All numeric columns; a recurrent model gets the columns V-trace and the loss read, with the padded
        sequences and initial states of :meth:`~flowrl.policy.Policy.sequence_tensors` and each row's
        ``state_out_<k>`` (the bootstrap values start from them)."""
        if not self.is_recurrent:
            return super().to_tensors(batch)
        outs = [STATE_OUT.format(k) for k in range(self.num_state_tensors)]
        return self.sequence_tensors(batch, [ACTIONS, LOGP, REWARDS, NEXT_OBS, TERMINATEDS, TRUNCATEDS, EPS_ID,
                                             ENV_ID, T, *outs])

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        dist_inputs, values = self.forward_rows(batch)
        dist = self.action_distribution(dist_inputs)
        logp = dist.logp(batch[ACTIONS])
        targets = self.vtrace_targets(batch, logp.detach(), values.detach())
        policy_loss = -(logp * self.policy_advantages(targets)).mean()
        vf_loss = 0.5 * (values - targets.vs).pow(2).mean()
        entropy = dist.entropy().mean()
        total = policy_loss + cfg.vf_loss_coeff * vf_loss - cfg.entropy_coeff * entropy
        parts = torch.stack([policy_loss, vf_loss, entropy, targets.clipped_rhos.mean()]).detach().tolist()
        return total, dict(zip(("policy_loss", "vf_loss", "entropy", "mean_rho"), parts))


def piece_ends(columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """Where :func:`sequence_layout` cuts, on numpy columns: ``True`` at the last row of each trajectory piece."""
    n = len(columns[REWARDS])
    ends = np.zeros(n, dtype=bool)
    ends[-1] = True
    for done in (TERMINATEDS, TRUNCATEDS):
        if done in columns:
            ends |= np.asarray(columns[done], dtype=bool)
    for column in (EPS_ID, ENV_ID):
        if column in columns:
            ends[:-1] |= columns[column][1:] != columns[column][:-1]
    if T in columns:
        ends[:-1] |= columns[T][1:] != columns[T][:-1] + 1
    return ends


class PieceMinibatches:
    """Cuts a train batch into minibatches of whole trajectory pieces (:func:`piece_ends`), for IMPALA's and APPO's
    ``sgd_minibatch_size``: consumes a :class:`~flowrl.sample_batch.SampleBatch`, emits its pieces in a random order
    (one generator, seeded once, so each call draws a new order) cut into minibatches that each take pieces until
    they hold at least ``size`` rows; every row lands in exactly one, each piece's rows in time order. A batch of at
    most ``size`` rows comes back whole.

    Examples:
        >>> batch = SampleBatch({REWARDS: np.zeros(6, np.float32), EPS_ID: np.array([0, 0, 1, 1, 2, 2]),
        ...                      T: np.array([0, 1, 0, 1, 0, 1])})
        >>> parts = PieceMinibatches(2, seed=0)(batch)
        >>> [p[EPS_ID].tolist() for p in parts]
        [[2, 2], [0, 0], [1, 1]]
        >>> [p.count for p in PieceMinibatches(3, seed=0)(batch)]  # pieces are never split: 4 rows, then 2
        [4, 2]
    """

    def __init__(self, size: int, seed: int | None = None) -> None:
        check_int("PieceMinibatches size", size, 1, "rows per minibatch")
        self.size = size
        self.rng = np.random.default_rng(seed)

    def __call__(self, batch: AnyBatch) -> list[AnyBatch]:
        if not isinstance(batch, SampleBatch):
            raise TypeError(f"PieceMinibatches cuts a SampleBatch, got {type(batch).__name__}: sgd_minibatch_size "
                            f"is for single-policy batches")
        if batch.count <= self.size:
            return [batch]
        ends = np.flatnonzero(piece_ends(batch))
        lengths = np.diff(ends, prepend=-1)
        return [batch.rows(rows) for rows, _ in shuffled_sequence_minibatches(lengths, self.size, self.rng)]

    def __repr__(self) -> str:
        return f"PieceMinibatches({self.size})"


def sequence_layout(batch: TensorBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """Cuts a flat train batch into contiguous trajectory pieces and lays them out time-major, left-padded.

    A piece ends after a row that terminated or was truncated, before a change of ``eps_id`` or ``env_id``,
    and before a row whose ``t`` is not the previous row's ``t + 1`` (a new fragment of another worker, or a
    replayed one). Missing columns just do not cut.

    Returns:
        ``(time_index, piece_index, last_rows, L, P)``: row ``i`` sits at ``[time_index[i], piece_index[i]]``
        of an ``[L, P]`` layout in which every piece ends at time ``L - 1``; ``last_rows`` are the rows that
        end the ``P`` pieces.
    """
    n = batch[REWARDS].shape[0]
    device = batch[REWARDS].device
    ends = torch.zeros(n, dtype=torch.bool, device=device)
    ends[-1] = True
    for done in (TERMINATEDS, TRUNCATEDS):
        if done in batch:
            ends |= batch[done].bool()
    for column in (EPS_ID, ENV_ID):
        if column in batch:
            ends[:-1] |= batch[column][1:] != batch[column][:-1]
    if T in batch:
        ends[:-1] |= batch[T][1:] != batch[T][:-1] + 1
    last_rows = torch.nonzero(ends).squeeze(1)
    piece_index = torch.cumsum(ends, 0) - ends.long()  # the piece of each row
    lengths = torch.diff(last_rows, prepend=last_rows.new_tensor([-1]))
    first_rows = last_rows - lengths + 1
    L = int(lengths.max())
    time_index = (L - lengths[piece_index]) + (torch.arange(n, device=device) - first_rows[piece_index])
    return time_index, piece_index, last_rows, L, int(last_rows.shape[0])


ALGORITHM = Algorithm("impala", IMPALAConfig, IMPALAPolicy, plan)
