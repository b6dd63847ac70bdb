"""Each rank's capacity in a `dynamic` epoch with equal steps (the rows it may lease),
re-spread when ranks join, leave or stall, without a pass over every rank.

A spread gives every rank that did not stall `max(capacity, leased + share)`, `share`
being what is not leased, in whole batches per such rank (`rayshard.core.leases`' rule).
To a rank whose leased rows did not change in between, several spreads amount to the one
with the largest share. So a spread only records its share, and a rank takes the largest
share recorded since it last settled when it is next read, leases, or stalls (`settle`;
its owner settles a rank before changing its leased rows or whether it stalled). Shares
are kept in a `ShareStack` (`rayshard.core.share_stack`), so settling costs a bisection:
a whole group of W ranks registering again is 2W spreads of O(log W) each, where a pass
over every rank made it O(W^2) (minutes at 10,000 ranks).

A growth (`grow`) adds the same rows to every such rank's capacity (the rest of ranks gone:
capacities equal stay equal). It is settled alike: a rank adds the growths since it last
settled, and a share spread before a growth counts that growth too (the stack keeps each
share less the growths before it).

Every spread and growth is recorded, the rare ones made while every rank stalled too:
those each rank takes at once (a rank that stalled takes nothing when it settles, so none
takes them twice), and the ranks gone read them all (`spreads`, `largest_since`, `grown`:
`rayshard.core.departures`), so that a rank back has the steps the others have.
"""

from __future__ import annotations

from collections.abc import Iterator

from rayshard.core.share_stack import ShareStack


class Capacities:
    """Capacities by rank (None: no cap), over the owner's `leased` rows by rank and its
    `stalled` ranks (members only), both read here and changed by the owner only (see
    module docstring)."""

    def __init__(self, leased: dict[int, int], stalled: set[int]) -> None:
        self._leased, self._stalled = leased, stalled
        self._cap: dict[int, int | None] = {}
        self._seen: dict[int, int] = {}  # rank -> the spreads it took into `_cap`
        self._grown_seen: dict[int, int] = {}  # rank -> the growth it took into `_cap`
        self._grown = 0  # rows every rank's capacity grew by (`grow`)
        self._stack = ShareStack()

    def __contains__(self, rank: object) -> bool:
        return rank in self._cap

    def __len__(self) -> int:
        return len(self._cap)

    def __iter__(self) -> Iterator[int]:
        return iter(self._cap)

    @property
    def spreads(self) -> int:
        """Spreads so far (every one: see module docstring)."""
        return self._stack.spreads

    @property
    def grown(self) -> int:
        """Rows every capacity grew by so far (every growth: see module docstring)."""
        return self._grown

    def largest_since(self, seen: int) -> int | None:
        """The largest share spread after spread `seen`, less the growth before it (None:
        none since): with `grown` added, what a rank gone since then is owed."""
        return self._stack.largest_since(seen)

    def get(self, rank: int) -> int | None:
        """`rank`'s capacity (None: no cap, or not a member)."""
        if rank not in self._cap:
            return None
        self.settle(rank)
        return self._cap[rank]

    def set(self, rank: int, capacity: int | None) -> None:
        """Make (or add) `rank`'s capacity `capacity`, as of now."""
        self._cap[rank], self._seen[rank] = capacity, self._stack.spreads
        self._grown_seen[rank] = self._grown

    def pop(self, rank: int) -> None:
        self._cap.pop(rank, None)
        self._seen.pop(rank, None)
        self._grown_seen.pop(rank, None)

    def settle(self, rank: int) -> None:
        """Apply to `rank` the spreads and growths since it last settled (none while it
        stalled)."""
        seen, self._seen[rank] = self._seen[rank], self._stack.spreads
        grown, self._grown_seen[rank] = self._grown_seen[rank], self._grown
        cap = self._cap[rank]
        if cap is None or rank in self._stalled:
            return
        cap += self._grown - grown
        share = self._stack.largest_since(seen)
        if share is not None:
            cap = max(cap, self._leased.get(rank, 0) + self._grown + share)
        self._cap[rank] = cap

    def spread(self, unleased: int, batch: int) -> None:
        """Spread `unleased` rows, in whole batches, over the ranks that did not stall (or
        over every rank when all of them stalled)."""
        share = self._per_rank(unleased, batch)
        if share is None:
            return
        self._stack.push(share, self._grown)
        if len(self._stalled) == len(self._cap):  # every rank stalled (rare): each takes it
            for rank, cap in self._cap.items():
                if cap is not None:
                    self._cap[rank] = max(cap, self._leased.get(rank, 0) + share)

    def grow(self, rows: int, batch: int) -> None:
        """Add `rows`, in whole batches per rank, to the capacity of every rank that did not
        stall (of every rank when all of them stalled)."""
        grown = self._per_rank(rows, batch)
        if grown is None:
            return
        self._grown += grown
        if len(self._stalled) == len(self._cap):  # every rank stalled (rare): each takes it
            for rank, cap in self._cap.items():
                if cap is not None:
                    self._cap[rank] = cap + grown

    def _per_rank(self, rows: int, batch: int) -> int | None:
        """`rows` over the ranks that did not stall (or every rank), in whole batches
        each (None: no rank)."""
        sharing = len(self._cap) - len(self._stalled) or len(self._cap)  # (O(1): members)
        return -(-rows // (sharing * batch)) * batch if sharing else None

    def as_dict(self) -> dict[int, int | None]:
        """Every rank's capacity, settled."""
        for rank in self._cap:
            self.settle(rank)
        return dict(self._cap)
