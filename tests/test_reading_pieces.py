"""Cutting a rank's ranges into reading pieces at split boundaries (pure, without Ray):
the vectorized cut gives, piece for piece, what a cut range by range with `bisect` gives,
for any splits (sorted or not, overlapping, repeated) and ranges (empty ones included);
pieces that continue one another inside one read unit (a row group) are joined, so a run
of small splits of one row group is one read."""

from __future__ import annotations

import bisect
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.data.reading_order import (
    Cuts,
    cut_at_boundaries,
    cut_pieces,
    reading_pieces,
    split_boundaries,
)


def reference_boundaries(splits):
    return sorted({b for split in splits for b in split})


def reference_cut(ranges, boundaries):
    out = []
    for start, end in ranges:
        lo, hi = bisect.bisect_right(boundaries, start), bisect.bisect_left(boundaries, end)
        cuts = [start, *boundaries[lo:hi], end]
        out += zip(cuts, cuts[1:])
    return out


def reference_join(pieces, read_boundaries):
    """Each piece joined to the one before when it starts where that one ended, off a read
    boundary."""
    out = []
    for start, end in pieces:
        if out and out[-1][1] == start and start not in read_boundaries:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


pairs = st.tuples(st.integers(0, 60), st.integers(0, 60)).map(lambda p: (min(p), max(p)))


@settings(max_examples=400, deadline=None)
@given(splits=st.lists(pairs, max_size=15), ranges=st.lists(pairs, max_size=6))
def test_the_cut_is_the_range_by_range_cut(splits, ranges):
    bounds = split_boundaries(splits)
    assert bounds.dtype == np.int64 and bounds.tolist() == reference_boundaries(splits)
    assert split_boundaries(np.array(splits, dtype=np.int64).reshape(-1, 2)).tolist() == (
        reference_boundaries(splits)
    )
    expected = reference_cut(ranges, reference_boundaries(splits))
    got = cut_at_boundaries(ranges, bounds)
    assert got == expected
    assert all(type(v) is int for piece in got for v in piece)  # plain ints, as before


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=20),
    ranges=st.lists(pairs, max_size=4),
    shuffle=st.booleans(),
)
def test_reading_pieces_keep_their_seeded_order(sizes, ranges, shuffle):
    ends = np.cumsum(sizes).tolist()
    splits = list(zip([0, *ends[:-1]], ends))
    expected = reference_cut(ranges, reference_boundaries(splits))
    if shuffle:
        random.Random("rayshard:0:1:2").shuffle(expected)  # the order the README documents
    kept = split_boundaries(splits)
    for boundaries in (None, kept):  # made here, or kept by the reading from epoch to epoch
        got = reading_pieces(
            ranges, splits, shuffle=shuffle, rng_key="rayshard:0:1:2", boundaries=boundaries
        )
        assert got == expected


@settings(max_examples=400, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 9), min_size=1, max_size=20),
    unit_ends=st.sets(st.integers(0, 19)),
    ranges=st.lists(pairs, max_size=6),
    shuffle=st.booleans(),
)
def test_pieces_in_order_inside_one_read_unit_are_read_as_one(sizes, unit_ends, ranges, shuffle):
    ends = np.cumsum(sizes).tolist()
    splits = list(zip([0, *ends[:-1]], ends))
    # read units: runs of whole splits (a file source's row groups cut by `split_rows`)
    units_at = sorted({0, ends[-1], *(ends[i] for i in unit_ends if i < len(ends))})
    cuts = Cuts(split_boundaries(splits), np.array(units_at, dtype=np.int64))
    split_cut = reference_cut(ranges, reference_boundaries(splits))
    got = reading_pieces(ranges, splits, shuffle=shuffle, rng_key="k", boundaries=cuts)
    if shuffle:  # pieces of splits, permuted as before: nothing joined
        random.Random("k").shuffle(split_cut)
        assert got == split_cut
        return
    assert got == reference_join(split_cut, units_at) == cut_pieces(ranges, cuts)
    rows = [i for a, b in got for i in range(a, b)]
    assert rows == [i for a, b in ranges for i in range(a, b)]  # the same rows, in order
    for (_, b), (c, _) in zip(got, got[1:]):  # joined as far as it goes
        assert b != c or c in units_at
    for a, b in got:  # no piece crosses a read unit
        assert not any(a < u < b for u in units_at)


