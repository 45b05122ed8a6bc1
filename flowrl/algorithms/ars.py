"""ARS: augmented random search (Mania et al. 2018, https://arxiv.org/abs/1803.07055) as a plan.

Dataflow: ES's (:mod:`flowrl.algorithms.es`) with ARS's update. Each round every worker evaluates antithetic
pairs ``theta +- noise_stdev * delta`` and sends back the noise offsets and returns; once ``num_rollouts``
directions are in, the ``rollouts_used`` best of them (by ``max(R+, R-)``) give the step
``theta += stepsize / (b * sigma_R) * sum_k (R_k+ - R_k-) delta_k``, ``sigma_R`` the standard deviation of
their ``2b`` returns (plain SGD: no momentum, no decay). The observation filter (``MeanStdFilter``, ARS's "V2")
learns on every worker and travels, merged, with the weights. The default policy is linear (no hidden layer).

Examples:
    >>> config = ARSConfig(env="CartPole-v1")
    >>> config.num_rollouts, config.rollouts_used, config.model.hidden_sizes
    (16, 8, ())
    >>> ARSConfig(num_rollouts=4, rollouts_used=8)
    Traceback (most recent call last):
    ...
    ValueError: rollouts_used=8 must be <= num_rollouts=4 (the best directions of those evaluated); lower rollouts_used or raise num_rollouts
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from flowrl.algorithms import Algorithm
from flowrl.config import ModelConfig
from flowrl.evolution import (Evaluations, EvolutionConfig, EvolutionPolicy, NoiseTable, PerturbationWorker,
                              noise_table_state)
from flowrl.iter import LocalIterator
from flowrl.ops.evolution import ApplyEvolutionUpdate, CollectEvaluations, ParallelEvaluations
from flowrl.ops.metrics import StandardMetricsReporting
from flowrl.validation import bounded
from flowrl.workers import WorkerSet

__all__ = ["ARSConfig", "ARSPolicy", "plan", "make_owned_state", "ARSGradient", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class ARSConfig(EvolutionConfig):
    """ARS's config: :class:`~flowrl.evolution.EvolutionConfig` with ARS's settings.

    Attributes:
        num_rollouts: directions (antithetic pairs) per update, ``N`` (16).
        rollouts_used: the best directions the update uses, ``b`` (8).
        noise_stdev: ``nu``, 0.05 (seeds 0-5 reached 150 on CartPole-v1 within 14.8k env steps; 0.02 took up to
            22.5k). stepsize: ``alpha``, 0.02.
        train_batch_size: 1: no minimum of env steps per update (``num_rollouts`` decides).
        model: linear (``hidden_sizes=()``), as in the paper.
    """

    num_rollouts: int = bounded(16, ge=1, meaning="directions (antithetic pairs) per update")
    rollouts_used: int = bounded(8, ge=1, meaning="the best directions the update uses")
    noise_stdev: float = bounded(0.05, gt=0, meaning="nu, the scale of each perturbation")
    stepsize: float = bounded(0.02, gt=0, meaning="alpha, the update's step size")
    train_batch_size: int = bounded(1, ge=1, meaning="env steps per update at least; 1: num_rollouts decides")
    model: ModelConfig = field(default_factory=lambda: ModelConfig(hidden_sizes=()))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rollouts_used > self.num_rollouts:
            raise ValueError(f"rollouts_used={self.rollouts_used} must be <= num_rollouts={self.num_rollouts} (the "
                             f"best directions of those evaluated); lower rollouts_used or raise num_rollouts")

    @property
    def pairs_per_iteration(self) -> int:
        return self.num_rollouts


def plan(workers: WorkerSet, config: ARSConfig, noise: NoiseTable) -> LocalIterator[dict[str, Any]]:
    """ARS: evaluate directions on every worker, collect ``num_rollouts``, step on the best, broadcast, report."""
    evaluations = ParallelEvaluations(workers, noise)
    train_op = (evaluations
                .combine(CollectEvaluations(2 * config.num_rollouts, config.train_batch_size))
                .for_each(ApplyEvolutionUpdate(workers, noise, ARSGradient(config.rollouts_used))))
    return StandardMetricsReporting(train_op, workers, config)


#: the noise table, made once per trainer
make_owned_state = noise_table_state


class ARSGradient:
    """ARS's update direction, to descend: ``-sum_k (R_k+ - R_k-) delta_k / (b * sigma_R)`` over the ``b`` directions
    with the highest ``max(R_k+, R_k-)`` (ties: the earlier one).

    Examples:
        >>> table = NoiseTable(size=10, seed=0)
        >>> returns = np.array([[1.0, 0.0], [5.0, 1.0], [0.0, 2.0]])
        >>> g, stats = ARSGradient(2)(Evaluations(np.array([0, 1, 2]), returns, np.ones((3, 2), np.int64), 6, 0),
        ...                           table, np.zeros(3, np.float32))
        >>> sigma = np.std([5.0, 1.0, 0.0, 2.0])
        >>> bool(np.allclose(g, -(4.0 * table.get(1, 3) - 2.0 * table.get(2, 3)) / (2 * sigma)))
        True
    """

    def __init__(self, rollouts_used: int) -> None:
        self.rollouts_used = rollouts_used

    def __call__(self, evaluations: Evaluations, noise: NoiseTable,
                 theta: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
        returns = evaluations.returns
        b = min(self.rollouts_used, len(returns))
        best = np.argsort(-returns.max(axis=1), kind="stable")[:b]
        used = returns[best]
        sigma = float(used.std())
        weights = used[:, 0] - used[:, 1]
        g = noise.weighted_sum(weights, evaluations.noise_indices[best], len(theta)) / (b * max(sigma, 1e-8))
        return -g.astype(np.float32), {"grad_norm": float(np.linalg.norm(g)), "return_std": sigma}

    def __repr__(self) -> str:
        return f"ARSGradient(top {self.rollouts_used})"


class ARSPolicy(EvolutionPolicy):
    """ARS's deterministic policy (linear by default); its optimizer is plain SGD with ``stepsize``."""

    config: ARSConfig
    config_class = ARSConfig

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.config.stepsize)


ALGORITHM = Algorithm("ars", ARSConfig, ARSPolicy, plan, make_owned_state, worker_class=PerturbationWorker)
