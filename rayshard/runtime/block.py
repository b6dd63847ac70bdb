"""The unit a reader hands its consumers: a `Block` of one epoch's batches, each batch
tagged with the `BatchMeta` its consumer acknowledges. A reader actor puts one `Block` per
object-store object; a consumer that reads for itself tags its batches the same way, so
every path delivers `Tagged(BatchMeta, batch)` and acknowledges from the tag alone."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from rayshard.data.batching import INDEX_KEY, PADDED_KEY, Tagged
from rayshard.data.wire import value_bytes
from rayshard.plan.id_runs import as_runs, sample_runs, to_intervals, union
from rayshard.runtime.packing_stage import COMPLETED_KEY, PARTIAL_KEY
from rayshard.runtime.transform_stage import DROPPED_KEY


class BatchMeta(NamedTuple):
    """What a consumer acknowledges for one batch, worked out where the batch was made:
    `runs`, the sample-id runs it consumes as an `(n, 2)` int64 array (its real samples,
    those a transform dropped, or under packing the documents it finished); `real`, the
    samples it delivers (padding and dropped ones excluded); its `nbytes`; and `partial`,
    (document, tokens delivered) of the split documents it carries (packing; else empty)."""

    runs: np.ndarray
    real: int
    nbytes: int
    partial: list


@dataclasses.dataclass(frozen=True)
class Block:
    """Batches `index` of `epoch`'s stream in membership `generation`, in order, with the
    sample-id runs they consume together (`runs`, merged)."""

    generation: int
    epoch: int
    index: int
    batches: tuple[Tagged, ...]
    runs: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, key: tuple[int, int], index: int, batches: list[Tagged]) -> Block:
        runs = union(np.concatenate([as_runs(t.tag.runs) for t in batches] or [as_runs(())]))
        return cls(key[0], key[1], index, tuple(batches), to_intervals(runs))


def tag_batch(batch: dict) -> Tagged:
    """`batch` (a reader's numpy batch) tagged with its `BatchMeta`; the keys only the
    metadata needs are taken out of it (`_index` and `_padded` stay: users see them)."""
    dropped = batch.pop(DROPPED_KEY, None)  # a transform's filter: consumed too
    if COMPLETED_KEY in batch:  # packing: documents finished here, split ones' progress
        consumed, partial = batch.pop(COMPLETED_KEY), batch.pop(PARTIAL_KEY).tolist()
    else:
        ids, padded = batch[INDEX_KEY], batch[PADDED_KEY]
        consumed, partial = (ids[~padded] if padded.any() else ids), []
    real = int(consumed.size)
    if dropped is not None and dropped.size:
        consumed = np.concatenate((consumed, dropped))
    if consumed.size > 1 and not (consumed[1:] > consumed[:-1]).all():
        consumed = np.sort(consumed)  # shuffled: runs need them in order
    nbytes = sum(column_bytes(value) for value in batch.values())
    return Tagged(BatchMeta(sample_runs(consumed), real, nbytes, partial), batch)


def column_bytes(column: Any) -> int:
    """Bytes of a batch column, for the batch's tag (the bytes metric) and for sizing
    object-store blocks: a string or binary column (Arrow, as a reader ships it, or an
    object array of only `bytes` or only `str`) its values' bytes (UTF-8 for text,
    `wire.value_bytes`), the same on every path; other arrays their `nbytes` (object
    arrays: 8 bytes a row); lists of bytes or strings an estimate."""
    if type(column) is np.ndarray and column.dtype != object:  # numbers: most columns
        return column.nbytes
    values = value_bytes(column)
    if values is not None:
        return values
    nbytes = getattr(column, "nbytes", None)
    if nbytes is not None:
        return int(nbytes)
    return sum(len(v) if isinstance(v, (bytes, str)) else 8 for v in column)


def shipped_bytes(batch: dict[str, Any], counted: int) -> int:
    """Bytes a reader's `batch` (after `wire.for_wire`) takes in the object store, given
    the bytes its tag `counted`: a string or binary column shipped as Arrow counts in the
    tag its values (`column_bytes`), its buffers hold their offsets too. Sizes
    object-store blocks, so that `object_bytes` bounds a block of large binaries (images)
    too."""
    for column in batch.values():
        if isinstance(column, pa.Array):
            held = sum(buffer.size for buffer in column.buffers() if buffer is not None)
            counted += held - column_bytes(column)
    return counted
