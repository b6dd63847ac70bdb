"""How columns become batch arrays: padding of variable-length lists, null fill values.

`Padding` holds one list column's options; `ColumnRules` holds every column's, checked
against the source's schema on the driver (`ColumnRules.build`), and travels to the
readers inside `LoaderConfig`. The conversion itself is `rayshard.data.ragged`.

A variable-length list column `name` of numbers or booleans (`list`, `large_list`)
becomes, per batch:

- `name`: a `(rows, width)` array padded with `pad_value`, where `width` is the longest
  row of the batch (at most `max_length`), rounded up to `pad_to_multiple`;
- `name_lengths`: int64 `(rows,)`, each row's length after truncation;
- `name_mask`: bool `(rows, width)`, True where a real element is.

With `nested=True` it becomes `name` (the flat values) and `name_offsets` (int64,
`rows + 1`) instead; under `batch_format="torch"` that is one `torch.nested` jagged tensor.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from rayshard.config.checks import check_int
from rayshard.errors import ConfigError

LENGTHS_SUFFIX = "_lengths"
MASK_SUFFIX = "_mask"
OFFSETS_SUFFIX = "_offsets"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Padding:
    """Options of one variable-length list column (see the module docstring).

    - `pad_value`: what fills the rows past their length (default 0).
    - `max_length`: longest row kept; `None` keeps every element.
    - `truncate`: rows longer than `max_length` are cut (True, default) or refused with a
      `DataError` naming the column and the sample (False).
    - `pad_to_multiple`: round the padded width up to a multiple of this (e.g. 8).
    - `nested`: deliver values and offsets (a `torch.nested` jagged tensor under torch)
      instead of padding.
    """

    pad_value: int | float | bool = 0
    max_length: int | None = None
    truncate: bool = True
    pad_to_multiple: int | None = None
    nested: bool = False

    def __post_init__(self) -> None:
        value = self.pad_value
        if not isinstance(value, (int, float)) or (isinstance(value, float) and math.isnan(value)):
            raise ConfigError(f"Padding(pad_value={value!r}) must be a number or a bool (not NaN)")
        for name in ("max_length", "pad_to_multiple"):
            limit = getattr(self, name)
            if limit is not None:
                check_int(limit, name, minimum=1, fix="Padding: use None for no limit")
        for name in ("truncate", "nested"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"Padding({name}={getattr(self, name)!r}) must be True or False")

    def width(self, longest: int) -> int:
        """The padded width of a batch whose longest row has `longest` elements."""
        width = longest if self.max_length is None else min(longest, self.max_length)
        if self.pad_to_multiple:
            width = -(-width // self.pad_to_multiple) * self.pad_to_multiple
        return width


def is_ragged(type_: pa.DataType) -> bool:
    """A variable-length list of numbers or booleans: what gets padded."""
    if not (pa.types.is_list(type_) or pa.types.is_large_list(type_)):
        return False
    value = type_.value_type
    return pa.types.is_integer(value) or pa.types.is_floating(value) or pa.types.is_boolean(value)


def is_list_type(type_: pa.DataType) -> bool:
    """A list of any kind: `list`, `large_list`, `fixed_size_list`, their views, or a
    `map` (a list of key-value pairs: its elements are its values)."""
    return any(test(type_) for test in _LIST_TESTS)


_LIST_TESTS = (
    pa.types.is_list,
    pa.types.is_large_list,
    pa.types.is_fixed_size_list,
    pa.types.is_list_view,
    pa.types.is_large_list_view,
    pa.types.is_map,
)


def element_type(type_: pa.DataType) -> pa.DataType:
    """The type of the elements of a list type; of a map, its values (its keys are never
    null: Arrow refuses null keys)."""
    return type_.item_type if pa.types.is_map(type_) else type_.value_type


def fill_type(type_: pa.DataType) -> pa.DataType:
    """The type of a `fill_null` value for a column of `type_`: the innermost values of
    (nested) lists and maps (and tensors: their storage), whose null elements it fills,
    else `type_` itself."""
    if isinstance(type_, pa.FixedShapeTensorType):
        type_ = type_.storage_type
    while is_list_type(type_):
        type_ = element_type(type_)
    return type_


@dataclasses.dataclass(frozen=True)
class ColumnRules:
    """Per-column conversion options, checked against a schema (`build`)."""

    padding: tuple[tuple[str, Padding], ...] = ()
    fill_null: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def build(
        cls,
        padding: Mapping[str, Padding] | None,
        fill_null: Mapping[str, Any] | None,
        schema: pa.Schema,
        where: str = "the source",
    ) -> ColumnRules:
        """Validate the options against `schema` (the columns the loader reads): every named
        column exists, padding only on numeric list columns, fill values fit their column,
        and the derived `_lengths`/`_mask`/`_offsets` names are free."""
        padding = _mapping(padding, "padding")
        fill_null = _mapping(fill_null, "fill_null")
        for name, options in padding.items():
            if not isinstance(options, Padding):
                raise TypeError(
                    f"padding[{name!r}] is a {type(options).__name__}: pass "
                    f"rayshard.data.columns.Padding(...), e.g. Padding(pad_value=0, max_length=512)"
                )
            field = _field(schema, name, "padding", where)
            if not is_ragged(field.type):
                raise ConfigError(
                    f"padding[{name!r}]: column {name!r} of {where} is {field.type}; padding "
                    "applies to variable-length lists of numbers (list or large_list)"
                )
            if not _pad_fits(options.pad_value, field.type.value_type):
                raise ConfigError(
                    f"padding[{name!r}]: pad_value={options.pad_value!r} does not fit the "
                    f"{field.type.value_type} values of column {name!r}: pick a value of "
                    "that type and range"
                )
        for name, value in fill_null.items():
            field = _field(schema, name, "fill_null", where)
            target = fill_type(field.type)
            if not _same_kind(value, target) or not _casts(value, target):
                raise ConfigError(
                    f"fill_null[{name!r}]={value!r} does not fit column {name!r} ({field.type}) "
                    f"of {where}: give a value of type {target}"
                )
        for field in schema:
            if not is_ragged(field.type):
                continue
            nested = padding.get(field.name, Padding()).nested
            for suffix in (OFFSETS_SUFFIX,) if nested else (LENGTHS_SUFFIX, MASK_SUFFIX):
                if schema.get_field_index(field.name + suffix) >= 0:
                    raise ConfigError(
                        f"column {field.name!r} of {where} is a variable-length list, which "
                        f"adds {field.name + suffix!r}, but the source already has a column of "
                        "that name: rename it, or leave one out with columns="
                    )
        return cls(tuple(sorted(padding.items())), tuple(sorted(fill_null.items())))

    def padding_of(self, name: str) -> Padding:
        return dict(self.padding).get(name) or Padding()

    def fill_of(self, name: str) -> tuple[bool, Any]:
        """(whether a fill value is configured, the value)."""
        fills = dict(self.fill_null)
        return (name in fills, fills.get(name))

    def nested_columns(self, schema: pa.Schema) -> tuple[str, ...]:
        """The list columns of `schema` delivered as jagged (values + offsets)."""
        return tuple(f.name for f in schema if is_ragged(f.type) and self.padding_of(f.name).nested)


def check_loader_columns(
    schema: pa.Schema,
    columns: Any,
    padding: Mapping[str, Padding] | None,
    fill_null: Mapping[str, Any] | None,
    where: str,
) -> ColumnRules:
    """On the driver: `Loader(columns=...)` names columns of the source (a `ConfigError`
    naming the column, `where` (the source, its first file) and the available columns),
    and the padding and fill options fit the columns read."""
    if columns is not None:
        names = [columns] if isinstance(columns, str) else list(columns)
        missing = [c for c in names if schema.get_field_index(c) < 0]
        if missing:
            raise ConfigError(
                f"columns={names!r}: {missing} not in {where}; available columns are "
                f"{schema.names} (check the spelling)"
            )
        schema = pa.schema([schema.field(c) for c in names])
    taken = [name for name in ("_index", "_padded") if name in schema.names]
    if taken:  # every batch carries these: a column of that name would be a second one
        kept = [name for name in schema.names if name not in taken]
        raise ConfigError(
            f"{where} has a column named {taken[0]!r}, a name every batch of the loader "
            f"carries (the sample index and the padding flag): leave it out with "
            f"columns={kept!r}, or rename it in the data"
        )
    return ColumnRules.build(padding, fill_null, schema, where)


def _mapping(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{name}={value!r} must be a dict of column name -> option, "
            f"e.g. {name}={{'tokens': ...}}"
        )
    return dict(value)


def _same_kind(value: Any, target: pa.DataType) -> bool:
    """Whether `value` is the kind of value a `target` column holds: text for strings,
    bytes for binary, integers (not bools) for integers, numbers for floats, bools for
    bools (Arrow's casts alone would turn 3 into "3" and "7" into 7)."""
    if str(target) in ("string", "large_string", "string_view"):
        return isinstance(value, str)
    if str(target) in ("binary", "large_binary", "binary_view"):
        return isinstance(value, bytes)
    if pa.types.is_boolean(target):
        return isinstance(value, (bool, np.bool_))
    if pa.types.is_integer(target):
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if pa.types.is_floating(target):
        return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
            value, bool
        )
    return True  # other types: Arrow's cast decides


