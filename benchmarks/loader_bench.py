"""Benchmark rayshard against the other ways to feed 2 data-parallel ranks from Parquet.

    python -m benchmarks [--rows N] [--quick] [--loaders rayshard,raw,...] [--json PATH]

One dataset (generated Parquet: `x` fixed_size_list<float32>[128], `label` int64, `id`
int64; 8 files) read with the same columns and batch size (1024) by 2 ranks through:

  rayshard   `Loader(ParquetSource)`, one Ray task per rank, batch_format="numpy"
  ray_data   `read_parquet(...).streaming_split(2, equal=True)`, one Ray task per split
  ray_train  `TorchTrainer` (2 workers, datasets={"train": ds}), `get_dataset_shard`
  torch      `DataLoader` over a map-style Dataset of row-group slices, each of 2 spawned
             processes reads its contiguous half (a DistributedSampler-style split)
  raw        `pq.ParquetFile.iter_batches` in 2 spawned processes, each over its half of
             the row groups: the ceiling

Each loader runs once to warm up (Ray workers, imports, page cache), then is measured
over `--epochs` epochs (default 4) with a fresh loader. The first measured epoch gives
the cold-loader time to first batch (iterator creation and reader start-up included);
rows/s, MB/s, the warm time to first batch and the ratios are the median over the warm
epochs after it (one epoch lasts about a second here, on a shared machine). Coverage is
checked on every measured epoch.

Memory: peak PSS summed over the benchmark process and all its descendants, sampled
every 0.1 s, or less often when a sample is costly so that sampling takes at most 20%
of one core (`benchmarks/_measure.py`). torch and raw run before Ray starts, so their
tree is the driver and its 2 child processes; for the Ray loaders it is the driver plus
everything the local Ray cluster runs (gcs_server, raylet, Ray's agents, every worker
process: idle pool workers, tasks, actors, Ray Data and Train actors). `pss_delta` is
the peak minus the tree's PSS just before the measured run.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import multiprocessing as mp
import os
import pickle
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from benchmarks._measure import (
    MB,
    EpochRecord,
    EpochTimer,
    PeakPss,
    format_table,
    process_tree,
    summarize_epoch,
)
from benchmarks._report import start_local_ray, write_json

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "loader_bench.json"
FEATURES = 128
COLUMNS = ["x", "label", "id"]
ROW_BYTES = FEATURES * 4 + 8 + 8  # bytes of one row as numpy: x, label, id
BATCH_SIZE = 1024
WORLD = 2
LOADERS = ("rayshard", "ray_data", "ray_train", "torch", "raw")
RAY_LOADERS = ("rayshard", "ray_data", "ray_train")
TARGETS = {
    "rows_vs_raw": 0.8,  # rayshard rows/s >= 0.8 x raw scan
    "rows_vs_ray_data": 4.0,  # rayshard rows/s >= 4 x Ray Data streaming_split
    "time_to_first_batch_s": 0.5,  # on a warm Ray
    "pss_vs_raw": 1.5,  # peak PSS <= 1.5 x raw scan
}


# ---------------------------------------------------------------------------- dataset


def make_dataset(folder: Path, rows: int, files: int = 8, row_group_size: int = 32768) -> Path:
    """Write (or reuse) `rows` rows in `files` Parquet files; ids are 0..rows-1 in order."""
    stamp = folder / "_DONE"
    if stamp.exists() and stamp.read_text() == f"{rows} {files} {row_group_size}":
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.parquet"):
        old.unlink()
    rng = np.random.default_rng(0)
    bounds = np.linspace(0, rows, files + 1).astype(np.int64)
    for index, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        x = rng.standard_normal((hi - lo) * FEATURES, dtype=np.float32)
        table = pa.table(
            {
                "x": pa.FixedSizeListArray.from_arrays(pa.array(x), FEATURES),
                "label": rng.integers(0, 10, hi - lo, dtype=np.int64),
                "id": np.arange(lo, hi, dtype=np.int64),
            }
        )
        pq.write_table(table, folder / f"part-{index:03d}.parquet", row_group_size=row_group_size)
    stamp.write_text(f"{rows} {files} {row_group_size}")
    return folder


def parquet_files(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("*.parquet"))


def row_group_halves(paths: Sequence[str], world: int) -> list[list[tuple[str, list[int]]]]:
    """Split the row groups (in dataset order) into `world` contiguous runs of about equal
    rows: rank r's list of (file, row groups)."""
    groups = []
    for path in paths:
        meta = pq.ParquetFile(path).metadata
        groups += [(path, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]
    total = sum(rows for _, _, rows in groups)
    out: list[list[tuple[str, list[int]]]] = [[] for _ in range(world)]
    seen = 0
    for path, group, rows in groups:
        rank = min(world - 1, seen * world // total)
        if out[rank] and out[rank][-1][0] == path:
            out[rank][-1][1].append(group)
        else:
            out[rank].append((path, [group]))
        seen += rows
    return out


def _check_numpy(batch: dict) -> None:
    """The first batch must hold x as a (rows, 128) float32 array."""
    x = batch["x"]
    if getattr(x, "shape", None) is None or x.ndim != 2 or x.shape[1] != FEATURES:
        raise TypeError(f"x arrived as {type(x).__name__} {getattr(x, 'shape', '?')}")
    if x.dtype != np.float32:
        raise TypeError(f"x arrived as {x.dtype}, expected float32")


def _numpy_columns(batch: pa.RecordBatch | pa.Table) -> dict[str, np.ndarray]:
    """Arrow columns as numpy (zero copy where Arrow allows); x becomes (rows, 128)."""
    out = {}
    for name in batch.schema.names:
        column = batch.column(name)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if pa.types.is_fixed_size_list(column.type):
            flat = column.flatten().to_numpy(zero_copy_only=False)
            out[name] = flat.reshape(len(column), column.type.list_size)
        else:
            out[name] = column.to_numpy(zero_copy_only=False)
    return out


# ---------------------------------------------------------------------------- raw, torch


def _raw_rank(part, rank: int, epochs: int, barrier, queue) -> None:
    """One raw-scan process: its row groups through `ParquetFile.iter_batches`."""
    barrier.wait()
    records = []
    for epoch in range(epochs):
        timer = EpochTimer(rank, epoch)

        def batches():
            for path, groups in part:
                reader = pq.ParquetFile(path)
                for batch in reader.iter_batches(
                    batch_size=BATCH_SIZE, row_groups=groups, columns=COLUMNS
                ):
                    yield _numpy_columns(batch)

        records.append(timer.consume(batches(), lambda b: b["id"], _check_numpy))
    queue.put(pickle.dumps(records))


class ParquetRowGroupDataset:
    """A map-style torch Dataset over Parquet files: sample i is row i of the files in
    order. `__getitems__` serves a batch of indices from the decoded row group(s) they
    fall in (the last row group is cached), slicing when the indices are contiguous."""

    def __init__(self, paths: Sequence[str], columns: Sequence[str]) -> None:
        self.columns = list(columns)
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
        self._files: dict[str, pq.ParquetFile] = {}
        self._cached: tuple[int, pa.Table] | None = None

    def __len__(self) -> int:
        return self.starts[-1]

    def _group(self, g: int) -> pa.Table:
        if self._cached is None or self._cached[0] != g:
            path, group = self.groups[g]
            if path not in self._files:
                self._files[path] = pq.ParquetFile(path)
            self._cached = (g, self._files[path].read_row_group(group, columns=self.columns))
        return self._cached[1]

    def __getitem__(self, index: int) -> dict:
        return self.__getitems__([index])

    def __getitems__(self, indices: Sequence[int]) -> dict:
        idx = np.asarray(indices, dtype=np.int64)
        pieces = []
        if idx.size and idx[-1] - idx[0] + 1 == idx.size and np.all(np.diff(idx) == 1):
            lo, hi = int(idx[0]), int(idx[-1]) + 1
            g = bisect.bisect_right(self.starts, lo) - 1
            while lo < hi:
                end = min(hi, self.starts[g + 1])
                pieces.append(self._group(g).slice(lo - self.starts[g], end - lo))
                lo, g = end, g + 1
        else:
            for index in idx:
                g = bisect.bisect_right(self.starts, int(index)) - 1
                pieces.append(self._group(g).slice(int(index) - self.starts[g], 1))
        table = pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)
        return _numpy_columns(table)


class ContiguousDistributedSampler:
    """DistributedSampler without shuffling, but each rank gets a contiguous block
    (rank r: rows [r*n/W, (r+1)*n/W)), so each process reads only its half of the files."""

    def __init__(self, dataset, num_replicas: int, rank: int) -> None:
        n = len(dataset)
        self.lo, self.hi = rank * n // num_replicas, (rank + 1) * n // num_replicas

    def __iter__(self):
        return iter(range(self.lo, self.hi))

    def __len__(self) -> int:
        return self.hi - self.lo


def _torch_collate(batch: dict) -> dict:
    import torch

    with warnings.catch_warnings():  # Arrow-backed arrays are read-only; nothing writes
        warnings.simplefilter("ignore", UserWarning)
        return {k: torch.from_numpy(v) for k, v in batch.items()}


def _torch_rank(paths, rank: int, epochs: int, barrier, queue) -> None:
    """One torch DataLoader process (num_workers=0) over its contiguous half."""
    import torch.utils.data

    barrier.wait()
    records = []
    dataset = None
    for epoch in range(epochs):
        timer = EpochTimer(rank, epoch)
        dataset = dataset or ParquetRowGroupDataset(paths, COLUMNS)  # footers: timed
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=BATCH_SIZE,
            sampler=ContiguousDistributedSampler(dataset, WORLD, rank),
            num_workers=0,
            collate_fn=_torch_collate,
        )

        def check(batch):
            _check_numpy({"x": batch["x"].numpy()})

        records.append(timer.consume(loader, lambda b: b["id"].numpy(), check))
    queue.put(pickle.dumps(records))


