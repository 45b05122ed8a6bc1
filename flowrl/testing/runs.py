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

__all__ = ["FakeTrainerConfig", "tiny_pg_plan", "make_fake_trainer", "tb_scalars", "wandb_offline_history"]


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


def wandb_offline_history(run_dir: Path) -> list[dict[str, Any]]:
    """The history rows (``wandb.log`` calls) of the offline W&B runs under ``run_dir/wandb``, oldest run first:
    read from each run's ``.wandb`` file (W&B's log of protocol-buffer records in 32 KiB blocks: a 7-byte file
    header, then records of a 7-byte header (CRC, length, type: whole, first, middle, last) and their data)."""
    import json
    import struct

    from wandb.proto import wandb_internal_pb2

    rows: list[dict[str, Any]] = []
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        data, pos, block, pending = path.read_bytes(), 7, 32768, b""
        assert data[:4] == b":W&B", f"{path} is not a W&B log"
        while pos + 7 <= len(data):
            if block - pos % block < 7:  # a block's tail too short for a header is padding
                pos += block - pos % block
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            if length == 0 and kind == 0:
                break
            pending += data[pos + 7:pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):  # a whole record, or the last piece of one
                record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
                record.ParseFromString(pending)
                pending = b""
                if record.WhichOneof("record_type") == "history":
                    rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                 for item in record.history.item})
    return rows
