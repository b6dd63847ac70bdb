"""Shared machinery of file sources: reading global row ranges from files cut into
chunks (Parquet row groups, Arrow IPC record batches); finding them is `_paths`.

A file source keeps, per file, only its path, its filesystem and its chunk row counts, so
it pickles small; open handles live in a per-process cache that is never pickled.
"""

from __future__ import annotations

import abc
import bisect
import os
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from rayshard.config.checks import check_int, strings
from rayshard.data.arrow_numpy import arrow_of
from rayshard.errors import ConfigError, DataError, ReadDeniedError
from rayshard.plan import DataLayout, pieces
from rayshard.sources import _catalog, _identity, _select
from rayshard.sources._decoded import DECODED_CHUNKS, DecodedChunks
from rayshard.sources._open_files import OpenFiles
from rayshard.sources._paths import resolve_paths
from rayshard.sources.base import Source
from rayshard.sources.cache import FileCache, is_denied, is_remote, with_retries
from rayshard.sources.schema import conform


def check_columns(columns: Sequence[str] | None, schema: pa.Schema, where: str) -> list[str] | None:
    """The requested columns as a list, or a `ConfigError` listing the available ones."""
    if columns is None:
        return None
    if isinstance(columns, str):
        columns = [columns]
    missing = [c for c in columns if schema.get_field_index(c) < 0]
    if missing:
        raise ConfigError(
            f"column(s) {missing} do not exist in {where}: available columns are {schema.names}"
        )
    return list(columns)


