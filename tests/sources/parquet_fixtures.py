"""Real Parquet datasets for the source tests, written into a temporary folder.

Every row carries an `id` column equal to its global sample index, so a test can check
exactly which samples a read returned.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def table_of(ids: Sequence[int] | np.ndarray) -> pa.Table:
    ids = np.asarray(ids, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "value": ids.astype(np.float64) * 0.5,
            "label": pa.array([f"s{i}" for i in ids], type=pa.string()),
        }
    )


def write_dataset(
    folder: os.PathLike | str,
    file_rows: Iterable[int],
    row_group_size: int | Sequence[int] = 7,
    prefix: str = "part",
) -> list[str]:
    """Files `prefix-000.parquet`, ... holding consecutive ids; returns their paths."""
    os.makedirs(folder, exist_ok=True)
    paths, start = [], 0
    for f, rows in enumerate(file_rows):
        path = os.path.join(os.fspath(folder), f"{prefix}-{f:03d}.parquet")
        size = row_group_size if isinstance(row_group_size, int) else row_group_size[f]
        pq.write_table(table_of(range(start, start + rows)), path, row_group_size=max(size, 1))
        paths.append(path)
        start += rows
    return paths


def uneven_dataset(folder: os.PathLike | str) -> list[str]:
    """Five files of uneven sizes (0..112 rows), row groups of 7: 112 samples in all."""
    return write_dataset(folder, [23, 40, 9, 31, 9], row_group_size=[7, 7, 4, 10, 9])


def ids_of(batches: Iterable[pa.RecordBatch]) -> list[int]:
    return [v for b in batches for v in b.column("id").to_pylist()]


def truncate(path: str, keep: float = 0.5) -> str:
    with open(path, "rb") as handle:
        data = handle.read()
    with open(path, "wb") as handle:
        handle.write(data[: int(len(data) * keep)])
    return path


def corrupt_row_group(path: str, group: int) -> None:
    """Overwrite the first data page header of row group `group` with garbage (footer kept)."""
    meta = pq.ParquetFile(path).metadata
    column = meta.row_group(group).column(0)
    offset = column.dictionary_page_offset or column.data_page_offset
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(b"\xab" * 64)
