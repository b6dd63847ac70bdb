"""How far ahead a `dynamic` reader asks for its next lease, and for how much.

A rank has one lease call in flight at a time (a retried call must get its journaled
answer, and the coordinator keeps one per rank). While the coordinator answers within
`min_round_trip_s` the reader asks as the last piece of a lease goes out, for `base` pieces
(the lease stream's behaviour without pacing). When answers come later (many ranks'
acknowledgements queued ahead of each lease), the reader asks earlier and for more:
enough rows in hand to cover `headroom` round trips at the rate its reading pulls pieces.
So that one rank cannot take an epoch's tail from the others (nor the epoch from a rank
that joins), one ask takes at most `1 / (2 * ranks)` of the rows still unleased when the
last answer was given (guided self-scheduling), and at most `max_pieces` pieces.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class LeasePacing:
    """Measures round trips and the reading rate; says when to ask and for how many pieces.
    Times are seconds from a monotonic clock, passed in (pure: no clock read here)."""

    base: int  # pieces per ask without pacing: one object's worth of batches
    piece_rows: int  # a typical piece's rows (the splits' median)
    min_round_trip_s: float = 0.01  # round trips below this never move the ask earlier
    headroom: float = 1.5  # round trips of reading held in hand when the ask goes out
    max_pieces: int = 256
    round_trip_s: float = 0.0  # the last measured round trip (0 until one is)
    seconds_per_row: float = 0.0  # reading pace, smoothed (0 until measured)
    unleased: int | None = None  # rows no rank held, as of the last answer (None: unknown)
    ranks: int = 1  # members of the epoch, as of the last answer
    _last_pull: float | None = None

    def pulled(self, rows: int, now: float, stalled_s: float = 0.0) -> None:
        """The reading took a piece of `rows` at `now`, having waited `stalled_s` of the time
        since the last one for a lease answer (not reading time, so not counted)."""
        if self._last_pull is not None and rows > 0:
            pace = max(0.0, now - self._last_pull - stalled_s) / rows
            smooth = self.seconds_per_row
            self.seconds_per_row = pace if smooth == 0.0 else 0.7 * smooth + 0.3 * pace
        self._last_pull = now

    def answered(
        self, asked_at: float, ready_at: float, unleased: int, ranks: int, waited: bool = True
    ) -> None:
        """An answer asked at `asked_at` was seen ready at `ready_at`, after the reading
        `waited` for it (then that is its round trip) or not (then the round trip was at
        most that: the estimate only falls). When it was given, the epoch had `unleased`
        rows left and `ranks` members (`unleased` < 0: not known)."""
        seen = max(0.0, ready_at - asked_at)
        self.round_trip_s = seen if waited else min(self.round_trip_s, seen)
        self.unleased = None if unleased < 0 else unleased
        self.ranks = max(1, ranks)

    def ahead_rows(self) -> float:
        """Rows to hold in hand when the next ask goes out (0: ask at the last piece)."""
        if self.round_trip_s < self.min_round_trip_s or self.seconds_per_row <= 0.0:
            return 0.0
        return self.headroom * self.round_trip_s / self.seconds_per_row

    def should_ask(self, rows_in_hand: int) -> bool:
        """Whether to ask now, with `rows_in_hand` leased rows not yet taken by the reading."""
        return rows_in_hand <= self.ahead_rows()

    def count(self) -> int:
        """Pieces to ask for: the base, or enough to stay `ahead_rows` ahead until the
        answer after this one, within the guided self-scheduling share and `max_pieces`."""
        wanted = 2.0 * self.ahead_rows()
        if self.unleased is not None:
            wanted = min(wanted, self.unleased / (2 * self.ranks))
        pieces = math.ceil(wanted / max(1, self.piece_rows) - 1e-9)
        return max(self.base, min(pieces, self.max_pieces))


__all__ = ["LeasePacing"]
