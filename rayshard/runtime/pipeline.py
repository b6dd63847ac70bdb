"""A reader's batch pipeline: rebatching, then the transform (on the reader's thread or in
its transform workers), with the batches made before a failure delivered ahead of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from rayshard.data.batching import FLUSH, rebatch, to_numpy
from rayshard.data.bulk_batches import bulk_rebatch
from rayshard.data.columns import ColumnRules
from rayshard.data.transforms import INDEX_KEY
from rayshard.runtime.transform_stage import transform_input, transform_stream
from rayshard.runtime.transform_workers import parallel_transform_stream


def reader_batches(
    rows: Iterator[pa.RecordBatch],
    *,
    batch_size: int,
    rules: ColumnRules | None = None,
    transform: Any,
    workers: Callable[[], list] | None,
    loader: str,
    seed: int,
    epoch: int,
    rank: int,
    keep_text: bool = False,
) -> Iterator[Any]:
    """Batches of `batch_size` rows from `rows`, through `transform` if there is one: in
    the processes `workers()` returns when `workers` is given, here otherwise. Columns are
    converted under `rules` (padding, null fills) either way: a transform sees them as
    they would arrive without it, and its output is delivered as it returns it. Without a
    transform, `keep_text` keeps string and binary columns Arrow (a reader actor ships
    them so: `rayshard.data.wire`)."""
    if transform is None:
        convert = lambda t: to_numpy(t, rules, keep_text)  # noqa: E731
        return flush_before_error(bulk_rebatch(rows, batch_size, convert))
    batches = rebatch(rows, batch_size, convert=lambda t: transform_input(t, rules))
    if workers is not None:
        stream = parallel_transform_stream(batches, workers(), epoch)
    else:
        stream = transform_stream(
            batches, transform, loader=loader, seed=seed, epoch=epoch, rank=rank
        )
    return flush_before_error(empty_batches_keep_columns(stream))


def empty_batches_keep_columns(batches: Iterator[Any]) -> Iterator[Any]:
    """A batch a transform emptied (every sample dropped) gets the columns of the last
    batch with rows, zero rows each, when it lacks them: whichever process ran the
    transform, the loop sees the same columns."""
    empty: dict[str, Any] | None = None
    for batch in batches:
        if batch is not FLUSH and isinstance(batch, dict):
            if len(batch[INDEX_KEY]):
                empty = {key: value[:0] for key, value in batch.items()}
            elif empty is not None:
                batch = {**empty, **batch}
        yield batch


def flush_before_error(batches: Iterator[Any]) -> Iterator[Any]:
    """Pass `batches` on; if the stream fails, emit `FLUSH` first so the batches made
    before the failure reach the consumers ahead of the error."""
    try:
        yield from batches
    except Exception:
        yield FLUSH
        raise