def test_lease_pieces_are_joined_inside_a_read_unit_and_cut_at_its_end():
    from rayshard.runtime.dynamic_rows import LeaseStream

    class Leased:
        def __init__(self, pieces):
            self.pieces, self.wait, self.unleased, self.ranks = pieces, False, 0, 1

    # splits of 4 rows in row groups of 8: a lease of five splits from row 4 on
    splits = [(a, a + 4) for a in range(0, 32, 4)]
    cuts = Cuts(split_boundaries(splits), np.array([0, 8, 16, 24, 32]))
    lease = Leased(((4, 8), (8, 12), (12, 16), (16, 20), (24, 28)))
    stream = LeaseStream(lease, lambda count, share: Leased(()), cuts, lambda: False)
    assert list(stream.pieces()) == [(4, 8), (8, 16), (16, 20), (24, 28)]
    # a lease's last piece stays its own (an early ask goes out with rows in hand)
    ends_in_a_unit = Leased(((8, 12), (12, 16), (16, 20), (20, 24)))
    stream = LeaseStream(ends_in_a_unit, lambda count, share: Leased(()), cuts, lambda: False)
    assert list(stream.pieces()) == [(8, 16), (16, 20), (20, 24)]
    # a bare array of split boundaries: every split read on its own, as before
    stream = LeaseStream(lease, lambda count, share: Leased(()), cuts.splits, lambda: False)
    assert list(stream.pieces()) == [(4, 8), (8, 12), (12, 16), (16, 20), (24, 28)]


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 5000), max_size=30), per_object=st.integers(1, 64))
def test_lease_pacing_reads_pairs_or_the_split_array_alike(sizes, per_object):
    from rayshard.config.loader_config import LoaderConfig
    from rayshard.runtime.dynamic_rows import lease_pacing

    ends = np.cumsum(sizes).tolist()
    splits = list(zip([0, *ends[:-1]], ends))
    settings_ = LoaderConfig(batch_size=100, batches_per_object=per_object)
    block_batches = settings_.block_batches
    median = max(1, sorted(sizes or [1])[len(sizes or [1]) // 2])  # the upper median
    for given_splits in (splits, np.array(splits, dtype=np.int64).reshape(-1, 2)):
        pacing = lease_pacing(settings_, given_splits)
        assert pacing.piece_rows == median
        assert pacing.base == max(1, -(-block_batches * 100 // median))


def test_a_reading_holds_the_split_array_and_its_boundaries_once():
    import pyarrow as pa

    from rayshard.config.loader_config import LoaderConfig
    from rayshard.runtime.row_streams import RankReading
    from rayshard.sources import TableSource

    table = pa.concat_tables([pa.table({"id": list(range(a, a + 5))}) for a in (0, 5, 10)])
    reading = RankReading(None, TableSource(table), LoaderConfig(batch_size=4), 0, "loader")
    splits = reading.splits()
    assert isinstance(splits, np.ndarray) and splits.tolist() == [[0, 5], [5, 10], [10, 15]]
    cuts = reading.boundaries()
    assert cuts.splits.tolist() == [0, 5, 10, 15]
    assert cuts.reads is None  # a table's splits are its read units: nothing joined
    assert reading.splits() is splits and reading.boundaries() is cuts


def test_a_split_that_is_not_a_pair_is_named_not_cut_short():
    import pytest

    with pytest.raises(ValueError, match=r"split 1 is \(3, 4, 5\), not a \(start, end\) pair"):
        split_boundaries([(0, 3), (3, 4, 5)])
