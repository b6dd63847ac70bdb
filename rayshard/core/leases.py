"""Dynamic splitting as pure bookkeeping: the split queue, leases, acknowledgements and
what goes back to the queue when a rank dies or leaves (SPEC 7).

The coordinator actor holds one `LeaseBook` per epoch and journals every call; replaying
the calls rebuilds the same book, because nothing here reads a clock or a random source.

Equal steps without a per-batch barrier: with `equal_steps`, every rank gets a capacity of
`T*B` rows, `T = ceil(rows / (W*B))`; a lease never exceeds what is left of the rank's
capacity (a split is cut, its rest stays at the front of the queue). All data then fits
and every rank yields exactly `T` batches, the last ones padded when the queue ran dry.
Without `equal_steps` there is no cap and faster ranks read more.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from rayshard.plan import intervals as iv


@dataclasses.dataclass
class Lease:
    """A piece of a split handed to one rank."""

    lease_id: int
    rank: int
    start: int
    end: int


class LeaseBook:
    """The dynamic state of one epoch (see module docstring)."""

    def __init__(
        self,
        splits: Sequence[tuple[int, int]],
        ranks: Iterable[int],
        batch_size: int,
        *,
        equal_steps: bool = True,
        consumed: Sequence[tuple[int, int]] = (),
    ) -> None:
        done = iv.normalize(consumed)
        self._queue: collections.deque[tuple[int, int]] = collections.deque(
            piece for split in splits for piece in iv.subtract((tuple(split),), done)
        )
        self._batch = batch_size
        self._equal = equal_steps
        self._consumed: list[tuple[int, int]] = list(done)
        self._consumed_norm: iv.Intervals = done
        self._dirty = False
        self._leases: dict[int, Lease] = {}
        self._next_id = 0
        self._leased: dict[int, int] = {}  # rank -> rows leased this epoch (kept on release)
        self._capacity: dict[int, int | None] = {}
        self.requeued_rows = 0
        self._set_capacities(list(ranks), initial=True)

    # -- queries ---------------------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        return sorted(self._capacity)

    def unleased_rows(self) -> int:
        return iv.total(self._queue)

    def outstanding(self, rank: int | None = None) -> list[Lease]:
        return [le for le in self._leases.values() if rank is None or le.rank == rank]

    def outstanding_count(self) -> int:
        """Leases handed out and not closed (O(1), for metrics on every lease)."""
        return len(self._leases)

    def steps(self, rank: int) -> int | None:
        """Batches `rank` yields this epoch (None without equal steps: until the data ends)."""
        cap = self._capacity.get(rank)
        return None if cap is None else -(-cap // self._batch)

    def consumed(self) -> iv.Intervals:
        if self._dirty:
            self._consumed_norm = iv.normalize(self._consumed)
            self._consumed = list(self._consumed_norm)
            self._dirty = False
        return self._consumed_norm

    def exhausted(self) -> bool:
        """No split is left to lease (leases may still be out)."""
        return not self._queue

    # -- changes (each is journaled by the coordinator) ------------------------------------
    def lease(self, rank: int) -> Lease | None:
        """The next piece of work for `rank`, or None if the queue is empty or its capacity
        is used up."""
        if rank not in self._capacity:
            raise KeyError(f"rank {rank} is not a member of this epoch")
        room = self._room(rank)
        while self._queue and room > 0:
            start, end = self._queue.popleft()
            if end - start > room:
                self._queue.appendleft((start + room, end))
                end = start + room
            lease = Lease(self._next_id, rank, start, end)
            self._next_id += 1
            self._leases[lease.lease_id] = lease
            self._leased[rank] = self._leased.get(rank, 0) + end - start
            return lease
        return None

    def ack(self, ranges: Iterable[Sequence[int]]) -> None:
        """Samples that reached a consumer; finished leases are closed."""
        self._consumed.extend(tuple(r) for r in ranges)
        self._dirty = True

    def close_finished(self) -> None:
        """Forget leases whose samples were all acknowledged."""
        done = self.consumed()
        for lease_id in [
            le.lease_id
            for le in self._leases.values()
            if not iv.subtract(((le.start, le.end),), done)
        ]:
            del self._leases[lease_id]

    def release(self, rank: int) -> list[tuple[int, int]]:
        """`rank` died or left: the unacknowledged rest of its leases goes back to the front
        of the queue, and the survivors' capacities grow to take it. Returns those pieces."""
        done = self.consumed()
        back: list[tuple[int, int]] = []
        for lease in self.outstanding(rank):
            back.extend(iv.subtract(((lease.start, lease.end),), done))
            del self._leases[lease.lease_id]
        self._queue.extendleft(reversed(back))
        self.requeued_rows += iv.total(back)
        self._capacity.pop(rank, None)
        self._set_capacities(self.ranks, initial=False)
        return back

    def join(self, rank: int) -> None:
        """A new rank takes part from now on (capacities of everyone are re-spread)."""
        if rank not in self._capacity:
            self._capacity[rank] = 0
            self._set_capacities(self.ranks, initial=False)

    # -- internals -------------------------------------------------------------------------
    def _room(self, rank: int) -> int:
        cap = self._capacity[rank]
        return 1 << 62 if cap is None else cap - self._leased.get(rank, 0)

    def _set_capacities(self, ranks: list[int], *, initial: bool) -> None:
        if not self._equal:
            self._capacity = {r: None for r in ranks}
            return
        if not ranks:
            self._capacity = {}
            return
        unleased = self.unleased_rows()
        if initial:
            steps = -(-unleased // (len(ranks) * self._batch))
            self._capacity = {r: steps * self._batch for r in ranks}
            return
        # Spread what is not leased over everyone, in whole batches, on top of what each
        # rank already leased; a rank's capacity never shrinks below what it holds.
        share = -(-unleased // (len(ranks) * self._batch)) * self._batch
        spare = {r: (self._capacity.get(r) or 0) - self._leased.get(r, 0) for r in ranks}
        self._capacity = {
            r: self._leased.get(r, 0) + max(spare[r], 0) + max(share - max(spare[r], 0), 0)
            for r in ranks
        }

    def to_dict(self) -> dict[str, Any]:
        """The whole book, JSON-safe (the coordinator's journal snapshots hold it)."""
        return {
            "queue": [list(p) for p in self._queue],
            "batch": self._batch,
            "equal": self._equal,
            "consumed": [list(r) for r in self.consumed()],
            "leases": [[le.lease_id, le.rank, le.start, le.end] for le in self._leases.values()],
            "next_id": self._next_id,
            "leased": [[r, n] for r, n in sorted(self._leased.items())],
            "capacity": [[r, c] for r, c in sorted(self._capacity.items())],
            "requeued_rows": self.requeued_rows,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LeaseBook:
        """The book `to_dict` described."""
        book = cls([], [], data["batch"], equal_steps=data["equal"])
        book._queue = collections.deque(tuple(p) for p in data["queue"])
        book._consumed_norm = tuple(tuple(r) for r in data["consumed"])
        book._consumed = list(book._consumed_norm)
        book._leases = {i: Lease(i, r, s, e) for i, r, s, e in data["leases"]}
        book._next_id = data["next_id"]
        book._leased = {r: n for r, n in data["leased"]}
        book._capacity = {r: c for r, c in data["capacity"]}
        book.requeued_rows = data["requeued_rows"]
        return book

    def snapshot(self) -> dict[str, Any]:
        """JSON-safe summary for stats and debugging."""
        return {
            "unleased_rows": self.unleased_rows(),
            "outstanding": len(self._leases),
            "requeued_rows": self.requeued_rows,
            "consumed_rows": iv.total(self.consumed()),
            "capacity": {str(r): c for r, c in self._capacity.items()},
        }