class ChunkedFileSource(Source):
    """A source over files made of chunks; `read` touches only the chunks it needs.

    Subclasses implement `_inspect` (chunk sizes and schema from metadata), `_open` and
    `_read_chunk`; construction (paths, columns, filesystem, `split_rows`) and its checks
    are shared.
    """

    _kind = "data"

    def __init__(
        self,
        paths: str | os.PathLike | Sequence[str | os.PathLike],
        columns: Sequence[str] | None = None,
        filesystem: pafs.FileSystem | None = None,
        *,
        split_rows: int | None = None,
        partitioning: str | None = "hive",
        filter: Any = None,  # noqa: A002 - pyarrow's name for it
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int = 10 << 30,
    ) -> None:
        if split_rows is not None:
            check_int(split_rows, "split_rows", minimum=1, fix="or None")
        resolved = resolve_paths(paths, filesystem, kind=self._kind)
        catalog = _catalog.build(self, resolved, partitioning, filter)
        self._filesystems, self._files = catalog.filesystems, catalog.files
        self._named = _identity.named(catalog.names, [f.num_rows for f in catalog.files])
        self.given_paths = strings(paths, "paths")  # as given (`config.checked` compares)
        self._file_schema = catalog.file_schema
        self._partition_schema = catalog.partition_schema
        self._full_schema = pa.schema([*catalog.file_schema, *catalog.partition_schema])
        files = self._files
        first = files[0].display + (f" and {len(files) - 1} more files" if len(files) > 1 else "")
        self._columns = check_columns(columns, self._full_schema, f"the dataset ({first})")
        self._split_rows, self._filter = split_rows, None if filter is None else str(filter)
        self._cache = FileCache(cache_dir, cache_limit) if cache_dir is not None else None
        self._layout = DataLayout.of_files([f.num_rows for f in files])
        self._init_process_state()

    # -- subclass hooks -------------------------------------------------------------------
    @abc.abstractmethod
    def _inspect(self, fs: pafs.FileSystem, path: str, display: str) -> tuple[list[int], pa.Schema]:
        """Chunk row counts and schema of one file from metadata; `ConfigError` naming it."""

    @abc.abstractmethod
    def _open(self, fs: pafs.FileSystem, path: str) -> Any:
        """An opened reader for one file (cached per process)."""

    @abc.abstractmethod
    def _read_chunk(self, handle: Any, chunk: int, columns: list[str] | None) -> pa.Table:
        """One whole chunk, projected to `columns`."""

    def _buffered_bytes(self, handle: Any, chunk: int, columns: list[str] | None) -> int:
        """What a handle opened on a remote store keeps buffered after reading `chunk`
        (until its next read); default: nothing."""
        return 0

    def _prune_chunks(
        self, fs: pafs.FileSystem, path: str, filter_: Any, partition: dict[str, Any], n: int
    ) -> list[int]:
        """The chunks of a file (`n` of them) that `filter_` may keep; default: all.
        `partition` maps partition keys to typed values."""
        return list(range(n))

    # -- process-local state: never pickled ------------------------------------------------
    def _init_process_state(self) -> None:
        self._handles = OpenFiles()
        self._decoded = DecodedChunks(DECODED_CHUNKS)  # chunks read in parts
        self._stats = {"chunks_read": 0, "rows_decoded": 0, "files_opened": 0}

    def __getstate__(self) -> dict[str, Any]:
        local = ("_handles", "_decoded", "_stats")
        return {key: value for key, value in self.__dict__.items() if key not in local}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    def stats(self) -> dict[str, int]:
        """Counters of this process: chunks decoded (once for its parts read in a row), rows."""
        return dict(self._stats)

    def let_go(self) -> None:
        """Drop the chunks kept decoded for parts to come (an epoch's reading ended)."""
        self._decoded.let_go()

    def reset_stats(self) -> None:
        for key in self._stats:
            self._stats[key] = 0

    # -- Source -----------------------------------------------------------------------------
    @property
    def files(self) -> list[str]:
        """The non-empty files, in dataset order (file `f` of the layout)."""
        return [f.display for f in self._files]

    def layout(self) -> DataLayout:
        return self._layout

    def schema(self) -> pa.Schema:
        full, columns = self._full_schema, self._columns
        return full if columns is None else pa.schema([full.field(c) for c in columns])

    @property
    def split_rows(self) -> int | None:
        """The most rows a split holds (None: whole chunks), as constructed."""
        return self._split_rows

    def splits(self, split_rows: int | None = None) -> list[tuple[int, int]]:
        """Chunks (row groups) as sample ranges; chunks larger than `split_rows` are cut."""
        return pieces.as_tuples(self._cut(split_rows))

    def split_array(self, split_rows: int | None = None) -> np.ndarray:
        """`splits(split_rows)` as an `(n, 2)` array, with no Python step per split."""
        if type(self).splits is not ChunkedFileSource.splits:
            args = () if split_rows is None else (split_rows,)
            return pieces.as_pieces(self.splits(*args))
        return self._cut(split_rows)

    def read_units(self) -> np.ndarray | None:
        """Whole chunks when `split_rows` is set (a run of a chunk's splits decodes once);
        None without it (the splits are the chunks), or if a subclass splits or reads its way."""
        base = (ChunkedFileSource.splits, ChunkedFileSource.read)
        own = (type(self).splits, type(self).read) != base  # a subclass's own rules
        return None if own or self._split_rows is None else self._cut(0)

    def _cut(self, split_rows: int | None) -> np.ndarray:
        limit = split_rows if split_rows is not None else self._split_rows
        rows = [np.asarray(f.chunk_rows, dtype=np.int64) for f in self._files]
        return pieces.cut_chunks(np.concatenate(rows) if rows else [], limit)

    def read(
        self, start: int, end: int, columns: Sequence[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        num = self._layout.num_samples
        if not (0 <= start <= end <= num):
            raise ValueError(f"rows [{start}, {end}) are outside the dataset's [0, {num})")
        checked = columns is not None
        cols = check_columns(columns, self.schema(), self.describe()) if checked else self._columns
        offsets = self._layout.offsets
        f = bisect.bisect_right(offsets, start) - 1
        while start < end and f < len(self._files):
            file, base = self._files[f], offsets[f]
            starts = file.chunk_starts
            # the chunk holding `start` (past empty ones): not a walk from the file's first
            chunk = max(bisect.bisect_right(starts, start - base) - 1, 0)
            while chunk < len(file.chunk_rows) and base + starts[chunk] < end:
                chunk_start = base + starts[chunk]
                chunk_end = base + starts[chunk + 1]
                lo, hi = max(start, chunk_start), min(end, chunk_end)
                if lo < hi:  # a chunk read in parts is decoded once for them (`_decoded`)
                    key = (f, chunk, cols if cols is None else tuple(cols))
                    decode = partial(self._chunk, f, chunk, cols)
                    table = self._decoded.part(key, decode, last=hi == chunk_end)
                    yield from table.slice(lo - chunk_start, hi - lo).to_batches()
                chunk += 1
            start = max(start, offsets[f + 1])
            f += 1

    def _chunk(self, f: int, chunk: int, columns: list[str] | None) -> pa.Table:
        """Kept chunk `chunk` of file `f`: its selected rows, promoted to the dataset's
        schema, with the partition columns added, projected to `columns`."""
        file = self._files[f]
        parts = self._partition_schema
        wanted = [c for c in columns if c not in parts.names] if columns is not None else None
        chunk_id = file.chunk_ids[chunk]
        try:
            table = with_retries(
                lambda: self._read_through_handle(f, chunk_id, wanted),
                remote=is_remote(self._filesystems[file.fs_index]),
                on_retry=lambda: self._handles.drop(f),
            )
            missing = set(self._file_schema.names if wanted is None else wanted)
            missing -= set(table.column_names)
            if missing:
                raise ValueError(
                    f"column(s) {sorted(missing)} are missing (did the file change after the "
                    "source was made?)"
                )
            table = conform(table, self._file_schema)
        except DataError:
            raise
        except (pa.ArrowException, OSError, ValueError, KeyError) as error:
            if is_denied(error):
                raise _denied(file.display, f"{self._chunk_name} {chunk_id}", error) from error
            raise DataError(
                f"{file.display}: {self._chunk_name} {chunk_id} is unreadable ({error}); "
                "rows delivered before it stay delivered"
            ) from error
        self._stats["chunks_read"] += 1
        self._stats["rows_decoded"] += table.num_rows
        selection = file.selections[chunk]
        if not _rows_as_made(table.num_rows, file.chunk_rows[chunk], selection):
            raise DataError(
                f"{file.display}: {self._chunk_name} {chunk_id} has {table.num_rows} rows, not "
                "as many as when the source was made: the file changed since; make the source "
                "(and the loader) again to read the new data. Rows delivered before it stay "
                "delivered"
            )
        if selection is not None:
            table = table.take(arrow_of(np.asarray(selection)))
        if parts.names:
            values = dict(file.partition)
            for field, column in zip(parts, _select.constants(parts, values, table.num_rows)):
                if columns is None or field.name in columns:
                    table = table.append_column(field, column)
        if columns is not None:  # in the order asked for, as `schema()` gives them
            table = table.select(list(columns))
        return table

    _chunk_name = "chunk"

    def _read_through_handle(self, f: int, chunk: int, columns: list[str] | None) -> pa.Table:
        """Chunk `chunk` of file `f` through this thread's reader of it."""
        handle = self._handle(f)
        table = self._read_chunk(handle, chunk, columns)
        self._handles.buffered(f, lambda: self._buffered_bytes(handle, chunk, columns))
        return table

    def _handle(self, f: int) -> Any:
        handle = self._handles.get(f)
        if handle is not None:
            return handle
        file = self._files[f]
        fs = self._filesystems[file.fs_index]
        remote = False
        try:
            if self._cache is not None and is_remote(fs):
                local = self._cache.local_path(fs, file.path, file.version)
                handle = self._open(pafs.LocalFileSystem(), local)
                nxt = self._files[f + 1] if f + 1 < len(self._files) else None
                if nxt is not None and is_remote(nxt_fs := self._filesystems[nxt.fs_index]):
                    self._cache.prefetch(nxt_fs, nxt.path, nxt.version)  # (local: not copied)
            else:  # a remote store's brief outage while opening rides through, as reads do
                remote = is_remote(fs)
                handle = with_retries(lambda: self._open(fs, file.path), remote=remote)
        except (pa.ArrowException, OSError) as error:
            if is_denied(error):
                raise _denied(file.display, "opening it", error) from error
            raise DataError(f"{file.display}: cannot open the file any more ({error})") from error
        self._stats["files_opened"] += 1
        self._handles.add(f, handle, remote)
        return handle

    def cache_stats(self) -> dict[str, int] | None:
        """This process's cache counters (hits, downloads, bytes fetched, evictions)."""
        return dict(self._cache.stats) if self._cache is not None else None

    def describe(self) -> str:
        """What the loader's id knows of it: every file's name under the dataset's root and
        rows, in order (`_identity`: not where it lives), and a filter or `split_rows` if set."""
        options = {"filter": self._filter, "split_rows": self._split_rows}
        kind, count = type(self).__name__, len(self._files)
        return _identity.describe_files(kind, self._named, count, self._layout.num_samples, options)


def _rows_as_made(rows: int, kept: int, selection: np.ndarray | None) -> bool:
    """Whether a chunk read with `rows` rows can be the one the catalog counted: `kept`
    rows, or (under a filter) rows for every selected row number."""
    if selection is None:
        return rows == kept
    return not len(selection) or rows > int(selection.max())


def _denied(display: str, what: str, error: BaseException) -> ReadDeniedError:
    """The error for a read the store refused (permanent: not retried)."""
    return ReadDeniedError(
        f"{display}: the store denied {what} ({error}); not retried. Give the reader "
        "processes' credentials read access to it (on S3: s3:GetObject), or leave the file "
        "out of the dataset; rows delivered before it stay delivered"
    )
