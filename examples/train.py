"""rayshard demo: train a small torch model with Ray Train's TorchTrainer through rayshard.

Runs on an embedded local Ray (`make demo`) and unchanged on a cluster
(`ray submit cluster.yaml examples/train.py`). Generates a Parquet dataset if none is
given, shows a progress bar per epoch, and ends with a summary: throughput, samples seen
and a coverage check (every sample of every epoch exactly once).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray
import torch
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from tqdm import tqdm

import rayshard.train
from rayshard.loader import Loader
from rayshard.runtime.audit import start_audit
from rayshard.runtime.ray_tuning import apply_ray_env_defaults
from rayshard.sources.parquet import ParquetSource

FEATURES = 16


def make_dataset(folder: str, rows: int, files: int = 4, seed: int = 0) -> str:
    """Write `rows` samples of a linearly separable 4-class problem into Parquet files."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(FEATURES, 4)).astype(np.float32)
    bounds = np.linspace(0, rows, files + 1).astype(int)
    for index, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        x = rng.normal(size=(hi - lo, FEATURES)).astype(np.float32)
        label = (x @ weights).argmax(axis=1).astype(np.int64)
        table = pa.table(
            {
                "id": np.arange(lo, hi, dtype=np.int64),
                "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), FEATURES),
                "label": label,
            }
        )
        pq.write_table(
            table, os.path.join(folder, f"part-{index:03d}.parquet"), row_group_size=2048
        )
    return folder


def train_loop_per_worker(config: dict) -> None:
    """One Train worker: rayshard iterator -> DDP model, a loss that ignores padding."""
    batches = rayshard.train.iterator(config["loader"])
    audit = config["audit"]
    model = ray.train.torch.prepare_model(
        torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    while batches.epoch < config["epochs"]:
        epoch, total, correct, loss_sum = batches.epoch, 0, 0, 0.0
        for batch in batches:
            real = ~batch["_padded"]
            logits = model(batch["x"])
            losses = torch.nn.functional.cross_entropy(logits, batch["label"], reduction="none")
            loss = (losses * real).sum() / real.sum().clamp(min=1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            audit.add.remote(epoch, batch["id"][real].cpu().numpy())
            total += int(real.sum())
            correct += int((logits.argmax(1) == batch["label"])[real].sum())
            loss_sum += float(loss) * int(real.sum())
        with tempfile.TemporaryDirectory() as folder:
            rayshard.train.save_state(batches, folder)
            ray.train.report(
                {
                    "epoch": epoch,
                    "loss": loss_sum / max(total, 1),
                    "accuracy": correct / max(total, 1),
                },
                checkpoint=Checkpoint.from_directory(folder),
            )


def show_progress(audit, num_samples: int, epochs: int, done: threading.Event) -> None:
    """One progress bar per epoch, fed by the audit actor (quiet when not a terminal)."""
    bars: dict[int, tqdm] = {}
    while True:
        finished = done.is_set()
        for epoch, seen in sorted(ray.get(audit.seen.remote()).items()):
            if epoch not in bars:
                bars[epoch] = tqdm(
                    total=num_samples,
                    desc=f"epoch {epoch}",
                    unit="sample",
                    disable=None,
                    leave=True,
                )
            bars[epoch].update(seen - bars[epoch].n)
        if finished:
            break
        done.wait(0.5)
    for bar in bars.values():
        bar.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="Parquet folder or glob (default: generate one)")
    parser.add_argument("--rows", type=int, default=20_000, help="rows to generate")
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--use-gpu", action="store_true", help="one GPU per worker")
    parser.add_argument("--storage", default=os.path.abspath("rayshard-output/ray-results"))
    args = parser.parse_args(argv)

    apply_ray_env_defaults()  # for the local Ray this may start (see rayshard.runtime.ray_tuning)
    ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=False)
    data = args.data or make_dataset(os.path.abspath("rayshard-output/demo-data"), args.rows)
    source = ParquetSource(data, columns=["id", "x", "label"])
    loader = Loader(source, batch_size=args.batch_size, name="demo", shuffle=True, seed=7)
    num_samples = loader.layout.num_samples
    audit = start_audit(num_samples)
    print(
        f"rayshard demo: {num_samples} samples in {len(source.layout().file_rows)} Parquet files, "
        f"{args.workers} workers, {args.epochs} epochs, batch size {args.batch_size}",
        flush=True,
    )
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"loader": loader, "audit": audit, "epochs": args.epochs},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=args.use_gpu),
        run_config=RunConfig(name=f"rayshard-demo-{int(time.time())}", storage_path=args.storage),
    )
    done = threading.Event()
    progress = threading.Thread(
        target=show_progress, args=(audit, num_samples, args.epochs, done), daemon=True
    )
    progress.start()
    started = time.perf_counter()
    try:
        result = trainer.fit()
    finally:
        done.set()
        progress.join()
    elapsed = time.perf_counter() - started
    report = ray.get(audit.report.remote())
    loader.shutdown()  # its readers and coordinator end; its default journal is removed
    seen = sum(r["seen"] for r in report.values())
    exact = len(report) == args.epochs and all(
        r["lost"] == 0 and r["duplicates"] == 0 for r in report.values()
    )
    print(f"\n{'epoch':>5} {'seen':>8} {'lost':>6} {'duplicates':>10}")
    for epoch, row in report.items():
        print(f"{epoch:>5} {row['seen']:>8} {row['lost']:>6} {row['duplicates']:>10}")
    print(
        f"trained {args.epochs} epochs in {elapsed:.1f} s: {seen} samples, "
        f"{seen / elapsed:,.0f} samples/s end to end (Ray Train start-up included); "
        f"final loss {result.metrics.get('loss', float('nan')):.3f}, "
        f"accuracy {result.metrics.get('accuracy', float('nan')):.3f}"
    )
    if not exact:
        print("rayshard demo: FAILED coverage check", flush=True)
        return 1
    print("rayshard demo: OK (every sample of every epoch seen exactly once)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
