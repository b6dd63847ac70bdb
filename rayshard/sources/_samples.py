"""Samples of map-style datasets as Arrow columns.

A sample is a dict (or a tuple/list, named `names` or "0", "1", ...) of scalars,
strings, bytes, numpy arrays or torch tensors. The schema comes from a few probe samples
(the first, the middle, the last): a key whose arrays have one shape in every probe is a
fixed-shape column (nested `fixed_size_list`, delivered as a `(rows, *shape)` array); a
key of rank-1 arrays whose lengths differ (or listed in `ragged`) is a variable-length
list (padded by the loader); arrays of higher rank whose shapes differ stay nested lists.
"""

from __future__ import annotations

import reprlib
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from rayshard.data.formats import fixed_size_lists
from rayshard.errors import ConfigError, DataError, RayshardError

# What a value that makes no Arrow column raises (pyarrow, numpy, a tensor's .numpy())
_UNCONVERTIBLE = (pa.ArrowException, TypeError, ValueError, OverflowError, AttributeError)
_FIX = (
    "every sample must give a key one type (numbers, strings, bytes, numpy arrays or "
    "tensors): convert it in __getitem__ (np.asarray(..., dtype=...), str(...))"
)


def as_dict(
    sample: Any,
    index: int,
    name: str,
    names: Sequence[str] | None = None,
    error: type[Exception] = ConfigError,
) -> dict:
    """The sample as a dict; tuples and lists get `names` (default "0", "1", ...)."""
    if isinstance(sample, dict):
        return sample
    if isinstance(sample, (tuple, list)):
        keys = list(names) if names is not None else [str(i) for i in range(len(sample))]
        if len(keys) != len(sample):
            raise error(
                f"{name}[{index}] is a {type(sample).__name__} of {len(sample)} values but "
                f"names={tuple(keys)} names {len(keys)}: give one name per value"
            )
        return dict(zip(keys, sample))
    raise error(
        f"{name}[{index}] returned {type(sample).__name__}: samples must be dicts of arrays "
        "or scalars (key -> value), or tuples such as (x, y) (named with names=)"
    )


def sample_of(
    dataset: Any,
    index: int,
    name: str,
    names: Sequence[str] | None = None,
    error: type[Exception] = DataError,
) -> dict:
    """Sample `index` of a map-style `dataset` as a dict (see `as_dict`). What
    `dataset[index]` raises becomes an `error` (`DataError` while reading, `ConfigError`
    at start-up) naming the index, the dataset's own exception as its `__cause__`."""
    try:
        sample = dataset[index]
    except (RayshardError, ConfigError):
        raise
    except Exception as cause:
        raise error(
            f"{name}[{index}] raised {type(cause).__name__}: {cause}; fix {name}.__getitem__ "
            "for this index (every index below len(dataset) must load)"
        ) from cause
    return as_dict(sample, index, name, names, error)


def check_keys(sample: dict, keys: list[str], index: int, name: str) -> None:
    """Every sample returns the keys of sample 0: a `DataError` naming the one that does not."""
    if sorted(sample.keys(), key=str) != sorted(keys, key=str):
        raise DataError(
            f"{name}[{index}] has keys {sorted(sample.keys(), key=str)}, but sample 0 has "
            f"{sorted(keys, key=str)}: every sample must return the same keys"
        )


def infer_schema(
    probes: list[dict],
    keys: list[str],
    ragged: Sequence[str] = (),
    name: str = "the dataset",
    where: Sequence[int] = (),
) -> pa.Schema:
    """The schema of samples like `probes` (see the module docstring), from samples
    `where` of dataset `name`; values that make no column are a `ConfigError` naming them."""
    fields = []
    for key in keys:
        try:
            fields.append(_field(key, [numpy_of(p[key]) for p in probes], ragged))
        except ConfigError:
            raise
        except _UNCONVERTIBLE as error:
            seen = "; ".join(
                f"{name}[{i}]: {_seen(p[key])}" for i, p in zip(where or range(len(probes)), probes)
            )
            raise ConfigError(
                f"key {key!r} of the probe samples makes no Arrow column ({seen}; "
                f"{type(error).__name__}: {error}): {_FIX}"
            ) from error
    return pa.schema(fields)


def _field(key: str, values: list[Any], ragged: Sequence[str]) -> pa.Field:
    """The field of one key from its probe values (see the module docstring)."""
    if not isinstance(key, str):
        raise ConfigError(f"sample key {key!r} is a {type(key).__name__}: keys must be strings")
    arrays = [v for v in values if isinstance(v, np.ndarray) and v.ndim >= 1]
    if len(arrays) != len(values):
        return pa.field(key, _scalars(values).type)
    dtype = pa.from_numpy_dtype(arrays[0].dtype)
    if key in ragged and arrays[0].ndim != 1:
        raise ConfigError(
            f"ragged={tuple(ragged)!r}: key {key!r} holds arrays of rank "
            f"{arrays[0].ndim}; only rank-1 arrays can be variable-length lists"
        )
    shapes = {a.shape for a in arrays}
    if key in ragged or (len(shapes) > 1 and arrays[0].ndim == 1):
        return pa.field(key, pa.list_(dtype))
    if len(shapes) == 1:
        type_ = dtype
        for size in reversed(arrays[0].shape):
            type_ = pa.list_(type_, size)
        return pa.field(key, type_)
    for _ in range(arrays[0].ndim):
        dtype = pa.list_(dtype)
    return pa.field(key, dtype)


