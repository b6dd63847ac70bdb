"""String and binary columns a reader actor ships as Arrow (`rayshard.data.wire`): kept as
Arrow by the reader's conversion, compacted to their own bytes before `ray.put`, and turned
back in the consumer into exactly the numpy object arrays `convert_table` makes; a
transform's object arrays of only bytes or only str likewise, back exactly as returned;
under `batch_format="arrow"` the Arrow column passes through where that is the same."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from rayshard.data.columns import ColumnRules
from rayshard.data.formats import arrow_batch
from rayshard.data.ragged import convert_table
from rayshard.data.wire import compact, for_arrow, for_user, for_wire, value_bytes
from rayshard.runtime.block import column_bytes
from rayshard.runtime.pipeline import reader_batches
from rayshard.runtime.reader_workers import ReaderWorker

TYPES = [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()]


def _table(values: list, type_: pa.DataType) -> pa.Table:
    if pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
        values = [None if v is None else v.encode() + b"\xff" for v in values]
    return pa.table({"s": pa.array(values, type_), "_index": np.arange(len(values))})


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.text(max_size=6)), min_size=1, max_size=30),
    type_=st.sampled_from(TYPES),
    data=st.data(),
)
def test_shipped_columns_reach_the_user_as_convert_table_makes_them(values, type_, data):
    lo = data.draw(st.integers(0, len(values) - 1))
    hi = data.draw(st.integers(lo, len(values)))
    fill = "-" if pa.types.is_string(type_) or pa.types.is_large_string(type_) else b"-"
    rules = ColumnRules(fill_null=(("s", fill),))
    table = _table(values, type_).slice(lo, hi - lo)  # a batch is often a slice
    kept = convert_table(table, rules, keep_text=True)
    assert isinstance(kept["s"], pa.Array) and isinstance(kept["_index"], np.ndarray)
    got = for_user(pickle.loads(pickle.dumps(for_wire(kept), protocol=5)))
    want = convert_table(table, rules)
    assert got.keys() == want.keys() and got["s"].dtype == want["s"].dtype == object
    assert [(type(v), v) for v in got["s"]] == [(type(v), v) for v in want["s"]]
    assert np.array_equal(got["_index"], want["_index"])


def test_a_shipped_slice_carries_its_own_bytes_not_its_parents():
    # a 16-row batch cut from a 4096-row group of 1 KiB values: pickling the slice as is
    # ships the whole group (ARROW-10739); compacted, only its 16 KiB
    parent = pa.array([bytes([i % 251]) * 1024 for i in range(4096)], pa.binary())
    part = parent.slice(1000, 16)
    assert len(pickle.dumps(part, protocol=5)) > 4_000_000
    shipped = compact(part)
    assert len(pickle.dumps(shipped, protocol=5)) < 20_000
    assert shipped.equals(part) and compact(parent.slice(5, 0)).to_pylist() == []


def test_a_readers_batches_keep_text_arrow_only_when_asked():
    table = pa.table({"s": ["a", "bb", "ccc"], "n": [1, 2, 3], "_index": [0, 1, 2]})

    def batches(keep_text: bool) -> list[dict]:
        rows = iter(table.to_batches())
        common = {"transform": None, "workers": None, "loader": "t", "seed": 0, "epoch": 0}
        return list(reader_batches(rows, batch_size=2, rank=0, keep_text=keep_text, **common))

    shipped, plain = batches(True), batches(False)
    assert all(isinstance(b["s"], pa.Array) and isinstance(b["n"], np.ndarray) for b in shipped)
    assert all(b["s"].dtype == object for b in plain)
    assert [for_user(for_wire(b))["s"].tolist() for b in shipped] == [["a", "bb"], ["ccc"]]


def _objects(values: list) -> np.ndarray:
    """`values` as a 1-d object array, whatever they are (np.array would nest lists)."""
    column = np.empty(len(values), object)
    column[:] = values
    return column


def _shipped(batch: dict) -> dict:
    """`batch` as a consumer fetches it: through `for_wire` and pickling (Ray's)."""
    return pickle.loads(pickle.dumps(for_wire(batch), protocol=5))


def _ships(values: list) -> bool:
    """Whether `text_array` ships `values`: rows, all exactly bytes or all str in UTF-8."""
    kinds = {type(v) for v in values}
    if kinds == {str}:
        return all(
            v.encode("utf-8", "replace") == v.encode("utf-8", "surrogatepass") for v in values
        )
    return kinds == {bytes}


def _typed(column) -> list:
    return [(type(v), v) for v in column]


TEXTS = st.text(alphabet=st.characters(codec="utf-8"), max_size=6)  # UTF-8: no lone surrogates


@settings(max_examples=60, deadline=None)
@given(values=st.one_of(st.lists(st.binary(max_size=8), max_size=20), st.lists(TEXTS, max_size=20)))
def test_a_transforms_bytes_or_str_column_comes_back_exactly_as_returned(values):
    column = _objects(values)
    batch = {"c": column, "_index": np.arange(len(values))}
    assert isinstance(for_wire(batch)["c"], pa.Array) == bool(values)  # no rows: as it is
    got = for_user(_shipped(batch))["c"]
    assert type(got) is np.ndarray and got.dtype == object and got.shape == column.shape
    assert _typed(got) == _typed(column) and got.flags.writeable
    # under batch_format="arrow": the record batch the object array makes
    want = arrow_batch(batch)
    arrow = arrow_batch(for_arrow(_shipped(batch)))
    assert arrow.schema == want.schema and arrow.equals(want)
    # counted alike shipped or not: the values' bytes (UTF-8 for text)
    expected = sum(len(v.encode() if isinstance(v, str) else v) for v in values)
    if values:
        assert value_bytes(column) == value_bytes(for_wire(batch)["c"]) == expected
    assert column_bytes(for_wire(batch)["c"]) == column_bytes(column) == expected


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.none(), st.binary(max_size=4), st.text(max_size=4), st.integers()),
        max_size=12,
    )
)
@example(values=[np.str_("a"), "b"]).via("a str subclass")
@example(values=[np.bytes_(b"a")]).via("a bytes subclass")
@example(values=["\udc80"]).via("a lone surrogate: not UTF-8")
@example(values=[b"a", "b"]).via("mixed")
@example(values=[]).via("no rows")
def test_other_object_columns_travel_as_they_are(values):
    column = _objects(values)
    assume(not _ships(values))
    assert for_wire({"c": column})["c"] is column
    assert _typed(_shipped({"c": column})["c"]) == _typed(column)
    if values and {type(v) for v in values} not in ({bytes}, {str}):
        assert value_bytes(column) is None and column_bytes(column) == 8 * len(values)


