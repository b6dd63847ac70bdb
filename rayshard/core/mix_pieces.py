"""Where a mixed epoch is cut into pieces (the splits `dynamic` leases, the "files" of
`file`) when `MixedSource(split_rows=None)`: at the row-group boundaries of one source.

A piece reads, per source, every whole split (row group) its picks fall in, so a row group
that straddles pieces is decoded once per piece, and under `dynamic` (pieces leased in a
random order to any rank) once per piece in practice. Pieces of a fixed 8192 positions cut
each 32768-row row group of a two-source 50/50 mix into 8 pieces (8 decodes where 1 would
do). Here the pieces follow the split boundaries of the source whose splits span the most
positions (the coarsest, so the fewest pieces): a piece reads one split of it and, of a
source with finer splits, the splits it covers plus at most one straddling at each end.
Boundaries are exact for a source's whole cycles and expected ones (`r/n` of the way) for
its seeded remainder, so the cut is the same every epoch. Pure: arithmetic on `Mix`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rayshard.core.mixing import Mix

#: The fewest positions in an aligned piece (shorter ones join the piece before), and the
#: fixed piece length when no source's splits span that many positions.
MIN_PIECE = 8192
#: The most positions in a piece (longer ones are cut in equal parts): a read holds its
#: piece's rows at once.
MAX_PIECE = 262144
#: A piece holds at most this many (median) splits' worth of rows of any source, or
#: MIN_PIECE positions if more: what a reading process caches of each source anyway.
SPLITS_PER_PIECE = 4


def crossings(n: int, c: int, starts: Sequence[int]) -> int:
    """How many split boundaries a source of `n` rows and `c` picks crosses in an epoch."""
    if not n or not c:
        return 0
    q, r = divmod(c, n)
    return q * len(starts) + (len(starts) if r else 0)


def pick_boundaries(n: int, c: int, starts: Sequence[int]) -> np.ndarray:
    """(k,) the pick numbers at which a source starts a new split, in `(0, c)`, sorted:
    every split start of every whole cycle, then the expected ones of the remainder."""
    q, r = divmod(c, n)
    first = np.asarray(starts, dtype=np.int64)  # (s,) split starts in [0, n)
    cycles = (np.arange(q, dtype=np.int64)[:, None] * n + first[None, :]).ravel()
    tail = q * n + (first * r + n // 2) // n  # where the sorted subset reaches each split
    out = np.unique(np.concatenate([cycles, tail]))
    return out[(out > 0) & (out < c)]


def first_positions(mix: Mix, source: int, picks: np.ndarray) -> np.ndarray:
    """(k,) the first position `p` with `picks` picks of `source` in `[0, p)`, per pick
    number (a bisection on `Mix.prefix`, which grows with `p`)."""
    picks = np.asarray(picks, dtype=np.int64)
    lo = np.zeros_like(picks)
    hi = np.full_like(picks, mix.total)
    while (lo < hi).any():
        mid = (lo + hi) // 2
        enough = mix.prefix(mid)[source] >= picks
        hi = np.where(enough, mid, hi)
        lo = np.where(enough, lo, mid + 1)
    return lo


def aligned_pieces(
    mix: Mix,
    split_starts: Sequence[Sequence[int]],
    min_piece: int = MIN_PIECE,
    max_piece: int = MAX_PIECE,
) -> list[int] | None:
    """Piece lengths (positions, in order, summing to `mix.total`) cut at the split
    boundaries of the source whose splits span the most positions; None when none spans
    `min_piece` (the caller cuts fixed pieces then). `split_starts[s]`: the first row of
    every split of source `s`, ascending, from 0."""
    total = mix.total
    cuts = [crossings(n, c, st) for n, c, st in zip(mix.sizes, mix.counts, split_starts)]
    used = [s for s, k in enumerate(cuts) if mix.counts[s]]
    coarse = min(used, key=lambda s: cuts[s])  # the widest splits, the first on a tie
    if total < min_piece * max(cuts[coarse], 1):
        return None  # its splits average under min_piece positions
    max_piece = max(min_piece, min(max_piece, _row_cap(mix, split_starts)))
    picks = pick_boundaries(mix.sizes[coarse], mix.counts[coarse], split_starts[coarse])
    bounds = np.unique(first_positions(mix, coarse, picks))
    pieces: list[int] = []
    last = 0
    for cut in [*bounds[(bounds > 0) & (bounds < total)].tolist(), total]:
        if pieces and cut - last < min_piece:
            pieces[-1] += cut - last  # too short: joins the piece before
        else:
            pieces.append(cut - last)
        last = cut
    if len(pieces) > 1 and pieces[0] < min_piece:
        first = pieces.pop(0)
        pieces[0] += first  # a short first piece joins the next
    out: list[int] = []
    for length in pieces:
        parts = -(-length // max_piece)
        out.extend(length // parts + (i < length % parts) for i in range(parts))
    return out


def _row_cap(mix: Mix, split_starts: Sequence[Sequence[int]]) -> int:
    """The most positions a piece may span and hold SPLITS_PER_PIECE median splits' rows
    of every source (a piece of `L` positions holds about `L * c / T` rows of a source)."""
    cap = mix.total
    for n, c, starts in zip(mix.sizes, mix.counts, split_starts):
        if n and c:
            median = int(np.median(np.diff([*starts, n])))
            cap = min(cap, SPLITS_PER_PIECE * median * mix.total // c)
    return cap


__all__ = [
    "MAX_PIECE",
    "MIN_PIECE",
    "SPLITS_PER_PIECE",
    "aligned_pieces",
    "crossings",
    "first_positions",
]
