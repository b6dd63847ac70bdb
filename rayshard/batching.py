"""Turn a rank's plan into a stream of batches: reading order, padding, rebatching.

Pure functions over a `Source` and a `RankPlan`, testable without Ray. The shard actor
runs `iter_rank_batches` in its reader thread.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from rayshard.plan import RankPlan, padding_indices
from rayshard.plan import intervals as iv
from rayshard.sources import Source

INDEX_KEY = "_index"
PADDED_KEY = "_padded"

Batch = dict[str, np.ndarray]


def reading_pieces(
    ranges: iv.Intervals, splits: Sequence[tuple[int, int]], *, shuffle: bool, rng_key: str
) -> list[tuple[int, int]]:
    """Cut a rank's ranges at split boundaries and order the pieces.

    Pieces never cross a split (a row group or file), so each read touches one split.
    With `shuffle`, the piece order is a permutation seeded by `rng_key`
    (seed, epoch, rank); otherwise the order of `ranges`.
    """
    boundaries = sorted({b for split in splits for b in split})
    pieces: list[tuple[int, int]] = []
    for start, end in ranges:
        lo, hi = bisect.bisect_right(boundaries, start), bisect.bisect_left(boundaries, end)
        cuts = [start, *boundaries[lo:hi], end]
        pieces.extend(zip(cuts, cuts[1:]))
    if shuffle:
        random.Random(rng_key).shuffle(pieces)
    return pieces


def iter_rows(
    source: Source,
    plan: RankPlan,
    pieces: Sequence[tuple[int, int]],
    columns: Sequence[str] | None,
) -> Iterator[pa.RecordBatch]:
    """Record batches of the rank's real rows (in piece order), then its padding rows.

    Every batch carries `_index` (the dataset sample index) and `_padded` (True for
    padding) columns. Padding rows are read once each and repeated.
    """
    for start, end in pieces:
        offset = start
        for batch in source.read(start, end, columns):
            yield _tag(batch, np.arange(offset, offset + batch.num_rows), padded=False)
            offset += batch.num_rows
    cache: dict[int, pa.RecordBatch] = {}
    for index in padding_indices(plan):
        if index not in cache:
            rows = pa.Table.from_batches(list(source.read(index, index + 1, columns)))
            cache[index] = rows.combine_chunks().to_batches()[0]
        yield _tag(cache[index], np.array([index]), padded=True)


def rebatch(record_batches: Iterator[pa.RecordBatch], batch_size: int) -> Iterator[Batch]:
    """Cut a stream of record batches into numpy dicts of exactly `batch_size` rows
    (the last one possibly shorter)."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in record_batches:
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        rows += batch.num_rows
        while rows >= batch_size:
            table = pa.Table.from_batches(pending).combine_chunks()
            yield to_numpy(table.slice(0, batch_size))
            rest = table.slice(batch_size)
            pending = rest.to_batches() if rest.num_rows else []
            rows = rest.num_rows
    if rows:
        yield to_numpy(pa.Table.from_batches(pending).combine_chunks())


def to_numpy(table: pa.Table) -> Batch:
    """Columns as numpy arrays; fixed-size lists become 2-D arrays (rows x width)."""
    out: Batch = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(column.type):
            width = column.type.list_size
            flat = column.flatten().to_numpy(zero_copy_only=False)
            out[name] = flat.reshape(len(column), width)
        else:
            out[name] = column.to_numpy(zero_copy_only=False)
    return out


def _tag(batch: pa.RecordBatch, index: np.ndarray, *, padded: bool) -> pa.RecordBatch:
    arrays = [*batch.columns, pa.array(index, pa.int64()), pa.array(np.full(len(index), padded))]
    names = [*batch.schema.names, INDEX_KEY, PADDED_KEY]
    return pa.RecordBatch.from_arrays(arrays, names=names)
