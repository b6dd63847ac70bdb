"""rayshard images example: PNGs in Parquet, decoded and augmented in the readers.

scikit-learn's bundled digits (1,797 8x8 images, no download) are upscaled to 32x32 and
stored as PNG bytes in Parquet. `Loader(transform=per_sample(decode_and_augment))` decodes
each PNG and applies a random 28x28 crop and a horizontal flip inside the reader actors;
the training workers (a small CNN under Ray Train's TorchTrainer) receive float tensors.
The random state of a sample depends only on (seed, epoch, sample index): the script ends
with the coverage table and a check that the augmented images of an epoch read on 2
ranks are identical to those of the same epoch stopped mid-way and resumed on 1 rank.

Runs on an embedded local Ray (`make example-images`) and unchanged on a cluster
(`ray submit cluster.yaml examples/train_images.py`).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray
import torch
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import rayshard.train
from rayshard.data.transforms import per_sample
from rayshard.loader import Loader
from rayshard.runtime.audit import format_report, start_audit
from rayshard.runtime.ray_tuning import apply_ray_env_defaults
from rayshard.sources.parquet import ParquetSource

SIZE, CROP, SEED = 32, 28, 7


def make_dataset(folder: str, samples: int | None = None, files: int = 3) -> str:
    """The digits (the first `samples` of them), upscaled to 32x32 grey PNGs, with their
    label and id, in Parquet."""
    from PIL import Image
    from sklearn.datasets import load_digits

    os.makedirs(folder, exist_ok=True)
    digits = load_digits()
    images = (digits.images[:samples] * (255 / 16)).clip(0, 255).astype(np.uint8)
    pngs = []
    for image in images:
        out = io.BytesIO()
        Image.fromarray(image).resize((SIZE, SIZE), Image.BILINEAR).save(out, format="PNG")
        pngs.append(out.getvalue())
    bounds = np.linspace(0, len(pngs), files + 1).astype(int)
    for index, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        table = pa.table(
            {
                "id": np.arange(lo, hi, dtype=np.int64),
                "png": pa.array(pngs[lo:hi], pa.binary()),
                "label": digits.target[lo:hi].astype(np.int64),
            }
        )
        pq.write_table(table, os.path.join(folder, f"part-{index}.parquet"), row_group_size=128)
    return folder


def decode_and_augment(sample: dict, rng: np.random.Generator) -> dict:
    """One sample, in a reader process: PNG -> random 28x28 crop, flipped half the time."""
    from PIL import Image

    image = np.asarray(Image.open(io.BytesIO(sample["png"])), dtype=np.float32) / 255.0
    top, left = rng.integers(0, SIZE - CROP + 1, size=2)
    image = image[top : top + CROP, left : left + CROP]
    if rng.random() < 0.5:
        image = image[:, ::-1]
    return {"id": sample["id"], "image": image[None].copy(), "label": sample["label"]}


def make_loader(data: str, name: str, namespace: str | None = None) -> Loader:
    return Loader(
        ParquetSource(data),
        batch_size=64,
        name=name,
        namespace=namespace,
        shuffle=True,
        seed=SEED,
        transform=per_sample(decode_and_augment),
    )


def small_cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),  # 14x14
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),  # 7x7
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 7 * 7, 10),
    )


def train_loop_per_worker(config: dict) -> None:
    """One Train worker: augmented image tensors from the readers -> DDP CNN."""
    torch.set_num_threads(1)
    batches = rayshard.train.iterator(config["loader"])
    audit = config["audit"]
    model = ray.train.torch.prepare_model(small_cnn())
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    while batches.epoch < config["epochs"]:
        epoch, total, correct, loss_sum = batches.epoch, 0, 0, 0.0
        for batch in batches:
            real = ~batch["_padded"]
            logits = model(batch["image"])
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
            metrics = {"epoch": epoch, "loss": loss_sum / total, "accuracy": correct / total}
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))


def images_by_id(rank_batches: list[list[dict]]) -> dict[int, np.ndarray]:
    return {
        int(i): image
        for batches in rank_batches
        for batch in batches
        for i, image, pad in zip(batch["id"], batch["image"], batch["_padded"])
        if not pad
    }


def lockstep(iterators: list, steps: int | None = None) -> list[list[dict]]:
    """Every rank's batches, one step at a time across the ranks (as in DDP)."""
    streams, out = [iter(it) for it in iterators], [[] for _ in iterators]
    step = 0
    while steps is None or step < steps:
        got = [next(stream, None) for stream in streams]
        if all(batch is None for batch in got):
            break
        for rank, batch in enumerate(got):
            if batch is not None:
                out[rank].append(batch)
        step += 1
    return out


