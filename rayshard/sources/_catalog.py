"""Building a file source's catalog on the driver: every file's chunks, the promoted
schema, hive partition values, and the rows a `filter=` keeps. Only metadata is read,
plus the filter's own columns of the chunks that statistics cannot rule out.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from rayshard.errors import ConfigError
from rayshard.sources import _select
from rayshard.sources.schema import conform, merge_schemas, plain_dictionaries

log = logging.getLogger(__name__)

PARTITIONINGS = ("hive", None)
#: Threads reading footers while a file source is made.
FOOTER_THREADS = 16


@dataclasses.dataclass(frozen=True, eq=False)
class FileChunks:
    """One non-empty file: where it is, its kept chunks (ids in the file), the rows of each
    kept chunk, the selected rows of each (None: all), and its partition values."""

    fs_index: int
    path: str
    display: str
    chunk_rows: tuple[int, ...]
    chunk_ids: tuple[int, ...] = ()
    selections: tuple[np.ndarray | None, ...] = ()
    partition: tuple[tuple[str, str], ...] = ()
    version: str = ""  # "size:mtime" when the source was made (keys the remote file cache)

    @property
    def num_rows(self) -> int:
        return sum(self.chunk_rows)

    @functools.cached_property
    def chunk_starts(self) -> tuple[int, ...]:
        """Where each kept chunk starts in the file's rows, and the file's end: computed
        once, as a read looks its first chunk up in them (files of thousands of chunks)."""
        return (0, *itertools.accumulate(self.chunk_rows))

    def __getstate__(self) -> dict:
        # The fields only: `chunk_starts` is rebuilt where the file is read.
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True)
class Catalog:
    filesystems: tuple[pafs.FileSystem, ...]
    files: tuple[FileChunks, ...]
    file_schema: pa.Schema
    partition_schema: pa.Schema
    resolved: list  # what the paths named, for messages
    names: tuple[str, ...] = ()  # each file's name under its dataset root (`_identity`)


def build(source: Any, resolved: list, partitioning: str | None, filter_: Any) -> Catalog:
    """Inspect every file through `source`'s hooks (`_inspect`, `_open`, `_read_chunk`,
    `_prune_chunks`) and apply partitions and the filter."""
    if partitioning not in PARTITIONINGS:
        raise ConfigError(
            f"partitioning={partitioning!r} is not a valid choice: use 'hive' (key=value "
            "folders become columns; the default) or None"
        )
    filesystems: list[pafs.FileSystem] = []
    found: list[tuple[int, str, str, str, list[int], str]] = []
    schema_of: tuple[str, pa.Schema] | None = None
    merged_with: pa.Schema | None = None  # the latest file schema merged in
    empty: list[str] = []
    promoted: set[str] = set()
    inspected = _inspect_all(source, resolved)
    for (fs, path, display, relative, version), (chunk_rows, schema) in zip(resolved, inspected):
        if fs not in filesystems:
            filesystems.append(fs)
        if sum(chunk_rows) == 0:
            # Empty files often carry loose types (all-null columns): not checked.
            empty.append(display)
            continue
        if schema_of is None:
            schema_of, first = (display, schema), display
        elif merged_with is None or not schema.equals(merged_with, check_metadata=True):
            # Merging a schema again changes nothing: files that repeat the previous one's
            # (the usual case) skip the per-field comparison (26 ms a file at 2,000 columns).
            merged_with = schema
            merged, changed = merge_schemas(schema_of, (display, schema))
            promoted.update(changed)
            # (a later conflict names the file whose type the merged schema holds)
            label = f"{first} (as promoted by {display})" if changed else schema_of[0]
            schema_of = (label, merged)
        found.append((filesystems.index(fs), path, display, relative, chunk_rows, version))
    if empty:  # one warning, however many (a dataset may hold thousands)
        named = ", ".join(empty[:3]) + (f" and {len(empty) - 3} more" if len(empty) > 3 else "")
        held = "holds no rows; skipping it" if len(empty) == 1 else "hold no rows; skipping them"
        warnings.warn(f"{named} {held}", stacklevel=4)
    if schema_of is None:
        where = ", ".join(r[2] for r in resolved[:3]) + (" ..." if len(resolved) > 3 else "")
        raise ConfigError(
            f"the dataset has no rows: every file is empty ({where}); "
            "check the paths, or write some rows first"
        )
    file_schema = plain_dictionaries(schema_of[1])
    if promoted:
        log.info(
            "rayshard: files of %s differ safely; columns %s are promoted, schema: %s",
            first,
            sorted(promoted),
            file_schema,
        )
    values = [(d, _select.hive_values(r) if partitioning else {}) for _, _, d, r, *_ in found]
    parts = _select.partition_schema(values, file_schema)
    full = pa.schema([*file_schema, *parts])
    used = _select.check_filter(filter_, full) if filter_ is not None else []
    files, names = [], []
    for (fs_index, path, display, name, chunk_rows, version), (_, keys) in zip(found, values):
        partition = tuple((k, keys[k]) for k in parts.names)
        file = FileChunks(
            fs_index, path, display, tuple(chunk_rows), tuple(range(len(chunk_rows))),
            (None,) * len(chunk_rows), partition, version,
        )  # fmt: skip
        if filter_ is not None:
            file = _filtered(source, filesystems[fs_index], file, filter_, used, file_schema, parts)
        if file.num_rows:
            files.append(file)
            names.append(name)
    if not files:
        raise ConfigError(
            f"filter={filter_} keeps no row of the dataset ({len(found)} files): "
            "check the expression against the data"
        )
    if filter_ is not None:
        kept = sum(f.num_rows for f in files)
        log.info("rayshard: filter=%s keeps %d rows in %d files", filter_, kept, len(files))
    return Catalog(tuple(filesystems), tuple(files), file_schema, parts, resolved, tuple(names))


def _inspect_all(source: Any, resolved: list) -> list[tuple[list[int], pa.Schema]]:
    """Every file's chunk rows and schema through `source._inspect`, `FOOTER_THREADS` files
    at a time: on an object store each footer costs round trips, so 20,000 files read one
    by one take minutes. The first file in order that fails raises (the rest are dropped)."""
    if len(resolved) < 2:
        return [source._inspect(fs, path, display) for fs, path, display, *_ in resolved]
    pool = ThreadPoolExecutor(min(FOOTER_THREADS, len(resolved)), "rayshard-footers")
    try:
        return list(pool.map(lambda r: source._inspect(r[0], r[1], r[2]), resolved))
    finally:
        pool.shutdown(cancel_futures=True)


def _filtered(
    source: Any,
    fs: pafs.FileSystem,
    file: FileChunks,
    filter_: Any,
    used: list[str],
    file_schema: pa.Schema,
    parts: pa.Schema,
) -> FileChunks:
    values = dict(file.partition)
    file_used = [c for c in used if file_schema.get_field_index(c) >= 0]
    if not file_used:  # partition columns only: the whole file is in or out
        table = pa.table(_select.constants(parts, values, 1), schema=parts)
        keep = _select.select_rows(table, filter_, file.display) is None
        return file if keep else dataclasses.replace(file, chunk_rows=(), chunk_ids=())
    typed = {f.name: c[0].as_py() for f, c in zip(parts, _select.constants(parts, values, 1))}
    candidates = source._prune_chunks(fs, file.path, filter_, typed, len(file.chunk_ids))
    handle = source._open(fs, file.path)
    ids, rows, selections = [], [], []
    for chunk in candidates:
        try:
            table = conform(source._read_chunk(handle, chunk, file_used), file_schema)
        except (OSError, pa.ArrowException) as error:  # named, as a read names it
            raise ConfigError(
                f"{file.display}: {source._chunk_name} {chunk} is unreadable while filter= is "
                f"evaluated ({error}): fix or remove the file"
            ) from error
        for field, column in zip(parts, _select.constants(parts, values, table.num_rows)):
            table = table.append_column(field, column)
        selection = _select.select_rows(table, filter_, file.display)
        count = table.num_rows if selection is None else len(selection)
        if count:
            ids.append(chunk)
            rows.append(count)
            selections.append(selection)
    return dataclasses.replace(
        file, chunk_rows=tuple(rows), chunk_ids=tuple(ids), selections=tuple(selections)
    )


__all__ = ["Catalog", "FileChunks", "build"]
