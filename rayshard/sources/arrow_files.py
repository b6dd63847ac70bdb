"""Arrow IPC files (`.arrow`, `.feather` v2) as a source; record batches are the chunks.

The IPC footer lists the record batches but not their row counts, so construction reads
each batch's header: with local files through a memory map (no data copied), with other
filesystems by reading the batches once. Reads then decode only the batches they need.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from rayshard.errors import ConfigError
from rayshard.sources._files import ChunkedFileSource


class ArrowFileSource(ChunkedFileSource):
    """Arrow IPC files (the file format, also Feather v2): a folder, a glob or a list.

    Same arguments, errors and pickling as `ParquetSource`; record batches play the role
    of row groups in `splits()` and `read`.
    """

    _kind = "Arrow IPC"
    _chunk_name = "record batch"

    def _inspect(self, fs: pafs.FileSystem, path: str, display: str) -> tuple[list[int], pa.Schema]:
        try:
            reader = self._open(fs, path)
            rows = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
        except (pa.ArrowException, OSError) as error:
            raise ConfigError(
                f"{display} is not a readable Arrow IPC file (truncated, corrupt, the stream "
                f"format, or Feather v1?): {error}"
            ) from error
        return rows, reader.schema

    def _open(self, fs: pafs.FileSystem, path: str) -> Any:
        if isinstance(fs, pafs.LocalFileSystem):
            return pa.ipc.open_file(pa.memory_map(path, "r"))
        return pa.ipc.open_file(fs.open_input_file(path))

    def _read_chunk(self, handle: Any, chunk: int, columns: list[str] | None) -> pa.Table:
        table = pa.Table.from_batches([handle.get_batch(chunk)])
        return table.select(columns) if columns is not None else table
