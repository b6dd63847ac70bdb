"""rayshard + PyTorch Lightning under Ray Train's TorchTrainer (wired as Ray's guide does).

Runs on an embedded local Ray (`make example-lightning`) and unchanged on a cluster
(`ray submit cluster.yaml examples/train_lightning.py`). Generates a Parquet dataset if none
is given, trains a small classifier for three epochs with `trainer.fit(model,
train_dataloaders=...)`, validates every epoch on a second loader (padding rows masked out
of the metric) and ends with a per-epoch coverage table: every sample exactly once.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import nullcontext
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.lightning import (
    RayDDPStrategy,
    RayLightningEnvironment,
    RayTrainReportCallback,
    prepare_trainer,
)
from ray.train.torch import TorchTrainer

import rayshard.train
from rayshard.frameworks.lightning import LightningBatches, RayshardCheckpoint
from rayshard.loader import Loader
from rayshard.runtime.audit import start_audit
from rayshard.runtime.ray_tuning import apply_ray_env_defaults
from rayshard.sources.parquet import ParquetSource

FEATURES = 16
CLASSES = 4


def make_dataset(folder: str, rows: int, files: int = 3, seed: int = 0) -> str:
    """`rows` samples of a linearly separable 4-class problem (`id`, `x`, `label`)."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    weights = np.random.default_rng(0).normal(size=(FEATURES, CLASSES)).astype(np.float32)
    bounds = np.linspace(0, rows, files + 1).astype(int)
    for index, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        x = rng.normal(size=(hi - lo, FEATURES)).astype(np.float32)
        table = pa.table(
            {
                "id": np.arange(lo, hi, dtype=np.int64),
                "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), FEATURES),
                "label": (x @ weights).argmax(axis=1).astype(np.int64),
            }
        )
        pq.write_table(table, os.path.join(folder, f"part-{index:03d}.parquet"), row_group_size=64)
    return folder


class Classifier(pl.LightningModule):
    """An MLP; every training batch's real ids go to `audit` (a CoverageAudit actor) if
    given. Validation sums loss and hits over real rows only and reduces the sums over the
    ranks, so the padding rows that even out the ranks' steps do not change the metric."""

    def __init__(self, audit: Any = None, lr: float = 0.1) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES)
        )
        self.audit, self.lr = audit, lr
        self._val = torch.zeros(3)  # loss sum, correct, rows (real rows only)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        real = ~batch["_padded"]
        losses = torch.nn.functional.cross_entropy(
            self.net(batch["x"]), batch["label"], reduction="none"
        )
        if self.audit is not None:
            self.audit.add.remote(self.current_epoch, batch["id"][real].cpu().numpy())
        return (losses * real).sum() / real.sum().clamp(min=1)

    def on_validation_epoch_start(self) -> None:
        self._val = torch.zeros(3, dtype=torch.float64, device=self.device)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        real = ~batch["_padded"]
        logits = self.net(batch["x"])
        losses = torch.nn.functional.cross_entropy(logits, batch["label"], reduction="none")
        hits = logits.argmax(1) == batch["label"]
        self._val += torch.stack(
            [losses[real].double().sum(), hits[real].double().sum(), real.double().sum()]
        )

    def on_validation_epoch_end(self) -> None:
        loss, correct, rows = self.trainer.strategy.reduce(self._val, reduce_op="sum").tolist()
        self.log_dict(
            {
                "val_loss": loss / max(rows, 1),
                "val_accuracy": correct / max(rows, 1),
                "val_rows": rows,
            },
        )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def fit(
    config: dict, model: pl.LightningModule, callbacks: list | None = None, report: bool = True
) -> None:
    """`trainer.fit` over rayshard, wired for Ray Train as Ray's guide does (Ray's DDP
    strategy and environment; with `report`, a checkpoint reported every epoch). After a
    restart it resumes from Ray Train's latest checkpoint, Lightning's own, which carries
    the loader's state (`RayshardCheckpoint`). Lightning's root folder is a temporary
    one, removed at the end (nothing is kept there: no logger, no checkpoints of its own)."""
    with tempfile.TemporaryDirectory(prefix="lightning-") as root:
        _fit_in(root, config, model, callbacks, report)


