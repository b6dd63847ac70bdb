"""Sets of sample ids as numpy runs: the vectorized twin of `rayshard.plan.intervals` for
the acknowledgement path, where a shuffled epoch brings about one run per sample.

A run array is an `(n, 2)` int64 array of half-open `[start, end)` pairs; `union` is
`intervals.normalize` without a Python object per pair.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from rayshard.plan import intervals as iv

MERGE_FLOOR = 64  # a `RunSet` merges once it holds more unmerged pairs than this


def as_runs(pairs: Any) -> np.ndarray:
    """`pairs` (an `(n, 2)` array, or any iterable of `(start, end)` pairs) as a run array."""
    if isinstance(pairs, np.ndarray):
        return pairs.astype(np.int64, copy=False).reshape(-1, 2)
    flat = [int(x) for pair in pairs for x in pair]
    return np.array(flat, dtype=np.int64).reshape(-1, 2)


def union(runs: np.ndarray) -> np.ndarray:
    """`runs` sorted, without empty pairs, overlapping or touching ones merged (the same
    set and the same pairs as `intervals.normalize`)."""
    # (m, 2) the non-empty pairs, by start
    runs = runs[runs[:, 1] > runs[:, 0]]
    if len(runs) < 2:
        return runs.copy()
    runs = runs[np.argsort(runs[:, 0], kind="stable")]
    starts, ends = runs[:, 0], runs[:, 1]
    # (m - 1,) a pair opens a new run when it starts past every end before it
    opens = starts[1:] > np.maximum.accumulate(ends)[:-1]
    # (k,) positions of the pairs that open a run
    first = np.concatenate(([0], np.flatnonzero(opens) + 1))
    return np.stack((starts[first], np.maximum.reduceat(ends, first)), axis=1)


def run_rows(runs: np.ndarray) -> int:
    """Rows in a run array, a row in two pairs counted twice."""
    return int((runs[:, 1] - runs[:, 0]).sum())


def to_intervals(runs: np.ndarray) -> iv.Intervals:
    """A run array as `intervals` pairs (Python ints)."""
    return tuple(map(tuple, runs.tolist()))


class RunSet:
    """A growing set of sample ids: `add` appends run arrays, merged (`union`) once the
    unmerged pairs outnumber the merged ones (and `MERGE_FLOOR`), so a stream of
    scattered pairs costs an amortized O(log n) numpy work per pair, and the set holds at
    most about twice its merged size."""

    def __init__(self, pairs: Iterable[Any] = ()) -> None:
        self._merged = union(as_runs(pairs))
        self._pending: list[np.ndarray] = []
        self._count = 0

    def add(self, pairs: Any) -> None:
        runs = as_runs(pairs)
        if not len(runs):
            return
        self._pending.append(runs)
        self._count += len(runs)
        if self._count > max(MERGE_FLOOR, len(self._merged)):
            self._merge()

    def merged(self) -> iv.Intervals:
        """The set as normalized `intervals` pairs (and kept merged)."""
        self._merge()
        return to_intervals(self._merged)

    def __len__(self) -> int:
        """Pairs held, merged or not (a bound on its memory, for tests)."""
        return len(self._merged) + self._count

    def _merge(self) -> None:
        if self._pending:
            self._merged = union(np.concatenate([self._merged, *self._pending]))
            self._pending, self._count = [], 0


def sample_runs(sorted_ids: np.ndarray) -> np.ndarray:
    """Sorted sample ids as merged half-open intervals, an `(n, 2)` int64 array (a
    shuffled batch has about one run per row: kept in numpy up to the coordinator)."""
    sorted_ids = np.asarray(sorted_ids, dtype=np.int64)
    if sorted_ids.size == 0:
        return np.empty((0, 2), dtype=np.int64)
    # (n - 1,) whether each id is one past the one before it
    steps = np.diff(sorted_ids) == 1
    if steps.all():  # one run: an unshuffled batch
        return np.array([[sorted_ids[0], sorted_ids[-1] + 1]], dtype=np.int64)
    # (k,) positions where a new run begins, after the first
    breaks = np.flatnonzero(~steps) + 1
    starts = sorted_ids[np.concatenate(([0], breaks))]
    ends = sorted_ids[np.concatenate((breaks, [sorted_ids.size])) - 1] + 1
    return np.stack((starts, ends), axis=1)


__all__ = ["MERGE_FLOOR", "RunSet", "as_runs", "run_rows", "sample_runs", "to_intervals", "union"]
