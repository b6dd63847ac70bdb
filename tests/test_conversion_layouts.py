"""Arrow layouts the conversion must read as their values, without Ray: null rows whose
offsets still span values, permuted tensors, maps and list views, numbers in the other
byte order under `arrow`, truncated padding without a (rows, width) index matrix."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pyarrow as pa
import pytest

from rayshard.data.columns import ColumnRules, Padding
from rayshard.data.formats import arrow_batch, arrow_types, torch_host_batch
from rayshard.data.ragged import convert_table, pad_list
from rayshard.errors import DataError


def _table(column: pa.Array, first: int = 10) -> pa.Table:
    return pa.table({"v": column, "_index": np.arange(first, first + len(column))})


def _fill(column: pa.Array, value: object) -> ColumnRules:
    return ColumnRules.build(None, {"v": value}, _table(column).schema)


def _hidden_extent(values: pa.Array) -> pa.Array:
    """Three list rows over `values` (6 long), the middle one null but its offsets still
    spanning values 2..4 (valid Arrow: IPC files keep it, polars and `if_else` make it)."""
    offsets = pa.array([0, 2, 4, 6], pa.int32())
    return pa.ListArray.from_arrays(offsets, values, mask=pa.array([False, True, False]))


@pytest.mark.parametrize(
    "values, fill, filled",
    [
        (pa.array(["a", None, "c", "d", "e", "f"]), "?", [["a", "?"], [], ["e", "f"]]),
        (
            pa.array([[1], None, [3], [4], [5], [6]], pa.list_(pa.int64())),
            0,
            [[[1], []], [], [[5], [6]]],
        ),
        (
            pa.array([{"x": 1}, {"x": None}, {"x": 3}, {"x": 4}, {"x": 5}, {"x": 6}]),
            {"x": 0},
            [[{"x": 1}, {"x": 0}], [], [{"x": 5}, {"x": 6}]],
        ),
    ],
    ids=["strings", "lists", "structs"],
)
def test_a_null_list_row_spanning_values_does_not_break_the_null_check(values, fill, filled):
    column = _hidden_extent(values)
    with pytest.raises(DataError, match=r"column 'v' is null at sample 10 \(an element"):
        convert_table(_table(column))
    assert convert_table(_table(column), _fill(column, fill))["v"].tolist() == filled


def test_a_null_struct_row_hiding_a_list_field_is_named():
    tags = pa.array([["hidden"], ["x", None]], pa.list_(pa.string()))
    column = pa.StructArray.from_arrays([tags], names=["tags"], mask=pa.array([True, False]))
    with pytest.raises(DataError, match=r"column 'v' is null at sample 10: give a fill"):
        convert_table(_table(column))


def test_a_permuted_fixed_shape_tensor_comes_in_its_logical_shape():
    images = np.arange(3 * 2 * 4, dtype=np.float32).reshape(3, 2, 4)
    column = pa.FixedShapeTensorArray.from_numpy_ndarray(images.transpose(0, 2, 1))
    assert list(column.type.permutation) == [1, 0]  # (pyarrow keeps the storage order)

    rows = convert_table(_table(column).slice(1))["v"]  # from the middle of the chunk

    assert rows.shape == (2, 4, 2) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows, images[1:].transpose(0, 2, 1))
    assert tuple(torch_host_batch({"v": rows})["v"].shape) == (2, 4, 2)
    batch = arrow_batch({"v": rows}, types=arrow_types(_table(column).schema))
    np.testing.assert_array_equal(batch.column(0).to_numpy_ndarray(), rows)


def test_a_null_inside_a_permuted_tensor_is_named_or_filled():
    storage = pa.array([[1.0, None, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], pa.list_(pa.float32(), 4))
    type_ = pa.fixed_shape_tensor(pa.float32(), [2, 2], permutation=[1, 0])
    column = pa.ExtensionArray.from_storage(type_, storage)
    with pytest.raises(DataError, match=r"column 'v' is null at sample 10 \(an element"):
        convert_table(_table(column))
    rows = convert_table(_table(column), _fill(column, -1.0))["v"]
    assert rows.tolist() == [[[1, 3], [-1, 4]], [[5, 7], [6, 8]]]


_MAP = pa.map_(pa.string(), pa.int64())


def test_a_map_column_checks_its_values_for_nulls_and_keeps_ints():
    clean = pa.array([[("a", 1)], [("b", 2), ("c", 3)]], _MAP)
    assert convert_table(_table(clean))["v"].tolist() == [[("a", 1)], [("b", 2), ("c", 3)]]
    holed = pa.array([[("a", 1), ("b", None)], None, [("c", 3)]], _MAP)
    with pytest.raises(DataError, match=r"column 'v' is null at sample 10 \(an element"):
        convert_table(_table(holed))
    with pytest.raises(DataError, match=r"column 'v' is null at sample 21: give a fill"):
        convert_table(_table(holed, 20).slice(1))
    out = convert_table(_table(holed), _fill(holed, -1))["v"].tolist()
    assert out == [[("a", 1), ("b", -1)], [], [("c", 3)]]
    nested = pa.array([[[("a", None)]], [[("b", 2)]]], pa.list_(_MAP))
    with pytest.raises(DataError, match=r"column 'v' is null at sample 10 \(an element"):
        convert_table(_table(nested))
    assert convert_table(_table(nested), _fill(nested, 0))["v"].tolist() == [
        [[("a", 0)]],
        [[("b", 2)]],
    ]


@pytest.mark.parametrize("kind", ["list_view", "large_list_view"])
def test_a_list_view_column_checks_its_elements_for_nulls(kind):
    column = pa.array([[1, None], None, [3]], getattr(pa, kind)(pa.int32()))
    with pytest.raises(DataError, match=r"column 'v' is null at sample 10 \(an element"):
        convert_table(_table(column))
    assert convert_table(_table(column), _fill(column, 0))["v"].tolist() == [[1, 0], [], [3]]
    clean = convert_table(_table(column.slice(2)))["v"]
    assert clean.tolist() == [[3]] and isinstance(clean[0][0], int)  # not 3.0


def test_list_views_in_any_value_order_name_the_sample_that_holds_the_null():
    """A list view's values may lie in any order, or be shared by rows: the null is the
    third row's here (its values come first), and overlapping views are checked too."""
    values = pa.array([1, 2, None, 4, 5, None])
    unordered = pa.ListViewArray.from_arrays(
        pa.array([4, 0, 2], pa.int32()), pa.array([1, 2, 2], pa.int32()), values
    )  # rows [5], [1, 2], [None, 4]
    with pytest.raises(DataError, match=r"is null at sample 12 \(an element"):
        convert_table(_table(unordered))
    filled = convert_table(_table(unordered), _fill(unordered, 0))["v"].tolist()
    assert filled == [[5], [1, 2], [0, 4]]
    shared = pa.ListViewArray.from_arrays(
        pa.array([0, 0, 3], pa.int32()), pa.array([3, 1, 1], pa.int32()), pa.array([1, None, 3, 4])
    )  # rows [1, None, 3], [1], [4]: the first and second share values
    with pytest.raises(DataError, match=r"is null at sample 10 \(an element"):
        convert_table(_table(shared))


