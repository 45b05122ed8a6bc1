"""Helpers shared by tests and doctests; no library module imports this one."""

from __future__ import annotations

from typing import Iterable, TypeVar

import torch

from flowrl.iter import LocalIterator
from flowrl.policy import Policy, TensorBatch
from flowrl.postprocessing import discounted_returns
from flowrl.sample_batch import ACTIONS, OBS, RETURNS, REWARDS, TERMINATEDS, TRUNCATEDS, SampleBatch

__all__ = ["iter_list", "TinyPGPolicy"]

T = TypeVar("T")


def iter_list(items: Iterable[T]) -> LocalIterator[T]:
    """A local iterator over a list, named ``iter_list``.

    Examples:
        >>> iter_list([1, 2]).for_each(lambda x: x + 1).take(5)
        [2, 3]
    """
    return LocalIterator.from_iterable(list(items), name="iter_list")


class TinyPGPolicy(Policy):
    """REINFORCE in a few lines, for tests and examples: returns-to-go, loss ``-logp(a) * G``."""

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        batch[RETURNS] = discounted_returns(rewards=batch[REWARDS], terminateds=batch[TERMINATEDS],
                                            truncateds=batch[TRUNCATEDS], gamma=self.config.gamma)
        return batch

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        dist_inputs, _ = self.model(batch[OBS])
        logp = self.action_distribution(dist_inputs).logp(batch[ACTIONS])
        return -(logp * batch[RETURNS]).mean(), {"mean_logp": float(logp.detach().mean())}
