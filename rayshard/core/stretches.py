"""The unleased pieces of a `dynamic` epoch: one stretch of the queue per rank, and work
stealing between them.

Ranks that took leases in turns from one queue shared the read unit in hand: with
`split_rows` below the row group size, a lease is a few splits of one row group, so W
ranks alternating inside it each decoded nearly every row group (up to W decodes each).
Here the epoch's queue (in `dynamic_pieces`' order: a read unit's splits in a row) is cut
at the start into one contiguous stretch per rank, even by rows. A rank leases from the
front of its own stretch, so it reads run after run of one row group, as a static rank
does. A rank whose stretch is empty steals the back half (by rows) of the fullest stretch
(the lowest rank on a tie), as work-stealing schedulers do: faster ranks still read more,
no rank waits while rows are queued, and a steal splits at most one read unit.

Rows taken back from a rank (lost, or revoked as a straggler) go to one shared
`SplitQueue` that is leased before any stretch, by whoever asks first, as before.

Nothing here reads a clock or a random source. The fullest stretch is found through a
heap whose entries may be stale, but never below a stretch's rows (a stretch only shrinks
between pushes): its answer is the full scan's, so a book loaded from a snapshot (which
rebuilds the heap) decides as the live one did.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from rayshard.core.split_queue import SplitQueue, pack_pieces, unpack_pieces
from rayshard.plan import intervals as iv

Piece = tuple[int, int]


class RankStretches:
    """Queued pieces `(start, end)` as one stretch per rank (see module docstring). The
    pieces are one (n, 2) array; a rank's stretch is the index range `[lo, hi)` of it,
    after the rest of a piece cut to a lease's room (`_cut`, leased first)."""

    def __init__(
        self, pieces: np.ndarray, ranks: Sequence[int], counts: Sequence[int] = ()
    ) -> None:
        self._pieces = np.asarray(pieces, dtype=np.int64).reshape(-1, 2)
        sizes = self._pieces[:, 1] - self._pieces[:, 0]
        self._before = np.concatenate([[0], np.cumsum(sizes)])  # rows before piece i
        self.rows = int(self._before[-1])
        ranks = list(dict.fromkeys(ranks))  # a rank named twice has one stretch
        if counts:  # a snapshot's: each rank's number of pieces, in `ranks` order
            bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        else:  # even by rows: stretch i ends at the first piece edge past (i+1)/W of them
            ranks = ranks or [0]  # no rank yet: one stretch, rank 0's should it come
            goals = self.rows * np.arange(1, len(ranks)) // max(len(ranks), 1)
            inner = np.searchsorted(self._before, goals)
            bounds = np.concatenate([[0], inner, [len(self._pieces)]]).astype(np.int64)
        self._span = {r: [int(lo), int(hi)] for r, lo, hi in zip(ranks, bounds, bounds[1:])}
        self._cut: dict[int, Piece] = {}
        self._fullest: list[tuple[int, int]] = []
        self._rebuild_heap()

    def __bool__(self) -> bool:
        return self.rows > 0

    def rows_of(self, rank: int) -> int:
        """Rows queued in `rank`'s stretch."""
        lo, hi = self._span.get(rank, (0, 0))
        cut = self._cut.get(rank)
        return int(self._before[hi] - self._before[lo]) + (cut[1] - cut[0] if cut else 0)

    def __iter__(self) -> Iterator[Piece]:
        """Every queued piece, stretch by stretch (ranks in order), each in leasing order."""
        for rank in sorted(self._span.keys() | self._cut.keys()):
            yield from (tuple(piece) for piece in self._run(rank).tolist())

    def take(self, rank: int, room: int) -> Piece | None:
        """The front piece of `rank`'s stretch (stolen first if it is empty), cut to `room`
        rows (its rest stays in front); None if no stretch holds a row."""
        piece = self._cut.pop(rank, None)
        if piece is None:
            span = self._span.get(rank)
            if span is None or span[0] == span[1]:
                self._steal(rank)
                piece = self._cut.pop(rank, None)
                span = self._span.get(rank)
            if piece is None:
                if span is None or span[0] == span[1]:
                    return None
                piece = self._pieces[span[0]].tolist()
                span[0] += 1
        start, end = piece
        if end - start > room:
            self._cut[rank] = (start + room, end)
            end = start + room
        self.rows -= end - start
        return start, end

    def _steal(self, thief: int) -> None:
        """Give `thief` (whose stretch is empty) the back half of the fullest stretch."""
        victim = self._fullest_rank()
        if victim is None:
            return
        lo, hi = self._span.get(victim, [0, 0])
        cut = self._cut.get(victim)
        if hi - lo + (cut is not None) == 1:  # one piece: the thief takes it
            if cut is not None:
                self._cut[thief] = self._cut.pop(victim)
            self._span[thief], self._span[victim] = [lo, hi], [hi, hi]
        else:  # the back half by rows, at a piece edge, leaving the victim a piece
            goal = self._before[hi] - self.rows_of(victim) // 2
            middle = int(np.searchsorted(self._before, goal))
            middle = min(max(middle, lo + (cut is None)), hi - 1)
            self._span[thief], self._span[victim] = [middle, hi], [lo, middle]
        heapq.heappush(self._fullest, (-self.rows_of(thief), thief))

    def _fullest_rank(self) -> int | None:
        """The rank whose stretch holds the most rows (the lowest on a tie); None if none.
        A stale entry is refreshed once per change of its stretch, so a steal that follows
        many takes may refresh many (tens of ms at 10,000 ranks), the epoch O(log W) each."""
        heap = self._fullest
        while heap:
            recorded, rank = heap[0]
            rows = self.rows_of(rank)
            if rows == -recorded:
                return rank
            if rows:
                heapq.heapreplace(heap, (-rows, rank))
            else:
                heapq.heappop(heap)
        return None

    def _rebuild_heap(self) -> None:
        """One entry, exact, for every stretch that holds rows."""
        ranks = self._span.keys() | self._cut.keys()
        self._fullest = [(-self.rows_of(r), r) for r in sorted(ranks) if self.rows_of(r)]
        heapq.heapify(self._fullest)

    def to_dict(self) -> dict[str, Any]:
        """The queued pieces (base64 of little-endian int64 pairs, stretch by stretch) and
        each rank's count of them, JSON-safe (a journal snapshot holds it)."""
        runs = {rank: self._run(rank) for rank in sorted(self._span.keys() | self._cut.keys())}
        runs = {rank: run for rank, run in runs.items() if len(run)}
        pieces = np.concatenate([np.empty((0, 2), np.int64), *runs.values()])
        return {
            "pieces": pack_pieces(pieces),
            "counts": [[rank, len(run)] for rank, run in runs.items()],
        }

    def _run(self, rank: int) -> np.ndarray:
        """`rank`'s queued pieces in leasing order, an (n, 2) array."""
        lo, hi = self._span.get(rank, (0, 0))
        cut = [self._cut[rank]] if rank in self._cut else []
        return np.concatenate([np.array(cut, np.int64).reshape(-1, 2), self._pieces[lo:hi]])

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankStretches:
        """The stretches `to_dict` described (the heap rebuilt: it decides alike)."""
        ranks = [rank for rank, _ in data["counts"]]
        counts = [count for _, count in data["counts"]]
        return cls(unpack_pieces(data["pieces"]), ranks, counts)


