"""Seeded split order and the bounded shuffle buffer: pure, deterministic, exactly-once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.core.shuffle import shuffle_batches, split_order
from rayshard.errors import ConfigError


def batches_of(ids, sizes):
    out, start = [], 0
    for size in sizes:
        chunk = ids[start : start + size]
        if len(chunk):
            out.append(
                pa.record_batch({"id": pa.array(chunk, pa.int64()), "x": [i * 2 for i in chunk]})
            )
        start += size
    if start < len(ids):
        out.append(
            pa.record_batch(
                {"id": pa.array(ids[start:], pa.int64()), "x": [i * 2 for i in ids[start:]]}
            )
        )
    return out


def ids(batches):
    return [v for b in batches for v in b.column("id").to_pylist()]


def test_split_order_is_a_seeded_permutation():
    splits = [(i * 10, i * 10 + 10) for i in range(20)]
    order = split_order(splits, seed=3, epoch=0)
    assert sorted(order) == splits and order != splits
    assert split_order(splits, seed=3, epoch=0) == order
    assert split_order(splits, seed=3, epoch=1) != order
    assert split_order(splits, seed=4, epoch=0) != order
    assert split_order(splits, seed=3, epoch=0, rank=0) != order
    assert split_order(splits, 3, 0, rank=0) != split_order(splits, 3, 0, rank=1)
    assert split_order([], 0, 0) == []


@settings(max_examples=200, deadline=None)
@given(
    unit_splits=st.lists(st.integers(1, 5), min_size=1, max_size=25),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 3),
    rank=st.one_of(st.none(), st.integers(0, 2)),
)
def test_split_order_by_unit_keeps_each_units_splits_together_and_in_order(
    unit_splits, seed, epoch, rank
):
    """Read units (row groups) of `unit_splits[u]` splits of 3 rows each: the units are
    permuted, as splits alone would be, and each one's splits come in a row, in order."""
    splits, units, unit_of, start = [], [], {}, 0
    for u, count in enumerate(unit_splits):
        for _ in range(count):
            splits.append((start, start + 3))
            unit_of[start] = u
            start += 3
        units.append((splits[-count][0], start))
    splits_array = np.array(splits, dtype=np.int64)
    got = split_order(splits_array, seed, epoch, rank, units=np.array(units)).tolist()
    assert sorted(map(tuple, got)) == splits  # a permutation
    runs = [unit_of[a] for a, _ in got]
    order = [u for i, u in enumerate(runs) if i == 0 or runs[i - 1] != u]
    assert len(order) == len(units)  # each unit's splits in one run
    assert got == sorted(got, key=lambda piece: order.index(unit_of[piece[0]]))  # in order
    # the units in the order `split_order` gives them alone: one split per unit is as before
    assert order == [u for u, _ in split_order(list(enumerate(units)), seed, epoch, rank)]
    one_each = np.array(units, dtype=np.int64)
    by_unit = split_order(one_each, seed, epoch, rank, units=one_each)
    assert np.array_equal(by_unit, split_order(one_each, seed, epoch, rank))


def test_split_order_rejects_bad_seed():
    with pytest.raises(ConfigError, match="seed=-1"):
        split_order([1, 2], seed=-1, epoch=0)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 300),
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=10),
    buffer_rows=st.integers(2, 64),
    emit=st.one_of(st.none(), st.integers(1, 80)),
)
def test_every_row_exactly_once_and_independent_of_batching(n, sizes, buffer_rows, emit):
    data = list(range(n))
    out = list(shuffle_batches(batches_of(data, sizes), buffer_rows, 7, 2, 1, emit_rows=emit))
    assert sorted(ids(out)) == data
    assert all(
        b.column("x").to_pylist() == [i * 2 for i in b.column("id").to_pylist()] for b in out
    )
    other = list(shuffle_batches(batches_of(data, [13]), buffer_rows, 7, 2, 1, emit_rows=emit))
    assert ids(other) == ids(out)


def test_same_seed_same_order_other_epoch_or_rank_other_order():
    data = list(range(500))

    def run(seed, epoch, rank):
        return ids(shuffle_batches(batches_of(data, [32]), 100, seed, epoch, rank))

    base = run(1, 0, 0)
    assert base == run(1, 0, 0) and base != data
    assert run(1, 1, 0) != base
    assert run(1, 0, 1) != base
    assert run(2, 0, 0) != base


def test_memory_stays_bounded():
    consumed = {"rows": 0}

    def source():
        for start in range(0, 2000, 10):
            consumed["rows"] += 10
            yield pa.record_batch({"id": pa.array(range(start, start + 10), pa.int64())})

    emitted = 0
    for batch in shuffle_batches(source(), 64, 0, 0, 0):
        emitted += batch.num_rows
        assert consumed["rows"] - emitted <= 64 + 10  # buffer plus one input batch
    assert emitted == 2000


def test_rows_move_but_only_locally():
    data = list(range(1000))
    out = ids(shuffle_batches(batches_of(data, [50]), 40, 0, 0, 0))
    early = np.array(out) - np.arange(1000)  # (1000,) id minus output position
    # when row i is read, at least i - buffer - one batch rows are out already
    assert early.max() <= 40 + 50 and np.abs(early).mean() < 200
    assert out != data


def test_small_buffers_pass_through():
    batches = batches_of(list(range(30)), [7])
    assert list(shuffle_batches(batches, 0, 0, 0, 0)) == batches
    assert list(shuffle_batches(batches, 1, 0, 0, 0)) == batches


def test_bad_arguments():
    with pytest.raises(ConfigError, match="buffer_rows=-1"):
        list(shuffle_batches([], -1, 0, 0, 0))
    with pytest.raises(ConfigError, match="emit_rows=0"):
        list(shuffle_batches([], 8, 0, 0, 0, emit_rows=0))