def to_batch(
    samples: list[dict], indices: list[int], schema: pa.Schema, name: str
) -> pa.RecordBatch:
    """Samples (at dataset `indices`) as one record batch of `schema`."""
    arrays = [_checked([s[f.name] for s in samples], f, indices, name) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _checked(values: list[Any], field: pa.Field, indices: list[int], name: str) -> pa.Array:
    """`_column`; values that do not convert are a `DataError` naming the sample (found by
    converting them one by one), the key, the value seen and the type expected."""
    try:
        return _column(values, field, indices, name)
    except _UNCONVERTIBLE as error:
        where, seen = f"{name}[{indices[0]}..{indices[-1]}]", "values"
        culprit = _culprit(values, field)
        if culprit is not None:
            where, seen = f"{name}[{indices[culprit]}]", _seen(values[culprit])
        raise DataError(
            f"{where}: key {field.name!r} holds {seen}, which does not convert to "
            f"{field.type}, the type the probe samples gave it ({type(error).__name__}: "
            f"{error}); {_FIX}"
        ) from error


def _culprit(values: list[Any], field: pa.Field) -> int | None:
    """The position of the first value that fails alone, else of the first (not None) whose
    own type is not the field's (`1` among `True`s: fine alone, not mixed), else None."""
    own = []
    for position, value in enumerate(values):
        try:
            own.append(_unconverted([numpy_of(value)], field.type).type)
            _column([value], field, [0], "")
        except _UNCONVERTIBLE:
            return position
    odd = [i for i, (v, t) in enumerate(zip(values, own)) if v is not None and t != field.type]
    return odd[0] if odd else None


def _seen(value: Any) -> str:
    """A value for messages: its type, dtype and shape, or a short repr."""
    try:
        value = numpy_of(value)
    except (*_UNCONVERTIBLE, RuntimeError):  # (a sparse tensor: named as it is)
        pass
    if isinstance(value, np.ndarray):
        return f"an array of {value.dtype} shaped {value.shape}"
    return f"{type(value).__name__} {reprlib.repr(value)}"


def _column(values: list[Any], field: pa.Field, indices: list[int], name: str) -> pa.Array:
    values = [numpy_of(v) for v in values]
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
    column = _unconverted(values, type_)
    return column if column.type.equals(type_) else column.cast(type_)


def _unconverted(values: list[Any], type_: pa.DataType) -> pa.Array:
    """Values (tensors already numpy) as a column of their own type, nested as `type_`."""
    if pa.types.is_fixed_size_list(type_):
        return fixed_size_lists(np.stack(values)) if values else pa.array([], type_)
    if pa.types.is_list(type_) and all(isinstance(v, np.ndarray) for v in values):
        return _nested(values, _depth(type_))
    return _scalars(values)


def _nested(arrays: list[np.ndarray], ndim: int) -> pa.Array:
    """Arrays of rank `ndim` as a list<...<list<dtype>>> column of `ndim` levels."""
    if any(a.ndim != ndim for a in arrays):
        raise ValueError(f"arrays of rank {[a.ndim for a in arrays]} where {ndim} was probed")
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
    dtype=torch.int8)`) of one numeric dtype keep it, datetime64/timedelta64 ones (any
    units) are timestamps/durations; anything else is Arrow's inference over the Python
    values."""
    numeric = [v for v in values if isinstance(v, (np.generic, np.ndarray))]
    dtypes = {v.dtype for v in numeric}
    kinds = {d.kind for d in dtypes}
    one = len(dtypes) == 1 and kinds <= set("biuf")
    if len(numeric) == len(values) and (one or kinds in ({"M"}, {"m"})):
        return pa.array(np.array([np.asarray(v) for v in values]))
    return pa.array([_scalar(v) for v in values])


def _scalar(value: Any) -> Any:
    """A numpy scalar or 0-d array (`torch.tensor(5)`, `np.array(5)`) as a Python value."""
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0):
        return value.item()
    return value


def numpy_of(value: Any) -> Any:
    """Tensors (subclasses too) as numpy arrays, bfloat16 (which neither numpy nor Arrow
    holds) as float32; a `torch.Size` as a tuple of ints. torch is never imported here:
    a tensor exists only if its module was (fully: another thread may be importing it,
    its module half made, while no tensor can exist yet)."""
    torch = sys.modules.get("torch")
    if torch is None or getattr(getattr(torch, "__spec__", None), "_initializing", False):
        return value
    if isinstance(value, torch.Size):
        return tuple(int(v) for v in value)
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bfloat16:
            value = value.float()
        return value.detach().cpu().numpy()
    return value


__all__ = ["as_dict", "check_keys", "infer_schema", "numpy_of", "sample_of", "to_batch"]