class LeaseQueue:
    """What a `dynamic` epoch has not leased: taken-back pieces (`returned`, shared, leased
    first) and the rest in rank stretches (`stretches`)."""

    def __init__(self, returned: SplitQueue, stretches: RankStretches) -> None:
        self.returned, self.stretches = returned, stretches

    @classmethod
    def of(cls, pieces: np.ndarray, ranks: Sequence[int]) -> LeaseQueue:
        """The queue of a new epoch: `pieces` in leasing order, cut into `ranks`' stretches."""
        return cls(SplitQueue(), RankStretches(pieces, ranks))

    @property
    def rows(self) -> int:
        """Rows queued, taken back or in a stretch."""
        return self.returned.rows + self.stretches.rows

    @property
    def requeued_front(self) -> int:
        """Taken-back pieces queued (the only ones that may hold received rows)."""
        return self.returned.requeued_front

    def __bool__(self) -> bool:
        return bool(self.returned) or bool(self.stretches)

    def __iter__(self) -> Iterator[Piece]:
        return itertools.chain(self.returned, self.stretches)

    def take(self, rank: int, room: int) -> Piece | None:
        """Taken-back rows first, then `rank`'s stretch (see `RankStretches.take`)."""
        return self.returned.take(room) if self.returned else self.stretches.take(rank, room)

    def put_back(self, pieces: list[Piece]) -> None:
        """Taken-back pieces, in order, leased before any stretch."""
        self.returned.put_back(pieces)

    def drop(self, received: iv.Intervals) -> None:
        """Received rows leave the queue (only taken-back rows can have been received)."""
        self.returned.drop(received)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, for the lease book's snapshot."""
        return {
            "queue": self.returned.packed(),
            "requeued_front": self.returned.requeued_front,
            "stretches": self.stretches.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LeaseQueue:
        """The queue `to_dict` described."""
        returned = SplitQueue.loaded(data["queue"], data["requeued_front"])
        return cls(returned, RankStretches.from_dict(data["stretches"]))


__all__ = ["LeaseQueue", "RankStretches"]