def _pad_fits(value: int | float | bool, target: pa.DataType) -> bool:
    """Whether `value` becomes itself as a `target` value: in range (no 2 -> True in a bool
    column, no 1e40 -> inf in a float32 one), no fraction cut off in an int column."""
    try:
        cast = pa.array([value]).cast(target).to_pylist()[0]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OverflowError):
        return False
    if pa.types.is_floating(target):  # (rounded to the nearest float32 value: fine)
        return math.isinf(cast) == math.isinf(value)
    return bool(cast == value)


def _casts(value: Any, target: pa.DataType) -> bool:
    """Whether Arrow casts `value` to `target` (range and precision checked; an int
    beyond 64 bits does not even become an Arrow array: OverflowError)."""
    try:
        pa.array([value]).cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OverflowError):
        return False
    return True


def _field(schema: pa.Schema, name: str, option: str, where: str) -> pa.Field:
    if schema.get_field_index(name) < 0:
        raise ConfigError(
            f"{option}[{name!r}]: column {name!r} is not read from {where}; "
            f"the columns are {schema.names}"
        )
    return schema.field(name)


__all__ = [
    "ColumnRules",
    "Padding",
    "check_loader_columns",
    "element_type",
    "fill_type",
    "is_list_type",
    "is_ragged",
]
