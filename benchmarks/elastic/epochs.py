"""Dynamic vs static epoch throughput (see `benchmarks/elastic_bench.py`)."""

from __future__ import annotations

import statistics
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._measure import EpochTimer, summarize_epoch
from benchmarks.elastic.common import (
    FEATURES,
    ROW_BYTES,
    kill_readers,
    progress,
)

EPOCH_BATCH = 1024
EPOCH_WORLD = 2


def write_features(folder: Path, rows: int, files: int = 8, row_group: int = 32768) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    bounds = np.linspace(0, rows, files + 1).astype(np.int64)
    paths = []
    for index, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        x = rng.standard_normal((hi - lo) * FEATURES, dtype=np.float32)
        table = pa.table(
            {
                "x": pa.FixedSizeListArray.from_arrays(pa.array(x), FEATURES),
                "label": rng.integers(0, 10, hi - lo, dtype=np.int64),
                "id": np.arange(lo, hi, dtype=np.int64),
            }
        )
        path = folder / f"part-{index:03d}.parquet"
        pq.write_table(table, path, row_group_size=row_group)
        paths.append(str(path))
    return paths


def _epoch_rank(loader, rank: int, epochs: int):
    batches = loader.iterator(world_rank=rank, world_size=EPOCH_WORLD, batch_format="numpy")
    return [
        EpochTimer(rank, e).consume(batches, lambda b: b["id"][~b["_padded"]])
        for e in range(epochs)
    ]


def epoch_once(paths: list[str], policy: str, rows: int) -> dict:
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
        records = ray.get([task.remote(loader, r, 2) for r in range(EPOCH_WORLD)])
    finally:
        kill_readers(loader)
        loader.shutdown()
    warm = [rank[-1] for rank in records]
    return summarize_epoch(warm, rows, ROW_BYTES)


def run_epoch(workdir: Path, rows: int, repeats: int) -> dict:
    paths = write_features(workdir / "epoch", rows)
    runs: dict[str, list[dict]] = {"data": [], "dynamic": []}
    for _, policy in progress([(i, p) for i in range(repeats) for p in runs], desc="epoch"):
        runs[policy].append(epoch_once(paths, policy, rows))
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
            "world_size": EPOCH_WORLD,
            "repeats": repeats,
            "files": len(paths),
            "row_group": 32768,
        },
        "runs": runs,
        "summary": summary,
    }
