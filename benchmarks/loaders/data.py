"""The benchmark dataset and the checks every loader's batches go through."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FEATURES = 128
COLUMNS = ["x", "label", "id"]
ROW_BYTES = FEATURES * 4 + 8 + 8  # bytes of one row as numpy: x, label, id
BATCH_SIZE = 1024
WORLD = 2


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


def check_numpy(batch: dict) -> None:
    """The first batch must hold x as a (rows, 128) float32 array."""
    x = batch["x"]
    if getattr(x, "shape", None) is None or x.ndim != 2 or x.shape[1] != FEATURES:
        raise TypeError(f"x arrived as {type(x).__name__} {getattr(x, 'shape', '?')}")
    if x.dtype != np.float32:
        raise TypeError(f"x arrived as {x.dtype}, expected float32")


def numpy_columns(batch: pa.RecordBatch | pa.Table) -> dict[str, np.ndarray]:
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
