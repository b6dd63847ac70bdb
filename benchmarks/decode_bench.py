"""Decode-bound epochs: PNG decode + random crop + flip through rayshard, Ray Data and torch.

    python -m benchmarks.decode_bench [--samples N] [--epochs E] [--ranks R] [--out DIR]

The images are scikit-learn's 1,797 bundled digits (8x8), upscaled to 64x64 grey with PIL
(bilinear), PNG-encoded and repeated to N samples, in Parquet (`png` binary, `label`,
`id` int64; row groups of 1,000 rows, 4 files). Every loader runs the same function,
`augment`, on batches of 256: decode each PNG (PIL), crop 56x56 at a random offset, flip
left-right with probability 1/2, output float32 in [0, 1]. Its random state is
`rayshard.data.transforms.sample_rng(seed, epoch, id)` in every loader (so the per-sample cost
is the same; Ray Data does not know the epoch and uses epoch 0).

  rayshard k=1  `Loader(ParquetSource, transform=rayshard_transform)`: the transform runs in
                each rank's reader actor; 2 ranks, one iterator each, 2 threads of the driver
  rayshard k=2  the same with `transform_workers=2` (2 worker processes per rank: 4 in all)
  rayshard r=2  the same with `reader_workers=2`: each rank's 2 worker processes read and
                decode the Parquet pieces and run the transform; the reader rebatches
                (`reader_workers=1` is the k=1 row: the reader reads and transforms)
  ray_data      `read_parquet(...).map_batches(ray_data_transform)` + `streaming_split(2)`,
                2 threads of the driver
  torch         `DataLoader(num_workers=2)` over a map-style Dataset whose `__getitems__`
                reads the batch's Parquet rows and runs `augment` (one DataLoader on the
                driver: its 2 worker processes decode, as rayshard's 2 readers do)

torch runs first, before Ray starts; the Ray loaders share one local Ray (`--ray-cpus`,
default 2; `main()` called with Ray up uses that one and leaves it up, as the smoke test
does). `--ranks R` (default 2) sets the ranks, Ray Data's splits and the DataLoader's
workers for every loader (the smoke test runs 1: fewer processes to start). Each loader is
built fresh and read for `--epochs` epochs: the first is the cold epoch (its time to first
batch includes starting readers or workers), rows/s is the median of the warm epochs after
it (of the cold one under `--epochs 1`, a smoke test). An epoch runs from the moment every
rank starts asking for it to the last rank's last batch; the time to first batch is to the
first batch any rank receives. Every epoch is checked to deliver every id (padding rows
excluded).

Notes. torch's workers are not persistent (`persistent_workers=False`, the default): they
are forked again each epoch (about 0.2 s of each warm epoch here). Ray Data runs with its
defaults: on these small files it reads all of them in one read task, so `map_batches`
runs as one task producing one block and the first batch arrives at the end of the epoch
(a smaller `DataContext.target_max_block_size` gives more tasks, not a much faster epoch).
On a machine shared with other work, loaders with more processes (rayshard k=2 and r=2
have 2 readers + 4 workers) get a larger share of the CPUs: compare within one run.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._measure import format_table
from benchmarks._report import ROOT, start_local_ray, write_json

DEFAULT_OUT = ROOT / "benchmarks" / "results"
SIZE, CROP, SEED = 64, 56, 7
BATCH_SIZE = 256
WORLD = 2
ROW_GROUP = 1000
FILES = 4
LOADERS = ("torch", "rayshard_k1", "rayshard_k2", "rayshard_r2", "ray_data")
TARGETS = {
    "rayshard_vs_torch": 1.0,  # rayshard (k=1) rows/s >= 1.0 x the torch DataLoader
    "rayshard_vs_ray_data": 2.0,  # rayshard (k=1) rows/s >= 2 x Ray Data
}


# ------------------------------------------------------------------------------ data


def make_dataset(folder: Path, samples: int) -> list[str]:
    """The digits as 64x64 PNGs, repeated to `samples` rows, in `FILES` Parquet files."""
    from PIL import Image
    from sklearn.datasets import load_digits

    folder.mkdir(parents=True, exist_ok=True)
    paths = [str(folder / f"part-{i}.parquet") for i in range(FILES)]
    if all(Path(p).exists() for p in paths) and (
        sum(pq.ParquetFile(p).metadata.num_rows for p in paths) == samples
    ):
        return paths
    digits = load_digits()
    images = (digits.images * (255 / 16)).clip(0, 255).astype(np.uint8)
    pngs = []
    for image in images[:samples]:  # the images the rows use
        out = io.BytesIO()
        Image.fromarray(image).resize((SIZE, SIZE), Image.BILINEAR).save(out, format="PNG")
        pngs.append(out.getvalue())
    ids = np.arange(samples, dtype=np.int64)
    labels = digits.target.astype(np.int64)[ids % len(pngs)]
    bounds = np.linspace(0, samples, FILES + 1).astype(int)
    for path, lo, hi in zip(paths, bounds, bounds[1:]):
        table = pa.table(
            {
                "png": pa.array([pngs[i % len(pngs)] for i in range(lo, hi)], pa.binary()),
                "label": labels[lo:hi],
                "id": ids[lo:hi],
            }
        )
        pq.write_table(table, path, row_group_size=ROW_GROUP)
    return paths


# ------------------------------------------------------------------------- transform


def augment(pngs, ids, seed: int, epoch: int) -> np.ndarray:
    """Decode PNGs, crop CROPxCROP at a random offset, flip with probability 1/2:
    (rows, CROP, CROP) float32 in [0, 1]. The random state of row i is
    `sample_rng(seed, epoch, ids[i])`."""
    from PIL import Image

    from rayshard.data.transforms import sample_rng

    out = np.empty((len(pngs), CROP, CROP), dtype=np.float32)
    for row, png in enumerate(pngs):
        image = np.asarray(Image.open(io.BytesIO(png)))
        rng = sample_rng(seed, epoch, int(ids[row]))
        y, x = rng.integers(0, SIZE - CROP + 1, size=2)
        crop = image[y : y + CROP, x : x + CROP]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        np.multiply(crop, np.float32(1 / 255), out=out[row])
    return out


def rayshard_transform(batch: dict, ctx) -> dict:
    """rayshard's `transform=`: `batch["png"]` is a list of bytes."""
    image = augment(batch["png"], batch["id"], ctx.seed, ctx.epoch)
    return {"image": image, "label": batch["label"], "id": batch["id"]}


