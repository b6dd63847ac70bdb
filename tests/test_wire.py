"""String and binary columns a reader actor ships as Arrow (`rayshard.data.wire`): kept as
Arrow by the reader's conversion, compacted to their own bytes before `ray.put`, and turned
back in the consumer into exactly the numpy object arrays `convert_table` makes."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.data.columns import ColumnRules
from rayshard.data.ragged import convert_table
from rayshard.data.wire import compact, for_user, for_wire
from rayshard.runtime.pipeline import reader_batches

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