def test_arrow_batches_take_numbers_in_the_other_byte_order():
    swapped = ">" if np.little_endian else "<"
    flux = np.arange(4, dtype=f"{swapped}f4")
    image = np.arange(8, dtype=f"{swapped}i2").reshape(4, 2)
    tokens = np.arange(5, dtype=f"{swapped}i8")
    batch = arrow_batch(
        {"flux": flux, "img": image, "tok": tokens, "tok_offsets": np.array([0, 2, 2, 4, 5])},
        nested=["tok"],
    )
    assert batch.column("flux").to_pylist() == [0.0, 1.0, 2.0, 3.0]
    assert batch.column("img").to_pylist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert batch.column("tok").to_pylist() == [[0, 1], [], [2, 3], [4]]
    tensor = arrow_batch({"t": image}, types={"t": pa.fixed_shape_tensor(pa.int16(), [2])})
    np.testing.assert_array_equal(tensor.column(0).to_numpy_ndarray(), image)


def test_arrow_batches_name_a_column_arrow_has_no_type_for():
    with pytest.raises(DataError, match=r"column 'z' cannot become an Arrow column"):
        arrow_batch({"a": np.arange(2), "z": np.array([1 + 2j, 3j])})


def test_truncated_padding_gathers_without_a_rows_by_width_index_matrix():
    rows, width = 512, 4096
    lengths = np.full(rows, 3)
    lengths[0] = width + 5  # one long row: the batch is as wide as `width`
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = (np.arange(offsets[-1]) % 100).astype(np.int8)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    tracemalloc.start()
    try:
        out = pad_list("v", column, Padding(max_length=width))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # padded (int8) + mask (bool): 2 bytes a slot; an int64 index matrix would be 8 more
    assert peak < 4 * rows * width
    np.testing.assert_array_equal(out["v"][0], values[:width])
    np.testing.assert_array_equal(out["v"][1, :4], [*values[width + 5 : width + 8], 0])
    assert out["v_lengths"].tolist() == [width] + [3] * (rows - 1)


def test_nested_rows_cut_short_gather_their_first_elements():
    column = pa.array([[1, 2, 3], [4], [5, 6, 7, 8]], pa.list_(pa.int64()))
    out = pad_list("v", column, Padding(max_length=2, nested=True))
    assert out["v"].tolist() == [1, 2, 4, 5, 6] and out["v_offsets"].tolist() == [0, 2, 3, 5]
    padded = pad_list("v", column.slice(1), Padding(max_length=2))
    assert padded["v"].tolist() == [[4, 0], [5, 6]]
