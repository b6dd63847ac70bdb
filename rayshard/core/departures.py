"""Ranks that left a `dynamic` epoch with equal steps, for the lease book
(`rayshard.core.leases`): what each had left of its capacity, and whether the rows it
left are re-spread over the others yet.

A rank that leaves (`iterator.close()`, a new iterator of it registering, its reader's
death) may come back in the same epoch: a new iterator of a notebook's loop, or of every
rank of a group that made new ones. Its new loop counts its batches from its first, so it
gets what its capacity had left past the rows it received (`rest`), not a capacity of its
own for the whole epoch on top of them (that padded the new loop with an all-padding batch
for each batch the old one received, and for each its read-ahead given back made).

The others' capacities grow (`pending`) only once one of them runs out of room while rows
are queued, not at once: a rank back before that finds the others as it left them, and the
steps stay equal (every rank of a group coming back gets its own rest). They then grow
alike, by the rest of the ranks gone (`Capacities.grow`: at most the rows queued, in whole
batches per rank), so capacities that were equal stay equal, whatever each rank had leased.
A rank back after that gets the growth on top of its rest, as each of them got it. If a
share was spread while it was away (a rank joined, a straggler's rows were offered again),
it gets at least that share on top of the read-ahead it gave back, as each other rank,
reading ahead as it did, got it on top of what it held. The spreads and growths are the
members' own (`rayshard.core.capacities`), read there, not kept again here: a rank away
is owed what a member that never stalled took since.

When every member had stalled, a spread or growth reaches each of them at once, not
through `settle`; a rank away gets it too, as if it had been there and not stalled: its
rest grows by the growth, or reaches its read-ahead plus the share, so that back, it has
as many steps as the members (as the book did when it kept its own copy of them).

Nothing here reads a clock; the state is JSON-safe (`to_dict`).
"""

from __future__ import annotations

from typing import Any

from rayshard.core.capacities import Capacities


class Departures:
    """The ranks gone from one epoch's book (see module docstring), over the book's
    `capacities`, whose spreads and growth are read here, never changed."""

    def __init__(self, capacities: Capacities) -> None:
        self.pending: set[int] = set()  # ranks gone whose rows are not re-spread yet
        self._back: set[int] = set()  # ranks gone and back this epoch
        self._left: dict[int, list[int]] = {}  # rank -> [rest, read ahead, spreads, growth]
        self._capacities = capacities

    def leave(self, rank: int, rest: int | None, ahead: int) -> None:
        """`rank` left with `rest` rows of capacity past what it received (None: no cap),
        `ahead` of them leased and given back."""
        if rest is not None:
            self._left[rank] = [max(rest, 0), ahead, *self._now()]
            self.pending.add(rank)

    def pending_rest(self) -> int:
        """The rest of the ranks gone whose rows are not spread yet."""
        return sum(self._rest(self._left[r]) for r in self.pending if r in self._left)

    def back(self, rank: int) -> int | None:
        """`rank` is back: the capacity of its new loop (None: it did not leave this
        epoch with a cap); its rows, if still pending, are not re-spread."""
        self.pending.discard(rank)
        record = self._left.pop(rank, None)
        if record is None:
            return None
        self._back.add(rank)
        return max(self._rest(record), 0)  # (late rows may take it below: see `late`)

    def late(self, rank: int | None, rows: int) -> bool:
        """`rank` acknowledged `rows` it had given back when it left (its reader died
        before the acknowledgements of its last batches came): they leave its rest. True:
        it is back already, and its capacity is to lose them (its new loop will not get
        them: an iterator dropped, not closed, and a new one made at once)."""
        if rank in self._left:  # (read ahead and given back: off both; a snapshot's rest
            # has the larger of the two in it already, so the order of the two agrees)
            record = self._left[rank]
            record[0], record[1] = record[0] - rows, record[1] - rows
        return rank in self._back and rank not in self._left

    def _now(self) -> tuple[int, int]:
        return self._capacities.spreads, self._capacities.grown

    def _rest(self, record: list[int]) -> int:
        """Its rest and the growth since it left, or the largest share spread since on top
        of its read-ahead (what each other rank, reading ahead as it did, was given), if
        larger (as `Capacities.settle` does)."""
        rest, ahead, seen, grown = record
        now = self._capacities.grown
        share = self._capacities.largest_since(seen)
        rest += now - grown
        return rest if share is None else max(rest, ahead + now + share)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, each rank's rest as of now. Read only: a book loaded from it owes
        each rank what the live one does, as every later growth, share or late row moves
        the rest as of now and the record kept alike."""
        left = [[r, self._rest(record), record[1]] for r, record in sorted(self._left.items())]
        return {"left": left, "pending": sorted(self.pending), "back": sorted(self._back)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], capacities: Capacities) -> Departures:
        """What `to_dict` described (empty for a book saved before it was kept), over the
        loaded book's `capacities`."""
        departures = cls(capacities)
        now = departures._now()
        departures._left = {r: [rest, ahead, *now] for r, rest, ahead in data.get("left", [])}
        departures.pending.update(data.get("pending", []))
        departures._back.update(data.get("back", []))
        return departures


__all__ = ["Departures"]