def _fit_in(
    root: str, config: dict, model: pl.LightningModule, callbacks: list | None, report: bool
) -> None:
    """`fit` with Lightning's root folder `root`."""
    train = LightningBatches(rayshard.train.iterator(config["loader"]))
    val = rayshard.train.iterator(config["val_loader"]) if config.get("val_loader") else None
    reporting = [RayTrainReportCallback()] if report else []
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        devices="auto",
        accelerator="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayshardCheckpoint(train, val), *reporting, *(callbacks or [])],
        num_sanity_val_steps=0,  # (only to save time: see the README)
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        default_root_dir=root,
    )
    trainer = prepare_trainer(trainer)
    checkpoint = ray.train.get_checkpoint()
    with checkpoint.as_directory() if checkpoint else nullcontext() as folder:
        ckpt_path = os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME) if folder else None
        trainer.fit(model, train_dataloaders=train, val_dataloaders=val, ckpt_path=ckpt_path)


def train_loop_per_worker(config: dict, callbacks: list | None = None) -> None:
    """One Ray Train worker: the Lightning module, fed by rayshard (`callbacks`: more
    Lightning callbacks, after the reporting one; the tests add one)."""
    fit(config, Classifier(audit=config.get("audit")), callbacks=callbacks)


def make_loaders(
    data: str, val_data: str, batch_size: int, name: str = "lightning"
) -> tuple[Loader, Loader]:
    """The training loader (shuffled) and the validation loader (in order)."""
    columns = ["id", "x", "label"]
    train = Loader(
        ParquetSource(data, columns=columns),
        batch_size=batch_size,
        name=f"{name}-train",
        shuffle=True,
        seed=7,
    )
    val = Loader(
        ParquetSource(val_data, columns=columns), batch_size=batch_size, name=f"{name}-val"
    )
    return train, val


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="Parquet folder or glob (default: generate one)")
    parser.add_argument("--val-data", help="validation Parquet (default: generate one)")
    parser.add_argument("--rows", type=int, default=4000, help="training rows to generate")
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--use-gpu", action="store_true", help="one GPU per worker")
    parser.add_argument("--storage", default=os.path.abspath("rayshard-output/ray-results"))
    args = parser.parse_args(argv)

    apply_ray_env_defaults()
    ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=False)
    root = os.path.abspath("rayshard-output")
    data = args.data or make_dataset(os.path.join(root, "lightning-train"), args.rows)
    val_data = args.val_data or make_dataset(
        os.path.join(root, "lightning-val"), max(args.rows // 4, 1) + 1, seed=1
    )
    loader, val_loader = make_loaders(data, val_data, args.batch_size)
    num_samples = loader.layout.num_samples
    audit = start_audit(num_samples)
    print(
        f"rayshard + Lightning: {num_samples} training samples, {args.workers} workers, "
        f"{args.epochs} epochs, batch size {args.batch_size}",
        flush=True,
    )
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "loader": loader,
            "val_loader": val_loader,
            "audit": audit,
            "epochs": args.epochs,
        },
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=args.use_gpu),
        run_config=RunConfig(
            name=f"rayshard-lightning-{int(time.time())}", storage_path=args.storage
        ),
    )
    started = time.perf_counter()
    result = trainer.fit()
    elapsed = time.perf_counter() - started
    report = ray.get(audit.report.remote())
    exact = sorted(report) == list(range(args.epochs)) and all(
        r["lost"] == 0 and r["duplicates"] == 0 for r in report.values()
    )
    print(f"\n{'epoch':>5} {'seen':>8} {'lost':>6} {'duplicates':>10}")
    for epoch, row in report.items():
        print(f"{epoch:>5} {row['seen']:>8} {row['lost']:>6} {row['duplicates']:>10}")
    metrics = result.metrics or {}
    print(
        f"trained {args.epochs} epochs in {elapsed:.1f} s (Ray Train start-up included); "
        f"val_loss {metrics.get('val_loss', float('nan')):.3f}, val_accuracy "
        f"{metrics.get('val_accuracy', float('nan')):.3f} over "
        f"{int(metrics.get('val_rows', 0))} validation rows"
    )
    loader.shutdown()
    val_loader.shutdown()
    if not exact:
        print("rayshard lightning example: FAILED coverage check", flush=True)
        return 1
    print(
        "rayshard lightning example: OK (every sample of every epoch seen exactly once)", flush=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
