"""Parquet files as a source: planned from footers alone, read one row group at a time.

Sample `i` is row `i` of the concatenation of the (non-empty) files in order. Building a
`ParquetSource` reads every footer once (row counts per file and row group, the schema)
and no data. `read(start, end)` decodes only the row groups that overlap `[start, end)`,
only the requested columns, and slices inside the first and last one.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rayshard.errors import ConfigError
from rayshard.sources._files import ChunkedFileSource

_MAGIC = b"PAR1"


class ParquetSource(ChunkedFileSource):
    """Parquet files: a folder, a glob, a file, or a list of those (local or any URI).

    - `columns`: project to these columns (an error lists the available ones).
    - `filesystem`: a `pyarrow.fs.FileSystem` for all paths; without it, URIs
      (`s3://...`, `gs://...`, `file://...`) go through `FileSystem.from_uri`.
    - `split_rows`: `splits()` cuts row groups larger than this into row ranges (for the
      dynamic policy); reading a part of a row group still decodes the whole row group.
    - `cache_dir`, `cache_limit` (bytes, default 10 GiB): remote files are cached whole on
      local disk there (LRU eviction, the next file prefetched while one is read), so
      later epochs read locally; several readers on a node may share the folder.

    Remote reads (and cache downloads) are retried on I/O errors with exponential
    back-off (6 attempts, about 8 s of outage) before a `DataError` reaches the loop.

    Errors at construction, each naming the file: missing path, unreadable or truncated
    Parquet, a non-Parquet file in a folder, schemas that disagree (both files and the
    field), unknown columns, no rows at all. Zero-row files are skipped with a warning.
    A row group that turns out corrupt while reading raises `DataError` naming the file and
    the row group. `stats()` counts the row groups this process decoded.
    """

    _kind = "Parquet"
    _chunk_name = "row group"

    def _inspect(self, fs: pafs.FileSystem, path: str, display: str) -> tuple[list[int], pa.Schema]:
        try:
            with fs.open_input_file(path) as handle:
                size = handle.size()
                head = handle.read(4) if size >= 4 else b""
                if head != _MAGIC:
                    raise ConfigError(
                        f"{display} is not a Parquet file (it does not start with 'PAR1'): "
                        "remove it from the folder, or name the Parquet files with a glob"
                    )
                metadata = pq.ParquetFile(handle).metadata
                schema = metadata.schema.to_arrow_schema()
        except ConfigError:
            raise
        except (pa.ArrowException, OSError) as error:
            raise ConfigError(
                f"{display} is not a readable Parquet file (truncated or corrupt footer?): {error}"
            ) from error
        rows = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        if sum(rows) != metadata.num_rows:
            raise ConfigError(
                f"{display}: the footer says {metadata.num_rows} rows but its row groups hold "
                f"{sum(rows)}; the file is corrupt"
            )
        return rows, schema

    def _open(self, fs: pafs.FileSystem, path: str) -> Any:
        return pq.ParquetFile(fs.open_input_file(path))

    def _read_chunk(self, handle: Any, chunk: int, columns: list[str] | None) -> pa.Table:
        return handle.read_row_group(chunk, columns=columns)

    def row_groups(self) -> list[tuple[str, int, int, int]]:
        """(file, row group, first sample, end sample) for every row group, in order."""
        out = []
        offset = 0
        for file in self._files:
            for group, rows in enumerate(file.chunk_rows):
                out.append((file.display, group, offset, offset + rows))
                offset += rows
        return out
