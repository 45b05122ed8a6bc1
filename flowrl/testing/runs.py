"""Fake trainer runs, for tests of the trainer's own work (recovery, reports, checkpoints), and reading what a run
wrote to TensorBoard. The trainer, its plan and tensorboardX are imported when a function here is called."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowrl.config import TrainerConfig
from flowrl.iter import LocalIterator
from flowrl.testing.fakes import FakeConfig, FakeWorker

if TYPE_CHECKING:
    from flowrl.trainer import Trainer
    from flowrl.workers import WorkerSet

__all__ = ["FakeTrainerConfig", "tiny_pg_plan", "make_fake_trainer", "tb_scalars"]


@dataclass(frozen=True, kw_only=True)
class FakeTrainerConfig(FakeConfig, TrainerConfig):
    """:class:`FakeConfig`'s simulated work with a trainer's fields (recovery, reporting), for
    :func:`make_fake_trainer`."""


def tiny_pg_plan(workers: WorkerSet, config: TrainerConfig) -> LocalIterator[dict[str, Any]]:
    """The PG plan: bulk-sync rollouts, ``ConcatBatches(train_batch_size)``, ``TrainOneStep``, reports."""
    from flowrl.ops import ConcatBatches, ParallelRollouts, StandardMetricsReporting, TrainOneStep

    train_op = (ParallelRollouts(workers, mode="bulk_sync")
                .combine(ConcatBatches(config.train_batch_size))
                .for_each(TrainOneStep(workers)))
    return StandardMetricsReporting(train_op, workers, config)


def make_fake_trainer(config: FakeTrainerConfig) -> Trainer:
    """A :class:`~flowrl.trainer.Trainer` of :func:`tiny_pg_plan` (algorithm ``"fake_pg"``) whose remote workers are
    :class:`FakeWorker` actors: no torch in them, so each starts in about a second; the local worker is a
    FakeWorker too. For tests of the trainer's own work: recovery, reports, checkpoints."""
    from flowrl.algorithms.pg import PGPolicy
    from flowrl.algorithms import Algorithm
    from flowrl.trainer import Trainer
    from flowrl.workers import WorkerSet

    class FakeWorkerTrainer(Trainer):
        def _make_workers(self, config: TrainerConfig) -> WorkerSet:
            return WorkerSet(policy_class=None, config=config, worker_class=FakeWorker)

    return FakeWorkerTrainer(Algorithm("fake_pg", FakeTrainerConfig, PGPolicy, tiny_pg_plan), config)


def tb_scalars(tb_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in a run's TensorBoard event files, ``{tag: [(step, value), ...]}`` (TFRecord framing:
    length, its CRC, data, its CRC)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(tb_dir.glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars
