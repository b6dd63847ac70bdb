"""String and binary columns on their way from a reader actor to its consumer: kept as
Arrow arrays in the reader (no Python object per value), shipped as compact Arrow buffers
(Ray pickles them out of band, one copy, no per-value pickling) and turned into the numpy
object arrays every path delivers only in the consumer, by the same `to_numpy` a consumer
that reads for itself runs. Pure functions, testable without Ray.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

_VARIABLE = (
    pa.types.is_binary,
    pa.types.is_large_binary,
    pa.types.is_string,
    pa.types.is_large_string,
)


def ships_as_arrow(type_: pa.DataType) -> bool:
    """Whether a column of `type_` travels as Arrow: string and binary, plain or large."""
    return any(test(type_) for test in _VARIABLE)


def compact(column: pa.Array) -> pa.Array:
    """`column` (a slice of a larger array, maybe) as an array over only its own bytes:
    pickling an array slice would ship its parent's whole buffers (ARROW-10739). Offsets
    are rebased (one small copy), the values stay a zero-copy slice of their buffer."""
    if not len(column):
        return pa.array([], column.type)
    if column.null_count:  # never after `convert_table`'s null check; copy to be safe
        return pa.concat_arrays([column])
    _, offset_buffer, values = column.buffers()
    width = (
        np.int64
        if pa.types.is_large_binary(column.type) or pa.types.is_large_string(column.type)
        else np.int32
    )
    # (rows + 1,) this slice's offsets into the parent's value buffer
    offsets = np.frombuffer(offset_buffer, width)[column.offset : column.offset + len(column) + 1]
    start, end = int(offsets[0]), int(offsets[-1])
    data = values.slice(start, end - start) if values is not None else pa.py_buffer(b"")
    rebased = pa.py_buffer(np.ascontiguousarray(offsets - offsets.dtype.type(start)))
    return pa.Array.from_buffers(column.type, len(column), [None, rebased, data])


def for_wire(batch: dict[str, Any]) -> dict[str, Any]:
    """A reader's batch with its Arrow columns compacted, ready for `ray.put`."""
    return {k: compact(v) if isinstance(v, pa.Array) else v for k, v in batch.items()}


def for_user(batch: dict[str, Any]) -> dict[str, Any]:
    """A fetched batch as the user gets it: Arrow columns as numpy object arrays (Python
    `bytes` or `str`), exactly as `convert_table` makes them."""
    if not any(isinstance(v, pa.Array) for v in batch.values()):
        return batch
    return {
        k: v.to_numpy(zero_copy_only=False) if isinstance(v, pa.Array) else v
        for k, v in batch.items()
    }


__all__ = ["compact", "for_user", "for_wire", "ships_as_arrow"]
