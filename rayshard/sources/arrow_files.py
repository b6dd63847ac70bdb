"""Arrow IPC files (`.arrow`, `.feather` v2) as a source; record batches are the chunks.

The IPC footer lists the record batches but not their row counts, so construction reads
each batch's header: with local files through a memory map (no data copied), with other
filesystems by reading the batches once. Reads then decode only the batches they need,
and of those only the columns asked for (a compressed file's other columns are not
decompressed: 8x less work for one column of ten, zstd).
"""

from __future__ import annotations

import os
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
            return _IpcFile(pa.memory_map(path, "r"), mapped=path)
        return _IpcFile(fs.open_input_file(path))

    def _read_chunk(self, handle: Any, chunk: int, columns: list[str] | None) -> pa.Table:
        table = pa.Table.from_batches([handle.reader(columns).get_batch(chunk)])
        return table.select(columns) if columns is not None else table


class _IpcFile:
    """One opened IPC file: its reader of every column, and a reader per column selection
    (`IpcReadOptions(included_fields=...)`), which decodes only those columns.

    A memory-mapped file cut shorter in place (`cp` over it) would kill the process with
    SIGBUS at the first page past its new end, so each read first checks that the file is
    still as long as when it was mapped (an `OSError` naming the sizes, which the source
    raises as a `DataError` naming the file); a file replaced by a rename keeps its mapping.
    """

    def __init__(self, stream: Any, mapped: str | None = None) -> None:
        self._stream, self._mapped = stream, mapped
        self.all = pa.ipc.open_file(stream)
        self.schema = self.all.schema
        self.num_record_batches = self.all.num_record_batches
        self._projected: dict[tuple[str, ...], Any] = {}

    def get_batch(self, index: int) -> pa.RecordBatch:
        return self.all.get_batch(index)

    def reader(self, columns: list[str] | None) -> Any:
        if self._mapped and (size := os.fstat(self._stream.fileno()).st_size) < self._stream.size():
            raise OSError(
                f"the file is {size} bytes now, {self._stream.size()} when it was opened: it "
                "was cut shorter in place"
            )
        if columns is None or len(columns) == len(self.schema):
            return self.all
        key = tuple(columns)
        if key not in self._projected:
            fields = sorted(self.schema.get_field_index(name) for name in columns)
            if not fields or fields[0] < 0:  # none (partition columns only), or one the file
                return self.all  # lost since: the caller's check names it
            options = pa.ipc.IpcReadOptions(included_fields=fields)
            self._projected[key] = pa.ipc.open_file(self._stream, options=options)
        return self._projected[key]
