"""Where a rank's reading cuts its ranges into pieces, and in which order it reads them:
at split boundaries, shuffled by the epoch's key or joined within a read unit; on a resume
on the same world size in the uninterrupted reading's order. Pure numpy, no Ray."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from rayshard.plan import intervals as iv
from rayshard.plan.pieces import as_pieces


class Cuts(NamedTuple):
    """Where a rank's reading cuts its ranges into pieces (sorted, as `split_boundaries`
    makes them): no piece crosses one of `splits` (a shuffle permutes the pieces between
    them); pieces that follow one another and meet off `reads`, where a read starts over
    (a file source's next row group: `Source.read_units`), are read as one; with `reads`
    None, none are joined."""

    splits: np.ndarray
    reads: np.ndarray | None = None

    @classmethod
    def of(cls, boundaries: Cuts | np.ndarray) -> Cuts:
        """`boundaries` as `Cuts`: a bare array of split boundaries joins no pieces."""
        return boundaries if isinstance(boundaries, Cuts) else cls(boundaries)


def reading_pieces(
    ranges: iv.Intervals,
    splits: Sequence[tuple[int, int]],
    *,
    shuffle: bool,
    rng_key: str,
    boundaries: Cuts | np.ndarray | None = None,
    order: iv.Intervals | None = None,
) -> list[tuple[int, int]]:
    """Cut a rank's ranges at split boundaries and order the pieces.

    With `shuffle`, the pieces (one split's rows each) in a permutation seeded by
    `rng_key` (seed, epoch, rank); otherwise in the order of `ranges`, with the pieces
    that continue one another inside one read unit joined (`Cuts`: the same rows in the
    same order, in fewer reads; a piece then never crosses a read unit). `boundaries`:
    the splits' `split_boundaries` (or `Cuts`, with the read units'), when the caller
    keeps them from epoch to epoch. `order` (`RankPlan.order`, a resume on the same world
    size): the uninterrupted shard, whose pieces are permuted, then cut to `ranges`, so
    the rest comes in the uninterrupted reading's order (the permutation of the rest's own
    pieces would differ).
    """
    cuts = Cuts.of(split_boundaries(splits) if boundaries is None else boundaries)
    if not shuffle:
        return cut_pieces(ranges, cuts)
    if order is not None:
        return _in_order(ranges, order, np.asarray(cuts.splits, dtype=np.int64), rng_key)
    pieces = cut_at_boundaries(ranges, cuts.splits)
    random.Random(rng_key).shuffle(pieces)
    return pieces


def _in_order(
    ranges: iv.Intervals, order: iv.Intervals, bounds: np.ndarray, rng_key: str
) -> list[tuple[int, int]]:
    """`order`'s pieces in the permutation `rng_key` gives them (the one a shuffled reading
    of `order` has: it depends on their count only), each cut to `ranges`; rows of
    `ranges` outside `order` (should a plan have any) after them, none lost. In numpy: a
    shard of a million pieces is cut in about the time its permutation takes."""
    pieces = _cut(order, bounds)
    shuffled = list(range(len(pieces)))
    random.Random(rng_key).shuffle(shuffled)
    position = np.empty(len(pieces), dtype=np.int64)
    position[np.asarray(shuffled, dtype=np.int64)] = np.arange(len(pieces))
    left = _normalized(ranges)
    by_start = np.argsort(pieces[:, 0], kind="stable")
    starts, ends = pieces[by_start, 0], pieces[by_start, 1]
    edges = np.sort(np.concatenate((starts, ends)))
    cut = _cut(left, edges[np.append(True, edges[1:] != edges[:-1])] if len(edges) else edges)
    cut = cut[cut[:, 1] > cut[:, 0]]
    at = np.maximum(np.searchsorted(starts, cut[:, 0], side="right") - 1, 0)
    inside = (starts[at] <= cut[:, 0]) & (cut[:, 1] <= ends[at]) if len(starts) else at < 0
    kept = cut[inside][np.lexsort((cut[inside, 0], position[by_start[at[inside]]]))]
    if not inside.all():  # (never from `plan_remaining`: its ranges lie in `order`)
        kept = np.concatenate((kept, _cut(cut[~inside], bounds)))
    return list(zip(kept[:, 0].tolist(), kept[:, 1].tolist()))


def _normalized(ranges: iv.Intervals) -> np.ndarray:
    """`ranges` as a sorted, non-overlapping `(n, 2)` array (as given when already so)."""
    spans = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    if len(spans) and not (spans[1:, 0] >= spans[:-1, 1]).all():
        spans = np.asarray(iv.normalize(ranges), dtype=np.int64).reshape(-1, 2)
    return spans[spans[:, 1] > spans[:, 0]]


def cut_pieces(ranges: iv.Intervals, cuts: Cuts) -> list[tuple[int, int]]:
    """`ranges` cut at `cuts.splits`, in order, then each run of pieces that goes on where
    the last one ended, off `cuts.reads`, joined into one piece: one `Source.read`, one
    reading thread's task and one tagging for a run of small splits of one row group."""
    pieces = _cut(ranges, np.asarray(cuts.splits, dtype=np.int64))
    if cuts.reads is not None and len(pieces) > 1:
        starts, reads = pieces[1:, 0], np.asarray(cuts.reads, dtype=np.int64)
        at = np.minimum(np.searchsorted(reads, starts), max(len(reads) - 1, 0))
        on_read_cut = reads[at] == starts if len(reads) else np.zeros(len(starts), bool)
        joined = (pieces[:-1, 1] == starts) & ~on_read_cut
        first, last = np.append(True, ~joined), np.append(~joined, True)
        pieces = np.stack((pieces[first, 0], pieces[last, 1]), axis=1)
    return list(zip(pieces[:, 0].tolist(), pieces[:, 1].tolist()))


