"""TinyPGPolicy, for tests and examples (exported by :mod:`flowrl.testing`, which loads it lazily)."""

from __future__ import annotations

import torch

from flowrl.policy import Policy, TensorBatch
from flowrl.postprocessing import discounted_returns
from flowrl.sample_batch import ACTIONS, OBS, RETURNS, REWARDS, TERMINATEDS, TRUNCATEDS, SampleBatch

__all__ = ["TinyPGPolicy"]


class TinyPGPolicy(Policy):
    """REINFORCE in a few lines, for tests and examples: returns-to-go, loss ``-logp(a) * G``."""

    postprocess_spans_episodes = True  # its postprocessing restarts at every episode boundary

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        batch[RETURNS] = discounted_returns(rewards=batch[REWARDS], terminateds=batch[TERMINATEDS],
                                            truncateds=batch[TRUNCATEDS], gamma=self.config.gamma)
        return batch

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        dist_inputs, _ = self.model(batch[OBS])
        logp = self.action_distribution(dist_inputs).logp(batch[ACTIONS])
        return -(logp * batch[RETURNS]).mean(), {"mean_logp": float(logp.detach().mean())}
