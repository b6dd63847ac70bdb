"""Samples of map-style datasets as Arrow columns.

A sample is a dict (or a tuple/list, named `names` or "0", "1", ...) of scalars,
strings, bytes, numpy arrays or torch tensors. The schema comes from a few probe samples
(the first, the middle, the last): a key whose arrays have one shape in every probe is a
fixed-shape column (nested `fixed_size_list`, delivered as a `(rows, *shape)` array); a
key of rank-1 arrays whose lengths differ (or listed in `ragged`) is a variable-length
list (padded by the loader); arrays of higher rank whose shapes differ stay nested lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from rayshard.data.formats import fixed_size_lists
from rayshard.errors import ConfigError, DataError


def as_dict(sample: Any, index: int, name: str, names: Sequence[str] | None = None) -> dict:
    """The sample as a dict; tuples and lists get `names` (default "0", "1", ...)."""
    if isinstance(sample, dict):
        return sample
    if isinstance(sample, (tuple, list)):
        keys = list(names) if names is not None else [str(i) for i in range(len(sample))]
        if len(keys) != len(sample):
            raise ConfigError(
                f"{name}[{index}] is a {type(sample).__name__} of {len(sample)} values but "
                f"names={tuple(keys)} names {len(keys)}: give one name per value"
            )
        return dict(zip(keys, sample))
    raise ConfigError(
        f"{name}[{index}] returned {type(sample).__name__}: samples must be dicts of arrays "
        "or scalars (key -> value), or tuples such as (x, y) (named with names=)"
    )


def sample_of(dataset: Any, index: int, name: str, names: Sequence[str] | None = None) -> dict:
    """Sample `index` of a map-style `dataset` as a dict (see `as_dict`)."""
    return as_dict(dataset[index], index, name, names)


def infer_schema(probes: list[dict], keys: list[str], ragged: Sequence[str] = ()) -> pa.Schema:
    """The schema of samples like `probes` (see the module docstring)."""
    fields = []
    for key in keys:
        values = [_numpy(p[key]) for p in probes]
        arrays = [v for v in values if isinstance(v, np.ndarray) and v.ndim >= 1]
        if len(arrays) != len(values):
            fields.append(pa.field(key, _scalars(values).type))
            continue
        dtype = pa.from_numpy_dtype(arrays[0].dtype)
        if key in ragged and arrays[0].ndim != 1:
            raise ConfigError(
                f"ragged={tuple(ragged)!r}: key {key!r} holds arrays of rank "
                f"{arrays[0].ndim}; only rank-1 arrays can be variable-length lists"
            )
        shapes = {a.shape for a in arrays}
        if key in ragged or (len(shapes) > 1 and arrays[0].ndim == 1):
            fields.append(pa.field(key, pa.list_(dtype)))
        elif len(shapes) == 1:
            type_ = dtype
            for size in reversed(arrays[0].shape):
                type_ = pa.list_(type_, size)
            fields.append(pa.field(key, type_))
        else:
            for _ in range(arrays[0].ndim):
                dtype = pa.list_(dtype)
            fields.append(pa.field(key, dtype))
    return pa.schema(fields)


def to_batch(
    samples: list[dict], indices: list[int], schema: pa.Schema, name: str
) -> pa.RecordBatch:
    """Samples (at dataset `indices`) as one record batch of `schema`."""
    arrays = [_column([s[f.name] for s in samples], f, indices, name) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _column(values: list[Any], field: pa.Field, indices: list[int], name: str) -> pa.Array:
    values = [_numpy(v) for v in values]
    type_ = field.type
    if pa.types.is_fixed_size_list(type_):
        shape = _fixed_shape(type_)
        for value, index in zip(values, indices):
            if np.shape(value) != shape:
                raise DataError(
                    f"{name}[{index}][{field.name!r}] has shape {np.shape(value)}, but the "
                    f"probe samples have {shape}: keep one shape, or list the key in "
                    "TorchMapSource(ragged=...) if its length varies (rank 1 only)"
                )
        column = fixed_size_lists(np.stack(values)) if values else pa.array([], type_)
        return column.cast(type_) if not column.type.equals(type_) else column
    if pa.types.is_list(type_) and all(isinstance(v, np.ndarray) for v in values):
        column = _nested(values, _depth(type_))
    else:
        column = _scalars(values)
    if column.type.equals(type_):
        return column
    try:
        return column.cast(type_)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise DataError(
            f"{name}: key {field.name!r} holds {column.type} in samples {indices[0]}.."
            f"{indices[-1]} but {type_} in the probe samples ({error}); samples must keep "
            "their types"
        ) from error


def _nested(arrays: list[np.ndarray], ndim: int) -> pa.Array:
    """Arrays of rank `ndim` as a list<...<list<dtype>>> column of `ndim` levels."""
    if any(a.ndim != ndim for a in arrays):
        raise DataError(f"arrays of one key have different ranks: {[a.ndim for a in arrays]}")
    # (rows + 1,) list offsets; the values are the arrays' rows (or elements) joined
    offsets = np.concatenate([[0], np.cumsum([a.shape[0] for a in arrays])]).astype(np.int32)
    if ndim == 1:
        flat = np.concatenate(arrays) if arrays else np.array([])
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
    inner = _nested([row for a in arrays for row in a], ndim - 1)
    return pa.ListArray.from_arrays(pa.array(offsets), inner)


def _fixed_shape(type_: pa.DataType) -> tuple[int, ...]:
    shape = []
    while pa.types.is_fixed_size_list(type_):
        shape.append(type_.list_size)
        type_ = type_.value_type
    return tuple(shape)


def _depth(type_: pa.DataType) -> int:
    depth = 0
    while pa.types.is_list(type_):
        depth += 1
        type_ = type_.value_type
    return depth


def _scalars(values: list[Any]) -> pa.Array:
    """Scalar values as a column: numpy scalars or 0-d arrays (`torch.tensor(5,
    dtype=torch.int8)`) of one numeric dtype keep it; anything else is Arrow's inference
    over the Python values."""
    numeric = [v for v in values if isinstance(v, (np.generic, np.ndarray))]
    dtypes = {v.dtype for v in numeric}
    if len(numeric) == len(values) and len(dtypes) == 1 and next(iter(dtypes)).kind in "biuf":
        return pa.array(np.array([np.asarray(v) for v in values]))
    return pa.array([_scalar(v) for v in values])


def _scalar(value: Any) -> Any:
    """A numpy scalar or 0-d array (`torch.tensor(5)`, `np.array(5)`) as a Python value."""
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0):
        return value.item()
    return value


def _numpy(value: Any) -> Any:
    """Tensors as numpy arrays; bfloat16, which neither numpy nor Arrow holds, as float32."""
    if type(value).__module__.startswith("torch"):
        import torch

        if value.dtype == torch.bfloat16:
            value = value.float()
        return value.detach().cpu().numpy()
    return value


__all__ = ["as_dict", "infer_schema", "to_batch"]
