"""The queue of pieces a `dynamic` epoch has not leased yet, with the two facts its lease
book asks for on every call kept up to date rather than summed: how many rows it holds,
and which pieces may hold rows a consumer already received.

Only rows taken back from a rank (lost, or revoked as a straggler) can be acknowledged
while queued: every other queued row was never leased (acknowledgements hold leased rows
only: the coordinator refuses an older generation's, whose book is gone). Taken-back rows
always sit at the queue's front: they go back there, and a piece cut from the front
leaves its rest there. So a late acknowledgement is dropped from the first
`requeued_front` pieces only, whose rows are also kept merged and sorted (`front_rows`):
an acknowledgement of other rows (nearly all of them) is told apart by bisection, and
costs the same with 10 pieces queued as with 100,000, and with 1 or 1,000 taken back.
"""

from __future__ import annotations

import base64
import collections
import itertools
from collections.abc import Iterable, Iterator

import numpy as np

from rayshard.plan import intervals as iv


class SplitQueue:
    """Pieces `(start, end)` in leasing order (see module docstring)."""

    def __init__(self, pieces: Iterable[tuple[int, int]] = (), requeued_front: int = 0) -> None:
        self._pieces: collections.deque[tuple[int, int]] = collections.deque(
            (int(a), int(b)) for a, b in pieces
        )
        self.rows = iv.total(self._pieces)
        self.requeued_front = min(requeued_front, len(self._pieces))
        self.front_rows = iv.normalize(list(self._pieces)[: self.requeued_front])

    @classmethod
    def loaded(cls, saved: str, requeued_front: int | None = None) -> SplitQueue:
        """The queue `packed()` saved; `requeued_front` None: every piece (snapshots from
        before it was kept)."""
        pieces = np.frombuffer(base64.b64decode(saved), dtype="<i8").reshape(-1, 2).tolist()
        return cls(pieces, len(pieces) if requeued_front is None else requeued_front)

    def packed(self) -> str:
        """The pieces as base64 of little-endian int64 pairs, for a journal snapshot: a
        queue of many pieces (a large dataset's row groups) saved as numbers rather than a
        Python list per piece, which took most of a compaction's time."""
        flat = itertools.chain.from_iterable(self._pieces)
        numbers = np.fromiter(flat, dtype="<i8", count=2 * len(self._pieces))
        return base64.b64encode(numbers.tobytes()).decode("ascii")

    def __bool__(self) -> bool:
        return bool(self._pieces)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._pieces)

    def take(self, room: int) -> tuple[int, int]:
        """The front piece, cut to `room` rows (its rest stays in front). Not empty."""
        start, end = self._pieces.popleft()
        taken_back = self.requeued_front > 0
        if end - start > room:
            self._pieces.appendleft((start + room, end))
            end = start + room
        else:
            self.requeued_front -= taken_back
        if taken_back:
            self.front_rows = iv.subtract(self.front_rows, ((start, end),))
        self.rows -= end - start
        return start, end

    def put_back(self, pieces: list[tuple[int, int]]) -> None:
        """Taken-back pieces go to the front, in order."""
        self._pieces.extendleft(reversed(pieces))
        self.requeued_front += len(pieces)
        self.front_rows = iv.normalize([*self.front_rows, *pieces])
        self.rows += iv.total(pieces)

    def drop(self, received: iv.Intervals) -> None:
        """Rows a consumer received (`received` normalized) leave the queue."""
        if not iv.intersect(received, self.front_rows):
            return
        front = [self._pieces.popleft() for _ in range(self.requeued_front)]
        kept = [p for piece in front for p in iv.subtract((piece,), received)]
        self._pieces.extendleft(reversed(kept))
        self.requeued_front = len(kept)
        self.front_rows = iv.subtract(self.front_rows, received)
        self.rows -= iv.total(front) - iv.total(kept)


__all__ = ["SplitQueue"]
