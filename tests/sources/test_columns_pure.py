"""Padding arithmetic, null handling, schema promotion and hive parsing, without Ray."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayshard.data.columns import ColumnRules, Padding, check_loader_columns
from rayshard.data.formats import arrow_batch, torch_host_batch
from rayshard.data.ragged import convert_table, pad_list
from rayshard.device import DeviceFeed
from rayshard.errors import ConfigError, DataError, unwrap_task_error
from rayshard.sources._select import check_filter, hive_values, partition_schema, select_rows
from rayshard.sources.schema import merge_schemas, promote_type

rows_st = st.lists(st.lists(st.integers(-50, 50), max_size=12), max_size=10)


def reference(rows, padding):
    """Row-by-row padding: what `pad_list` must compute without a loop."""
    kept = [r if padding.max_length is None else r[: padding.max_length] for r in rows]
    width = padding.width(max((len(r) for r in kept), default=0))
    padded = [r + [padding.pad_value] * (width - len(r)) for r in kept]
    mask = [[True] * len(r) + [False] * (width - len(r)) for r in kept]
    return padded, [len(r) for r in kept], mask, width


@settings(max_examples=150, deadline=None)
@given(
    rows=rows_st,
    offset=st.integers(0, 3),
    pad=st.integers(-9, 9),
    max_length=st.none() | st.integers(1, 8),
    multiple=st.none() | st.integers(1, 5),
    large=st.booleans(),
)
@example(rows=[], offset=0, pad=0, max_length=None, multiple=None, large=False)
@example(rows=[[], []], offset=0, pad=-1, max_length=3, multiple=4, large=True)
def test_padding_matches_a_row_by_row_reference(rows, offset, pad, max_length, multiple, large):
    padding = Padding(pad_value=pad, max_length=max_length, pad_to_multiple=multiple)
    type_ = pa.large_list(pa.int32()) if large else pa.list_(pa.int32())
    # a slice of a longer array: offsets do not start at 0
    column = pa.array([[7] * 3] * offset + rows, type_).slice(offset)
    out = pad_list("tokens", column, padding)
    padded, lengths, mask, width = reference(rows, padding)
    assert out["tokens"].shape == (len(rows), width) and out["tokens"].dtype == np.int32
    assert out["tokens"].tolist() == padded
    assert out["tokens_lengths"].tolist() == lengths
    assert out["tokens_mask"].tolist() == mask
    nested = pad_list("tokens", column, Padding(max_length=max_length, nested=True))
    kept = [r if max_length is None else r[:max_length] for r in rows]
    assert nested["tokens"].tolist() == [v for r in kept for v in r]
    assert nested["tokens_offsets"].tolist() == list(np.cumsum([0] + [len(r) for r in kept]))


def test_max_length_refused_names_column_and_sample():
    table = pa.table(
        {"tokens": pa.array([[1], [1, 2, 3, 4]], pa.list_(pa.int32())), "_index": [40, 41]}
    )
    rules = ColumnRules.build({"tokens": Padding(max_length=3, truncate=False)}, None, table.schema)
    with pytest.raises(DataError, match=r"'tokens': sample 41 has 4 elements.*max_length=3"):
        convert_table(table, rules)


def test_nulls_are_errors_naming_column_and_sample_unless_filled():
    tokens = pa.array([[1, 2], None, [3, None]], pa.list_(pa.int64()))
    table = pa.table({"tokens": tokens, "label": [1, None, 3], "_index": [5, 6, 7]})
    with pytest.raises(DataError, match=r"column 'tokens' is null at sample 6.*fill_null"):
        convert_table(table)
    with pytest.raises(DataError, match=r"'tokens' is null at sample 7 \(an element"):
        convert_table(table.slice(2))
    rules = ColumnRules.build(None, {"tokens": -1, "label": 0}, table.schema)
    out = convert_table(table, rules)
    assert out["tokens"].tolist() == [[1, 2], [0, 0], [3, -1]]
    assert out["tokens_lengths"].tolist() == [2, 0, 2]
    assert out["label"].tolist() == [1, 0, 3] and out["label"].dtype == np.int64


def test_fixed_shapes_of_any_rank():
    grid = pa.array(np.arange(24, dtype=np.float32))
    for size in (4, 3, 2):
        grid = pa.FixedSizeListArray.from_arrays(grid, size)
    out = convert_table(pa.table({"g": grid}))
    assert out["g"].shape == (1, 2, 3, 4)
    assert out["g"].ravel().tolist() == list(range(24))
    back = arrow_batch(out)
    assert back.column("g").type == grid.type


def test_rules_are_validated_on_the_driver():
    schema = pa.schema(
        [("tokens", pa.list_(pa.int32())), ("text", pa.string()), ("tokens_mask", pa.int8())]
    )
    with pytest.raises(ConfigError, match="'tokens_mask'.*already has a column"):
        ColumnRules.build(None, None, schema)
    schema = schema.remove(2)
    with pytest.raises(ConfigError, match=r"padding\['text'\].*string"):
        ColumnRules.build({"text": Padding()}, None, schema)
    with pytest.raises(ConfigError, match=r"padding\['nope'\].*the columns are"):
        ColumnRules.build({"nope": Padding()}, None, schema)
    with pytest.raises(TypeError, match="rayshard.data.columns.Padding"):
        ColumnRules.build({"tokens": {"pad_value": 0}}, None, schema)
    with pytest.raises(ConfigError, match=r"fill_null\['tokens'\]='x'.*int32"):
        ColumnRules.build(None, {"tokens": "x"}, schema)
    # Arrow would cast these; they are not values of the column's kind
    for column, value in [("text", 3), ("text", b"x"), ("tokens", "7"), ("tokens", True)]:
        with pytest.raises(ConfigError, match=rf"fill_null\['{column}'\]={value!r} does not"):
            ColumnRules.build(None, {column: value}, schema)
    floats = pa.schema([("score", pa.float32()), ("flag", pa.bool_())])
    assert ColumnRules.build(None, {"score": 0, "flag": False}, floats).fill_of("score") == (
        True,
        0,
    )
    with pytest.raises(ConfigError, match=r"fill_null\['flag'\]=0 does not"):
        ColumnRules.build(None, {"flag": 0}, floats)
    with pytest.raises(ConfigError, match=r"pad_value=0.5 does not fit the int32"):
        ColumnRules.build({"tokens": Padding(pad_value=0.5)}, None, schema)
    # out of range: no 2 -> True in a bool column, no 1e40 -> inf in a float32 one
    lists = pa.schema([("b", pa.list_(pa.bool_())), ("f", pa.list_(pa.float32()))])
    with pytest.raises(ConfigError, match=r"padding\['b'\]: pad_value=2 does not fit the bool"):
        ColumnRules.build({"b": Padding(pad_value=2)}, None, lists)
    with pytest.raises(ConfigError, match=r"padding\['f'\]: pad_value=1e\+40 does not fit"):
        ColumnRules.build({"f": Padding(pad_value=1e40)}, None, lists)
    fits = {"b": Padding(pad_value=1), "f": Padding(pad_value=float("-inf"))}
    assert ColumnRules.build(fits, None, lists).padding_of("f").pad_value == float("-inf")
    assert ColumnRules.build({"f": Padding(pad_value=0.1)}, None, lists)  # (rounded: fine)
    # beyond 64 bits: Arrow cannot even hold the value (OverflowError, not a cast error)
    wide = pa.schema([("x", pa.int64()), ("ids", pa.list_(pa.int64()))])
    with pytest.raises(ConfigError, match=r"fill_null\['x'\]=1180591620717411303424 does not"):
        ColumnRules.build(None, {"x": 2**70}, wide)
    with pytest.raises(ConfigError, match=r"pad_value=-1180591620717411303424 does not fit"):
        ColumnRules.build({"ids": Padding(pad_value=-(2**70))}, None, wide)
    with pytest.raises(ConfigError, match=r"max_length=0"):
        Padding(max_length=0)
    with pytest.raises(ConfigError, match=r"pad_value='a'"):
        Padding(pad_value="a")
    with pytest.raises(ConfigError, match=r"\['tokns'\] not in data/x.parquet.*available"):
        check_loader_columns(schema, ["tokns"], None, None, "data/x.parquet")
    rules = ColumnRules.build({"tokens": Padding(nested=True)}, {"text": ""}, schema)
    assert pickle.loads(pickle.dumps(rules)) == rules
    assert rules.nested_columns(schema) == ("tokens",)


def test_run_time_errors_pickle_and_unwrap():
    error = DataError("x.parquet: row group 3 is unreadable")
    assert str(pickle.loads(pickle.dumps(error))) == str(error)

    class TaskError(Exception):  # what Ray raises: the reader's error as `cause`
        cause = error

    unwrapped = unwrap_task_error(TaskError(), "loader 'l', data-parallel rank 1, epoch 2")
    assert type(unwrapped) is DataError
    assert str(unwrapped) == "loader 'l', data-parallel rank 1, epoch 2: " + str(error)
    other = ValueError("not ours")
    assert unwrap_task_error(other, "w") is other


def test_lists_of_strings_become_python_lists():
    table = pa.table({"tags": pa.array([["a", "b"], [], ["c"]], pa.list_(pa.string()))})
    out = convert_table(table)
    assert torch_host_batch(out)["tags"] == [["a", "b"], [], ["c"]]
    feed = DeviceFeed([{**torch_host_batch(out), "n": [1, 2, 3]}], device="cpu")
    staged = next(iter(feed))
    assert staged["tags"] == [["a", "b"], [], ["c"]] and torch.equal(
        staged["n"], torch.tensor([1, 2, 3])
    )
    feed.close()


def test_torch_host_batch_strings_and_jagged():
    batch = {
        "tokens": np.array([1, 2, 3], np.int32),
        "tokens_offsets": np.array([0, 1, 1, 3]),
        "text": np.array(["a", "b", None], dtype=object),
    }
    out = torch_host_batch(batch, nested=("tokens",))
    assert out["text"] == ["a", "b", None] and "tokens_offsets" not in out
    assert [t.tolist() for t in out["tokens"].unbind()] == [[1], [], [2, 3]]
    back = arrow_batch(batch, nested=("tokens",))
    assert back.column("tokens").to_pylist() == [[1], [], [2, 3]]


ints = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
uints = [pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
scalar_types = st.sampled_from(
    [*ints, *uints, pa.float32(), pa.float64(), pa.string(), pa.large_string(), pa.bool_()]
)
types_st = st.recursive(
    scalar_types,
    lambda inner: st.builds(pa.list_, inner) | st.builds(pa.large_list, inner),
    max_leaves=2,
)


def _values(type_):
    if pa.types.is_integer(type_):
        info = np.iinfo(type_.to_pandas_dtype())
        return [int(info.min), int(info.max), 0]
    if pa.types.is_floating(type_):
        return [1.5, -2.25]
    if pa.types.is_boolean(type_):
        return [True, False]
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return ["a", ""]
    return [_values(type_.value_type), []]


@settings(max_examples=200, deadline=None)
@given(a=types_st, b=types_st)
def test_promotion_is_symmetric_and_lossless(a, b):
    wide = promote_type(a, b)
    assert (wide is None) == (promote_type(b, a) is None)
    if wide is None:
        return
    assert wide.equals(promote_type(b, a))
    for t in (a, b):  # every value of either type survives the cast unchanged
        values = pa.array(_values(t), t)
        assert values.cast(wide).to_pylist() == values.to_pylist()


def test_promotion_rules():
    assert promote_type(pa.int32(), pa.int64()) == pa.int64()
    assert promote_type(pa.uint16(), pa.int16()) == pa.int32()
    assert promote_type(pa.uint64(), pa.int64()) is None
    assert promote_type(pa.int64(), pa.float64()) is None
    assert promote_type(pa.string(), pa.large_string()) == pa.large_string()
    polars, duckdb = pa.large_list(pa.int32()), pa.list_(pa.field("element", pa.int64()))
    assert promote_type(polars, duckdb) == pa.large_list(pa.int64())
    assert promote_type(pa.list_(pa.string()), pa.list_(pa.int32())) is None


def test_merge_schemas_names_both_files():
    a = pa.schema([("id", pa.int32()), ("text", pa.string())])
    merged, changed = merge_schemas(("a.parquet", a), ("b.parquet", a.set(0, pa.field("id", "i8"))))
    assert merged.field("id").type == pa.int64() and changed == ["id"]
    bad = a.set(1, pa.field("text", pa.int64()))
    with pytest.raises(ConfigError, match=r"'text': string in a.parquet but int64 in b.parquet"):
        merge_schemas(("a.parquet", a), ("b.parquet", bad))


def test_hive_partitions_and_filters():
    assert hive_values("split=train/lang=en%20us/part-0.parquet") == {
        "split": "train",
        "lang": "en us",
    }
    assert hive_values("part-0.parquet") == {}
    files = [("x", {"split": "train", "year": "2024"}), ("y", {"split": "test", "year": "7"})]
    schema = partition_schema(files, pa.schema([("id", pa.int64())]))
    assert schema == pa.schema([("split", pa.string()), ("year", pa.int64())])
    huge = [("x", {"id": "12345678901234567890"}), ("y", {"id": "-9223372036854775808"})]
    assert partition_schema(huge, pa.schema([])) == pa.schema([("id", pa.string())])
    assert partition_schema(huge[1:], pa.schema([])) == pa.schema([("id", pa.int64())])
    with pytest.raises(ConfigError, match="hive partitions disagree: x.*y"):
        partition_schema([files[0], ("y", {"split": "a"})], pa.schema([]))
    full = pa.schema([("id", pa.int64()), *schema])
    assert check_filter((pc.field("split") == "train") & (pc.field("id") > 3), full) == [
        "id",
        "split",
    ]
    with pytest.raises(ConfigError, match="cannot be evaluated"):
        check_filter(pc.field("nope") == 1, full)
    with pytest.raises(TypeError, match="pyarrow.compute.Expression"):
        check_filter("split == 'train'", full)
    table = pa.table({"id": [1, 5, None, 9]})
    assert select_rows(table, pc.field("id") > 3, "t").tolist() == [1, 3]
    assert select_rows(table.slice(1, 1), pc.field("id") > 3, "t") is None
