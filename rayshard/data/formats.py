"""What the iterator hands the training loop, per `batch_format`, from a reader's numpy
batch: the numpy dict itself, an Arrow record batch, or (for torch) the host batch the
device feed stages, with strings as Python lists and jagged columns as `torch.nested`.

`collate_fn` runs after this conversion under every format.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from rayshard.data.columns import OFFSETS_SUFFIX
from rayshard.data.wire import ships_as_arrow
from rayshard.errors import DataError

FORMATS = ("torch", "numpy", "arrow")
# what Arrow raises for a value it cannot hold (a complex dtype: not implemented)
_ARROW_REFUSALS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError)


def torch_host_batch(batch: dict[str, Any], nested: Sequence[str] = ()) -> dict[str, Any]:
    """The batch the device feed stages: numeric arrays as they are, string, binary and
    other object columns as Python lists, `nested` columns as one `torch.nested` jagged
    tensor each: from values + `_offsets`, or from the list of per-row arrays a transform
    returned for them."""
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if key.endswith(OFFSETS_SUFFIX) and key[: -len(OFFSETS_SUFFIX)] in nested:
            continue
        jagged = _values_and_offsets(batch, key) if key in nested else None
        if jagged is not None:
            import torch

            from rayshard.device._staging import host_tensor

            values, offsets = (_tensor(np.asarray(a), host_tensor) for a in jagged)
            out[key] = torch.nested.nested_tensor_from_jagged(values, offsets)
        elif isinstance(value, np.ndarray) and value.dtype.kind in "OUS":
            out[key] = value.tolist()
        else:
            out[key] = value
    return out


def _values_and_offsets(batch: dict[str, Any], key: str) -> tuple | None:
    """A nested column's flat values and int64 offsets, or None if it is neither values
    with offsets nor a list of 1-D numeric arrays (a transform made something else)."""
    value = batch[key]
    if key + OFFSETS_SUFFIX in batch:
        return value, np.asarray(batch[key + OFFSETS_SUFFIX], dtype=np.int64)
    rows = [np.asarray(row) for row in value] if isinstance(value, list) else None
    if not rows or any(row.ndim != 1 or row.dtype.kind not in "biuf" for row in rows):
        return None
    offsets = np.concatenate([[0], np.cumsum([len(row) for row in rows])]).astype(np.int64)
    return np.concatenate(rows), offsets


def _tensor(array: np.ndarray, host_tensor: Callable[[np.ndarray], Any]) -> Any:
    """A tensor viewing `array` (object-store memory, read-only: no copy, no warning), or a
    native-order copy where torch cannot view it."""
    import torch

    tensor = host_tensor(array)
    if tensor is None:
        tensor = torch.from_numpy(array.astype(array.dtype.newbyteorder("="), order="C"))
    return tensor


def arrow_types(schema: pa.Schema) -> dict[str, pa.DataType]:
    """The columns of `schema` that `arrow_batch` builds with their own type: those it
    gets as Python objects or numpy dates (not numbers, strings or binary: those come
    back as they were; not dictionaries: read as their plain values)."""
    plain = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)
    return {
        field.name: field.type
        for field in schema
        if not any(test(field.type) for test in plain)
        and not ships_as_arrow(field.type)
        and not pa.types.is_dictionary(field.type)
    }


def arrow_batch(
    batch: dict[str, Any], nested: Sequence[str] = (), types: Mapping[str, Any] | None = None
) -> pa.RecordBatch:
    """The batch as an Arrow record batch: arrays of rank >= 2 as (nested) fixed-size
    lists, object arrays through `pa.array` (with their source type from `types` where
    that holds them: one schema in every batch), `nested` columns as list columns again
    (zero-copy from values and offsets)."""
    types = types or {}
    columns: dict[str, Any] = {}
    for key, value in batch.items():
        if key.endswith(OFFSETS_SUFFIX) and key[: -len(OFFSETS_SUFFIX)] in nested:
            continue
        value = _native(value)
        jagged = _values_and_offsets(batch, key) if key in nested else None
        if jagged is not None:
            values, offsets = (pa.array(_native(np.asarray(a))) for a in jagged)
            columns[key] = pa.LargeListArray.from_arrays(offsets, values)
        elif isinstance(value, np.ndarray) and value.ndim >= 2:
            tensor = isinstance(types.get(key), pa.FixedShapeTensorType)  # (the source's)
            columns[key] = _tensors(value) if tensor else fixed_size_lists(value)
        elif key in types and (isinstance(value, (list, pa.Array)) or _objects_or_dates(value)):
            columns[key] = _typed(value, types[key])
        else:
            columns[key] = value
    try:
        return pa.RecordBatch.from_pydict(columns)
    except _ARROW_REFUSALS as error:
        named = _unconvertible(columns)
        if named is None:
            raise
        raise named from error


def _tensors(array: np.ndarray) -> pa.Array:
    """A `(rows, *shape)` array as Arrow's `fixed_shape_tensor` column."""
    return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(_native(array)))