def ray_data_transform(batch: dict) -> dict:
    """Ray Data's `map_batches` function: `batch["png"]` is an object array of bytes."""
    image = augment(batch["png"], batch["id"], SEED, 0)
    return {"image": image, "label": batch["label"], "id": batch["id"]}


class DecodeDataset:
    """A map-style torch Dataset over the Parquet files: sample i is row i of the files in
    order. `__getitems__` reads a batch's rows from their row group(s) (the last one read
    is cached per worker) and runs `augment` on them."""

    def __init__(self, paths: list[str]) -> None:
        self.groups: list[tuple[str, int]] = []
        self.starts: list[int] = []
        total = 0
        for path in paths:
            meta = pq.ParquetFile(path).metadata
            for group in range(meta.num_row_groups):
                self.groups.append((path, group))
                self.starts.append(total)
                total += meta.row_group(group).num_rows
        self.starts.append(total)
        self.epoch = 0
        self._cached: tuple[int, dict] | None = None

    def __len__(self) -> int:
        return self.starts[-1]

    def _group(self, g: int) -> dict:
        if self._cached is None or self._cached[0] != g:
            path, group = self.groups[g]
            table = pq.ParquetFile(path).read_row_group(group)
            columns = {
                "png": table.column("png").to_pylist(),
                "label": table.column("label").to_numpy(),
                "id": table.column("id").to_numpy(),
            }
            self._cached = (g, columns)
        return self._cached[1]

    def __getitem__(self, index: int) -> dict:
        return self.__getitems__([index])

    def __getitems__(self, indices) -> dict:
        import bisect

        pngs, labels, ids = [], [], []
        for index in indices:
            g = bisect.bisect_right(self.starts, int(index)) - 1
            group, row = self._group(g), int(index) - self.starts[g]
            pngs.append(group["png"][row])
            labels.append(group["label"][row])
            ids.append(group["id"][row])
        ids_array = np.asarray(ids, dtype=np.int64)
        return {
            "image": augment(pngs, ids_array, SEED, self.epoch),
            "label": np.asarray(labels, dtype=np.int64),
            "id": ids_array,
        }


def _torch_collate(batch: dict) -> dict:
    import torch

    return {k: torch.from_numpy(v) for k, v in batch.items()}


# --------------------------------------------------------------------------- loaders


