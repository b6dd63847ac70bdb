"""Weighted mixing: which samples of each source an epoch holds, and where.

A mixed epoch has `T = sum(counts)` positions. Position `i` belongs to one source and is
that source's `k`-th pick of the epoch; pick `k` is a sample index of the source. Both
maps are pure functions of (sizes, counts, seed, epoch): no clock, no globals, randomness
only from generators seeded by (seed, epoch, source). So every rank, every world size and
every resume agrees on them, and the loader's exactly-once coverage of positions `[0, T)`
is exactly-once coverage of the epoch's picks, with `counts[s]` picks of source `s`.

- Interleave: source 0 takes positions spread evenly over `[0, T)` (Bresenham), source 1
  spread evenly over the rest, and so on; every prefix holds each source's share within
  one sample per source, so any contiguous range of positions is mixed in proportion.
- Picks of a source with `n` rows and `c = q*n + r` picks: `q` whole cycles `0..n-1` in
  order, then a seeded subset of `r` samples (sorted), drawn anew every epoch. `c < n` is
  downsampling (`q = 0`), `c > n` upsampling.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from rayshard.config.checks import check_int
from rayshard.errors import ConfigError

#: Positions per epoch above which `m * c` could overflow int64 in `prefix`.
MAX_EPOCH_SAMPLES = 3_000_000_000


def check_weights(weights: Sequence[float], num_sources: int) -> tuple[float, ...]:
    """The weights as floats, or a `ConfigError` naming the value and the fix. A 1-D
    NumPy array is a sequence of weights too."""
    if isinstance(weights, np.ndarray) and weights.ndim == 1:
        weights = list(weights)
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise ConfigError(
            f"weights={weights!r} must be a list of numbers, one per source ({num_sources})"
        )
    if len(weights) != num_sources:
        raise ConfigError(
            f"weights={list(weights)!r} has {len(weights)} value(s) but there are "
            f"{num_sources} sources: give exactly one weight per source, in the same order"
        )
    out = []
    for i, w in enumerate(weights):
        # numbers.Real: NumPy scalars too (list(np.array([0.7, 0.3], dtype=np.float32)))
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w):
            raise ConfigError(
                f"weights[{i}]={w!r} is not a finite number: use a number >= 0 per source"
            )
        if w < 0:
            raise ConfigError(
                f"weights[{i}]={w!r} is negative: weights are proportions of the epoch, use "
                "0 to leave a source out or a positive number to draw from it"
            )
        out.append(float(w))
    if not any(out):
        raise ConfigError(
            f"weights={list(weights)!r} are all zero: an epoch would hold no sample; give at "
            "least one source a positive weight"
        )
    return tuple(out)


def apportion(total: int, weights: Sequence[float]) -> tuple[int, ...]:
    """`total` split in proportion to `weights` (largest remainders, ties to the lower
    index): whole numbers that sum to exactly `total`."""
    weights = check_weights(weights, len(weights))
    check_int(total, "samples_per_epoch", minimum=0, integral=True)
    exact = [Fraction(w) for w in weights]
    quotas = [total * w / sum(exact) for w in exact]
    counts = [math.floor(q) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda s: (-(quotas[s] - counts[s]), s))
    for s in order[: total - sum(counts)]:
        counts[s] += 1
    return tuple(counts)


@dataclass(frozen=True)
class Mix:
    """The arithmetic of one mixed dataset: `sizes[s]` rows in source `s`, `counts[s]`
    picks of it per epoch, seeded by `seed`."""

    sizes: tuple[int, ...]
    counts: tuple[int, ...]
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.counts) or not self.sizes:
            raise ConfigError(
                f"counts={list(self.counts)} and sizes={list(self.sizes)} must have one entry "
                "per source (at least one source)"
            )
        for s, (n, c) in enumerate(zip(self.sizes, self.counts)):
            check_int(n, f"sizes[{s}]", minimum=0, integral=True)
            check_int(c, f"counts[{s}]", minimum=0, integral=True)
            if c > 0 and n == 0:
                raise ConfigError(
                    f"source {s} has no rows but is asked for {c} samples per epoch: give it "
                    "weight 0 (or count 0), or fix the source"
                )
        if not 0 < self.total <= MAX_EPOCH_SAMPLES:
            raise ConfigError(
                f"a mixed epoch of {self.total} samples is out of range: it must hold between "
                f"1 and {MAX_EPOCH_SAMPLES} samples (raise a weight or samples_per_epoch)"
            )

    @property
    def total(self) -> int:
        return sum(self.counts)

    def prefix(self, positions: np.ndarray) -> np.ndarray:
        """(S, n): how many of positions `[0, p)` belong to each source, per `p`."""
        m = np.asarray(positions, dtype=np.int64).copy()  # (n,) positions still unassigned
        left = self.total
        out = np.zeros((len(self.counts), m.size), dtype=np.int64)
        for s, c in enumerate(self.counts):
            if left == 0:
                break
            out[s] = m * c // left  # (n,) source s spread evenly over what is left
            m -= out[s]
            left -= c
        return out

    def locate(self, epoch: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, sample index) of every position in `[start, end)`, two (n,) arrays."""
        if not 0 <= start <= end <= self.total:
            raise ValueError(f"positions [{start}, {end}) are outside [0, {self.total})")
        bounds = self.prefix(np.arange(start, end + 1))  # (S, n+1)
        source = np.argmax(np.diff(bounds, axis=1), axis=0)  # (n,) the source that grew
        rank = bounds[source, np.arange(end - start)]  # (n,) pick number within its source
        index = np.empty(end - start, dtype=np.int64)
        for s in np.unique(source):
            mask = source == s
            index[mask] = self.picks(epoch, int(s), rank[mask])
        return source.astype(np.int64), index

    def picks(self, epoch: int, source: int, ranks: np.ndarray) -> np.ndarray:
        """Sample indices of picks `ranks` (an array) of `source` in `epoch`."""
        n, c = self.sizes[source], self.counts[source]
        ranks = np.asarray(ranks, dtype=np.int64)
        cycles = c // n * n if n else 0  # picks in whole cycles
        out = ranks % max(n, 1)
        tail = ranks >= cycles
        if tail.any():
            out[tail] = remainder_subset(self.seed, epoch, source, n, c - cycles)[
                ranks[tail] - cycles
            ]
        return out

    def epoch_picks(self, epoch: int, source: int) -> np.ndarray:
        """All `counts[source]` picks of `source` in `epoch`, in pick order."""
        return self.picks(epoch, source, np.arange(self.counts[source]))


@functools.lru_cache(maxsize=16)
def remainder_subset(seed: int, epoch: int, source: int, n: int, r: int) -> np.ndarray:
    """A sorted seeded subset of `r` of `range(n)`, one per (seed, epoch, source): the picks
    past a source's whole cycles (read-only; cached per process)."""
    rng = np.random.default_rng([seed, epoch, source, 0x6D6978])
    subset = np.sort(rng.choice(n, size=r, replace=False)).astype(np.int64)
    subset.flags.writeable = False
    return subset
