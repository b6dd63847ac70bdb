"""A `dynamic` epoch's lease book (`rayshard.core.leases.LeaseBook`) as JSON-safe data and
back: the coordinator's journal snapshots hold it, and a book loaded from one goes on
exactly as the one saved."""

from __future__ import annotations

from typing import Any

from rayshard.core.departures import Departures
from rayshard.core.rank_clocks import RankClocks
from rayshard.core.stretches import LeaseQueue
from rayshard.plan import intervals as iv


def book_to_dict(book: Any) -> dict[str, Any]:
    """The whole book, JSON-safe."""
    return {
        **book._queue.to_dict(),
        "batch": book._batch,
        "equal": book._equal,
        "consumed": [list(r) for r in book.consumed()],
        "leases": [[le.lease_id, le.rank, le.start, le.end] for le in book._leases.values()],
        "next_id": book._next_id,
        "leased": [[r, n] for r, n in sorted(book._leased.items())],
        "capacity": [[r, c] for r, c in sorted(book._capacity.as_dict().items())],
        "requeued_rows": book.requeued_rows,
        "duplicate_rows": book.duplicate_rows,
        "since": book._since.to_list(),
        "stalled": sorted(book._stalled),
        "departed": book._departed.to_dict(),
    }


def load_book(cls: type, data: dict[str, Any], lease: type) -> Any:
    """The book (of class `cls`, its leases of class `lease`) `book_to_dict` described."""
    book = cls([], [], data["batch"], equal_steps=data["equal"])
    book._queue = LeaseQueue.from_dict(data)
    book._consumed_norm = tuple(tuple(r) for r in data["consumed"])
    book._consumed = list(book._consumed_norm)
    book._index({i: lease(i, r, s, e) for i, r, s, e in data["leases"]})
    book._next_id = data["next_id"]
    book._leased.update((r, n) for r, n in data["leased"])
    book.requeued_rows = data["requeued_rows"]
    book._duplicates_carried = data.get("duplicate_rows", 0)  # absent before stragglers
    book._distinct_from = iv.total(book._consumed_norm)
    book._since = RankClocks(data.get("since", []))
    for rank, capacity in data["capacity"]:
        book._capacity.set(rank, capacity)
    book._stalled.update(r for r in data.get("stalled", []) if r in book._capacity)
    book._departed = Departures.from_dict(data.get("departed", {}), book._capacity)
    return book


def book_summary(book: Any) -> dict[str, Any]:
    """JSON-safe summary for stats and debugging."""
    return {
        "unleased_rows": book.unleased_rows(),
        "outstanding": len(book._leases),
        "requeued_rows": book.requeued_rows,
        "duplicate_rows": book.duplicate_rows,
        "stalled": sorted(book._stalled),
        "consumed_rows": iv.total(book.consumed()),
        "capacity": {str(r): c for r, c in book._capacity.as_dict().items()},
    }


__all__ = ["book_summary", "book_to_dict", "load_book"]
