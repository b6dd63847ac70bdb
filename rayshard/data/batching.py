"""Turn a rank's plan into a stream of batches: reading order, padding, rebatching.

Pure functions over a `Source` and a `RankPlan`, testable without Ray. The shard actor
runs the row pipeline (`rayshard.runtime.pipeline`) in its reader thread.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from rayshard.data.arrow_numpy import arrow_of
from rayshard.data.columns import ColumnRules
from rayshard.data.ragged import convert_table
from rayshard.plan import RankPlan, padding_indices
from rayshard.sources import Source

INDEX_KEY = "_index"
PADDED_KEY = "_padded"

Batch = dict[str, np.ndarray]
PADDING_RUN = 1024  # padding rows of one sample built at once at most (`_padding`)
PADDING_RUN_BYTES = 64 << 20  # and at most this many bytes of them (at least one row)
FLUSH: Any = object()  # marker in a record-batch stream: emit what `rebatch` holds
# How a reader gets the record batches of its pieces, in piece order, with these columns:
# its threads, its own thread, or its reader workers (`rayshard.runtime.reader_workers`).
Reads = Callable[[Sequence[tuple[int, int]], Sequence[str] | None], Iterator[pa.RecordBatch]]


class Tagged(NamedTuple):
    """A batch with metadata that travels with it through every stage (format conversion,
    the device feed's staging thread), so the consumer never matches the two by order."""

    tag: Any
    batch: Any


def iter_rows(
    source: Source, pieces: Sequence[tuple[int, int]], columns: Sequence[str] | None
) -> Iterator[pa.RecordBatch]:
    """Record batches of a rank's real rows in piece order, each tagged with `_index` (the
    dataset sample index) and `_padded` (False)."""
    for start, end in pieces:
        offset = start
        for batch in source.read(start, end, columns):
            yield _tag(batch, np.arange(offset, offset + batch.num_rows), padded=False)
            offset += batch.num_rows


def iter_rows_parallel(
    source: Source,
    pieces: Sequence[tuple[int, int]],
    columns: Sequence[str] | None,
    pool: Any,
    ahead: int,
) -> Iterator[pa.RecordBatch]:
    """`iter_rows` with pieces read by the threads of `pool` (a `ThreadPoolExecutor`),
    `ahead` pieces (>= 1; its thread count) ahead, yielded in piece order."""

    def submit(piece: tuple[int, int]) -> Any:
        return pool.submit(lambda: list(iter_rows(source, [piece], columns)))

    return in_piece_order(pieces, submit, ahead)


def in_piece_order(
    pieces: Iterable[tuple[int, int]], submit: Callable[[tuple[int, int]], Any], ahead: int
) -> Iterator[pa.RecordBatch]:
    """The record batches of `pieces` in piece order, whoever reads them: `submit(piece)`
    starts one read and returns what `.result()` gives its list of record batches (a
    thread's future, a reader worker's call); `ahead` reads (>= 1) are in flight."""
    queue = iter(pieces)
    futures = collections.deque(submit(piece) for piece in itertools.islice(queue, ahead))
    while futures:
        batches = futures.popleft().result()
        futures.extend(submit(piece) for piece in itertools.islice(queue, 1))
        yield from batches


def iter_padding(
    source: Source, plan: RankPlan, columns: Sequence[str] | None
) -> Iterator[pa.RecordBatch]:
    """The rank's padding rows (`_padded` True), each distinct sample read once."""
    yield from _padding(source, padding_indices(plan), columns, {})


def rebatch(
    record_batches: Iterator[pa.RecordBatch],
    batch_size: int,
    convert: Callable[[pa.Table], Any] | None = None,
) -> Iterator[Batch]:
    """Cut a stream of record batches into numpy dicts of exactly `batch_size` rows
    (the last one possibly shorter), made by `convert` (default `to_numpy`). A `FLUSH` in
    the stream emits the rows held so far as a short batch, then passes the `FLUSH` on (a
    dynamic reader about to wait must not sit on rows others wait for)."""
    convert = convert or to_numpy
    for table in cut_rows(record_batches, batch_size):
        yield table if table is FLUSH else convert(table)


def cut_rows(
    record_batches: Iterator[pa.RecordBatch], batch_size: int, batches_per_cut: int = 1
) -> Iterator[pa.Table]:
    """The rows of a stream of record batches as tables of whole batches: each holds
    `batch_size` rows times as many full batches as the first record batch in hand holds
    (at most `batches_per_cut`; a zero-copy slice of it), or one batch whose rows span
    record batches; the last one and those before a `FLUSH` (passed on) possibly shorter.
    Rows are taken from the stream only when a batch needs them: under `dynamic` a reader
    must not hold rows others could read."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in record_batches:
        if batch is FLUSH:
            if rows:
                yield pa.Table.from_batches(pending).combine_chunks()
                pending, rows = [], 0
            yield FLUSH  # downstream holders (object blocks) must flush too
            continue
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        rows += batch.num_rows
        while rows >= batch_size:
            head = pending[0]
            take = min(head.num_rows // batch_size, batches_per_cut) * batch_size
            if take:  # whole batches inside one record batch: slice it
                yield pa.Table.from_batches([head.slice(0, take)])
                if head.num_rows > take:
                    pending[0] = head.slice(take)
                else:
                    pending.pop(0)
                rows -= take
                continue
            # One batch across record batches, on its own: only its rows get copied (a
            # cut of many batches across them would copy them all), and the rest stays
            # as zero-copy slices instead of being re-concatenated on every cut.
            table = pa.Table.from_batches(pending)
            yield table.slice(0, batch_size)
            rest = table.slice(batch_size)
            pending = rest.to_batches() if rest.num_rows else []
            rows = rest.num_rows
    if rows:
        yield pa.Table.from_batches(pending)


def to_numpy(table: pa.Table, rules: ColumnRules | None = None, keep_text: bool = False) -> Batch:
    """Columns as numpy arrays: fixed-size lists become 2-D arrays (rows x width),
    variable-length numeric lists padded arrays plus lengths and mask (`rayshard.data.ragged`);
    a null is a `DataError` unless `rules` give a fill value. `keep_text` keeps string and
    binary columns Arrow arrays (a reader actor's batches: `rayshard.data.wire`)."""
    return convert_table(table, rules, keep_text)


def _tag(batch: pa.RecordBatch, index: np.ndarray, *, padded: bool) -> pa.RecordBatch:
    arrays = [*batch.columns, arrow_of(index, pa.int64()), arrow_of(np.full(len(index), padded))]
    names = [*batch.schema.names, INDEX_KEY, PADDED_KEY]
    return pa.RecordBatch.from_arrays(arrays, names=names)


def pad_rows(
    source: Source,
    count: int,
    last_index: int | None,
    columns: Sequence[str] | None,
    cache: dict[int, pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """`count` padding rows (`_padded` True) repeating sample `last_index` (sample 0 if
    the rank read nothing); the row is read once per `cache`."""
    index = 0 if last_index is None else last_index
    yield from _padding(source, itertools.repeat(index, count), columns, cache)


def _padding(
    source: Source,
    indices: Iterable[int],
    columns: Sequence[str] | None,
    cache: dict[int, pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """Padding rows repeating samples `indices`, in order: a run of one sample goes as
    record batches of up to `PADDING_RUN` rows and `PADDING_RUN_BYTES` (a large sample's
    run held a gigabyte, or passed 2 GiB of offsets), one built and tagged per run and
    yielded again (a batch per padding row cost a tagging and a cut each; one batch of a
    whole run, which `repeat` padding can make most of an epoch, would hold it at once).
    Built by concatenating the row (no `take`: it lacks kernels for some types, and given
    a numpy index makes pyarrow import pandas)."""
    for index, run in itertools.groupby(indices):
        times = sum(1 for _ in run)
        row = _row(source, index, columns, cache)
        size = min(times, PADDING_RUN, max(PADDING_RUN_BYTES // max(row.nbytes, 1), 1))
        if size > 1:
            row = pa.Table.from_batches([row] * size).combine_chunks().to_batches()[0]
        tagged = _tag(row, np.full(size, index, dtype=np.int64), padded=True)
        for start in range(0, times, size):
            yield tagged if times - start >= size else tagged.slice(0, times - start)


def _row(
    source: Source, index: int, columns: Sequence[str] | None, cache: dict[int, pa.RecordBatch]
) -> pa.RecordBatch:
    """Sample `index` as a one-row record batch, read once per `cache`."""
    if index not in cache:
        rows = pa.Table.from_batches(list(source.read(index, index + 1, columns)))
        cache[index] = rows.combine_chunks().to_batches()[0]
    return cache[index]
