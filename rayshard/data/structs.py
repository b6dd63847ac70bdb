"""Struct columns to batch values: one Python dict per row, the field values exact (numpy's
conversion makes an int field holding a null a float). A null anywhere in a row (the row,
a field, an element of a list field) is a `DataError` unless `fill_null` gives the column
a dict of field values: it fills null rows and null fields, at any depth of structs.
The null check and the fill of list and map values (`row_nulls`, `filled_lists`) serve
list columns too, whose elements may be structs.

Pure functions, testable without Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayshard.data.columns import element_type, is_list_type
from rayshard.errors import DataError

_LISTS = (
    pa.types.is_list,
    pa.types.is_large_list,
    pa.types.is_fixed_size_list,
    pa.types.is_list_view,
    pa.types.is_large_list_view,
)
UNFILLED = " (a null the fill value cannot fill: a field it lacks, or inside a list field)"


def row_nulls(array: pa.Array) -> np.ndarray:
    """(rows,) bool: the rows of `array` holding a null at any depth (the row, a struct's
    field, a list's element, a map's value)."""
    if pa.types.is_map(array.type):  # (no list kernels for maps: their list of pairs)
        type_ = array.type
        array = array.cast(pa.list_(pa.struct([type_.key_field, type_.item_field])))
    nulls = array.is_null().to_numpy(zero_copy_only=False).copy()
    if pa.types.is_struct(array.type):
        for child in array.flatten():  # (a null row's fields are null: already counted)
            nulls |= row_nulls(child)
    elif any(test(array.type) for test in _LISTS) and len(array):
        inner = row_nulls(pc.list_flatten(array))
        if inner.any():
            # `list_flatten` goes in row order and skips null rows (whatever their offsets
            # span); a list view's values may lie in any order: parents by row lengths
            lengths = pc.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False)
            parents = np.repeat(np.arange(len(array)), lengths)
            nulls[parents[inner]] = True
    return nulls


def struct_rows(
    column: pa.Array,
    has_fill: bool,
    fill: Any,
    null_error: Callable[[int, str], DataError],
) -> np.ndarray:
    """A struct column as an object array of dicts; a null is `null_error(row, detail)`
    unless there is a `fill` (a dict of field values, checked on the driver)."""
    nulls = row_nulls(column)
    if nulls.any():
        if not has_fill:
            row = int(np.argmax(nulls))
            detail = "" if column[row].is_valid is False else " (a field of the struct)"
            raise null_error(row, detail)
        column = _filled(column, fill)
        left = row_nulls(column)
        if left.any():
            raise null_error(int(np.argmax(left)), UNFILLED)
    out = np.empty(len(column), dtype=object)
    for i, row in enumerate(column.to_pylist()):
        out[i] = row
    return out


def fill_fields(value: Any, fill: Any) -> Any:
    """A struct's Python `value` (a dict, or None) with null fields filled from `fill`."""
    if value is None:
        return fill
    if not isinstance(value, dict) or not isinstance(fill, dict):
        return value
    return {
        k: fill_fields(v, fill.get(k)) if isinstance(v, dict) or v is None else v
        for k, v in value.items()
    }


def holds_none(value: Any) -> bool:
    """Whether a Python value (of a list, map or struct column's row) holds a None."""
    if isinstance(value, dict):
        return any(holds_none(v) for v in value.values())
    # (a map's row: a list of (key, value) tuples)
    return value is None or (isinstance(value, (list, tuple)) and any(map(holds_none, value)))


def filled_lists(rows: list[Any], type_: pa.DataType, fill: Any) -> list[Any]:
    """`rows` (Python values of the list type `type_`) with null (sub)lists and maps empty
    (or, of a fixed size, full of `fill`) and null values (of a map: its values) `fill`."""
    value_type = element_type(type_)
    out = []
    for row in rows:
        if row is None:
            row = [None] * type_.list_size if pa.types.is_fixed_size_list(type_) else []
        if pa.types.is_map(type_):  # (key, value) pairs: keys are never null
            values = filled_lists([[v for _, v in row]], pa.list_(value_type), fill)[0]
            out.append([(key, value) for (key, _), value in zip(row, values)])
        elif is_list_type(value_type):
            out.append(filled_lists(row, value_type, fill))
        else:  # (a struct's null fields filled from a dict `fill`)
            out.append([fill_fields(value, fill) for value in row])
    return out


def _filled(column: pa.Array, fill: dict) -> pa.Array:
    """`column` (a struct) with null rows `fill` and null fields their value in it."""
    type_ = column.type
    if column.null_count:
        column = column.fill_null(pa.scalar(fill, type=type_))
    children = []
    for i, field in enumerate(type_):
        child, value = column.field(i), (fill or {}).get(field.name)
        if pa.types.is_struct(field.type) and value is not None:
            child = _filled(child, value)
        elif child.null_count and value is not None:
            child = child.fill_null(pa.scalar(value, type=field.type))
        children.append(child)
    return pa.StructArray.from_arrays(children, fields=list(type_))


__all__ = ["fill_fields", "filled_lists", "holds_none", "row_nulls", "struct_rows"]