def _native(value: Any) -> Any:
    """A numpy array of numbers in the other byte order (`np.frombuffer(raw, ">f4")`) as a
    native-order copy, which Arrow can hold ("Byte-swapped arrays not supported"); any
    other value as it is."""
    swapped = isinstance(value, np.ndarray) and not value.dtype.isnative
    if swapped and value.dtype.kind in "biufcmM":  # (numbers, complex, dates, durations)
        return value.astype(value.dtype.newbyteorder("="))
    return value


def _objects_or_dates(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "OMm"


def _typed(value: Any, type_: pa.DataType) -> Any:
    """`value` as an Arrow array of `type_` (an Arrow one, as shipped from a reader
    actor, cast); as it is (inferred) where that fails: a reader path that changed it."""
    try:
        if isinstance(value, pa.Array):
            return value if value.type == type_ else value.cast(type_)
        return pa.array(value, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError):
        return value


def _unconvertible(columns: dict[str, Any]) -> DataError | None:
    """A `DataError` naming the first column Arrow cannot hold, if one alone fails."""
    for key, value in columns.items():
        if isinstance(value, pa.Array):
            continue
        try:
            pa.array(value)
        except _ARROW_REFUSALS as error:
            return DataError(
                f"column {key!r} cannot become an Arrow column under batch_format='arrow' "
                f"({error}): make it numbers, strings or lists of one type (collate_fn or "
                "transform), or use batch_format='numpy'"
            )
    return None


def fixed_size_lists(array: np.ndarray) -> pa.Array:
    """A `(rows, d_1, ..., d_k)` array as `rows` nested fixed-size lists
    (`fixed_size_list<...<fixed_size_list<t, d_k>...>, d_1>`), zero-copy where Arrow can
    view it. A width of 0 is kept (lists of size 0), which
    `FixedSizeListArray.from_arrays` refuses."""
    column = pa.array(_native(array).reshape(-1))
    for depth in range(array.ndim - 1, 0, -1):
        # (prod(shape[:depth]),) lists of shape[depth] values each
        type_ = pa.list_(column.type, array.shape[depth])
        length = math.prod(array.shape[:depth])
        column = pa.Array.from_buffers(type_, length, [None], children=[column])
    return column


def convert_batch(
    batch: dict[str, Any],
    batch_format: str,
    nested: Sequence[str] = (),
    collate_fn: Callable[[Any], Any] | None = None,
    arrow_types: Mapping[str, Any] | None = None,
) -> Any:
    """A batch in `batch_format` ("numpy" or "arrow"; "torch" goes through
    `torch_host_batch` and the device feed), passed through `collate_fn` if given."""
    out: Any = batch if batch_format == "numpy" else arrow_batch(batch, nested, arrow_types)
    return out if collate_fn is None else collate_fn(out)


__all__ = [
    "FORMATS",
    "arrow_batch",
    "arrow_types",
    "convert_batch",
    "fixed_size_lists",
    "torch_host_batch",
]
