"""Helpers shared by tests and doctests; no library module imports this package.

- :mod:`flowrl.testing.fakes`: torch-free fakes (``FakeWorker``, ``FakePolicy``, ``FakeConfig``,
  ``make_fake_workers``, ``fake_batch``) and ``iter_list``/``plan_lines``. A fake worker actor imports neither
  torch nor a model, so it starts in well under a second: operator tests run against them.
- :mod:`flowrl.testing.runs`: a trainer over fake workers (``make_fake_trainer``), ``tb_scalars`` and
  ``wandb_offline_history`` (what a run logged to TensorBoard and to offline W&B).
- :mod:`flowrl.testing.network`: ``keep_traffic_on_loopback`` (tests and benchmarks: no request leaves the machine).
- :mod:`flowrl.testing.sweeps`: a Ray Tune sweep killed part-way at a known point (tests of ``Tuner.restore``).
- :mod:`flowrl.testing.envpool_stub`: a stand-in for EnvPool's API (tests of ``vector_backend="envpool"`` where
  EnvPool, an optional extra, is not installed).
- :mod:`flowrl.testing.offline`: recorded datasets written as rollout workers write them (``record_fake_episodes``,
  ``fake_episode``, ``record_cartpole_controller``), loaded on first use.
- ``TinyPGPolicy``: a small torch policy for tests and examples (REINFORCE, :class:`flowrl.algorithms.pg.PGPolicy`),
  loaded on first use so that importing this package stays free of torch.

Examples:
    >>> ws = make_fake_workers(num_workers=0, rollout_fragment_length=5)
    >>> batch = ws.local_worker().sample()
    >>> batch.count, batch[WEIGHTS_VERSION].tolist()
    (5, [0, 0, 0, 0, 0])
"""

from __future__ import annotations

from typing import Any

from flowrl.testing.fakes import (SAMPLE_INDEX, WEIGHTS_VERSION, WORKER_INDEX, FakeConfig, FakePolicy, FakeWorker,
                                  fake_batch, iter_list, make_fake_workers, plan_lines)
from flowrl.testing.runs import FakeTrainerConfig, make_fake_trainer, tb_scalars, tiny_pg_plan, wandb_offline_history

__all__ = ["iter_list", "plan_lines", "fake_batch", "FakeConfig", "FakePolicy", "FakeWorker", "make_fake_workers",
           "TinyPGPolicy", "WEIGHTS_VERSION", "WORKER_INDEX", "SAMPLE_INDEX", "FakeTrainerConfig", "make_fake_trainer",
           "tiny_pg_plan", "tb_scalars", "wandb_offline_history", "record_fake_episodes", "fake_episode",
           "record_cartpole_controller"]


def __getattr__(name: str) -> Any:
    if name == "TinyPGPolicy":  # lazily: it imports torch, which the fakes must not
        from flowrl.algorithms.pg import PGPolicy
        return PGPolicy
    if name in ("record_fake_episodes", "fake_episode", "record_cartpole_controller"):  # lazily: flowrl.offline imports torch (through spaces)
        from flowrl.testing import offline
        return getattr(offline, name)
    raise AttributeError(f"module 'flowrl.testing' has no attribute {name!r}")
