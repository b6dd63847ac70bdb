"""Lightning training loops run inside Ray Train workers (importable there as
`tests.frameworks.lightning_loops`): the example's worker loop (its module, trainer and
epoch-end `RayTrainReportCallback`), plus a callback that records every training step's ids
in a `TrainLedger`, reports mid-epoch checkpoints with a marker of what the model had
received, and kills a worker process on request."""

from __future__ import annotations

import json
import os
import tempfile

import lightning.pytorch as pl
import ray
from ray.train import Checkpoint

from examples.train_lightning import train_loop_per_worker

MARKER_FILE = "marker.json"
CKPT_FILE = "checkpoint.ckpt"  # the name RayTrainReportCallback uses, which `fit` resumes from


class LedgerCallback(pl.Callback):
    """Every training step's real ids to the ledger (tagged attempt, rank, Lightning's epoch,
    the rank's step count `seq`); a Lightning checkpoint reported to Ray Train every `every`
    global steps but not at an epoch's last step (the example's `RayTrainReportCallback`
    reports there), with a marker {attempt, seq, epoch}. With `crash_at`, rank 1 of attempt
    0 exits its process at a step >= crash_at once rank 0 reported 2 of these checkpoints."""

    def __init__(self, config: dict, attempt: int) -> None:
        self.ledger, self.attempt, self.config = config["ledger"], attempt, config
        self.rank = ray.train.get_context().get_world_rank()
        self.seq = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seq += 1
        ids = batch["id"][~batch["_padded"]].tolist()
        ray.get(
            self.ledger.batch.remote(self.attempt, self.rank, trainer.current_epoch, self.seq, ids)
        )
        crash_at = self.config.get("crash_at")
        if (
            crash_at is not None
            and self.attempt == 0
            and self.rank == 1
            and self.seq >= crash_at
            and len(ray.get(self.ledger.progress.remote())["checkpoints"]) >= 2
        ):
            os._exit(1)  # a real worker death, mid-epoch; Ray Train restarts the group

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (
            trainer.global_step % self.config["every"] == 0
            and not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        ):
            self._report(trainer)

    def _report(self, trainer: pl.Trainer) -> None:
        marker = {"attempt": self.attempt, "seq": self.seq, "epoch": trainer.current_epoch}
        with tempfile.TemporaryDirectory() as folder:
            trainer.save_checkpoint(os.path.join(folder, CKPT_FILE), weights_only=False)
            with open(os.path.join(folder, MARKER_FILE), "w") as handle:
                json.dump(marker, handle)
            ray.train.report(marker, checkpoint=Checkpoint.from_directory(folder))
        trainer.strategy.barrier()
        if self.rank == 0:
            ray.get(self.ledger.checkpoint.remote(marker))


def ledger_loop(config: dict) -> None:
    """The example's `train_loop_per_worker` with a `LedgerCallback`; it resumes from Ray
    Train's latest checkpoint through Lightning's `ckpt_path` (the marker says which one,
    for the audit; the run must resume from one of the ledger's mid-epoch checkpoints)."""
    from ray.train.collective import broadcast_from_rank_zero

    context = ray.train.get_context()
    resumed_from = None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder, open(os.path.join(folder, MARKER_FILE)) as f:
            resumed_from = json.load(f)
    ledger = config["ledger"]
    attempt = None
    if context.get_world_rank() == 0:
        attempt = ray.get(ledger.new_attempt.remote(context.get_world_size(), resumed_from))
    attempt = broadcast_from_rank_zero(attempt)
    train_loop_per_worker(config, callbacks=[LedgerCallback(config, attempt)])
