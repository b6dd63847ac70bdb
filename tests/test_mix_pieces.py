"""Aligned pieces of a mixed epoch (`rayshard.core.mix_pieces`), without Ray or data: they
cover the epoch, keep within their bounds, and a piece reads one split of the source with
the widest splits."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.core.mix_pieces import aligned_pieces, first_positions
from rayshard.core.mixing import Mix


@st.composite
def mixes(draw):
    sources = draw(st.integers(1, 3))
    sizes = [draw(st.integers(1, 400)) for _ in range(sources)]
    counts = [draw(st.integers(0, 900)) for _ in range(sources)]
    if not any(counts):
        counts[0] = 1
    starts = [
        sorted({0, *draw(st.lists(st.integers(1, max(n - 1, 1)), max_size=6))} - {n}) for n in sizes
    ]
    return Mix(tuple(sizes), tuple(counts), draw(st.integers(0, 5))), starts


@settings(max_examples=150, deadline=None)
@given(case=mixes(), min_piece=st.integers(1, 60), wide=st.integers(2, 5))
def test_pieces_cover_the_epoch_within_their_bounds(case, min_piece, wide):
    mix, starts = case
    pieces = aligned_pieces(mix, starts, min_piece=min_piece, max_piece=min_piece * wide)
    if pieces is None:
        return  # the caller cuts fixed pieces
    assert sum(pieces) == mix.total and all(p > 0 for p in pieces)
    assert all(p <= min_piece * wide for p in pieces)
    # short ones joined the one before; long ones were cut in parts of over half the cap,
    # which is at least min_piece
    assert len(pieces) == 1 or all(p >= min_piece // 2 for p in pieces)


@settings(max_examples=60, deadline=None)
@given(case=mixes())
def test_first_positions_invert_the_prefix(case):
    mix, _ = case
    prefix = mix.prefix(np.arange(mix.total + 1))  # (S, T+1)
    for s, c in enumerate(mix.counts):
        picks = np.arange(c + 1)
        want = [int(np.argmax(prefix[s] >= k)) for k in picks]
        assert first_positions(mix, s, picks).tolist() == want


def test_a_piece_reads_one_split_of_the_widest_source_each_epoch():
    """Source 1 (2 cycles of 3 splits of 50 rows) has the widest splits; source 0's splits
    are 10 rows. Every piece holds picks of one split of source 1, in every epoch."""
    mix = Mix((100, 150), (130, 300), seed=3)
    starts = [list(range(0, 100, 10)), [0, 50, 100]]
    pieces = aligned_pieces(mix, starts, min_piece=20, max_piece=1000)
    assert pieces is not None and len(pieces) == 6 and sum(pieces) == mix.total
    edges = np.cumsum([0, *pieces])
    for epoch in (0, 1):
        for a, b in zip(edges, edges[1:]):
            source, index = mix.locate(epoch, int(a), int(b))
            splits = np.unique(np.searchsorted(starts[1], index[source == 1], side="right"))
            assert len(splits) == 1, (a, b, splits)


def test_fine_splits_everywhere_leave_the_cut_to_the_caller():
    mix = Mix((100, 100), (100, 100))
    assert aligned_pieces(mix, [list(range(0, 100, 5))] * 2, min_piece=20) is None
    assert aligned_pieces(mix, [[0], [0]], min_piece=20) == [200]  # one split each


def test_a_piece_holds_at_most_four_splits_of_rows_of_a_finely_grouped_source():
    """A text source in one 100k-row split and an image source in splits of 50 rows,
    50/50: pieces follow the text split but hold at most 4 * 50 image rows (400
    positions), not 100k (a read holds its piece at once), unless min_piece is more."""
    mix = Mix((100_000, 10_000), (100_000, 100_000))
    starts = [[0], list(range(0, 10_000, 50))]
    pieces = aligned_pieces(mix, starts, min_piece=100, max_piece=10**9)
    assert pieces is not None and max(pieces) <= 400 and sum(pieces) == mix.total
    assert max(aligned_pieces(mix, starts, min_piece=1000, max_piece=10**9)) <= 1000
