"""Arrow arrays of numbers or bools to numpy and back, without importing pandas.

`Array.to_numpy`, `np.asarray(array)` and `pa.array(numpy_array)` go through pyarrow's
pandas layer, which imports pandas when it is installed (it always is beside Ray Data):
about 42 MB and 0.2-0.5 CPU-s in every process that reads, on the way to its first batch.
A plain array of numbers or bools needs none of it: its value buffer is the numpy array's
(a read-only view, as `to_numpy` gives; bools are packed into bits, so they are copied).
Anything else (nulls, strings, dates, nested types) takes pyarrow's own way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

_NUMBERS = "iuf"  # numpy kinds whose Arrow layout is a plain value buffer


def numpy_of(array: pa.Array) -> np.ndarray:
    """`array.to_numpy(zero_copy_only=False)`: the same values, dtype and writability."""
    kind = array.type
    if array.null_count or not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        if pa.types.is_boolean(kind) and not array.null_count:
            return _bools(array)
        return array.to_numpy(zero_copy_only=False)
    dtype = np.dtype(kind.to_pandas_dtype())
    buffer = array.buffers()[1]
    if buffer is None or not len(array):
        view = np.empty(0, dtype)
    else:
        view = np.frombuffer(buffer, dtype, count=len(array), offset=array.offset * dtype.itemsize)
    view.flags.writeable = False  # Arrow's memory: shared, immutable (as `to_numpy` has it)
    return view


def _bools(array: pa.Array) -> np.ndarray:
    """A bool array without nulls, unpacked from its bits (a new, writable array)."""
    if not len(array):
        return np.empty(0, bool)
    first, count = array.offset, len(array)
    bits = np.frombuffer(array.buffers()[1], np.uint8)[first // 8 : (first + count + 7) // 8]
    unpacked = np.unpackbits(bits, bitorder="little")
    return unpacked[first % 8 : first % 8 + count].astype(bool)


def arrow_of(values: Any, type_: pa.DataType | None = None) -> pa.Array:
    """`pa.array(values, type_)` for a 1-d numpy array of numbers or bools (zero-copy for
    numbers, cast to `type_` if it differs); anything else through `pa.array`."""
    if not isinstance(values, np.ndarray) or values.ndim != 1:
        return pa.array(values, type_)
    if values.dtype.kind == "b":
        bits = pa.py_buffer(np.packbits(values, bitorder="little"))
        array = pa.Array.from_buffers(pa.bool_(), len(values), [None, bits])
    elif values.dtype.kind in _NUMBERS and values.dtype.byteorder in "=|":
        values = np.ascontiguousarray(values)
        kind = pa.from_numpy_dtype(values.dtype)
        array = pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])
    else:
        return pa.array(values, type_)
    return array if type_ is None or array.type == type_ else array.cast(type_)


__all__ = ["arrow_of", "numpy_of"]