def _run_processes(target: Callable, args_of_rank: Callable[[int], tuple], epochs: int):
    """Spawn one process per rank; they start together after their imports."""
    context = mp.get_context("spawn")
    barrier, queue = context.Barrier(WORLD + 1), context.Queue()
    procs = [
        context.Process(target=target, args=(*args_of_rank(r), r, epochs, barrier, queue))
        for r in range(WORLD)
    ]
    for proc in procs:
        proc.start()
    barrier.wait(timeout=120)
    started = time.time()
    records = [pickle.loads(queue.get(timeout=1800)) for _ in procs]
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"{target.__name__} process exited with {proc.exitcode}")
    return [r for rank in records for r in rank], started


def run_raw(paths: list[str], epochs: int) -> tuple[list[EpochRecord], float]:
    halves = row_group_halves(paths, WORLD)
    return _run_processes(_raw_rank, lambda r: (halves[r],), epochs)


def run_torch(paths: list[str], epochs: int) -> tuple[list[EpochRecord], float]:
    return _run_processes(_torch_rank, lambda r: (paths,), epochs)


# ---------------------------------------------------------------------------- Ray loaders


def _rayshard_rank(loader, rank: int, epochs: int) -> list[EpochRecord]:
    started = time.time()
    batches = loader.iterator(world_rank=rank, world_size=WORLD, batch_format="numpy")
    records = []
    for epoch in range(epochs):
        timer = EpochTimer(rank, epoch, started if epoch == 0 else None)
        records.append(timer.consume(batches, lambda b: b["id"][~b["_padded"]], _check_numpy))
    return records


