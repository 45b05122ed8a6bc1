"""MARWIL: monotonic advantage re-weighted imitation learning (Wang et al., NeurIPS 2018), RLlib's offline plan.

Dataflow: PG's plan itself (:func:`flowrl.algorithms.pg.plan`). ``ParallelRollouts(bulk_sync)`` yields the experience, which with ``input=DIR`` (the usual
case) is a recorded dataset (:mod:`flowrl.offline`), read in items, each episode postprocessed with its discounted
returns and the rows shuffled; the items are concatenated into train batches of ``train_batch_size`` rows
(``ConcatBatches``) and each takes one gradient step (``TrainOneStep``). Without ``input`` the workers sample the
env, and MARWIL learns on-policy. Reports come from ``StandardMetricsReporting``; a run that reads a dataset has
no training episodes, so the default config evaluates the policy in the env every report
(``result["evaluation"]``).

The loss, with advantages ``A = G - V(s)`` (``G`` the discounted return of the recorded episode) scaled by the
running root mean square ``c`` of the advantages: ``-mean(exp(beta * A / c) * log pi(a|s)) + vf_coeff * 0.5 *
mean(A^2)``. With ``beta = 0`` it is behaviour cloning (:mod:`flowrl.algorithms.bc`) and the value is not trained.

Examples:
    >>> config = MARWILConfig(seed=0)
    >>> config.beta, config.num_workers, config.train_batch_size, config.evaluation_interval
    (1.0, 0, 2000, 1)
    >>> import tempfile
    >>> from flowrl.testing import record_fake_episodes
    >>> data = record_fake_episodes(tempfile.mkdtemp(), episodes=20, length=50)
    >>> config = MARWILConfig(input=data, train_batch_size=200, timesteps_per_iteration=0, evaluation_interval=0,
    ...                       executor="local", seed=0)
    >>> it = plan(WorkerSet(policy_class=MARWILPolicy, config=config), config)
    >>> it
    LocalIterator[ReadInput(200 rows).combine(ConcatBatches(200)).for_each(TrainOneStep)...]
    >>> next(it)["info"]["num_steps_sampled"]
    200
    >>> MARWILConfig(beta=-1.0)
    Traceback (most recent call last):
    ...
    ValueError: beta=-1.0 must be a number >= 0 (the advantage weight's temperature; 0 is behaviour cloning)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import gymnasium as gym
import torch

from flowrl.algorithms import Algorithm
from flowrl.algorithms.pg import plan
from flowrl.config import TrainerConfig
from flowrl.policy import Policy, TensorBatch
from flowrl.postprocessing import discounted_returns
from flowrl.sample_batch import ACTIONS, OBS, RETURNS, REWARDS, TERMINATEDS, TRUNCATEDS, SampleBatch
from flowrl.validation import bounded
from flowrl.workers import WorkerSet

__all__ = ["MARWILConfig", "MARWILPolicy", "plan", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class MARWILConfig(TrainerConfig):
    """MARWIL's config: :class:`~flowrl.config.TrainerConfig` with RLlib's MARWIL defaults.

    Attributes:
        beta: the temperature of the advantage weights ``exp(beta * A / c)``; 0 imitates every recorded action
            alike (behaviour cloning).
        vf_coeff: the value loss's weight (unused with ``beta = 0``).
        moving_average_sqd_adv_norm_start: the running mean of squared advantages ``c^2`` starts here.
        moving_average_sqd_adv_norm_update_rate: how fast ``c^2`` follows each batch's mean of squared advantages
            (RLlib's 1e-8: ``c`` stays near its start).
        num_workers: 0: the driver reads the dataset (or samples) and learns.
        lr: Adam learning rate.
        train_batch_size: rows per gradient step.
        timesteps_per_iteration: a report (and its evaluation) every 10,000 rows read: 5 gradient steps.
        evaluation_interval / evaluation_duration: evaluate in the env every report, 10 episodes, greedy: with a
            dataset as input the evaluation is the only measure of the policy.
    """

    beta: float = bounded(1.0, ge=0, meaning="the advantage weight's temperature; 0 is behaviour cloning")
    vf_coeff: float = bounded(1.0, ge=0, meaning="the value loss's weight")
    moving_average_sqd_adv_norm_start: float = bounded(100.0, gt=0, meaning="the first mean of squared advantages")
    moving_average_sqd_adv_norm_update_rate: float = bounded(1e-8, gt=0, le=1,
                                                             meaning="the squared-advantage average's step")
    num_workers: int = 0
    lr: float = 1e-3
    train_batch_size: int = 2000
    timesteps_per_iteration: int = 10_000
    evaluation_interval: int = 1
    evaluation_duration: int = 10


class MARWILPolicy(Policy):
    """Advantage-weighted imitation: each recorded action's log-likelihood weighted by ``exp(beta * A / c)``.

    ``postprocess_trajectory`` adds the ``returns`` column (``discounted_returns`` with ``config.gamma``; a piece
    cut before its episode ended counts the cut as zero-valued). ``loss`` computes ``A = returns - V(obs)``, moves
    the running mean of squared advantages ``c^2`` toward the batch's, and returns the weighted negative
    log-likelihood plus ``vf_coeff`` times the value loss; with ``beta = 0`` only the negative log-likelihood.
    ``c^2`` is learned state: it moves only with a step that is applied, and travels in :meth:`get_state`.

    Examples:
        >>> import numpy as np
        >>> policy = MARWILPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), MARWILConfig(seed=0))
        >>> piece = SampleBatch({OBS: np.zeros((3, 4), np.float32), ACTIONS: np.zeros(3, np.int64),
        ...                      REWARDS: np.ones(3, np.float32), TERMINATEDS: np.array([False, False, True]),
        ...                      TRUNCATEDS: np.zeros(3, bool)})
        >>> [round(float(g), 4) for g in policy.postprocess_trajectory(piece)[RETURNS]]
        [2.9701, 1.99, 1.0]
        >>> sorted(policy.learn_on_batch(piece)["learner_stats"])
        ['loss', 'ma_sqd_adv_norm', 'policy_loss', 'vf_explained_var', 'vf_loss']
    """

    config_class = MARWILConfig
    postprocess_spans_episodes = True  # discounted_returns restarts at every episode end
    #: the columns it reads from a dataset beyond flowrl.ops.offline.INPUT_COLUMNS: none (no next observations)
    offline_columns: ClassVar[tuple[str, ...]] = ()
    config: MARWILConfig

    def __init__(self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: MARWILConfig) -> None:
        super().__init__(observation_space, action_space, config)
        self.ma_sqd_adv_norm = float(config.moving_average_sqd_adv_norm_start)
        self._next_ma_sqd_adv_norm: float | None = None  # what the step in progress moves it to

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        batch[RETURNS] = discounted_returns(rewards=batch[REWARDS], terminateds=batch[TERMINATEDS],
                                            truncateds=batch[TRUNCATEDS], gamma=self.config.gamma)
        return batch

    def to_tensors(self, batch: SampleBatch) -> TensorBatch:
        """Only the columns the loss reads."""
        return super().to_tensors(SampleBatch._of_checked({k: batch[k] for k in (OBS, ACTIONS, RETURNS)}))

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        dist_inputs, values = self.model(batch[OBS])
        logp = self.action_distribution(dist_inputs).logp(batch[ACTIONS])
        if self.config.beta == 0.0:  # behaviour cloning: every action alike, no value
            policy_loss = -logp.mean()
            return policy_loss, {"policy_loss": float(policy_loss.detach())}
        advantages = batch[RETURNS] - values
        squared = float(advantages.detach().pow(2).mean())
        rate = self.config.moving_average_sqd_adv_norm_update_rate
        self._next_ma_sqd_adv_norm = self.ma_sqd_adv_norm + rate * (squared - self.ma_sqd_adv_norm)
        weights = torch.exp(self.config.beta * advantages.detach() / (1e-8 + math.sqrt(self._next_ma_sqd_adv_norm)))
        policy_loss = -(weights * logp).mean()
        vf_loss = 0.5 * advantages.pow(2).mean()
        variance = float(batch[RETURNS].var()) if len(batch[RETURNS]) > 1 else 0.0
        explained = 1.0 - float((batch[RETURNS] - values.detach()).var()) / variance if variance > 0 else float("nan")
        return policy_loss + self.config.vf_coeff * vf_loss, {
            "policy_loss": float(policy_loss.detach()), "vf_loss": float(vf_loss.detach()),
            "ma_sqd_adv_norm": self._next_ma_sqd_adv_norm, "vf_explained_var": explained}

    def optimizer_step(self) -> None:
        """The step, and the running mean of squared advantages moves with it: a step skipped on a non-finite
        gradient (a NaN in the batch) leaves both as they were."""
        version = self.weights_version
        super().optimizer_step()
        if self.weights_version > version and self._next_ma_sqd_adv_norm is not None:
            self.ma_sqd_adv_norm = self._next_ma_sqd_adv_norm
        self._next_ma_sqd_adv_norm = None

    def get_state(self) -> dict[str, Any]:
        """The base state plus the running mean of squared advantages."""
        return {**super().get_state(), "ma_sqd_adv_norm": self.ma_sqd_adv_norm}

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        if "ma_sqd_adv_norm" not in state:
            raise ValueError(f"MARWILPolicy.set_state: the state has no 'ma_sqd_adv_norm' (keys {sorted(state)}); "
                             f"restore a state saved by a MARWILPolicy")
        self.ma_sqd_adv_norm = float(state["ma_sqd_adv_norm"])


ALGORITHM = Algorithm("marwil", MARWILConfig, MARWILPolicy, plan)