def split_boundaries(splits: Sequence[tuple[int, int]] | np.ndarray) -> np.ndarray:
    """Every split's start and end, sorted and once each (int64): what `cut_at_boundaries`
    cuts at. Without a Python step per split: a dataset may have millions."""
    flat = as_pieces(splits).reshape(-1)
    if flat.size and not (flat[1:] >= flat[:-1]).all():
        return np.unique(flat)
    return flat[np.concatenate(([True], flat[1:] != flat[:-1]))] if flat.size else flat


def cut_at_boundaries(ranges: iv.Intervals, boundaries: np.ndarray) -> list[tuple[int, int]]:
    """`ranges` cut at the sorted `boundaries` (`split_boundaries`), in order: each range
    `(start, end)` becomes its pieces between the boundaries strictly inside it (an empty
    range stays one empty piece)."""
    pieces = _cut(ranges, np.asarray(boundaries, dtype=np.int64))
    return list(zip(pieces[:, 0].tolist(), pieces[:, 1].tolist()))


def _cut(ranges: iv.Intervals, bounds: np.ndarray) -> np.ndarray:
    """`cut_at_boundaries` as a `(pieces, 2)` int64 array."""
    if not len(ranges):  # a lease answer without pieces: no array work
        return np.zeros((0, 2), dtype=np.int64)
    spans = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    # (r,) the first boundary past each start, and the count of those before its end
    first = np.searchsorted(bounds, spans[:, 0], side="right")
    inside = np.maximum(np.searchsorted(bounds, spans[:, 1], side="left") - first, 0)
    # (p,) each piece's range, and its place among that range's pieces
    owner = np.repeat(np.arange(len(spans)), inside + 1)
    place = np.arange(owner.size) - np.repeat(np.cumsum(inside + 1) - (inside + 1), inside + 1)
    at = first[owner] + place  # the boundary a piece ends at (while inside its range)
    padded = np.concatenate((bounds, [0]))  # `at` may point one past the end: masked below
    starts = np.where(place == 0, spans[owner, 0], padded[at - 1])
    ends = np.where(place == inside[owner], spans[owner, 1], padded[at])
    return np.stack((starts, ends), axis=1)


__all__ = ["Cuts", "cut_at_boundaries", "cut_pieces", "reading_pieces", "split_boundaries"]
