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


STAMP = "_DONE"  # "rows files row_group_size" of a finished dataset
WRITING = "_WRITING"  # the same, written before the first file: what a cut-off run wrote


def _spec(rows: int, files: int, row_group_size: int) -> str:
    return f"{rows} {files} {row_group_size}"


def _file_name(index: int) -> str:
    return f"part-{index:03d}.parquet"


def written_here(folder: Path) -> set[Path]:
    """The Parquet files this benchmark's stamps (finished or begun) say it wrote."""
    out = set()
    for name in (STAMP, WRITING):
        try:
            files = int((folder / name).read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out.update(folder / _file_name(index) for index in range(files))
    return out


def check_folder(folder: Path) -> None:
    """Refuse a folder holding Parquet files this benchmark did not write: it rewrites
    its dataset there, deleting what it wrote before, and never someone else's data."""
    if not folder.is_dir():
        return
    foreign = sorted(set(folder.glob("*.parquet")) - written_here(folder))
    if foreign:
        shown = ", ".join(p.name for p in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise FileExistsError(
            f"{folder} holds {len(foreign)} Parquet file(s) the benchmark did not write "
            f"({shown}); give --data an empty or new folder, or one the benchmark wrote"
        )


def make_dataset(folder: Path, rows: int, files: int = 8, row_group_size: int = 32768) -> Path:
    """Write (or reuse) `rows` rows in `files` Parquet files; ids are 0..rows-1 in order.
    Raises FileExistsError if `folder` holds Parquet files it did not write."""
    spec = _spec(rows, files, row_group_size)
    stamp = folder / STAMP
    if stamp.exists() and stamp.read_text() == spec and not (folder / WRITING).exists():
        return folder
    check_folder(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in written_here(folder):
        old.unlink(missing_ok=True)
    stamp.unlink(missing_ok=True)
    (folder / WRITING).write_text(spec)
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
        pq.write_table(table, folder / _file_name(index), row_group_size=row_group_size)
    stamp.write_text(spec)
    (folder / WRITING).unlink()
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
