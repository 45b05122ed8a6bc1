"""ES: OpenAI's evolution strategies (Salimans et al. 2017, https://arxiv.org/abs/1703.03864) as a plan.

Dataflow: no learner and no sample batch. Each round, every worker evaluates antithetic pairs of episodes
with ``theta +- noise_stdev * eps``, ``eps`` a slice of a noise table all processes share, and sends back only
the slices' offsets and the returns (``ParallelEvaluations``); rounds are collected until ``episodes_per_batch``
perturbed episodes and ``train_batch_size`` env steps are in (``CollectEvaluations``); the returns become centred
ranks, the gradient estimate ``g = sum_k (rank_k+ - rank_k-) eps_k / (2K)``, and Adam steps ``theta`` along it
with L2 decay ``l2_coeff``; the new weights (and the merged observation filter) go to every worker
(``ApplyEvolutionUpdate``). One update is one report.

Examples:
    >>> config = ESConfig(env="CartPole-v1")
    >>> config.num_workers, config.noise_stdev, config.stepsize, config.pairs_per_iteration
    (2, 0.02, 0.01, 25)
    >>> ESConfig(episodes_per_batch=1)
    Traceback (most recent call last):
    ...
    ValueError: episodes_per_batch=1 must be an int >= 2 (perturbed episodes per update, two per antithetic pair)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from flowrl.algorithms import Algorithm
from flowrl.evolution import (Evaluations, EvolutionConfig, EvolutionPolicy, NoiseTable, PerturbationWorker,
                              noise_table_state)
from flowrl.iter import LocalIterator
from flowrl.ops.evolution import ApplyEvolutionUpdate, CollectEvaluations, ParallelEvaluations, centered_ranks
from flowrl.ops.metrics import StandardMetricsReporting
from flowrl.validation import bounded
from flowrl.workers import WorkerSet

__all__ = ["ESConfig", "ESPolicy", "plan", "make_owned_state", "es_gradient", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class ESConfig(EvolutionConfig):
    """ES's config: :class:`~flowrl.evolution.EvolutionConfig` with RLlib's ES defaults scaled to 2 workers.

    Attributes:
        episodes_per_batch: perturbed episodes per update at least (50: 25 pairs).
        train_batch_size: env steps per update at least (1000).
        l2_coeff: L2 decay of ``theta`` added to the estimate (0.005).
    """

    episodes_per_batch: int = bounded(50, ge=2, meaning="perturbed episodes per update, two per antithetic pair")
    train_batch_size: int = bounded(1000, ge=1, meaning="env steps per update at least")
    l2_coeff: float = bounded(0.005, ge=0, meaning="L2 decay of theta; 0 turns it off")

    @property
    def pairs_per_iteration(self) -> int:
        return math.ceil(self.episodes_per_batch / 2)


def plan(workers: WorkerSet, config: ESConfig, noise: NoiseTable) -> LocalIterator[dict[str, Any]]:
    """ES: evaluate perturbation pairs on every worker, collect a batch of them, rank, step, broadcast, report."""
    evaluations = ParallelEvaluations(workers, noise)
    train_op = (evaluations
                .combine(CollectEvaluations(config.episodes_per_batch, config.train_batch_size))
                .for_each(ApplyEvolutionUpdate(workers, noise, es_gradient)))
    return StandardMetricsReporting(train_op, workers, config)


#: the noise table, made once per trainer
make_owned_state = noise_table_state


def es_gradient(evaluations: Evaluations, noise: NoiseTable, theta: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """The direction to descend: ``-sum_k (rank(R_k+) - rank(R_k-)) eps_k / (2K)`` with centred ranks over all
    ``2K`` returns (the L2 decay is the optimizer's ``weight_decay``).

    Examples:
        >>> table = NoiseTable(size=10, seed=0)
        >>> evals = Evaluations(np.array([0, 5]), np.array([[3.0, 1.0], [0.0, 2.0]]), np.ones((2, 2), np.int64), 4, 0)
        >>> g, stats = es_gradient(evals, table, np.zeros(3, np.float32))
        >>> bool(np.allclose(g, -(table.get(0, 3) * (0.5 - (-1 / 6)) + table.get(5, 3) * (-0.5 - 1 / 6)) / 4))
        True
    """
    ranks = centered_ranks(evaluations.returns)
    weights = ranks[:, 0] - ranks[:, 1]
    g = noise.weighted_sum(weights, evaluations.noise_indices, len(theta)) / evaluations.returns.size
    return -g.astype(np.float32), {"grad_norm": float(np.linalg.norm(g))}


class ESPolicy(EvolutionPolicy):
    """ES's deterministic MLP policy; its optimizer is Adam with ``stepsize`` and ``weight_decay=l2_coeff``."""

    config: ESConfig
    config_class = ESConfig

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=self.config.stepsize, weight_decay=self.config.l2_coeff)


ALGORITHM = Algorithm("es", ESConfig, ESPolicy, plan, make_owned_state, worker_class=PerturbationWorker)
