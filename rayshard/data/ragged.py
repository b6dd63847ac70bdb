"""Arrow columns to numpy batch arrays: padding of variable-length lists (from the list
offsets and the flat values, no loop over rows), null checks and fill values.

Pure functions, testable without Ray; the readers run `convert_table` on every batch.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayshard.data.arrow_numpy import numpy_of
from rayshard.data.columns import (
    LENGTHS_SUFFIX,
    MASK_SUFFIX,
    OFFSETS_SUFFIX,
    ColumnRules,
    Padding,
    fill_type,
    is_list_type,
    is_ragged,
)
from rayshard.data.structs import UNFILLED, filled_lists, holds_none, row_nulls, struct_rows
from rayshard.data.wire import ships_as_arrow
from rayshard.errors import DataError

INDEX_KEY = "_index"
# view types (polars' Arrow IPC) have no fill kernel: filled as their large kind
UNVIEWED = {"string_view": pa.large_string(), "binary_view": pa.large_binary()}


def convert_table(
    table: pa.Table, rules: ColumnRules | None = None, keep_text: bool = False
) -> dict[str, Any]:
    """Columns as numpy arrays: fixed-size lists as (rows, *shape) arrays, variable-length numeric
    lists padded (or values + offsets), other lists as Python lists per row, anything else
    through `to_numpy`. A null (a row, or an element of a list at any depth) is a
    `DataError` naming the column and the sample (`_index`) unless `rules` fill it. With
    `keep_text`, string and binary columns stay Arrow arrays (nulls checked and filled) for
    a reader actor to ship (`rayshard.data.wire`)."""
    rules = rules or ColumnRules()
    index = table.column(INDEX_KEY) if INDEX_KEY in table.column_names else None
    out: dict[str, Any] = {}
    for name, kind, shape in _column_kinds(table.schema):
        chunked = table.column(name)
        # One chunk (the usual case): use it as is; `combine_chunks` would copy it.
        column = chunked.chunk(0) if chunked.num_chunks == 1 else chunked.combine_chunks()
        if kind == "ragged":
            has_fill, fill = rules.fill_of(name)
            out.update(pad_list(name, column, rules.padding_of(name), has_fill, fill, index))
        elif kind == "fixed":
            out[name] = _fixed(name, column, shape, rules, index)
        elif kind == "tensor":
            out[name] = _tensor(name, column, shape, rules, index)
        elif kind == "list":
            out[name] = _python_lists(name, column, rules, index)
        elif pa.types.is_struct(column.type):
            at_row = functools.partial(_row_error, name, index)
            out[name] = struct_rows(column, *rules.fill_of(name), at_row)
        else:
            if column.null_count:
                has_fill, fill = rules.fill_of(name)
                if not has_fill:
                    raise _null_error(name, column.is_null(), index)
                column = column.cast(UNVIEWED.get(str(column.type), column.type))
                column = column.fill_null(pa.scalar(fill).cast(column.type))
            keep = keep_text and ships_as_arrow(column.type)
            out[name] = column if keep else numpy_of(column)
    return out


def _fixed(
    name: str, column: pa.Array, shape: tuple[int, ...], rules: ColumnRules, index: Any
) -> np.ndarray:
    """fixed_size_list<...<fixed_size_list<t, d_k>...>, d_1> -> (rows, d_1, ..., d_k). With
    a fill value, null elements and every element of a null (sub)list become it."""
    # levels[k]: the lists (or, last, the values) at depth k, null slots' children included
    levels = [column]
    for size in shape:
        parent = levels[-1]
        levels.append(parent.values.slice(parent.offset * size, len(parent) * size))
    flat = levels[-1]
    if any(level.null_count for level in levels):
        has_fill, fill = rules.fill_of(name)
        if not has_fill:
            row, element = _first_fixed_null(levels, shape)
            detail = " (an element of the list)" if element else ""
            raise _null_error(name, None, index, row=row, detail=detail)
        nulls = pa.array(_fixed_nulls(levels, shape))
        flat = flat.cast(UNVIEWED.get(str(flat.type), flat.type))  # (no kernel for views)
        flat = pc.if_else(nulls, pa.scalar(fill).cast(flat.type), flat)
    return numpy_of(flat).reshape(len(column), *shape)


def _tensor(
    name: str, column: pa.Array, shape: tuple[int, ...], rules: ColumnRules, index: Any
) -> np.ndarray:
    """Arrow's fixed_shape_tensor as (rows, *its logical shape): its storage in the
    physical `shape`, axes in the type's `permutation` (pyarrow writes one for a
    transposed array: logical axis i is physical axis permutation[i])."""
    flat = _fixed(name, column.storage, (math.prod(shape),), rules, index)
    tensors = flat.reshape(len(column), *shape)
    order = column.type.permutation
    if order is None:
        return tensors
    return np.ascontiguousarray(tensors.transpose(0, *(1 + int(axis) for axis in order)))


def _first_fixed_null(levels: list[pa.Array], shape: tuple[int, ...]) -> tuple[int, bool]:
    """(the first row holding a null at some depth, whether that null is below the row)."""
    found = []
    per_row = 1  # slots of one row at this depth
    for depth, level in enumerate(levels):
        if level.null_count:
            first = int(pc.index(level.is_null(), True).as_py())
            found.append((first // per_row, depth > 0))
        per_row *= shape[depth] if depth < len(shape) else 1
    return min(found)


def _fixed_nulls(levels: list[pa.Array], shape: tuple[int, ...]) -> np.ndarray:
    """(values,) bool: the values that are null or lie in a null (sub)list."""
    nulls = np.zeros(len(levels[0]), dtype=bool)
    for level, size in zip(levels, (*shape, 1)):
        if level.null_count:
            nulls |= level.is_null().to_numpy(zero_copy_only=False)
        nulls = np.repeat(nulls, size)
    return nulls


def _python_lists(name: str, column: pa.Array, rules: ColumnRules, index: Any) -> np.ndarray:
    """Lists of strings, of lists, ...: a Python list per row (an object array). With a
    fill value, a null row or sublist becomes empty and a null element the fill value."""
    rows = column.to_pylist()
    nulls = row_nulls(column)  # (also a struct element's field)
    if nulls.any():
        has_fill, fill = rules.fill_of(name)
        if not has_fill:
            row = int(np.argmax(nulls))
            detail = "" if rows[row] is None else " (an element of the list)"
            raise _null_error(name, None, index, row=row, detail=detail)
        fill = pa.scalar(fill).cast(fill_type(column.type)).as_py()
        rows = filled_lists(rows, column.type, fill)
        left = next((i for i, row in enumerate(rows) if holds_none(row)), None)
        if left is not None:
            raise _null_error(name, None, index, row=left, detail=UNFILLED)
    out = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):
        out[i] = row
    return out


@functools.lru_cache(maxsize=64)
def _column_kinds(schema: pa.Schema) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """How each column of `schema` converts: (name, "ragged" | "fixed" | "list" | "plain",
    the fixed-size list widths); worked out once per schema, not once per batch."""
    kinds = []
    for field in schema:
        type_, shape = field.type, []
        if is_ragged(type_):
            kind = "ragged"
        elif isinstance(type_, pa.FixedShapeTensorType):  # shape: the physical one
            kind, shape = "tensor", list(type_.shape)
        elif pa.types.is_fixed_size_list(type_):
            while pa.types.is_fixed_size_list(type_):
                shape.append(type_.list_size)
                type_ = type_.value_type
            # of variable-length lists: a Python list per row (their nulls checked too)
            nested = is_list_type(type_) or pa.types.is_struct(type_)
            kind, shape = ("list", []) if nested else ("fixed", shape)
        else:  # (lists of other values, list views, maps: nulls checked at any depth)
            kind = "list" if is_list_type(type_) else "plain"
        kinds.append((field.name, kind, tuple(shape)))
    return tuple(kinds)


def converts_by_row(schema: pa.Schema) -> bool:
    """Whether `convert_table` converts each row of `schema` on its own (no variable-length
    list column, whose padding or offsets depend on the batch): converting many rows at
    once and slicing the arrays gives the arrays of each slice converted alone."""
    return all(kind != "ragged" for _, kind, _ in _column_kinds(schema))


def pad_list(
    name: str,
    column: pa.Array,
    padding: Padding,
    has_fill: bool = False,
    fill: Any = None,
    index: Any = None,
) -> dict[str, np.ndarray]:
    """One `list`/`large_list` column as padded values, lengths and mask (or, with
    `padding.nested`, flat values and offsets). Null rows become empty rows and null
    elements `fill` when `has_fill`; otherwise a null is a `DataError`."""
    rows = len(column)
    # (rows + 1,) offsets into the child array (a slice keeps its parent's child)
    offsets = numpy_of(column.offsets).astype(np.int64)
    # only the child values this slice uses (a batch is often a slice of a row group)
    values = column.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    offsets = offsets - offsets[0]
    starts, lengths = offsets[:-1], np.diff(offsets)
    if column.null_count:
        if not has_fill:
            raise _null_error(name, column.is_null(), index)
        lengths = np.where(column.is_null().to_numpy(zero_copy_only=False), 0, lengths)
    limit = padding.max_length
    if limit is not None and lengths.size and lengths.max() > limit:
        if not padding.truncate:
            row = int(np.flatnonzero(lengths > limit)[0])
            raise DataError(
                f"column {name!r}: sample {_sample(index, row)} has {int(lengths[row])} "
                f"elements, more than max_length={limit} (Padding(truncate=False)); raise "
                "max_length, or allow truncate=True"
            )
        lengths = np.minimum(lengths, limit)
    if values.null_count:
        # (values,) element i is kept by some row (after truncation): a null there matters
        nulls = values.is_null().to_numpy(zero_copy_only=False) & _used_elements(
            starts, lengths, len(values)
        )
        if nulls.any() and not has_fill:
            element = int(np.flatnonzero(nulls)[0])
            row = int(np.searchsorted(offsets, element, side="right") - 1)
            raise _null_error(name, None, index, row=row, detail=" (an element of the list)")
        # nulls no row keeps are filled too: `to_numpy` would make integers floats
        filler = fill if has_fill else padding.pad_value
        values = values.fill_null(pa.scalar(filler).cast(values.type))
    flat = numpy_of(values)
    if padding.nested:
        return _jagged(name, flat, starts, lengths)
    width = padding.width(int(lengths.max()) if rows else 0)
    # (rows, width) True where a row has a real element
    mask = np.arange(width)[None, :] < lengths[:, None]
    padded = np.full((rows, width), padding.pad_value, dtype=flat.dtype)
    if rows and lengths.sum() == len(flat):  # every element kept, rows back to back
        padded[mask] = flat
    else:
        padded[mask] = flat[_positions(starts, lengths)]
    return {name: padded, name + LENGTHS_SUFFIX: lengths, name + MASK_SUFFIX: mask}


def _jagged(
    name: str, flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> dict[str, np.ndarray]:
    """Values of the rows, joined, and their (rows + 1,) offsets from 0."""
    new_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    contiguous = lengths.size == 0 or (
        (starts[1:] == starts[:-1] + lengths[:-1]).all() if lengths.size > 1 else True
    )
    if contiguous:  # rows follow each other in `flat`: one slice, no gather
        start = int(starts[0]) if starts.size else 0
        values = flat[start : start + int(new_offsets[-1])]
    else:
        values = flat[_positions(starts, lengths)]
    return {name: values, name + OFFSETS_SUFFIX: new_offsets}


def _positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """(lengths.sum(),) where the first `lengths[r]` elements of each row r sit in the flat
    values, row after row: O(kept elements), no (rows, width) matrix (a long row would
    make that many times the batch)."""
    first = np.cumsum(lengths) - lengths  # each row's first slot among the kept elements
    return np.arange(int(lengths.sum())) + np.repeat(starts - first, lengths)


def _used_elements(starts: np.ndarray, lengths: np.ndarray, size: int) -> np.ndarray:
    """(size,) bool: which child elements lie inside some row (a difference array)."""
    marks = np.zeros(size + 1, dtype=np.int64)
    np.add.at(marks, starts, 1)
    np.add.at(marks, starts + lengths, -1)
    return np.cumsum(marks[:-1]) > 0


def _sample(index: Any, row: int) -> int:
    if index is None:
        return row
    return int(index[row].as_py()) if hasattr(index, "__getitem__") else row


def _row_error(name: str, index: Any, row: int, detail: str) -> DataError:
    return _null_error(name, None, index, row=row, detail=detail)


def _null_error(
    name: str, is_null: Any, index: Any, *, row: int | None = None, detail: str = ""
) -> DataError:
    if row is None:
        row = int(pc.index(is_null, True).as_py())
    return DataError(
        f"column {name!r} is null at sample {_sample(index, row)}{detail}: give a fill "
        f"value with Loader(fill_null={{{name!r}: ...}}), or drop the column with columns="
    )


__all__ = ["UNVIEWED", "convert_table", "pad_list"]