class Epoch:
    """What every rank saw in one epoch: start, first-batch and end stamps, rows, ids."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: list[float] = []
        self.firsts: list[float] = []
        self.ends: list[float] = []
        self.rows = 0
        self.ids: list[np.ndarray] = []

    def consume(self, batches, ids_of) -> None:
        start = time.perf_counter()
        first, rows, ids = None, 0, []
        for batch in batches:
            if first is None:
                first = time.perf_counter()
            real = ids_of(batch)
            rows += len(real)
            ids.append(np.asarray(real))
            if batch["image"].shape[1:] != (CROP, CROP):
                raise AssertionError(f"bad image shape {batch['image'].shape}")
        end = time.perf_counter()
        with self.lock:
            self.starts.append(start)
            self.firsts.append(first if first is not None else end)
            self.ends.append(end)
            self.rows += rows
            self.ids.extend(ids)

    def summary(self, num_rows: int) -> dict:
        seconds = max(self.ends) - min(self.starts)
        ids = np.concatenate(self.ids) if self.ids else np.empty(0, np.int64)
        unique = np.unique(ids)
        return {
            "rows": self.rows,
            "seconds": seconds,
            "rows_per_s": self.rows / seconds,
            "time_to_first_batch_s": min(self.firsts) - min(self.starts),
            "coverage_ok": bool(self.rows == num_rows and unique.size == num_rows),
        }


def _threads(target, count: int) -> None:
    """Run `target(rank)` on `count` threads; re-raise the first error."""
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            target(rank)
        except BaseException as error:  # noqa: BLE001 - reported on the driver below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def run_torch(paths: list[str], epochs: int, world: int = WORLD) -> list[Epoch]:
    import torch.utils.data

    dataset = DecodeDataset(paths)
    out = []
    for epoch in range(epochs):
        dataset.epoch = epoch
        record = Epoch()
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=BATCH_SIZE,
            shuffle=False,
            num_workers=world,
            collate_fn=_torch_collate,
            persistent_workers=False,
        )
        record.consume(loader, lambda b: b["id"].numpy())
        out.append(record)
    return out


def run_rayshard(
    paths: list[str], epochs: int, workers: int, reader_workers: int = 1, world: int = WORLD
) -> list[Epoch]:
    from rayshard.loader import Loader
    from rayshard.sources.parquet import ParquetSource

    loader = Loader(
        ParquetSource(paths),
        batch_size=BATCH_SIZE,
        name=f"decode-{uuid.uuid4().hex[:8]}",
        seed=SEED,
        transform=rayshard_transform,
        transform_workers=workers,
        reader_workers=reader_workers,
    )
    out = [Epoch() for _ in range(epochs)]
    barrier = threading.Barrier(world)

    def rank_loop(rank: int) -> None:
        batches = loader.iterator(world_rank=rank, world_size=world, batch_format="numpy")
        for record in out:
            barrier.wait()
            record.consume(batches, lambda b: b["id"][~b["_padded"]])

    try:
        _threads(rank_loop, world)
    finally:
        loader.shutdown()
    return out


def run_ray_data(paths: list[str], epochs: int, world: int = WORLD) -> list[Epoch]:
    import ray

    dataset = ray.data.read_parquet(paths).map_batches(
        ray_data_transform, batch_size=BATCH_SIZE, batch_format="numpy"
    )
    splits = dataset.streaming_split(world, equal=False)
    out = [Epoch() for _ in range(epochs)]

    def rank_loop(rank: int) -> None:
        for record in out:
            batches = splits[rank].iter_batches(batch_size=BATCH_SIZE, batch_format="numpy")
            record.consume(batches, lambda b: b["id"])

    _threads(rank_loop, world)
    return out


RUNNERS = {
    "torch": run_torch,
    "rayshard_k1": lambda paths, epochs, world: run_rayshard(paths, epochs, 1, world=world),
    "rayshard_k2": lambda paths, epochs, world: run_rayshard(paths, epochs, 2, world=world),
    "rayshard_r2": lambda paths, epochs, world: run_rayshard(paths, epochs, 1, 2, world),
    "ray_data": run_ray_data,
}


def measure(name: str, paths: list[str], num_rows: int, epochs: int, world: int = WORLD) -> dict:
    begun = time.perf_counter()
    records = RUNNERS[name](paths, epochs, world)
    total = time.perf_counter() - begun
    per_epoch = [r.summary(num_rows) for r in records]
    warm_epochs = per_epoch[1:] or per_epoch  # --epochs 1 (smoke test): the cold one
    warm = [e["rows_per_s"] for e in warm_epochs]
    return {
        "loader": name,
        "rows_per_s": statistics.median(warm),
        "first_epoch_rows_per_s": per_epoch[0]["rows_per_s"],
        "time_to_first_batch_s": statistics.median(e["time_to_first_batch_s"] for e in warm_epochs),
        "cold_time_to_first_batch_s": per_epoch[0]["time_to_first_batch_s"],
        "total_s": total,
        "coverage_ok": all(e["coverage_ok"] for e in per_epoch),
        "epochs": per_epoch,
    }


def add_ratios(results: dict[str, dict]) -> dict:
    """Ratios between loaders of this run, and the targets for rayshard (k=1)."""
    rate = {name: r["rows_per_s"] for name, r in results.items()}
    ratios = {}
    if "rayshard_k1" in rate:
        for other, key in (("torch", "rayshard_vs_torch"), ("ray_data", "rayshard_vs_ray_data")):
            if other in rate:
                ratios[key] = rate["rayshard_k1"] / rate[other]
        for other in ("rayshard_k2", "rayshard_r2"):
            if other in rate:
                ratios[f"{other}_vs_k1"] = rate[other] / rate["rayshard_k1"]
    for result in results.values():
        for other in ("torch", "ray_data", "rayshard_k1"):
            if other in rate:
                result[f"vs_{other}"] = result["rows_per_s"] / rate[other]
    checks = {
        key: {"value": ratios[key], "target": target, "met": bool(ratios[key] >= target)}
        for key, target in TARGETS.items()
        if key in ratios
    }
    return {"ratios": ratios, "targets": checks}


TABLE = (
    ("loader", "loader", "s"),
    ("rows/s warm", "rows_per_s", ",.0f"),
    ("rows/s 1st", "first_epoch_rows_per_s", ",.0f"),
    ("TTFB warm s", "time_to_first_batch_s", ".3f"),
    ("TTFB 1st s", "cold_time_to_first_batch_s", ".3f"),
    ("vs torch", "vs_torch", ".2f"),
    ("vs ray_data", "vs_ray_data", ".2f"),
    ("vs rayshard_k1", "vs_rayshard_k1", ".2f"),
    ("total s", "total_s", ".1f"),
    ("coverage", "coverage", "s"),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.decode_bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--samples", type=int, default=10_000, help="rows (images)")
    parser.add_argument(
        "--epochs", type=int, default=3, help="epochs per loader (>= 2 for warm numbers)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the JSON")
    parser.add_argument("--loaders", default=",".join(LOADERS), help="comma-separated subset")
    parser.add_argument("--ray-cpus", type=int, default=2, help="logical CPUs for ray.init")
    parser.add_argument(
        "--ranks", type=int, default=WORLD, help="ranks (and torch workers, Ray Data splits)"
    )
    parser.add_argument("--data", type=Path, help="dataset folder (default: a temp folder)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.loaders.split(",") if n.strip()]
    unknown = [n for n in names if n not in LOADERS]
    if unknown or not names:
        parser.error(f"argument --loaders: invalid choice {','.join(unknown) or args.loaders!r}")
    args.names = [n for n in LOADERS if n in names]  # torch first, before Ray starts
    for option, value, low in (
        ("--ranks", args.ranks, 1),
        ("--samples", args.samples, args.ranks),
        ("--epochs", args.epochs, 1),
    ):
        if value < low:
            parser.error(f"Invalid value for '{option}': {value} is not in the range x>={low}.")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ray_was_up = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    folder = args.data or Path(tempfile.gettempdir()) / f"rayshard-decode-bench-{args.samples}"
    paths = make_dataset(folder, args.samples)
    num_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in paths)
    print(
        f"decode bench: {num_rows:,} PNGs ({SIZE}x{SIZE} -> crop {CROP}x{CROP} + flip, "
        f"float32) in {len(paths)} Parquet files, batch {BATCH_SIZE}, {args.ranks} ranks, "
        f"{args.epochs} epochs, loaders {', '.join(args.names)}",
        flush=True,
    )
    results: dict[str, dict] = {}
    for name in args.names:
        if name != "torch":
            import ray

            start_local_ray(args.ray_cpus, "rayshard-decode-bench")
            ray.data.DataContext.get_current().enable_progress_bars = False
        results[name] = measure(name, paths, num_rows, args.epochs, args.ranks)
        print(
            f"  {name}: {results[name]['rows_per_s']:,.0f} rows/s warm "
            f"({results[name]['total_s']:.1f} s)",
            flush=True,
        )
    summary = add_ratios(results)
    rows = [{**r, "coverage": "ok" if r["coverage_ok"] else "FAILED"} for r in results.values()]
    print(format_table(rows, TABLE))
    for key, value in summary["ratios"].items():
        check = summary["targets"].get(key)
        verdict = ""
        if check:
            verdict = f" (target >= {check['target']}: {'met' if check['met'] else 'NOT met'})"
        print(f"{key}: {value:.2f}{verdict}")
    report = {
        "config": {
            "samples": num_rows,
            "files": len(paths),
            "row_group": ROW_GROUP,
            "image": [SIZE, SIZE],
            "crop": [CROP, CROP],
            "batch_size": BATCH_SIZE,
            "world_size": args.ranks,
            "epochs": args.epochs,
            "ray_cpus": args.ray_cpus,
            "data": str(folder),
        },
        "results": results,
        **summary,
    }
    write_json(args.out / "decode_bench.json", report)
    if not ray_was_up and "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()  # the Ray it started (the smoke test's stays up)
    return 0 if all(r["coverage_ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
