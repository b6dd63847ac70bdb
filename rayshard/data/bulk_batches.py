"""Small batches converted in bulk: Arrow to numpy once per `BULK_ROWS` rows, not once per
batch.

Converting a table costs tens of microseconds whatever its size, more than the rest of a
consumer's work on a batch of 32 rows. When every column converts row by row
(`converts_by_row`: no padded or values+offsets lists), `bulk_rebatch` cuts the rows as
`rebatch` does, converts the full batches it has in hand at once (a record batch of a
Parquet row group holds many) and yields each batch as slices (views) of their arrays: the
same batches, cut at the same rows, at the same `FLUSH` points, with rows taken from the
stream when `rebatch` would take them. A run whose conversion fails (a null without a
fill value) is converted batch by batch, so the batches before the failing one come first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from rayshard.data.batching import FLUSH, Batch, cut_rows, rebatch
from rayshard.data.ragged import converts_by_row

BULK_ROWS = 32768  # rows converted at once at most, in whole batches


def bulk_rebatch(
    record_batches: Iterator[pa.RecordBatch],
    batch_size: int,
    convert: Callable[[pa.Table], Batch],
    schema_fits: Callable[[pa.Schema], bool] = converts_by_row,
) -> Iterator[Batch]:
    """`rebatch(record_batches, batch_size, convert)`, converting the full batches in hand
    (up to `BULK_ROWS // batch_size` at once) together when `schema_fits` says `convert`
    works row by row. Rows are taken from `record_batches` exactly when `rebatch` takes
    them: never more to fill a run (under `dynamic` a reader must not hold rows others
    could read)."""
    per_run = BULK_ROWS // batch_size
    if per_run < 2:
        yield from rebatch(record_batches, batch_size, convert)
        return
    for table in cut_rows(record_batches, batch_size, per_run):
        if table is FLUSH:
            yield FLUSH
        elif table.num_rows <= batch_size:  # one batch, full or short: nothing to share
            yield convert(table)
        else:
            yield from _split(table, batch_size, convert, schema_fits(table.schema))


def _split(
    table: pa.Table, batch_size: int, convert: Callable[[pa.Table], Batch], bulk: bool
) -> Iterator[Batch]:
    """`table` in batches of `batch_size` rows (the last possibly shorter), converted."""
    starts = range(0, table.num_rows, batch_size)
    converted: dict[str, Any] | None = None
    if bulk:
        try:
            converted = convert(table)
        except Exception:  # noqa: BLE001 - batch by batch below raises it at its batch
            converted = None
    if converted is None:
        for start in starts:
            yield convert(table.slice(start, batch_size))
        return
    for start in starts:
        yield {name: column[start : start + batch_size] for name, column in converted.items()}


__all__ = ["BULK_ROWS", "bulk_rebatch"]
