"""Where a reader packs: its rank's documents, in reading order, into batches of packed rows.

`packed_batches` runs the pure `rayshard.core.packing.plan_rows` over the documents the
reader reads, fills `batch_size` rows per batch and pads with marked rows up to the
planned batch count (equal steps). Each batch tells the iterator what it finished:
`_completed` (sample indices whose last token is in the batch, or whose tokens a dropped
last row skipped) and `_partial` ((sample index, tokens delivered) of documents split
across rows, so far). Pure functions over record batches, testable without Ray.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from rayshard.core.packing import Row, materialize, plan_rows
from rayshard.data.batching import FLUSH, PADDED_KEY
from rayshard.data.packing import Packing
from rayshard.errors import RayshardError
from rayshard.runtime._packed_arrays import (
    COMPLETED_KEY,
    PARTIAL_KEY,
    packed_batch,
    token_lists,
)
from rayshard.runtime._packing_fit import fit_batches
from rayshard.runtime._packing_split import split_batches


def documents(
    record_batches: Iterator[pa.RecordBatch], column: str
) -> Iterator[tuple[int, np.ndarray]]:
    """(sample index, tokens) of every real row, from the list column's Arrow offsets."""
    for batch in record_batches:
        if batch is FLUSH or batch.num_rows == 0:
            continue
        index, offsets, values = token_lists(batch, column)
        for row in range(batch.num_rows):
            yield int(index[row]), values[offsets[row] : offsets[row + 1]]


def packed_batches(
    record_batches: Iterator[pa.RecordBatch],
    packing: Packing,
    batch_size: int,
    offsets: Mapping[int, int],
    batches: int,
    *,
    fast: bool = True,
) -> Iterator[dict[str, Any]]:
    """`batches` batches of `batch_size` packed rows (the last real one may be shorter;
    padding batches after it are marked `_padded`). Both modes run their numpy path unless
    `fast=False` (the per-document path, which the tests compare them with)."""
    spec = packing.spec
    store: dict[int, np.ndarray] = {}  # tokens of documents in rows not yet emitted
    dtype: list[Any] = [np.int64]

    def lengths() -> Iterator[tuple[int, int]]:
        for index, tokens in documents(record_batches, packing.column):
            store[index] = tokens
            dtype[0] = tokens.dtype
            yield index, len(tokens)

    def batch(rows: Sequence[Row], extra_done: Sequence[int] = ()) -> dict[str, Any]:
        arrays = materialize(rows, store, spec, pad_id=packing.pad_id, dtype=dtype[0])
        done = [s.index for r in rows for s in r.spans if s.done] + list(extra_done)
        finished = set(done)
        partial = [(s.index, s.end) for r in rows for s in r.spans if s.index not in finished]
        for index in done:
            store.pop(index, None)
        return packed_batch(
            packing.column,
            arrays["tokens"],
            arrays["position_ids"],
            arrays["document_ids"],
            done,
            partial,
        )

    made = 0
    if fast:
        numpy_path = split_batches if spec.split else fit_batches
        real = numpy_path(record_batches, packing.column, spec, packing.pad_id, batch_size, offsets)
    else:
        real = _rows_batches(plan_rows(lengths(), spec, offsets), batch, batch_size)
    while True:
        try:
            out = next(real)
        except StopIteration as end:
            dropped, seen = end.value
            dtype[0] = dtype[0] if seen is None else seen
            break
        if made == batches:  # raised before the extra batch: no rank takes a step alone
            raise RayshardError(
                f"packing made more than the {batches} batches the plan counted: the token "
                f"column changed while the loader ran, or the reading order differs from "
                f"the plan"
            )
        made += 1
        dtype[0] = out[packing.column].dtype  # padding batches get the same type
        yield out
    for _ in range(batches - made):
        pad = batch([Row(())] * batch_size, dropped)
        dropped = []
        pad[PADDED_KEY][:] = True
        yield pad


def _rows_batches(rows: Iterator[Row], batch: Any, batch_size: int) -> Iterator[dict]:
    """Batches of `batch_size` rows made by `batch`; returns the documents of a dropped
    last row that no batch took (and no token type: `batch` knows it)."""
    pending, dropped = [], []
    held: dict[str, Any] | None = None  # a full batch, kept until the next row is known
    for row in rows:
        if row.dropped:  # the last row: its documents count as consumed
            dropped = [s.index for s in row.spans]
            continue
        if held is not None:
            yield held
            held = None
        pending.append(row)
        if len(pending) == batch_size:
            held, pending = batch(pending), []
    if pending:
        if held is not None:
            yield held
        held, pending = batch(pending, dropped), []
        dropped = []
    elif held is not None and dropped:
        held[COMPLETED_KEY] = np.concatenate([held[COMPLETED_KEY], np.asarray(dropped, np.int64)])
        dropped = []
    if held is not None:
        yield held
    return dropped, None


__all__ = ["COMPLETED_KEY", "PARTIAL_KEY", "documents", "packed_batches"]
