"""The paper's operators: rollout, train, replay, concurrency and metrics, plus IMPALA's
tree aggregation, the evolution strategies' evaluations, meta-learning's adaptation, DD-PPO's
decentralized learning and offline input.

A plan imports what it wires from here: ``from flowrl.ops import ParallelRollouts, ConcatBatches, ...``.
Each name also lives in its family module (``flowrl.ops.rollout``, ``.train``, ``.replay``,
``.concurrency``, ``.metrics``, ``.aggregation``, ``.evolution``, ``.meta``, ``.decentralized``, ``.offline``), and
this package exports exactly the names the family
modules list in their ``__all__``: a new operator is added to its family's list, nowhere else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowrl.ops import (aggregation, concurrency, decentralized, evolution, meta, metrics, offline, replay, rollout,
                        train)
from flowrl.ops.aggregation import *  # noqa: F401,F403  (each family's __all__; see below)
from flowrl.ops.concurrency import *  # noqa: F401,F403
from flowrl.ops.decentralized import *  # noqa: F401,F403
from flowrl.ops.evolution import *  # noqa: F401,F403
from flowrl.ops.meta import *  # noqa: F401,F403
from flowrl.ops.metrics import *  # noqa: F401,F403
from flowrl.ops.offline import *  # noqa: F401,F403
from flowrl.ops.replay import *  # noqa: F401,F403
from flowrl.ops.rollout import *  # noqa: F401,F403
from flowrl.ops.train import *  # noqa: F401,F403

__all__: list[str] = []
__all__ += rollout.__all__
__all__ += train.__all__
__all__ += replay.__all__
__all__ += concurrency.__all__
__all__ += metrics.__all__
__all__ += aggregation.__all__
__all__ += evolution.__all__
__all__ += meta.__all__
__all__ += decentralized.__all__
__all__ += offline.__all__

if TYPE_CHECKING:
    from flowrl.contracts import LearnerThreadLike, PriorityUpdater, ReplayReader, ReplayWriter
    from flowrl.replay_buffers import LocalReplayBuffer, SimpleReplayBuffer

    def _conforms(learner: concurrency.LearnerThread, multi_gpu: concurrency.MultiGPULearnerThread,
                  apex: concurrency.ApexLearnerThread, local: LocalReplayBuffer, simple: SimpleReplayBuffer,
                  ) -> tuple[LearnerThreadLike, LearnerThreadLike, LearnerThreadLike, ReplayWriter, ReplayReader,
                             PriorityUpdater, ReplayWriter, ReplayReader]:
        # mypy checks here that the learner threads and replay buffers keep the contracts the operators rely on
        return learner, multi_gpu, apex, local, local, local, simple, simple
