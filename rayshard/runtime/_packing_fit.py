"""No-split packing (first-fit) without per-document objects or per-span array writes:
the readers' fast path for `Packing(split_documents=False)`.

First-fit decides rows from token counts in a loop over plain integers; each batch's
arrays are then filled with a few numpy calls: one concatenation of the batch's documents
(a row's documents are contiguous from its first token), one scatter into the padded
rows, and `repeat`/`arange` for positions and document ids. The rows are those
`rayshard.core.packing.plan_rows` makes in no-split mode (tested against it)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from rayshard.core.packing import PackSpec, too_long
from rayshard.data.batching import FLUSH
from rayshard.runtime._packed_arrays import packed_batch, placed, token_lists


def fit_batches(
    record_batches: Iterator[pa.RecordBatch],
    column: str,
    spec: PackSpec,
    pad_id: int,
    batch_size: int,
    offsets: Mapping[int, int],
) -> Iterator[dict[str, Any]]:
    """The real batches of first-fit packing; returns (no dropped documents, the token
    type seen), as the per-document path does."""
    # arrival number -> (sample index, its tokens still to deliver (a view), first token,
    # tokens it occupies with its separator): documents read and not yet emitted
    pending: dict[int, tuple[int, np.ndarray, int, int]] = {}
    dtype: Any = np.int64  # the token column's type, once a batch was seen
    sep = spec.separator is not None
    bins: list[list] = []  # open rows: [fill, [arrival numbers]]
    closed: list[list[int]] = []  # rows closed, not yet emitted
    arrival = 0
    for batch in record_batches:
        if batch is FLUSH or batch.num_rows == 0:
            continue
        index, offsets_of_rows, values = token_lists(batch, column)
        bounds = offsets_of_rows.tolist()
        dtype = values.dtype
        for row, sample in enumerate(index.tolist()):
            lo, hi = bounds[row], bounds[row + 1]
            at = offsets.get(sample, 0) if offsets else 0
            size = hi - lo + sep - at
            if size > spec.seq_len:
                raise too_long(sample, hi - lo, spec)
            pending[arrival] = (sample, values[min(lo + at, hi) : hi], at, size)
            for open_row in bins:
                if open_row[0] + size <= spec.seq_len:
                    open_row[0] += size
                    open_row[1].append(arrival)
                    break
            else:
                bins.append([size, [arrival]])
                if len(bins) > spec.window:
                    closed.append(bins.pop(0)[1])
            arrival += 1
        while len(closed) >= batch_size:
            yield _batch(closed[:batch_size], pending, spec, pad_id, column, dtype)
            del closed[:batch_size]
    closed += [members for _, members in bins]
    for first in range(0, len(closed), batch_size):
        rows = closed[first : first + batch_size]
        yield _batch(rows, pending, spec, pad_id, column, dtype)
    return [], dtype


def _batch(
    rows: list[list[int]],
    pending: dict[int, tuple[int, np.ndarray, int, int]],
    spec: PackSpec,
    pad_id: int,
    column: str,
    dtype: Any,
) -> dict[str, Any]:
    """The arrays of `rows` (lists of arrival numbers, taken out of `pending`), each padded
    to `seq_len`."""
    taken = [pending.pop(k) for members in rows for k in members]
    per_row = np.asarray([len(members) for members in rows], np.int64)
    samples = np.asarray([t[0] for t in taken], np.int64)
    starts = np.asarray([t[2] for t in taken], np.int64)
    sizes = np.asarray([t[3] for t in taken], np.int64)
    total = int(sizes.sum())
    # rows keep their tokens contiguous from their first: the padded slot of every token
    ends = np.cumsum(sizes)
    doc_first = ends - sizes
    row_fill = np.add.reduceat(sizes, np.cumsum(per_row) - per_row)  # no row is empty
    row_shift = np.arange(len(rows), dtype=np.int64) * spec.seq_len - (
        np.cumsum(row_fill) - row_fill
    )
    where = np.arange(total, dtype=np.int64) + np.repeat(row_shift, row_fill)
    flat = np.empty(total, dtype=dtype)
    if spec.separator is not None:  # every document's last token is its separator
        last = ends[sizes > 0] - 1
        flat[last] = spec.separator
        body = np.ones(total, bool)
        body[last] = False
        flat[body] = np.concatenate([t[1] for t in taken])
    elif total:
        flat[:] = np.concatenate([t[1] for t in taken])
    positions = np.arange(total, dtype=np.int64) - np.repeat(doc_first - starts, sizes)
    arrays = placed(
        (len(rows), spec.seq_len), where, pad_id, flat, positions, np.repeat(samples, sizes)
    )
    return packed_batch(column, *arrays, samples, ())
