"""A reading order of dataset indices as numpy runs, for map-style sources.

Shards that are not contiguous (stride shards `range(k, n, S)`, permuted `Subset`s) give
one run per sample: held as numpy arrays (positions located by bisection), a million of
them cost a few MB and a read anywhere costs the same, where a tuple of pairs walked from
the start cost seconds per read.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from rayshard.errors import ConfigError
from rayshard.plan import check_coverage


def joined(pairs: np.ndarray) -> np.ndarray:
    """`(start, end)` rows (a `(k, 2)` array) in order, empty ones dropped and those where
    one ends exactly where the next starts merged (`intervals.concat`, in numpy)."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    pairs = pairs[pairs[:, 1] > pairs[:, 0]]
    if len(pairs) < 2:
        return pairs
    # (k,) rows that start a new run: the first, and each not touching the one before
    first = np.concatenate([[True], pairs[1:, 0] != pairs[:-1, 1]])
    heads = np.flatnonzero(first)
    tails = np.concatenate([heads[1:] - 1, [len(pairs) - 1]])
    return np.stack([pairs[heads, 0], pairs[tails, 1]], axis=1)


def runs_of_values(values: np.ndarray) -> np.ndarray:
    """Indices in order as runs of consecutive ones, a `(k, 2)` array (no tuple per run)."""
    if len(values) == 0:
        return np.zeros((0, 2), np.int64)
    heads = np.concatenate([[0], np.flatnonzero(np.diff(values) != 1) + 1])
    tails = np.concatenate([heads[1:], [len(values)]]) - 1
    return np.stack([values[heads], values[tails] + 1], axis=1).astype(np.int64)


def size_of(runs: np.ndarray) -> int:
    """How many indices the runs hold."""
    return int((runs[:, 1] - runs[:, 0]).sum())


def check_runs(shards: Sequence[np.ndarray], num_samples: int) -> None:
    """The shards (runs each) cover `[0, num_samples)` exactly once: checked in numpy; a
    failure is explained by `check_coverage` (which names the shards and samples)."""
    runs = np.concatenate([*shards, np.zeros((0, 2), np.int64)])
    ordered = runs[np.argsort(runs[:, 0], kind="stable")]
    disjoint = bool(np.all(ordered[1:, 0] >= ordered[:-1, 1]))
    inside = not len(runs) or (ordered[0, 0] >= 0 and ordered[:, 1].max() <= num_samples)
    if disjoint and inside and size_of(runs) == num_samples:
        return
    check_coverage([[tuple(p) for p in s.tolist()] for s in shards], num_samples)
    raise ConfigError(f"the shards do not cover the {num_samples} samples exactly once")


def short_hash(*arrays: np.ndarray) -> str:
    """8 hex digits of the arrays' int64 values: what tells two orders apart in an id."""
    digest = hashlib.blake2b(digest_size=4)
    for array in arrays:
        digest.update(np.ascontiguousarray(array, dtype="<i8").tobytes())
    return digest.hexdigest()


def subset_mark(dataset: Any) -> str:
    """`, indices <hash>` for a torch `Subset` (nested ones composed) whose indices are not
    0..n-1 in order, else "": two subsets of one dataset get different ids."""
    torch = sys.modules.get("torch")
    subset = getattr(getattr(torch, "utils", None), "data", None)
    subset = getattr(subset, "Subset", None)
    if subset is None or not isinstance(dataset, subset):
        return ""
    picked = np.arange(len(dataset), dtype=np.int64)
    while isinstance(dataset, subset):
        picked = np.asarray(dataset.indices, dtype=np.int64)[picked]
        dataset = dataset.dataset
    if np.array_equal(picked, np.arange(len(picked))):
        return ""
    return f", indices {short_hash(picked)}"


class IndexRuns:
    """Dataset indices in reading order as runs: run `k` holds indices `starts[k]`,
    `starts[k] + 1`, ... at positions `offsets[k]` to `offsets[k + 1]` of the order."""

    def __init__(self, runs: np.ndarray) -> None:
        runs = joined(runs)
        self.starts = np.ascontiguousarray(runs[:, 0])
        self.offsets = np.concatenate([[0], np.cumsum(runs[:, 1] - runs[:, 0])]).astype(np.int64)

    @property
    def total(self) -> int:
        return int(self.offsets[-1])

    def is_identity(self) -> bool:
        """The order is 0, 1, 2, ... (one run from 0, or none)."""
        return len(self.starts) == 0 or (len(self.starts) == 1 and self.starts[0] == 0)

    def digest(self) -> str:
        return short_hash(self.starts, self.offsets)

    def take(self, begin: int, stop: int) -> np.ndarray:
        """Positions `[begin, stop)` of the order as `(start, end)` runs, by bisection (a
        range past the end is cut there, as slicing cuts it)."""
        begin, stop = max(begin, 0), min(stop, int(self.offsets[-1]))
        if stop <= begin:
            return np.zeros((0, 2), np.int64)
        lo = int(np.searchsorted(self.offsets, begin, "right")) - 1
        hi = int(np.searchsorted(self.offsets, stop, "left"))
        starts = self.starts[lo:hi].copy()
        ends = starts + np.diff(self.offsets[lo : hi + 1])
        starts[0] += begin - self.offsets[lo]
        ends[-1] -= self.offsets[hi] - stop
        return np.stack([starts, ends], axis=1)

    def indices(self, begin: int, stop: int) -> Iterator[int]:
        """The dataset indices at positions `[begin, stop)`, in order."""
        for start, end in self.take(begin, stop).tolist():
            yield from range(start, end)

    def __getstate__(self) -> dict[str, np.ndarray]:
        # pickled small: the starts and run lengths in the narrowest unsigned dtype
        return {"starts": _narrow(self.starts), "lengths": _narrow(np.diff(self.offsets))}

    def __setstate__(self, state: dict[str, np.ndarray]) -> None:
        self.starts = state["starts"].astype(np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(state["lengths"], dtype=np.int64)])


def _narrow(values: np.ndarray) -> np.ndarray:
    """Non-negative ints in the smallest unsigned dtype that holds them."""
    return values.astype(np.min_scalar_type(int(values.max()))) if len(values) else values
