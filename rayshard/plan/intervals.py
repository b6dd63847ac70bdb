"""Half-open integer intervals: the planner's currency for "which samples".

A set of sample indices is a sorted tuple of disjoint, non-adjacent `(start, end)` pairs,
so a shard of ten million samples costs one pair, not ten million integers.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

Interval = tuple[int, int]
Intervals = tuple[Interval, ...]


def normalize(intervals: Iterable[Iterable[int]]) -> Intervals:
    """Sort, drop empty pairs and merge overlapping or touching ones."""
    pairs = sorted((int(a), int(b)) for a, b in intervals if int(b) > int(a))
    merged: list[list[int]] = []
    for start, end in pairs:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return tuple((a, b) for a, b in merged)


def concat(intervals: Iterable[Interval]) -> Intervals:
    """Join pairs given in order, merging only where one ends exactly where the next starts.

    Unlike `normalize`, the order is kept: it is the reading order of a shard.
    """
    out: list[Interval] = []
    for start, end in intervals:
        if end <= start:
            continue
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return tuple(out)


def total(intervals: Iterable[Interval]) -> int:
    """How many indices the intervals hold."""
    return sum(end - start for start, end in intervals)


def subtract(intervals: Intervals, removed: Intervals) -> Intervals:
    """The indices of `intervals` not in `removed`, keeping the order of `intervals`.

    `removed` must be normalized; `intervals` may be in any order (a reading order).
    """
    out: list[Interval] = []
    for start, end in intervals:
        cursor = start
        for r_start, r_end in _overlapping(removed, start, end):
            if r_start > cursor:
                out.append((cursor, r_start))
            cursor = max(cursor, r_end)
        if cursor < end:
            out.append((cursor, end))
    return concat(out)


def intersect(intervals: Intervals, other: Intervals) -> Intervals:
    """The indices of `intervals` that are also in `other` (normalized), in `intervals`' order."""
    out: list[Interval] = []
    for start, end in intervals:
        for o_start, o_end in _overlapping(other, start, end):
            out.append((max(start, o_start), min(end, o_end)))
    return concat(out)


def take(intervals: Intervals, begin: int, stop: int) -> Intervals:
    """Positions `[begin, stop)` of the concatenation of `intervals`, as intervals."""
    out: list[Interval] = []
    offset = 0
    for start, end in intervals:
        size = end - start
        lo, hi = max(begin - offset, 0), min(stop - offset, size)
        if lo < hi:
            out.append((start + lo, start + hi))
        offset += size
        if offset >= stop:
            break
    return concat(out)


def split(intervals: Intervals, sizes: Iterable[int]) -> list[Intervals]:
    """Consecutive stretches of the concatenation of `intervals`, `sizes` positions each
    (what is left after them is left out): `take` of every stretch, in one pass, so
    cutting R pairs into W stretches costs O(R + W), not O(R * W)."""
    out: list[Intervals] = []
    pairs, index, at = list(intervals), 0, 0  # the pair being cut, and where in it
    for size in sizes:
        part: list[Interval] = []
        while size > 0 and index < len(pairs):
            start, end = pairs[index]
            cut = min(size, end - start - at)
            part.append((start + at, start + at + cut))
            size, at = size - cut, at + cut
            if start + at >= end:
                index, at = index + 1, 0
        out.append(concat(part))
    return out


def add_into(merged: list[Interval], start: int, end: int) -> None:
    """Add `[start, end)` to `merged` (a normalized list, kept so) by bisection: a long
    list kept up to date piece by piece, where `normalize` would pass over all of it."""
    if end <= start:
        return
    i = bisect_left(merged, (start, start))  # the first pair starting at `start` or after
    if i > 0 and merged[i - 1][1] >= start:  # one before reaches it: they merge
        i -= 1
        start, end = merged[i][0], max(end, merged[i][1])
    j = i
    while j < len(merged) and merged[j][0] <= end:
        end, j = max(end, merged[j][1]), j + 1
    merged[i:j] = [(start, end)]


def remove_from(merged: list[Interval], start: int, end: int) -> None:
    """Take `[start, end)` out of `merged` (a normalized list, kept so), by bisection."""
    if end <= start:
        return
    i = max(bisect_right(merged, (start, start)) - 1, 0)  # the last pair starting before
    while i < len(merged) and merged[i][1] <= start:
        i += 1
    j, kept = i, []
    while j < len(merged) and merged[j][0] < end:
        first, last = merged[j]
        kept += [(first, start)] if first < start else []
        kept += [(end, last)] if last > end else []
        j += 1
    merged[i:j] = kept


def indices(intervals: Iterable[Interval]) -> Iterator[int]:
    """Every index, in order. For tests and small shards only."""
    for start, end in intervals:
        yield from range(start, end)


def _overlapping(normalized: Intervals, start: int, end: int) -> Iterator[Interval]:
    """Pairs of `normalized` that overlap `[start, end)`, found by bisection."""
    i = max(bisect_right(normalized, (start, start)) - 1, 0)
    while i < len(normalized) and normalized[i][0] < end:
        r_start, r_end = normalized[i]
        if r_end > start:
            yield r_start, r_end
        i += 1