def _stacked(batches):
    """Ray Data hands a fixed_size_list column to numpy as an object array of per-row
    arrays; a training loop needs the (rows, 128) matrix, so stack it (charged to Ray)."""
    for batch in batches:
        x = batch["x"]
        if x.dtype == object:
            batch["x"] = np.stack(x)
        yield batch


def _ray_data_rank(split, rank: int, epochs: int) -> list[EpochRecord]:
    records = []
    for epoch in range(epochs):
        timer = EpochTimer(rank, epoch)
        batches = _stacked(split.iter_batches(batch_size=BATCH_SIZE, batch_format="numpy"))
        records.append(timer.consume(batches, lambda b: b["id"], _check_numpy))
    return records


def _train_loop(config: dict) -> None:
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    shard = ray.train.get_dataset_shard("train")
    records = []
    for epoch in range(config["epochs"]):
        timer = EpochTimer(rank, epoch)
        batches = _stacked(shard.iter_batches(batch_size=BATCH_SIZE, batch_format="numpy"))
        records.append(timer.consume(batches, lambda b: b["id"], _check_numpy))
    with open(os.path.join(config["out"], f"rank-{rank}.pkl"), "wb") as handle:
        pickle.dump(records, handle)


def run_rayshard(paths: list[str], epochs: int) -> tuple[list[EpochRecord], float]:
    import ray

    from rayshard.loader import Loader
    from rayshard.sources.parquet import ParquetSource

    loader = Loader(
        ParquetSource(paths, columns=COLUMNS),
        batch_size=BATCH_SIZE,
        name=f"bench-{uuid.uuid4().hex[:8]}",
        policy="data",
        shuffle=False,
        prefetch_depth=2,
        columns=COLUMNS,
    )
    try:
        task = ray.remote(num_cpus=0)(_rayshard_rank)
        started = time.time()
        refs = [task.remote(loader, rank, epochs) for rank in range(WORLD)]
        return [r for rank in ray.get(refs) for r in rank], started
    finally:
        loader.shutdown()


