"""A queue of pieces in leasing order, with the two facts a lease book asks for on every
call kept up to date rather than summed: how many rows it holds, and which pieces may hold
rows a consumer already received. A `dynamic` epoch's book keeps the pieces taken back
from its ranks in one (`rayshard.core.stretches.LeaseQueue.returned`: leased first, by
any rank); the rest of its queue is in rank stretches. It holds any pieces, as a whole
queue did before the stretches (its untouched array, for many pieces, is kept for that).

Only rows taken back from a rank (lost, or revoked as a straggler) can be acknowledged
while queued: every other queued row was never leased (acknowledgements hold leased rows
only: the coordinator refuses an older generation's, whose book is gone). Taken-back rows
always sit at the queue's front: they go back there, and a piece cut from the front
leaves its rest there. So a late acknowledgement is dropped from the first
`requeued_front` pieces only, whose rows are also kept merged and sorted (`front_rows`):
an acknowledgement of other rows (nearly all of them) is told apart by bisection, and
costs the same with 10 pieces queued as with 100,000, and with 1 or 1,000 taken back.
Pieces taken back, and leased from the front, change `front_rows` by bisection too: a
whole group of 10,000 ranks giving its leases back, then leasing them again, is not
quadratic in the pieces.
"""

from __future__ import annotations

import base64
import collections
import itertools
from collections.abc import Iterable, Iterator

import numpy as np

from rayshard.plan import intervals as iv

TAKEN_AHEAD = 256  # untouched pieces made tuples at once for `take`


def pack_pieces(pieces: np.ndarray) -> str:
    """Pieces (an (n, 2) int64 array) as base64 of little-endian int64 pairs, for a journal
    snapshot: many pieces (a large dataset's row groups) saved as numbers rather than a
    Python list per piece, which took most of a compaction's time."""
    return base64.b64encode(np.asarray(pieces, dtype="<i8").tobytes()).decode("ascii")


def unpack_pieces(saved: str) -> np.ndarray:
    """The (n, 2) int64 array of pieces `pack_pieces` saved."""
    return np.frombuffer(base64.b64decode(saved), dtype="<i8").astype(np.int64).reshape(-1, 2)


class SplitQueue:
    """Pieces `(start, end)` in leasing order (see module docstring). The pieces never
    taken from are kept as one int64 array with a cursor, and only the pieces in front of
    them (taken back, the rest of a piece cut, and up to `TAKEN_AHEAD` about to be
    leased) as a deque of tuples: a snapshot (`packed`) then costs a copy of numbers, not
    a Python step per queued piece."""

    def __init__(self, pieces: Iterable[tuple[int, int]] = (), requeued_front: int = 0) -> None:
        if not isinstance(pieces, np.ndarray):
            pieces = np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int64)
        untouched = pieces.reshape(-1, 2)
        front = min(requeued_front, len(untouched))
        # every requeued piece sits in `_front` (it holds at least `requeued_front`)
        self._front: collections.deque[tuple[int, int]] = collections.deque(
            (a, b) for a, b in untouched[:front].tolist()
        )
        self._untouched = untouched[front:]  # (n, 2), read from `_next` on
        self._next, self._untouched_count = 0, len(self._untouched)
        self.rows = int((untouched[:, 1] - untouched[:, 0]).sum())
        self.requeued_front = front
        self._front_rows = list(iv.normalize(self._front))  # (changed in place)

    @classmethod
    def loaded(cls, saved: str, requeued_front: int | None = None) -> SplitQueue:
        """The queue `packed()` saved; `requeued_front` None: every piece (snapshots from
        before it was kept)."""
        pieces = unpack_pieces(saved)
        return cls(pieces, len(pieces) if requeued_front is None else requeued_front)

    def packed(self) -> str:
        """The pieces, in order, as `pack_pieces` saves them (a journal snapshot)."""
        front = np.array(self._front, dtype=np.int64).reshape(-1, 2)
        return pack_pieces(np.concatenate([front, self._untouched[self._next :]]))

    @property
    def front_rows(self) -> iv.Intervals:
        """The rows of the requeued front, normalized."""
        return tuple(self._front_rows)

    def __bool__(self) -> bool:
        return bool(self._front) or self._next < self._untouched_count

    def __iter__(self) -> Iterator[tuple[int, int]]:
        rest = (tuple(piece) for piece in self._untouched[self._next :].tolist())
        return itertools.chain(self._front, rest)

    def take(self, room: int) -> tuple[int, int]:
        """The front piece, cut to `room` rows (its rest stays in front). Not empty."""
        if not self._front:  # the next untouched pieces, a few at a time, as tuples
            chunk = self._untouched[self._next : self._next + TAKEN_AHEAD].tolist()
            self._front.extend((a, b) for a, b in chunk)
            self._next += len(chunk)
        start, end = self._front.popleft()
        taken_back = self.requeued_front > 0
        if end - start > room:
            self._front.appendleft((start + room, end))
            end = start + room
        else:
            self.requeued_front -= taken_back
        if taken_back:
            iv.remove_from(self._front_rows, start, end)
        self.rows -= end - start
        return start, end

    def put_back(self, pieces: list[tuple[int, int]]) -> None:
        """Taken-back pieces go to the front, in order."""
        self._front.extendleft(reversed(pieces))
        self.requeued_front += len(pieces)
        for start, end in pieces:
            iv.add_into(self._front_rows, start, end)
        self.rows += iv.total(pieces)

    def drop(self, received: iv.Intervals) -> None:
        """Rows a consumer received (`received` normalized) leave the queue."""
        if not iv.intersect(received, self._front_rows):
            return
        front = [self._front.popleft() for _ in range(self.requeued_front)]
        kept = [p for piece in front for p in iv.subtract((piece,), received)]
        self._front.extendleft(reversed(kept))
        self.requeued_front = len(kept)
        self._front_rows = list(iv.subtract(self._front_rows, received))
        self.rows -= iv.total(front) - iv.total(kept)


__all__ = ["SplitQueue", "pack_pieces", "unpack_pieces"]
