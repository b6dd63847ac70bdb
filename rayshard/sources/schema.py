"""Schemas of the files of one dataset: safe promotion, or a refusal naming both files.

Files written by different tools differ in ways that lose nothing when widened:
`list` vs `large_list` (polars writes `large_list`), `string` vs `large_string`, `binary`
vs `large_binary`, integer widths (`int32` vs `int64`, `uint16` vs `int32`), float widths,
the name of a list's item field (`item` vs `element`), view types (`string_view`, as
polars writes Arrow IPC) as their large kind, decimals of one scale to the larger
precision, structs field by field, a column of only nulls (type `null`) and dictionary
encoding (pandas' categoricals: read as their plain values). Those are promoted to the
wider type; anything else (another kind of value, a missing column) is a `ConfigError`.
Pure functions over `pyarrow` types, testable without files.
"""

from __future__ import annotations

import pyarrow as pa

from rayshard.errors import ConfigError

_SIGNED = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_UNSIGNED = (pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64())
_FLOATS = (pa.float16(), pa.float32(), pa.float64())
# view types (polars' Arrow IPC; pyarrow >= 16) promote as their large kind: by name
_TEXT = ("string", "large_string", "string_view")
_BYTES = ("binary", "large_binary", "binary_view")


def promote_type(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The narrowest type both `a` and `b` convert to without loss, or None."""
    if a.equals(b):
        return a
    if pa.types.is_null(a) or pa.types.is_null(b):  # a column of only nulls (pandas, polars)
        return b if pa.types.is_null(a) else a
    if pa.types.is_dictionary(a) or pa.types.is_dictionary(b):  # read as plain values
        return promote_type(*(t.value_type if pa.types.is_dictionary(t) else t for t in (a, b)))
    for family in (_SIGNED, _UNSIGNED, _FLOATS):
        if a in family and b in family:
            return max(a, b, key=family.index)
    if (a in _SIGNED and b in _UNSIGNED) or (a in _UNSIGNED and b in _SIGNED):
        signed, unsigned = (a, b) if a in _SIGNED else (b, a)
        # a signed type holds an unsigned one of fewer bits; int64 is the widest
        need = max(_SIGNED.index(signed), _UNSIGNED.index(unsigned) + 1)
        return _SIGNED[need] if need < len(_SIGNED) else None
    for kinds, large in ((_TEXT, pa.large_string()), (_BYTES, pa.large_binary())):
        if {str(a), str(b)} <= set(kinds):
            return large
    if pa.types.is_decimal(a) and pa.types.is_decimal(b):  # duckdb, pandas: precisions
        same = a.scale == b.scale and a.bit_width == b.bit_width
        return max(a, b, key=lambda t: t.precision) if same else None
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return _promote_struct(a, b)
    if _is_list(a) and _is_list(b):
        value = promote_type(a.value_type, b.value_type)
        if value is None:
            return None
        nullable = a.value_field.nullable or b.value_field.nullable
        field = pa.field("item", value, nullable=nullable)
        large = pa.types.is_large_list(a) or pa.types.is_large_list(b)
        return pa.large_list(field) if large else pa.list_(field)
    return None


def merge_schemas(
    first: tuple[str, pa.Schema], other: tuple[str, pa.Schema]
) -> tuple[pa.Schema, list[str]]:
    """The promoted schema of two files (in the first one's field order) and the names of
    the fields whose types differ (and were promoted); a `ConfigError` naming both files
    otherwise."""
    (a_name, a), (b_name, b) = first, other
    missing = [f for f in a if b.get_field_index(f.name) < 0]
    extra = [f.name for f in b if a.get_field_index(f.name) < 0]
    if missing:
        field = missing[0]
        raise ConfigError(
            f"schemas disagree: {a_name} has field {field.name!r} ({field.type}) but {b_name} "
            "does not; all files of a dataset need the same columns (rewrite the files)"
        )
    if extra:
        raise ConfigError(
            f"schemas disagree: {b_name} differs from {a_name} (extra fields {extra}); all "
            "files of a dataset need the same columns (rewrite the files)"
        )
    fields, promoted = [], []
    for field in a:
        other_field = b.field(field.name)
        wide = promote_type(field.type, other_field.type)
        if wide is None:
            raise ConfigError(
                f"schemas disagree on column {field.name!r}: {field.type} in {a_name} but "
                f"{other_field.type} in {b_name}, and there is no safe promotion between them "
                "(see the kinds promoted in the README's Real data); rewrite one file with the "
                "other's type"
            )
        if not (wide.equals(field.type) and wide.equals(other_field.type)):
            promoted.append(field.name)
        fields.append(pa.field(field.name, wide, nullable=field.nullable or other_field.nullable))
    return pa.schema(fields), promoted


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with exactly `schema`'s fields, in its order (types, item names, no
    metadata), so chunks of files that order their columns differently concatenate; a
    no-op when they already agree. Fields of `schema` missing from `table` are not added;
    a column `schema` lacks is a `ValueError`."""
    unknown = [n for n in table.column_names if schema.get_field_index(n) < 0]
    if unknown:
        raise ValueError(
            f"column(s) {unknown} are not in the dataset's schema (did the file change "
            "after the source was made?)"
        )
    present = set(table.column_names)  # a set: a read of 2 of 2,000 columns stays cheap
    names = [n for n in schema.names if n in present]  # the dataset's order
    if names != table.column_names:
        table = table.select(names)
    target = pa.schema([schema.field(n) for n in names])
    if table.schema.equals(target, check_metadata=True):
        return table
    return table.cast(target)


def _promote_struct(a: pa.StructType, b: pa.StructType) -> pa.DataType | None:
    """Structs of the same field names in the same order, each field promoted (polars
    writes a struct's strings as `large_string`, pyarrow as `string`)."""
    if [f.name for f in a] != [f.name for f in b]:
        return None
    fields = []
    for x, y in zip(a, b):
        value = promote_type(x.type, y.type)
        if value is None:
            return None
        fields.append(pa.field(x.name, value, nullable=x.nullable or y.nullable))
    return pa.struct(fields)


def plain_dictionaries(schema: pa.Schema) -> pa.Schema:
    """`schema` with dictionary-encoded columns (pandas' categoricals, pyarrow's) as their
    plain values: batches join row groups, and row groups and files each have their own
    dictionary, whose union may not fit the index type (pandas gives 100 categories an
    int8 index; two such files hold 200)."""
    plain = [
        f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in schema
    ]
    return pa.schema(plain, metadata=schema.metadata)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


__all__ = ["conform", "merge_schemas", "plain_dictionaries", "promote_type"]
