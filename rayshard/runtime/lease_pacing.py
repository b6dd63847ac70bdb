"""How far ahead a `dynamic` reader asks for its next lease, and for how much.

A rank has one lease call in flight at a time (a retried call must get its journaled answer,
and the coordinator keeps one per rank). While the coordinator answers within
`min_round_trip_s` (as measured from the answers the reading waited for; ones that came in
time only lower the estimate) the reader asks as the last piece of a lease goes out, for
`base` pieces (the lease stream's behaviour without pacing). When answers come later (many
ranks' acknowledgements queued ahead of each lease), the reader asks earlier and for more:
enough rows in hand to cover `headroom` round trips at the pace its reading takes pieces, at
most `max_pieces` pieces. The pace is measured over windows of `window_s` of reading or
`first_pieces` pieces, so a burst of pulls as reading threads start does not read as a fast
pace, and the first one needs `first_pieces`: in its first epoch a rank whose loop stops
early (a slow or frozen consumer) fills its read-ahead unpaced, as it did before pacing, and
holds no more than that. The pace is rows over reading seconds summed over the windows, an
earlier window's weight falling by `keep` with each new one: a window that closed on time
holding a piece or two (the reading held up a while: its consumer slow, its threads
descheduled) counts for its rows and seconds, not as half the pace (with 4 ranks on 2 cores
a per-window average fell 10-25x within an epoch, and its leases with it).

An ask made early, with rows in hand, is marked as a share: the coordinator stops granting
it pieces once they hold `1 / (2 x members)` of the rows no rank holds (guided
self-scheduling), so one rank cannot take an epoch's tail from the others, nor the epoch
from a rank that joins, and offers it no straggler's work; the count asked is sized from the
last answer's figures to the same bound.

A lease call costs the coordinator and the reader about a millisecond of CPU each (a Ray
call), whatever it grants: once the pace is measured, a lease asks for at least
`min_lease_s` of reading (more than the base when pieces read fast), sized to the same
bound.
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
    min_lease_s: float = 0.25  # reading time a lease asks for at least, once paced
    window_s: float = 0.1  # reading time per pace measurement, or `first_pieces` pieces
    first_pieces: int = 16  # pieces the first measurement needs (more than a read-ahead)
    round_trip_s: float = 0.0  # the last measured round trip (0 until one is)
    seconds_per_row: float = 0.0  # reading pace (0 until measured; a first window replaces it)
    unleased: int | None = None  # rows no rank held, as of the last answer (None: unknown)
    ranks: int = 1  # members of the epoch, as of the last answer
    waited_s: float = 0.0  # seconds the reading waited for answers, not yet reported
    keep: float = 0.75  # the weight an earlier window keeps per window since, in [0, 1)
    _last_pull: float | None = None
    _window: tuple[int, int, float] = (0, 0, 0.0)  # rows, pieces, reading s of the window
    _seen: tuple[float, float] = (0.0, 0.0)  # rows and reading s of the windows, weighted

    def pulled(self, rows: int, now: float, stalled_s: float = 0.0) -> None:
        """The reading took a piece of `rows` at `now`, having waited `stalled_s` of the time
        since the last one for a lease answer (not reading time, so not counted)."""
        if self._last_pull is not None:
            window_rows, window_pieces, window_s = self._window
            window_rows, window_pieces = window_rows + rows, window_pieces + 1
            window_s += max(0.0, now - self._last_pull - stalled_s)
            self._window = (window_rows, window_pieces, window_s)
            timed = self.seconds_per_row > 0.0 and window_s >= self.window_s
            if (timed or window_pieces >= self.first_pieces) and window_rows > 0:
                rows_seen, seconds_seen = self._seen
                rows_seen = rows_seen * self.keep + window_rows
                seconds_seen = seconds_seen * self.keep + window_s
                self._seen = (rows_seen, seconds_seen)
                self.seconds_per_row = seconds_seen / rows_seen
                self._window = (0, 0, 0.0)
        self._last_pull = now

    def new_stream(self, unleased: int = -1, ranks: int = 1) -> None:
        """A new lease stream begins with an answer that left `unleased` rows and `ranks`
        members: the time since the last one's pulls (an epoch's end, a wait for work) is
        not reading time."""
        self._last_pull = None
        self.unleased, self.ranks = (None if unleased < 0 else unleased), max(1, ranks)

    def paced(self) -> bool:
        """Whether asks are paced now (early, and granted within a share)."""
        return self.ahead_rows() > 0

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

    def waited(self, seconds: float) -> None:
        """The reading waited `seconds` for a lease answer (reported with the next ask)."""
        self.waited_s += max(0.0, seconds)

    def take_waited(self) -> float:
        """The waits not reported yet, for the ask going out now (then none are left)."""
        waited, self.waited_s = self.waited_s, 0.0
        return waited

    def ahead_rows(self) -> float:
        """Rows to hold in hand when the next ask goes out (0: ask at the last piece)."""
        if self.round_trip_s < self.min_round_trip_s or self.seconds_per_row <= 0.0:
            return 0.0
        ahead = self.headroom * self.round_trip_s / self.seconds_per_row
        return min(ahead, self.max_pieces * max(1, self.piece_rows))

    def lease_rows(self) -> float:
        """Rows that take `min_lease_s` to read at the measured pace (0 until measured)."""
        return self.min_lease_s / self.seconds_per_row if self.seconds_per_row > 0.0 else 0.0

    def should_ask(self, rows_in_hand: int) -> bool:
        """Whether to ask now, with `rows_in_hand` leased rows not yet taken by the reading."""
        return rows_in_hand <= self.ahead_rows()

    def count(self) -> int:
        """Pieces to ask for: the base, or enough to stay `ahead_rows` ahead until the
        answer after this one and (with the share known) to read for `min_lease_s`, within
        the guided self-scheduling share and `max_pieces`."""
        wanted = 2.0 * self.ahead_rows()
        if self.unleased is not None:  # (a share unknown: no lease grows for its cost)
            wanted = max(wanted, self.lease_rows())
            wanted = min(wanted, self.unleased / (2 * self.ranks))
        pieces = math.ceil(wanted / max(1, self.piece_rows) - 1e-9)
        return max(self.base, min(pieces, self.max_pieces))


__all__ = ["LeasePacing"]
