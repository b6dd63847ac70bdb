"""Edge cases of the conversion from Arrow columns to batches, without Ray: empty padded
widths under `arrow`, nulls inside fixed-size lists and lists of strings, nulls cut away
by `max_length`."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from rayshard.data.columns import ColumnRules, Padding
from rayshard.data.formats import arrow_batch
from rayshard.data.ragged import convert_table
from rayshard.errors import DataError


def _table(column: pa.Array, first: int = 10) -> pa.Table:
    return pa.table({"v": column, "_index": np.arange(first, first + len(column))})


@pytest.mark.parametrize("rows", [[[], []], []], ids=["empty-rows", "zero-rows"])
def test_arrow_format_delivers_ragged_columns_of_width_zero(rows):
    numpy_batch = convert_table(_table(pa.array(rows, pa.list_(pa.int32()))))
    assert numpy_batch["v"].shape == (len(rows), 0)

    batch = arrow_batch(numpy_batch)

    assert batch.num_rows == len(rows)
    assert batch.schema.field("v").type == pa.list_(pa.int32(), 0)
    assert batch.schema.field("v_mask").type == pa.list_(pa.bool_(), 0)
    assert batch.column("v").to_pylist() == [[] for _ in rows]
    assert batch.column("v_lengths").to_pylist() == [0 for _ in rows]
    # and back: the Arrow batch converts to the numpy one
    again = convert_table(pa.Table.from_batches([batch]))
    assert again["v"].shape == (len(rows), 0) and again["v"].dtype == np.int32


def test_arrow_format_keeps_a_zero_width_inside_a_fixed_shape():
    batch = arrow_batch({"g": np.zeros((2, 3, 0), np.float32), "_index": np.arange(2)})
    assert batch.schema.field("g").type == pa.list_(pa.list_(pa.float32(), 0), 3)
    assert batch.column("g").to_pylist() == [[[], [], []], [[], [], []]]
    assert convert_table(pa.Table.from_batches([batch]))["g"].shape == (2, 3, 0)


def test_nulls_in_fixed_size_lists_are_errors_unless_filled():
    values = pa.FixedSizeListArray.from_arrays(pa.array([1, None, 3, 4]), 2)
    with pytest.raises(DataError, match=r"column 'v' is null at sample 10 \(an element.*fill_null"):
        convert_table(_table(values))
    null_row = pa.array([[1, 2], None, [5, 6]], pa.list_(pa.int64(), 2))
    with pytest.raises(DataError, match=r"column 'v' is null at sample 11: give a fill"):
        convert_table(_table(null_row))
    # a slice (a batch of a row group): the null of sample 20 is outside it
    with pytest.raises(DataError, match=r"'v' is null at sample 22 \(an element"):
        convert_table(_table(pa.array([[None, 1], [2, 3], [4, None]], null_row.type), 20)[1:])

    rules = ColumnRules.build(None, {"v": 0}, _table(values).schema)
    out = convert_table(_table(values), rules)
    assert out["v"].tolist() == [[1, 0], [3, 4]] and out["v"].dtype == np.int64
    filled = convert_table(_table(null_row), rules)["v"]
    assert filled.tolist() == [[1, 2], [0, 0], [5, 6]] and filled.dtype == np.int64


def test_nulls_in_nested_fixed_size_lists_name_the_sample():
    inner = pa.list_(pa.float32(), 2)
    grid = pa.array([[[1, 2], [3, 4]], [[5, 6], None], [[7, None], [8, 9]]], pa.list_(inner, 2))
    with pytest.raises(DataError, match=r"'v' is null at sample 11 \(an element"):
        convert_table(_table(grid))
    rules = ColumnRules.build(None, {"v": -1.0}, _table(grid).schema)
    out = convert_table(_table(grid), rules)["v"]
    assert out.shape == (3, 2, 2)
    assert out.tolist() == [[[1, 2], [3, 4]], [[5, 6], [-1, -1]], [[7, -1], [8, 9]]]


def test_nulls_in_lists_of_strings_are_errors_unless_filled():
    tags = pa.array([["a", None], ["b"], None])
    with pytest.raises(DataError, match=r"column 'v' is null at sample 10 \(an element.*fill_null"):
        convert_table(_table(tags))
    with pytest.raises(DataError, match=r"column 'v' is null at sample 12: give a fill"):
        convert_table(_table(tags)[1:])

    rules = ColumnRules.build(None, {"v": ""}, _table(tags).schema)
    assert convert_table(_table(tags), rules)["v"].tolist() == [["a", ""], ["b"], []]


def test_nulls_in_lists_of_lists_are_errors_unless_filled():
    nested = pa.array([[[1], []], [None, [2, None]]], pa.list_(pa.list_(pa.int64())))
    with pytest.raises(DataError, match=r"'v' is null at sample 11 \(an element"):
        convert_table(_table(nested))
    rules = ColumnRules.build(None, {"v": 0}, _table(nested).schema)
    assert convert_table(_table(nested), rules)["v"].tolist() == [[[1], []], [[], [2, 0]]]


def test_null_elements_cut_away_by_max_length_do_not_matter():
    table = _table(pa.array([[1, 2, None], [3]], pa.list_(pa.int64())))
    rules = ColumnRules.build({"v": Padding(max_length=2)}, None, table.schema)

    out = convert_table(table, rules)

    assert out["v"].tolist() == [[1, 2], [3, 0]] and out["v"].dtype == np.int64
    assert out["v_lengths"].tolist() == [2, 1]
    kept = _table(pa.array([[1, None, 3], [3]], pa.list_(pa.int64())))
    with pytest.raises(DataError, match=r"'v' is null at sample 10 \(an element"):
        convert_table(kept, rules)


def test_arrow_batches_name_a_column_arrow_cannot_hold_and_take_nested_rows_as_arrays():
    from rayshard.errors import DataError

    with pytest.raises(DataError, match=r"column 'b' cannot become an Arrow column"):
        arrow_batch({"a": np.arange(2), "b": [[1, "x"], [2]]})
    # A nested column a transform returned as per-row arrays: one list column again.
    batch = arrow_batch({"t": [np.arange(2), np.arange(3)]}, nested=["t"])
    assert batch.column(0).to_pylist() == [[0, 1], [0, 1, 2]]


def test_a_null_inside_a_fixed_size_list_of_lists_is_named_not_a_float_nan():
    pairs = pa.array([[[1, 2], [3]], [[4, None], [5]]], pa.list_(pa.list_(pa.int32()), 2))
    with pytest.raises(DataError, match=r"column 'v' is null at sample 11 \(an element"):
        convert_table(_table(pairs))
    rows = convert_table(_table(pairs.slice(0, 1)))["v"]
    assert rows.tolist() == [[[1, 2], [3]]]  # Python lists, int values kept
    filled = convert_table(_table(pairs), ColumnRules.build(None, {"v": 0}, _table(pairs).schema))
    assert filled["v"].tolist() == [[[1, 2], [3]], [[4, 0], [5]]]


@pytest.mark.parametrize("kind, fill", [("string_view", "z"), ("binary_view", b"z")])
def test_fill_null_fills_a_fixed_size_list_of_view_strings(kind, fill):
    value = "a" if kind == "string_view" else b"a"
    column = pa.array([[value, None]], pa.list_(getattr(pa, kind)(), 2))
    rules = ColumnRules.build(None, {"v": fill}, _table(column).schema)
    assert convert_table(_table(column), rules)["v"].tolist() == [[value, fill]]


@pytest.mark.parametrize("kind", ["string", "large_string", "string_view", "binary_view"])
def test_a_transform_gets_view_strings_as_python_lists_as_other_strings(kind):
    from rayshard.runtime.transform_stage import transform_input

    values = ["a", None] if "string" in kind else [b"a", None]
    table = _table(pa.array(values, getattr(pa, kind)())).append_column(
        "_padded", pa.array([False, False])
    )
    assert transform_input(table)["v"] == values  # a list, None for the null
    fill = values[0] * 2  # ("aa" or b"aa"): views have no fill kernel, their large kind has
    rules = ColumnRules.build(None, {"v": fill}, table.schema)
    assert transform_input(table, rules)["v"] == [values[0], fill]


def test_a_source_column_named_like_a_batch_key_is_refused_before_work():
    from rayshard.data.columns import check_loader_columns
    from rayshard.errors import ConfigError

    schema = pa.schema([("x", pa.int64()), ("_index", pa.int64())])
    with pytest.raises(ConfigError, match=r"column named '_index'.* columns=\['x'\]"):
        check_loader_columns(schema, None, None, None, "t.parquet")
    check_loader_columns(schema, ["x"], None, None, "t.parquet")  # left out: fine


def test_per_sample_refuses_a_key_only_later_samples_return():
    from rayshard.data.transforms import TransformContext, per_sample

    ctx = TransformContext("l", 0, 0, 0, np.arange(3), np.zeros(3, bool))
    batch = {"x": np.arange(3.0), "_index": np.arange(3), "_padded": np.zeros(3, bool)}
    fn = per_sample(lambda s, rng: {"x": s["x"]} if s["x"] == 0 else {"x": s["x"], "e": 1})
    with pytest.raises(ValueError, match="one returns 'e', which the first did not"):
        fn(batch, ctx)


_META = pa.struct([("id", pa.int64()), ("inner", pa.struct([("w", pa.float32())]))])


def test_a_null_field_of_a_struct_is_named_and_filled_by_a_dict_and_ints_stay_ints():
    rows = [{"id": 1, "inner": {"w": 0.5}}, {"id": None, "inner": {"w": None}}, None]
    column = pa.array(rows, _META)
    with pytest.raises(DataError, match=r"column 'v' is null at sample 11 \(a field of"):
        convert_table(_table(column))
    assert convert_table(_table(column.slice(0, 1)))["v"].tolist() == rows[:1]  # 1, not 1.0
    fill = {"id": -1, "inner": {"w": 0.0}}
    rules = ColumnRules.build(None, {"v": fill}, _table(column).schema)
    assert convert_table(_table(column), rules)["v"].tolist() == [rows[0], fill, fill]
    sliced = _table(column).slice(1)  # a batch cut from the middle of a chunk
    assert convert_table(sliced, rules)["v"].tolist() == [fill, fill]


def test_a_null_field_of_a_struct_in_a_list_is_named_and_filled_by_a_dict():
    column = pa.array(
        [[{"id": 1, "inner": None}], [{"id": None, "inner": {"w": 1.0}}]], pa.list_(_META)
    )
    with pytest.raises(DataError, match=r"column 'v' is null at sample 10 \(an element"):
        convert_table(_table(column))
    fill = {"id": -1, "inner": {"w": 0.0}}
    rules = ColumnRules.build(None, {"v": fill}, _table(column).schema)
    assert convert_table(_table(column), rules)["v"].tolist() == [
        [{"id": 1, "inner": {"w": 0.0}}],
        [{"id": -1, "inner": {"w": 1.0}}],
    ]


def test_a_fixed_shape_tensor_column_comes_in_its_shape_under_every_format(tmp_path):
    import pyarrow.parquet as pq

    from rayshard.data.formats import arrow_types, torch_host_batch

    images = np.arange(3 * 2 * 3, dtype=np.float32).reshape(3, 2, 3)
    column = pa.FixedShapeTensorArray.from_numpy_ndarray(images)
    pq.write_table(pa.table({"v": column}), tmp_path / "t.parquet")  # the type round-trips
    table = pq.read_table(tmp_path / "t.parquet").append_column("_index", pa.array([0, 1, 2]))
    rows = convert_table(table.slice(1))["v"]  # a batch from the middle of the chunk
    assert rows.shape == (2, 2, 3) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows, images[1:])
    assert tuple(torch_host_batch({"v": rows})["v"].shape) == (2, 2, 3)
    batch = arrow_batch({"v": rows}, types=arrow_types(table.schema))
    assert batch.schema.field("v").type == table.schema.field("v").type
    np.testing.assert_array_equal(batch.column(0).to_numpy_ndarray(), images[1:])


def test_a_fixed_size_list_of_structs_and_a_fill_lacking_a_field_are_checked():
    pairs = pa.array(
        [[{"id": None, "inner": None}, {"id": 2, "inner": {"w": 1.0}}]], pa.list_(_META, 2)
    )
    with pytest.raises(DataError, match=r"sample 10 \(an element of the list\)"):
        convert_table(_table(pairs))  # (its ints were floats, the null passed)
    fill = {"id": -1, "inner": {"w": 0.0}}
    rules = ColumnRules.build(None, {"v": fill}, _table(pairs).schema)
    assert convert_table(_table(pairs), rules)["v"].tolist() == [
        [fill, {"id": 2, "inner": {"w": 1.0}}]
    ]
    lacking = ColumnRules.build(None, {"v": {"id": -1}}, _table(pairs).schema)  # no "inner"
    with pytest.raises(DataError, match=r"a null the fill value cannot fill: a field it lacks"):
        convert_table(_table(pairs), lacking)
    column = pa.array([{"id": None, "inner": None}], _META)
    lacking = ColumnRules.build(None, {"v": {"id": -1}}, _table(column).schema)
    with pytest.raises(DataError, match=r"a null the fill value cannot fill: a field it lacks"):
        convert_table(_table(column), lacking)
