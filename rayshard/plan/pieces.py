"""Splits as one `(n, 2)` int64 array of `[start, end)` rows, for a dataset of millions.

A `dynamic` epoch's queue holds every split; made as a list of tuples, a dataset of 2M
splits kept the coordinator from answering for seconds at each epoch start. Cut, permuted
and queued as an array, the same work is a few numpy calls. Pure: no Ray, no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import numpy as np

from rayshard.plan import intervals as iv


def as_pieces(splits: Iterable[Sequence[int]] | np.ndarray) -> np.ndarray:
    """`splits` as an `(n, 2)` int64 array (an array is reshaped, not copied, if it is one).
    A split that is not a `(start, end)` pair is a `ValueError` naming it (a source's
    `splits()` gone wrong would otherwise shift every pair after it)."""
    if isinstance(splits, np.ndarray):
        return splits.astype(np.int64, copy=False).reshape(-1, 2)
    splits = splits if isinstance(splits, Sequence) else list(splits)
    for index, split in enumerate(splits):
        if len(split) != 2:
            raise ValueError(
                f"split {index} is {split!r}, not a (start, end) pair: a source's splits() "
                f"must return (start, end) sample ranges"
            )
    return np.fromiter(itertools.chain.from_iterable(splits), dtype=np.int64).reshape(-1, 2)


def as_tuples(pieces: np.ndarray) -> list[tuple[int, int]]:
    """The pieces as a list of `(start, end)` tuples of Python ints (zipped from the two
    columns: no list per piece made and dropped)."""
    return list(zip(pieces[:, 0].tolist(), pieces[:, 1].tolist()))


def nonempty(pieces: np.ndarray) -> np.ndarray:
    """The pieces holding at least one row, in order."""
    return pieces[pieces[:, 1] > pieces[:, 0]]


def rest_of(splits: Iterable[Sequence[int]] | np.ndarray, done: iv.Intervals) -> np.ndarray:
    """The non-empty splits without the rows of `done` (normalized), split by split: the
    rests of two adjacent splits stay two pieces (a resumed epoch leases them apart)."""
    whole = nonempty(as_pieces(splits))
    if not done:
        return whole
    return as_pieces(p for split in whole.tolist() for p in iv.subtract((tuple(split),), done))


def between(offsets: Sequence[int] | np.ndarray) -> np.ndarray:
    """The non-empty ranges between consecutive `offsets` (a file's or chunk's starts)."""
    bounds = np.asarray(offsets, dtype=np.int64)
    return nonempty(np.stack([bounds[:-1], bounds[1:]], axis=1))


def cut_chunks(chunk_rows: Sequence[int] | np.ndarray, limit: int | None) -> np.ndarray:
    """Consecutive chunks of `chunk_rows` rows (from row 0) as pieces, each chunk cut into
    pieces of at most `limit` rows (None: whole chunks); empty chunks give none."""
    rows = np.asarray(chunk_rows, dtype=np.int64).reshape(-1)
    starts = np.cumsum(rows) - rows
    if not limit:  # one piece per non-empty chunk
        return nonempty(np.stack([starts, starts + rows], axis=1))
    step = np.full_like(rows, limit)
    counts = -(-rows // step)  # pieces per chunk: 0 for an empty one
    first = np.repeat(np.cumsum(counts) - counts, counts)  # each piece's chunk's first piece
    within = np.arange(int(counts.sum()), dtype=np.int64) - first
    chunk_start, chunk_step = np.repeat(starts, counts), np.repeat(step, counts)
    piece_start = chunk_start + within * chunk_step
    piece_end = np.minimum(piece_start + chunk_step, np.repeat(starts + rows, counts))
    return np.stack([piece_start, piece_end], axis=1)
