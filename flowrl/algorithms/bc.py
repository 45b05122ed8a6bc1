"""BC: behaviour cloning, MARWIL with ``beta = 0`` (every recorded action imitated alike, no value trained).

Dataflow: MARWIL's, which is PG's plan (:func:`flowrl.algorithms.pg.plan`): a recorded dataset (``input=DIR``) read in items,
concatenated into train batches, one gradient step on ``-mean(log pi(a|s))`` each; the policy is evaluated in the
env every report.

Examples:
    >>> BCConfig().beta
    0.0
    >>> BCConfig(beta=1.0)
    Traceback (most recent call last):
    ...
    ValueError: beta=1.0: BC is MARWIL with beta=0; use MARWILConfig (flowrl train marwil) for advantage weights
"""

from __future__ import annotations

from dataclasses import dataclass

from flowrl.algorithms import Algorithm
from flowrl.algorithms.marwil import MARWILConfig, MARWILPolicy
from flowrl.algorithms.pg import plan

__all__ = ["BCConfig", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class BCConfig(MARWILConfig):
    """BC's config: :class:`~flowrl.algorithms.marwil.MARWILConfig` with ``beta = 0`` (any other value is refused)."""

    beta: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.beta != 0.0:
            raise ValueError(f"beta={self.beta}: BC is MARWIL with beta=0; use MARWILConfig (flowrl train marwil) "
                             f"for advantage weights")


ALGORITHM = Algorithm("bc", BCConfig, MARWILPolicy, plan)
