"""String and binary columns on their way from a reader actor to its consumer: kept as
Arrow arrays in the reader (no Python object per value), shipped as compact Arrow buffers
(Ray pickles them out of band, one copy, no per-value pickling) and turned into the numpy
object arrays every path delivers only in the consumer, by the same `to_numpy` a consumer
that reads for itself runs. A transform's output takes the same way where it can: a 1-d
numpy object array of only `bytes` or only `str` (`text_array`) comes back as exactly such
an array; anything else (None, mixed types, subclasses, no rows) travels as it is. Pure
functions, testable without Ray.
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
    values = column.buffers()[2]
    offsets = _offsets(column)
    start, end = int(offsets[0]), int(offsets[-1])
    data = values.slice(start, end - start) if values is not None else pa.py_buffer(b"")
    rebased = pa.py_buffer(np.ascontiguousarray(offsets - offsets.dtype.type(start)))
    return pa.Array.from_buffers(column.type, len(column), [None, rebased, data])


def text_array(column: Any) -> pa.Array | None:
    """`column` as an Arrow binary or string array if it is a 1-d numpy object array of
    rows that are all exactly `bytes` or all exactly `str` (what `to_numpy` makes of such
    an array again), else None. One type pass over the values, then one copy of them."""
    if not _plain_objects(column) or type(column[0]) not in _ARROW_OF:  # cheap way out first
        return None
    types = set(map(type, column))
    if len(types) != 1:
        return None
    try:
        array = pa.array(column, _ARROW_OF[types.pop()])
    except (pa.ArrowException, UnicodeError):  # a lone surrogate, say: not UTF-8
        return None
    return array if isinstance(array, pa.Array) else None  # chunked: over 2 GiB


_ARROW_OF = {bytes: pa.binary(), str: pa.string()}


def _plain_objects(column: Any) -> bool:
    """Whether `column` is a plain (no subclass: a masked array stays one) 1-d numpy object
    array with rows."""
    return (
        type(column) is np.ndarray
        and column.dtype == object
        and column.ndim == 1
        and bool(len(column))
    )


def value_bytes(column: Any) -> int | None:
    """The bytes of a string or binary column's values (UTF-8 for `str`): of an Arrow
    array from its offsets, of an object array that `text_array` ships without making
    the Arrow array (one pass); None for anything else."""
    if isinstance(column, pa.Array):
        if not ships_as_arrow(column.type):
            return None
        if not len(column):
            return 0
        offsets = _offsets(column)
        return int(offsets[-1]) - int(offsets[0])
    if not _plain_objects(column) or type(column[0]) not in _ARROW_OF:
        return None
    types = set(map(type, column))
    if types == {bytes}:
        return sum(map(len, column))
    try:
        if types != {str}:
            return None
        return sum(len(v) if v.isascii() else len(v.encode()) for v in column)
    except UnicodeError:  # not UTF-8: `text_array` does not ship it either
        return None


def _offsets(column: pa.Array) -> np.ndarray:
    """(rows + 1,) the offsets of `column` (a slice, maybe) into its value buffer."""
    large = pa.types.is_large_binary(column.type) or pa.types.is_large_string(column.type)
    buffer = column.buffers()[1]
    return np.frombuffer(buffer, np.int64 if large else np.int32)[
        column.offset : column.offset + len(column) + 1
    ]


def for_wire(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch ready for `ray.put` (a reader's, or a transform worker's result): Arrow
    columns compacted, object arrays of `bytes` or `str` as Arrow (`text_array`)."""
    out = {}
    for key, value in batch.items():
        if isinstance(value, pa.Array):
            out[key] = compact(value)
        else:
            shipped = text_array(value)
            out[key] = value if shipped is None else shipped
    return out


def for_user(batch: dict[str, Any]) -> dict[str, Any]:
    """A fetched batch as the user gets it: Arrow columns as numpy object arrays (Python
    `bytes` or `str`), exactly as `convert_table` makes them."""
    if not any(isinstance(v, pa.Array) for v in batch.values()):
        return batch
    return {
        k: v.to_numpy(zero_copy_only=False) if isinstance(v, pa.Array) else v
        for k, v in batch.items()
    }


def for_arrow(batch: dict[str, Any]) -> dict[str, Any]:
    """A fetched batch for `batch_format="arrow"`: an Arrow column stays Arrow where it is
    the array `pa.array` makes of `for_user`'s object array (`string` or `binary`, large
    ones cast down, with rows), saving the trip through Python objects; any other, as
    `for_user` makes it."""
    return {k: _kept(v) if isinstance(v, pa.Array) else v for k, v in batch.items()}


def _kept(column: pa.Array) -> Any:
    """`column` as `string` or `binary`; as `for_user` makes it where `pa.array` would not
    give that back (no rows: of type null) or the cast fails (over 2 GiB of values)."""
    kind = column.type
    small = None
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        small = pa.string()
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        small = pa.binary()
    if small is not None and len(column):
        try:
            return column if kind == small else column.cast(small)
        except pa.ArrowException:
            pass
    return column.to_numpy(zero_copy_only=False)


__all__ = [
    "compact",
    "for_arrow",
    "for_user",
    "for_wire",
    "ships_as_arrow",
    "text_array",
    "value_bytes",
]
