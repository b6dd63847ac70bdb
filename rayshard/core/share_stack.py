"""The shares spread over a `dynamic` epoch's ranks, numbered, for `Capacities` (and, read
through it, `Departures`): what a rank that has not looked since spread `seen` is owed is
the largest share spread after it. Kept as a stack that decreases (a larger share hides the
smaller ones before it), so that question costs a bisection. Shares are kept less the growth
(`Capacities.grow`) before them, and given back with the growth since added by the asker."""

from __future__ import annotations

import bisect


class ShareStack:
    """Spread numbers and their shares (see module docstring)."""

    def __init__(self) -> None:
        self.spreads = 0  # spreads so far: the number of the next one is this plus one
        self._at: list[int] = []  # spread numbers of the stack, increasing
        self._shares: list[int] = []  # their shares less the growth before, decreasing

    def push(self, share: int, grown: int) -> None:
        """A new spread of `share` rows per rank, after a growth of `grown` rows so far."""
        self.spreads += 1
        while self._shares and self._shares[-1] <= share - grown:
            self._at.pop()
            self._shares.pop()
        self._at.append(self.spreads)
        self._shares.append(share - grown)

    def largest_since(self, seen: int) -> int | None:
        """The largest share spread after spread `seen`, less the growth before it (None:
        no spread since)."""
        first = bisect.bisect_right(self._at, seen)
        return self._shares[first] if first < len(self._shares) else None


__all__ = ["ShareStack"]
