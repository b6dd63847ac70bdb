"""Small batches converted in bulk (`bulk_rebatch`): the batches `rebatch` makes, cut at
the same rows and `FLUSH` points, with one conversion per run of batches; a run whose
conversion fails delivers the batches before the failing one first."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.data.batching import FLUSH, rebatch, to_numpy
from rayshard.data.bulk_batches import BULK_ROWS, bulk_rebatch
from rayshard.data.columns import ColumnRules
from rayshard.errors import DataError


def record_batches(sizes: list[int], ragged: bool, null_at: int | None) -> list:
    """Ids 0, 1, ..., a 2-wide feature, strings, a nullable int (null at `null_at`) and,
    with `ragged`, a variable-length list (padded per batch: not converted in bulk)."""
    out, start = [], 0
    for size in sizes:
        ids = np.arange(start, start + size, dtype=np.int64)
        columns = {
            "id": pa.array(ids),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 2) * 1.0), 2),
            "s": pa.array([f"r{i}" for i in ids]),
            "v": pa.array([None if i == null_at else int(i) for i in ids], pa.int64()),
        }
        if ragged:
            columns["t"] = pa.array([list(range(int(i) % 4)) for i in ids], pa.list_(pa.int64()))
        out.append(pa.RecordBatch.from_pydict(columns))
        start += size
    return out


def counted(items: list, pulls: list[int]):
    """`items`, counting in `pulls[0]` how many were taken so far."""
    for item in items:
        pulls[0] += 1
        yield item


def collect(stream, pulls: list[int]) -> tuple[list, str | None, list[int]]:
    """The items of `stream`, the error it ended with, and the input items taken before
    each item came out (rows must be taken exactly when `rebatch` takes them)."""
    out, taken = [], []
    try:
        for item in stream:
            out.append(item)
            taken.append(pulls[0])
    except DataError as error:
        return out, str(error), taken
    return out, None, taken


def same(a, b) -> bool:
    if a is FLUSH or b is FLUSH:
        return a is b
    return a.keys() == b.keys() and all(
        np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a
    )


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), max_size=8),
    batch_size=st.sampled_from([1, 3, 17, 100, 300, 513]),
    flush_at=st.integers(0, 8),
    ragged=st.booleans(),
    null_at=st.one_of(st.none(), st.integers(0, 2400)),
    fill=st.booleans(),
)
def test_bulk_rebatch_makes_the_batches_rebatch_makes(
    sizes, batch_size, flush_at, ragged, null_at, fill
):
    rules = ColumnRules(fill_null={"v": -1}) if fill else ColumnRules()

    def run(cut):
        items = record_batches(sizes, ragged, null_at)
        items.insert(min(flush_at, len(items)), FLUSH)
        pulls = [0]
        return collect(cut(counted(items, pulls), batch_size, lambda t: to_numpy(t, rules)), pulls)

    expected, error, taken = run(rebatch)
    got, got_error, got_taken = run(bulk_rebatch)
    assert got_error == error  # a null without a fill fails at the same batch
    assert len(got) == len(expected) and all(map(same, got, expected))
    assert got_taken == taken  # no row read ahead to fill a run


def test_bulk_rebatch_converts_once_per_run_of_batches():
    assert BULK_ROWS == 32768  # the README's number
    calls = []

    def convert(table):
        calls.append(table.num_rows)
        return to_numpy(table)

    rows = 4 * BULK_ROWS
    batches = list(bulk_rebatch(iter(record_batches([rows], False, None)), 1024, convert))
    assert len(batches) == rows // 1024 and calls == [BULK_ROWS] * 4
    assert batches[0]["id"].base is batches[1]["id"].base  # slices of one conversion
    calls.clear()
    ragged = list(bulk_rebatch(iter(record_batches([rows // 8], True, None)), 32, convert))
    assert len(ragged) == rows // 8 // 32 and calls == [32] * (rows // 8 // 32)  # per batch


def test_a_run_never_spans_record_batches():
    """Record batches of 1,500 rows, batches of 1,024: a run converts the whole batches
    inside one record batch (a zero-copy slice of it); a batch across two record batches
    is converted on its own, so only its rows are copied to combine them."""
    calls = []

    def convert(table):
        calls.append((table.num_rows, table.column("id").num_chunks))
        return to_numpy(table)

    batches = list(bulk_rebatch(iter(record_batches([1500] * 4, False, None)), 1024, convert))
    assert [len(b["id"]) for b in batches] == [1024] * 5 + [880]
    assert np.array_equal(np.concatenate([b["id"] for b in batches]), np.arange(6000))
    assert all(chunks == 1 or rows <= 1024 for rows, chunks in calls)
    assert (1024, 2) in calls  # rows 1024-2047 come from two record batches


@pytest.mark.parametrize("batch_size", [BULK_ROWS // 2 + 1, BULK_ROWS])
def test_big_batches_convert_one_by_one(batch_size):
    calls = []

    def convert(table):
        calls.append(table.num_rows)
        return to_numpy(table)

    list(bulk_rebatch(iter(record_batches([3 * batch_size], False, None)), batch_size, convert))
    assert calls == [batch_size] * 3