def check_resume_reproducible(data: str) -> tuple[bool, int]:
    """Epoch 0 on 2 ranks vs. epoch 0 stopped half-way on 2 ranks and resumed on 1:
    every sample's augmented image must be identical. Runs outside Ray Train (the loader
    is the same one the trainer used, in fresh namespaces)."""
    full = make_loader(data, "images-check", namespace="rayshard-images-full")
    ranks = [full.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    reference = images_by_id(lockstep(ranks))
    full.shutdown()
    first = make_loader(data, "images-check", namespace="rayshard-images-a")
    ranks = [first.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    before = lockstep(ranks, steps=len(ranks[0]) // 2)
    state = json.loads(json.dumps(ranks[0].state_dict()))  # as a checkpoint holds it
    assert state["epoch"] == 0 and state["consumed"], "stopped mid-epoch"
    first.shutdown()
    second = make_loader(data, "images-check", namespace="rayshard-images-b")
    alone = second.iterator(world_rank=0, world_size=1, batch_format="numpy")
    alone.load_state_dict(state)
    after = lockstep([alone])
    second.shutdown()
    resumed = images_by_id(before + after)
    same = sorted(resumed) == sorted(reference) and all(
        np.array_equal(resumed[i], reference[i]) for i in reference
    )
    return same, len(reference)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="Parquet folder or glob (default: make the digits)")
    parser.add_argument("--samples", type=int, help="use the first N digits (default: all)")
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--use-gpu", action="store_true", help="one GPU per worker")
    parser.add_argument("--storage", default=os.path.abspath("rayshard-output/ray-results"))
    parser.add_argument(
        "--address",
        default=os.environ.get("RAY_ADDRESS"),
        help="Ray address (default: RAY_ADDRESS, else the cluster `ray start` runs here, else "
        "a new local Ray); `local` always starts a new one",
    )
    args = parser.parse_args(argv)

    apply_ray_env_defaults()  # for the local Ray this may start (see rayshard.runtime.ray_tuning)
    ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    data = args.data or make_dataset(os.path.abspath("rayshard-output/digits-png"), args.samples)
    loader = make_loader(data, "images")
    num_samples = loader.layout.num_samples
    audit = start_audit(num_samples)
    print(
        f"rayshard images: {num_samples} PNG digits, decoded and augmented in the readers; "
        f"{args.workers} workers, {args.epochs} epochs",
        flush=True,
    )
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"loader": loader, "audit": audit, "epochs": args.epochs},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=args.use_gpu),
        run_config=RunConfig(name=f"rayshard-images-{int(time.time())}", storage_path=args.storage),
    )
    started = time.perf_counter()
    result = trainer.fit()
    elapsed = time.perf_counter() - started
    report = ray.get(audit.report.remote())
    exact = len(report) == args.epochs and all(
        r["lost"] == 0 and r["duplicates"] == 0 for r in report.values()
    )
    print("\n" + format_report(report))
    print(
        f"trained {args.epochs} epochs in {elapsed:.1f} s; final loss "
        f"{result.metrics.get('loss', float('nan')):.3f}, accuracy "
        f"{result.metrics.get('accuracy', float('nan')):.3f}"
    )
    loader.shutdown()
    same, checked = check_resume_reproducible(data)
    print(
        f"augmentation check: {checked} samples, world size 2 vs. stopped half-way and "
        f"resumed on world size 1: {'identical' if same else 'DIFFERENT'}"
    )
    if not (exact and same):
        print("rayshard images: FAILED", flush=True)
        return 1
    print("rayshard images: OK (every sample once per epoch; augmentation reproducible)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
