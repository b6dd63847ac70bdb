"""Splits as int64 arrays (`rayshard.plan.pieces`) against plain-Python models, and the
array path a `dynamic` epoch queues through (`Source.split_array`, `dynamic_pieces`,
`LeaseBook`) against the list path it replaced."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.core.leases import LeaseBook
from rayshard.core.sharding import assign, dynamic_pieces
from rayshard.core.shuffle import lease_order, split_order
from rayshard.plan import DataLayout, PlanConfig, pieces
from rayshard.plan import intervals as iv
from rayshard.sources import TableSource
from rayshard.sources.arrow_files import ArrowFileSource
from rayshard.sources.base import Source
from rayshard.sources.parquet import ParquetSource

chunk_rows = st.lists(st.integers(0, 40), max_size=12)
limits = st.one_of(st.none(), st.integers(1, 17))


def cut_model(rows: list[int], limit: int | None) -> list[tuple[int, int]]:
    """The loop `ChunkedFileSource.splits` ran before it cut arrays."""
    out, offset = [], 0
    for n in rows:
        step = limit or n or 1
        out.extend((a, min(a + step, offset + n)) for a in range(offset, offset + n, step))
        offset += n
    return out


@settings(max_examples=300, deadline=None)
@given(rows=chunk_rows, limit=limits)
def test_cut_chunks_is_the_loop_it_replaced(rows, limit):
    cut = pieces.cut_chunks(rows, limit)
    assert cut.dtype == np.int64 and cut.shape == (len(cut), 2)
    assert pieces.as_tuples(cut) == cut_model(rows, limit)


@settings(max_examples=200, deadline=None)
@given(
    splits=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=10),
    done=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=5),
)
def test_rest_of_subtracts_split_by_split(splits, done):
    done = iv.normalize(done)
    whole = [(a, b) for a, b in splits if b > a]
    model = [p for split in whole for p in (iv.subtract((split,), done) if done else [split])]
    assert pieces.as_tuples(pieces.rest_of(splits, done)) == model
    assert pieces.as_tuples(pieces.rest_of(np.array(splits).reshape(-1, 2), done)) == model


def test_between_and_conversions():
    assert pieces.as_tuples(pieces.between([0, 3, 3, 8])) == [(0, 3), (3, 8)]
    assert pieces.as_tuples(pieces.between([0])) == []
    assert pieces.as_pieces([]).shape == (0, 2)
    assert pieces.as_tuples(pieces.as_pieces([[1, 2], (5, 9)])) == [(1, 2), (5, 9)]
    (pair,) = pieces.as_tuples(pieces.as_pieces([(1, 2)]))
    assert all(type(v) is int for v in pair)


def test_parquet_split_array_is_its_splits(tmp_path):
    """Files with uneven row groups, an empty file among them, cut or whole."""
    sizes = {"a": (10, [4, 4, 2]), "b": (0, [0]), "c": (25, [7, 7, 7, 4])}
    for name, (rows, _) in sizes.items():
        table = pa.table({"id": np.arange(rows, dtype=np.int64)})
        pq.write_table(table, tmp_path / f"{name}.parquet", row_group_size=7 if name == "c" else 4)
    source = ParquetSource(str(tmp_path))
    for limit in (None, 1, 3, 100):
        array = source.split_array(limit)
        assert pieces.as_tuples(array) == source.splits(limit)
        assert int((array[:, 1] - array[:, 0]).sum()) == 35
    assert source.splits() == [(0, 4), (4, 8), (8, 10), (10, 17), (17, 24), (24, 31), (31, 35)]
    assert ParquetSource(str(tmp_path), split_rows=3).split_array().tolist()[:2] == [[0, 3], [3, 4]]


def test_arrow_file_split_array_is_its_splits(tmp_path):
    """Arrow IPC files: record batches of 5, 5, 2 rows, then of 9, cut or whole."""
    for name, sizes in {"a": [5, 5, 2], "b": [9]}.items():
        batches = [pa.record_batch({"id": pa.array(np.arange(n), pa.int64())}) for n in sizes]
        with pa.ipc.new_file(str(tmp_path / f"{name}.arrow"), batches[0].schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
    source = ArrowFileSource(sorted(str(p) for p in tmp_path.glob("*.arrow")))
    assert source.splits() == [(0, 5), (5, 10), (10, 12), (12, 21)]
    for limit in (None, 2, 4):
        assert pieces.as_tuples(source.split_array(limit)) == source.splits(limit)


def test_table_split_array_is_its_chunks():
    table = pa.Table.from_batches(
        [pa.record_batch({"id": pa.array(np.arange(a, b))}) for a, b in [(0, 5), (5, 5), (5, 12)]]
    )
    source = TableSource(table)
    assert source.splits() == [(0, 5), (5, 12)]
    assert pieces.as_tuples(source.split_array()) == source.splits()
    assert TableSource(pa.table({"id": pa.array([], pa.int64())})).splits() == []


class _ListSplits(Source):
    """A source that only knows `splits()`: the default `split_array` converts it."""

    def layout(self):
        return DataLayout.of_samples(9)

    def schema(self):
        return pa.schema([("id", pa.int64())])

    def read(self, start, end, columns=None):
        yield pa.record_batch({"id": pa.array(range(start, end), pa.int64())})

    def splits(self):
        return [[0, 2], (2, 9)]


def test_a_subclass_redefining_splits_alone_queues_its_own_splits(tmp_path):
    class Halves(TableSource):
        def splits(self):
            return [(0, 30), (30, 60)]

    table = pa.Table.from_batches(
        [pa.record_batch({"id": pa.array(np.arange(a, a + 6))}) for a in range(0, 60, 6)]
    )
    assert pieces.as_tuples(Halves(table).split_array()) == [(0, 30), (30, 60)]
    queue = dynamic_pieces(PlanConfig(batch_size=4), Halves(table), 1, 0)
    assert sorted(pieces.as_tuples(queue)) == [(0, 30), (30, 60)]
    assert len(TableSource(table).split_array()) == 10  # the parent's own stays as it was

    class FirstHalf(TableSource):  # an override through the parent's splits()
        def splits(self):
            return super().splits()[:5]

    assert pieces.as_tuples(FirstHalf(table).split_array()) == FirstHalf(table).splits()
    assert len(FirstHalf(table).splits()) == 5
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=6)

    class Evens(ParquetSource):
        def splits(self, split_rows=None):
            return super().splits(split_rows)[::2]

    evens = Evens(str(tmp_path / "t.parquet"))
    assert (
        pieces.as_tuples(evens.split_array())
        == evens.splits()
        == [(0, 6), (12, 18), (24, 30), (36, 42), (48, 54)]
    )
    assert pieces.as_tuples(dynamic_pieces(PlanConfig(batch_size=4), evens, 1, 0)) != []


def test_dynamic_pieces_is_the_list_paths_queue_for_any_source():
    """The array queue is the seeded order of the splits as lists of tuples gave it."""
    table = pa.Table.from_batches(
        [pa.record_batch({"id": pa.array(np.arange(a, a + 6))}) for a in range(0, 60, 6)]
    )
    config = PlanConfig(batch_size=4, seed=5)
    sources = {
        TableSource(table): [(a, a + 6) for a in range(0, 60, 6)],
        _ListSplits(): [(0, 2), (2, 9)],
        DataLayout.of_files([3, 0, 5, 2]): [(0, 3), (3, 8), (8, 10)],
    }
    for source, splits in sources.items():
        for epoch in (0, 1):
            model = split_order(splits, config.seed, epoch)
            assert pieces.as_tuples(dynamic_pieces(config, source, 2, epoch)) == model
            assert list(assign("dynamic", config, source, 2, epoch).splits) == model


def test_lease_order_is_a_seeded_permutation_apart_from_split_order():
    queue = pieces.as_pieces([(i, i + 1) for i in range(50)])
    order = lease_order(queue, seed=1, epoch=0)
    assert sorted(pieces.as_tuples(order)) == pieces.as_tuples(queue)
    assert np.array_equal(order, lease_order(queue, seed=1, epoch=0))
    assert not np.array_equal(order, lease_order(queue, seed=1, epoch=1))
    assert not np.array_equal(order, split_order(queue, 1, 0))


def test_a_book_from_an_array_leases_as_one_from_tuples():
    splits = [(0, 7), (7, 7), (7, 20), (20, 21), (30, 45)]
    consumed = [(3, 9), (40, 41)]
    for done in ((), consumed):
        arrays = (splits, np.array(splits))
        books = [LeaseBook(s, [0, 1], 4, consumed=done, equal_steps=False) for s in arrays]
        taken = [[], []]
        for book, out in zip(books, taken):
            while (lease := book.lease(len(out) % 2, 0.0)) is not None:
                out.append((lease.rank, lease.start, lease.end))
        assert taken[0] == taken[1]
        rest = iv.subtract(iv.normalize(splits), iv.normalize(done))
        assert iv.normalize([(a, b) for _, a, b in taken[0]]) == rest


@pytest.mark.parametrize("splits", [[(0, 2), (2, 5, 7), (7,)], iter([(0, 2), (3,)])])
def test_a_split_that_is_not_a_pair_is_named(splits):
    """Even when a triple and a single add up to whole pairs, the bad split is named."""
    with pytest.raises(ValueError, match=r"split 1 is \((2, 5, 7|3,)\), not a \(start, end\)"):
        pieces.as_pieces(splits)