def run_ray_data(paths: list[str], epochs: int) -> tuple[list[EpochRecord], float]:
    import ray

    splits = ray.data.read_parquet(paths).select_columns(COLUMNS).streaming_split(WORLD, equal=True)
    task = ray.remote(num_cpus=0)(_ray_data_rank)
    started = time.time()
    refs = [task.remote(split, rank, epochs) for rank, split in enumerate(splits)]
    return [r for rank in ray.get(refs) for r in rank], started


def run_ray_train(paths: list[str], epochs: int) -> tuple[list[EpochRecord], float]:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    with tempfile.TemporaryDirectory(prefix="rayshard-bench-train-") as out:
        trainer = TorchTrainer(
            _train_loop,
            train_loop_config={"epochs": epochs, "out": out},
            scaling_config=ScalingConfig(num_workers=WORLD, use_gpu=False),
            datasets={"train": ray.data.read_parquet(paths).select_columns(COLUMNS)},
            run_config=RunConfig(name=f"bench-{uuid.uuid4().hex[:8]}", storage_path=out),
        )
        started = time.time()
        trainer.fit()
        records = []
        for rank in range(WORLD):
            with open(os.path.join(out, f"rank-{rank}.pkl"), "rb") as handle:
                records += pickle.load(handle)
    return records, started


RUNNERS = {
    "rayshard": run_rayshard,
    "ray_data": run_ray_data,
    "ray_train": run_ray_train,
    "torch": run_torch,
    "raw": run_raw,
}


# ---------------------------------------------------------------------------- driver


def start_ray(num_cpus: int) -> None:
    import ray

    os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_TRACKING", "0")
    start_local_ray(num_cpus, "rayshard-bench")
    ray.data.DataContext.get_current().enable_progress_bars = False