def test_lists_and_other_arrays_travel_as_they_are():
    two_d = _objects([b"a", b"b"]).reshape(1, 2)
    masked = np.ma.masked_array(_objects(["a", "b"]), mask=[False, False])
    batch = {"l": [b"a", b"b"], "o": two_d, "m": masked, "n": np.arange(2)}
    assert all(for_wire(batch)[key] is batch[key] for key in batch)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(TEXTS, max_size=20), type_=st.sampled_from(TYPES), data=st.data())
def test_arrow_format_gets_the_record_batch_it_got_through_numpy(values, type_, data):
    # a file's string or binary column, shipped by a reader: passed through as Arrow where
    # that is the same (large types cast to what `pa.array` of the object array makes)
    lo = data.draw(st.integers(0, len(values)))
    hi = data.draw(st.integers(lo, len(values)))
    table = _table(values, type_).slice(lo, hi - lo)
    batch = _shipped(convert_table(table, keep_text=True))
    want = arrow_batch(for_user(batch))
    got = arrow_batch(for_arrow(batch))
    assert got.schema == want.schema and got.equals(want)
    assert isinstance(for_arrow(batch)["s"], pa.Array) == (hi > lo)
    text = convert_table(table)["s"]
    assert column_bytes(batch["s"]) == sum(
        len(v.encode() if isinstance(v, str) else v) for v in text
    )


def _text_objects(batch, ctx):
    return {"t": _objects(["x" * i for i in batch["_index"]]), "m": _objects([None] * len(ctx))}


def test_a_transform_worker_returns_bytes_and_str_columns_as_arrow():
    worker = ReaderWorker(None, _text_objects, "l", 0, 0)
    batch = {"_index": np.arange(3), "_padded": np.zeros(3, bool)}
    (result,), error, _ = worker.apply_batches([batch], epoch=0)
    assert error is None and isinstance(result["t"], pa.Array) and result["m"].dtype == object
    assert _typed(for_user(result)["t"]) == [(str, ""), (str, "x"), (str, "xx")]
