"""Cutting a rank's ranges into reading pieces at split boundaries (pure, without Ray):
the vectorized cut gives, piece for piece, what a cut range by range with `bisect` gives,
for any splits (sorted or not, overlapping, repeated) and ranges (empty ones included)."""

from __future__ import annotations

import bisect
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.data.batching import cut_at_boundaries, reading_pieces, split_boundaries


def reference_boundaries(splits):
    return sorted({b for split in splits for b in split})


def reference_cut(ranges, boundaries):
    out = []
    for start, end in ranges:
        lo, hi = bisect.bisect_right(boundaries, start), bisect.bisect_left(boundaries, end)
        cuts = [start, *boundaries[lo:hi], end]
        out += zip(cuts, cuts[1:])
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
    assert reading.boundaries().tolist() == [0, 5, 10, 15]
    assert reading.splits() is splits and reading.boundaries() is reading.boundaries()


def test_a_split_that_is_not_a_pair_is_named_not_cut_short():
    import pytest

    with pytest.raises(ValueError, match=r"split 1 is \(3, 4, 5\), not a \(start, end\) pair"):
        split_boundaries([(0, 3), (3, 4, 5)])
