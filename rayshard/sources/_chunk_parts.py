"""Where a row range of a chunked file source lies: the parts of chunks (row groups,
record batches) that reading it takes, each with whether it reaches its chunk's end."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple


class ChunkPart(NamedTuple):
    """Rows `[lo, hi)` of chunk `chunk` of file `file`, whose first row is `chunk_start`;
    `last`: `hi` is the chunk's end."""

    file: int
    chunk: int
    chunk_start: int
    lo: int
    hi: int
    last: bool


def chunk_parts(
    offsets: Sequence[int], chunk_starts: Callable[[int], Sequence[int]], start: int, end: int
) -> Iterator[ChunkPart]:
    """The non-empty parts of rows `[start, end)`, in order. `offsets`: each file's first
    row in the dataset, and the row count at the end; `chunk_starts(f)`: file `f`'s chunk
    starts within it, and its row count at the end (asked only for the files read)."""
    f = bisect.bisect_right(offsets, start) - 1
    while start < end and f < len(offsets) - 1:
        starts, base = chunk_starts(f), offsets[f]
        # the chunk holding `start` (past empty ones): not a walk from the file's first
        chunk = max(bisect.bisect_right(starts, start - base) - 1, 0)
        while chunk < len(starts) - 1 and base + starts[chunk] < end:
            chunk_start, chunk_end = base + starts[chunk], base + starts[chunk + 1]
            lo, hi = max(start, chunk_start), min(end, chunk_end)
            if lo < hi:
                yield ChunkPart(f, chunk, chunk_start, lo, hi, hi == chunk_end)
            chunk += 1
        start = max(start, offsets[f + 1])
        f += 1


__all__ = ["ChunkPart", "chunk_parts"]
