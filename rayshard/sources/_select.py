"""Hive partitions and row filters of file sources, decided once on the driver.

`split=train/part-0.parquet` puts the file in partition `split="train"`: the key becomes
a column (int64 when every value of the key is an integer, else string). A `filter=`
(a `pyarrow.compute` expression) is applied when the source is built, so every rank
plans over the same samples: files whose partition values fail it are left out, chunks
(Parquet row groups) whose statistics rule it out are never read, and the rest is
evaluated exactly, reading only the filter's columns, into a row selection per chunk.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayshard.errors import ConfigError

_SEGMENT = re.compile(r"^([^=/]+)=([^/]*)$")
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"  # a null partition value (Hive, Spark, pyarrow)
_ROW = "__rayshard_row"


def hive_values(relative: str) -> dict[str, str]:
    """`{key: value}` of the `key=value` folders of a path relative to the dataset root."""
    out: dict[str, str] = {}
    for part in relative.split("/")[:-1]:
        match = _SEGMENT.match(part)
        if match:
            out[urllib.parse.unquote(match.group(1))] = urllib.parse.unquote(match.group(2))
    return out


def partition_schema(
    values: Sequence[tuple[str, dict[str, str]]], file_schema: pa.Schema
) -> pa.Schema:
    """The partition columns of files `(display, {key: value})`; every file must have the
    same keys, and no key may also be a column inside the files."""
    if not values:
        return pa.schema([])
    first_name, first = values[0]
    for name, keys in values[1:]:
        if sorted(keys) != sorted(first):
            raise ConfigError(
                f"hive partitions disagree: {first_name} is under {sorted(first)} but {name} "
                f"under {sorted(keys)}; every file needs the same key=value folders "
                "(or pass partitioning=None to ignore them)"
            )
    fields = []
    for key in first:
        if file_schema.get_field_index(key) >= 0:
            raise ConfigError(
                f"partition key {key!r} ({first_name}) is also a column inside the files: "
                "rename the folders, or pass partitioning=None"
            )
        given = [keys[key] for _, keys in values if keys[key] != HIVE_NULL]
        ints = bool(given) and all(_is_int64(value) for value in given)
        fields.append(pa.field(key, pa.int64() if ints else pa.string()))
    return pa.schema(fields)


def _is_int64(text: str) -> bool:
    """Whether a partition value reads as an integer that int64 holds."""
    return bool(re.fullmatch(r"-?\d+", text)) and -(2**63) <= int(text) < 2**63


def constants(schema: pa.Schema, values: dict[str, str], rows: int) -> list[pa.Array]:
    """The partition columns of `schema` for `rows` rows of a file with `values`."""
    return [pa.array([_typed(values[f.name], f.type)] * rows, f.type) for f in schema]


def check_filter(expression: Any, schema: pa.Schema) -> list[str]:
    """Validate `filter=` against the full schema (file and partition columns) and return
    the columns it reads; a `ConfigError` naming the problem otherwise."""
    if not isinstance(expression, pc.Expression):
        raise TypeError(
            f"filter={expression!r} must be a pyarrow.compute.Expression, "
            "e.g. pyarrow.compute.field('split') == 'train'"
        )
    empty = schema.empty_table()
    _evaluate(empty, expression, "the dataset's columns " + str(schema.names))
    used = []
    for name in schema.names:
        try:
            empty.drop_columns([name]).filter(expression)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            used.append(name)
    return used


def select_rows(table: pa.Table, expression: Any, where: str) -> np.ndarray | None:
    """(k,) int64 row numbers of `table` where `expression` holds; None if it holds for
    every row. Null counts as false (as in SQL)."""
    numbered = table.append_column(_ROW, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    rows = _evaluate(numbered, expression, where).column(_ROW).to_numpy()
    return None if len(rows) == table.num_rows else rows


def _evaluate(table: pa.Table, expression: Any, where: str) -> pa.Table:
    try:
        return table.filter(expression)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as error:
        raise ConfigError(
            f"filter={expression} cannot be evaluated over {where}: {error}; use the "
            "columns and types of the dataset (partition keys included)"
        ) from error


def _typed(value: str, type_: pa.DataType) -> Any:
    if value == HIVE_NULL:
        return None
    return int(value) if pa.types.is_integer(type_) else value


__all__ = ["check_filter", "constants", "hive_values", "partition_schema", "select_rows"]