def _wait_for_exit(names: tuple[str, ...], timeout_s: float) -> None:
    """Wait until no process of this tree has one of these names (killed actors take a
    few seconds to exit, and would count in the next measurement's memory)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        alive = []
        for pid in process_tree():
            try:
                with open(f"/proc/{pid}/comm") as handle:
                    alive.append(handle.read().strip())
            except OSError:
                continue
        if not any(name in names for name in alive):
            return
        time.sleep(0.2)


def measure(name: str, paths: list[str], num_rows: int, epochs: int, warmup: bool) -> dict:
    """Warm up once, then measure a fresh loader over `epochs` epochs."""
    run = RUNNERS[name]
    if warmup:
        run(paths, 1)
        gc.collect()
        time.sleep(1.0)  # let finished actors and processes exit before the baseline
        _wait_for_exit(("ray::ShardReade", "ray::Coordinato"), timeout_s=30)
    begun = time.time()
    with PeakPss() as memory:
        records, started = run(paths, epochs)
    finished = time.time()
    epochs_out = [
        summarize_epoch([r for r in records if r.epoch == e], num_rows, ROW_BYTES)
        for e in range(epochs)
    ]
    cold = epochs_out[0]
    warm_epochs = sorted(epochs_out[1:], key=lambda e: e["rows_per_s"])
    warm = warm_epochs[len(warm_epochs) // 2]  # the median warm epoch (the upper one of two)
    return {
        "loader": name,
        "rows_per_s": warm["rows_per_s"],
        "mb_per_s": warm["mb_per_s"],
        "epoch_s": warm["seconds"],
        "time_to_first_batch_s": warm["time_to_first_batch_s"],
        "cold_time_to_first_batch_s": cold["time_to_first_batch_s"],
        "setup_s": min(r.start for r in records) - begun,
        "launch_to_first_batch_s": max(r.first for r in records if r.epoch == 0) - started,
        "total_s": finished - begun,
        "peak_pss_mb": memory.peak / MB,
        "baseline_pss_mb": memory.baseline / MB,
        "pss_delta_mb": (memory.peak - memory.baseline) / MB,
        "pss_by_process_mb": {
            k: round(v / MB, 1) for k, v in sorted(memory.top.items(), key=lambda kv: -kv[1])
        },
        "pss_by_kind_mb": {k: round(v / MB, 1) for k, v in memory.kinds.items()},
        "pss_samples": memory.samples,
        "coverage_ok": all(e["coverage"]["ok"] for e in epochs_out),
        "epochs": epochs_out,
    }


def add_ratios(results: dict[str, dict]) -> dict:
    """Ratios against raw and Ray Data from this same run, and the targets for rayshard."""
    raw, ray_data = results.get("raw"), results.get("ray_data")
    for result in results.values():
        if raw:
            result["rows_vs_raw"] = result["rows_per_s"] / raw["rows_per_s"]
            result["pss_vs_raw"] = result["peak_pss_mb"] / raw["peak_pss_mb"]
            result["pss_delta_vs_raw"] = result["pss_delta_mb"] / max(raw["pss_delta_mb"], 1e-9)
        if ray_data:
            result["rows_vs_ray_data"] = result["rows_per_s"] / ray_data["rows_per_s"]
    shard = results.get("rayshard")
    if shard is None:
        return {}
    checks = {}
    for key, target in TARGETS.items():
        value = shard.get(key)
        if value is None:
            continue
        ok = value <= target if key in ("time_to_first_batch_s", "pss_vs_raw") else value >= target
        checks[key] = {"value": value, "target": target, "met": bool(ok)}
    checks["cold_time_to_first_batch_s"] = {
        "value": shard["cold_time_to_first_batch_s"],
        "target": TARGETS["time_to_first_batch_s"],
        "met": shard["cold_time_to_first_batch_s"] <= TARGETS["time_to_first_batch_s"],
    }
    if "pss_delta_vs_raw" in shard:
        checks["pss_delta_vs_raw"] = {
            "value": shard["pss_delta_vs_raw"],
            "target": TARGETS["pss_vs_raw"],
            "met": shard["pss_delta_vs_raw"] <= TARGETS["pss_vs_raw"],
        }
    return checks


TABLE = (
    ("loader", "loader", "s"),
    ("rows/s", "rows_per_s", ",.0f"),
    ("MB/s", "mb_per_s", ".0f"),
    ("epoch s", "epoch_s", ".2f"),
    ("vs raw", "rows_vs_raw", ".2f"),
    ("vs ray_data", "rows_vs_ray_data", ".2f"),
    ("TTFB warm s", "time_to_first_batch_s", ".3f"),
    ("TTFB cold s", "cold_time_to_first_batch_s", ".3f"),
    ("setup s", "setup_s", ".2f"),
    ("peak PSS MB", "peak_pss_mb", ".0f"),
    ("PSS delta MB", "pss_delta_mb", ".0f"),
    ("coverage", "coverage", "s"),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows to generate")
    parser.add_argument("--quick", action="store_true", help="100k rows (smoke test)")
    parser.add_argument("--loaders", default=",".join(LOADERS), help="comma-separated subset")
    parser.add_argument(
        "--epochs", type=int, default=4, help="measured epochs (the first is cold; >= 2)"
    )
    parser.add_argument("--no-warmup", action="store_true", help="skip the warm-up run")
    parser.add_argument("--ray-cpus", type=int, default=4, help="logical CPUs for ray.init")
    parser.add_argument("--data", type=Path, help="dataset folder (default: a temp folder)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows = min(args.rows, 100_000)
    names = [n.strip() for n in args.loaders.split(",") if n.strip()]
    unknown = [n for n in names if n not in LOADERS]
    if unknown or not names:
        parser.error(
            f"argument --loaders: invalid choice {','.join(unknown) or args.loaders!r} "
            f"(choose from {', '.join(LOADERS)})"
        )
    for option, value, low in (("--rows", args.rows, 1), ("--epochs", args.epochs, 2)):
        if value < low:
            parser.error(f"Invalid value for '{option}': {value} is not in the range x>={low}.")
    # Non-Ray loaders first, before Ray starts, so their process tree holds no Ray.
    args.names = sorted(names, key=lambda n: (n in RAY_LOADERS, LOADERS.index(n)))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    folder = args.data or Path(tempfile.gettempdir()) / f"rayshard-loader-bench-{args.rows}"
    # Generate in a child process, so the driver's memory (counted in every PSS) stays small.
    writer = mp.get_context("spawn").Process(target=make_dataset, args=(folder, args.rows))
    writer.start()
    writer.join()
    if writer.exitcode != 0:
        print(f"loader bench: writing the dataset into {folder} failed", file=sys.stderr)
        return 1
    paths = parquet_files(folder)
    num_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in paths)
    print(
        f"loader bench: {num_rows:,} rows ({num_rows * ROW_BYTES / MB:,.0f} MB as numpy) in "
        f"{len(paths)} Parquet files, batch {BATCH_SIZE}, {WORLD} ranks, "
        f"loaders {', '.join(args.names)}",
        flush=True,
    )
    results: dict[str, dict] = {}
    bar = tqdm(args.names, desc="loaders", unit="loader", disable=None, file=sys.stderr)
    for name in bar:
        bar.set_postfix_str(name)
        if name in RAY_LOADERS:
            start_ray(args.ray_cpus)
        results[name] = measure(name, paths, num_rows, args.epochs, not args.no_warmup)
        gc.collect()
    bar.close()
    checks = add_ratios(results)
    rows = [{**r, "coverage": "ok" if r["coverage_ok"] else "FAILED"} for r in results.values()]
    print(format_table(rows, TABLE))
    for key, check in checks.items():
        print(
            f"rayshard {key}: {check['value']:.3f} (target "
            f"{'<=' if key.startswith(('time', 'cold', 'pss')) else '>='} {check['target']}) "
            f"{'met' if check['met'] else 'MISSED'}"
        )
    report = {
        "config": {
            "rows": num_rows,
            "files": len(paths),
            "batch_size": BATCH_SIZE,
            "world_size": WORLD,
            "columns": COLUMNS,
            "row_bytes": ROW_BYTES,
            "epochs": args.epochs,
            "warmup": not args.no_warmup,
            "ray_cpus": args.ray_cpus,
            "data": str(folder),
        },
        "results": results,
        "targets": checks,
    }
    write_json(args.json, report)
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()
    return 0 if all(r["coverage_ok"] for r in results.values()) else 1


__all__ = ["LOADERS", "main"]
