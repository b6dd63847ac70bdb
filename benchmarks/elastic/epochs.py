"""Dynamic vs static epoch throughput (see `benchmarks/elastic_bench.py`)."""

from __future__ import annotations

import statistics
import uuid
from pathlib import Path

from benchmarks._measure import EpochTimer, summarize_epoch
from benchmarks.elastic.common import (
    ROW_BYTES,
    progress,
)
from benchmarks.loaders.data import make_dataset, parquet_files

EPOCH_BATCH = 1024
EPOCH_WORLD = 2


def write_features(folder: Path, rows: int, files: int = 8, row_group: int = 32768) -> list[str]:
    """The loader benchmark's dataset (x float32[128], label, id), written once per size."""
    return parquet_files(make_dataset(folder, rows, files, row_group))


def _epoch_rank(loader, rank: int, epochs: int, world: int = EPOCH_WORLD):
    batches = loader.iterator(world_rank=rank, world_size=world, batch_format="numpy")
    return [
        EpochTimer(rank, e).consume(batches, lambda b: b["id"][~b["_padded"]])
        for e in range(epochs)
    ]


def epoch_once(paths: list[str], policy: str, rows: int, world: int = EPOCH_WORLD) -> dict:
    import ray

    from rayshard.loader import Loader
    from rayshard.sources.parquet import ParquetSource

    loader = Loader(
        ParquetSource(paths),
        batch_size=EPOCH_BATCH,
        name=f"epoch-{policy}-{uuid.uuid4().hex[:8]}",
        policy=policy,
    )
    try:
        task = ray.remote(num_cpus=0)(_epoch_rank)
        records = ray.get([task.remote(loader, r, 2, world) for r in range(world)])
    finally:
        loader.shutdown()
    warm = [rank[-1] for rank in records]
    return summarize_epoch(warm, rows, ROW_BYTES)


def run_epoch(workdir: Path, rows: int, repeats: int, world: int = EPOCH_WORLD) -> dict:
    paths = write_features(workdir / "epoch", rows)
    runs: dict[str, list[dict]] = {"data": [], "dynamic": []}
    for _, policy in progress([(i, p) for i in range(repeats) for p in runs], desc="epoch"):
        runs[policy].append(epoch_once(paths, policy, rows, world))
    summary = {}
    for policy, mine in runs.items():
        rates = [r["rows_per_s"] for r in mine]
        summary[policy] = {
            "policy": policy,
            "rows_per_s": statistics.median(rates),
            "rows_per_s_min": min(rates),
            "rows_per_s_max": max(rates),
            "coverage_ok": all(r["coverage"]["ok"] for r in mine),
        }
    summary["dynamic"]["ratio_vs_data"] = (
        summary["dynamic"]["rows_per_s"] / summary["data"]["rows_per_s"]
    )
    return {
        "config": {
            "rows": rows,
            "batch_size": EPOCH_BATCH,
            "world_size": world,
            "repeats": repeats,
            "files": len(paths),
            "row_group": 32768,
        },
        "runs": runs,
        "summary": summary,
    }
