"""Dynamic splitting as pure bookkeeping: the split queue, leases, acknowledgements and
what goes back to the queue when a rank dies or leaves. The coordinator holds one
`LeaseBook` per epoch and journals every call; replaying them rebuilds the same book
(nothing here reads a clock or a random source).
Which queued piece a rank gets is `rayshard.core.stretches`' rule: taken-back rows first,
then the rank's own stretch of the queue, stolen from the fullest one when it is empty.

Equal steps without a per-batch barrier: with `equal_steps`, every rank gets a capacity of
`T*B` rows, `T = ceil(rows / (W*B))`; a lease never exceeds what is left of the rank's
capacity (a split is cut, its rest stays at the front of the rank's stretch). All data
then fits and every rank yields exactly `T` batches, the last ones padded when the queue
ran dry (a rank that left and is back gets the rest: `rayshard.core.departures`).
Without `equal_steps` there is no cap and faster ranks read more.

Stragglers: a lease granted to a rank or an acknowledgement from it restarts its clock
(`since`, a time the caller carries in). `stragglers(now, timeout)` names the ranks that
hold unacknowledged rows and whose clock is older than `timeout`; `revoke` queues their
unacknowledged rows again, first, as `release` does, but the rank stays a member (its
capacity stops at what it kept). Rows acknowledged twice count in `duplicate_rows`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from rayshard.core import lease_snapshots
from rayshard.core.capacities import Capacities
from rayshard.core.departures import Departures
from rayshard.core.rank_clocks import RankClocks
from rayshard.core.stretches import LeaseQueue
from rayshard.plan import intervals as iv
from rayshard.plan import pieces


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
        done = iv.normalize(consumed)  # a resumed epoch's: not leased again
        ranks = list(ranks)
        self._queue = LeaseQueue.of(pieces.rest_of(splits, done), ranks)
        self._out_rows = 0  # rows of the leases not closed
        self._batch, self._equal = batch_size, equal_steps
        self._consumed: list[tuple[int, int]] = list(done)
        self._consumed_norm, self._dirty = done, False
        self._leases: dict[int, Lease] = {}
        self._by_rank: dict[int, dict[int, Lease]] = {}  # the same leases, by rank
        self._next_id = self.requeued_rows = 0
        self._leased: dict[int, int] = {}  # rank -> rows its loop leased this epoch
        self._stalled: set[int] = set()  # ranks whose work was revoked this epoch
        self._capacity = Capacities(self._leased, self._stalled)  # (settled before either
        # changes for a rank: `_unstall`, `lease`, `restart`, `revoke`)
        self._duplicates_carried = self._acked_counted = self._distinct_from = 0  # see below
        self._since = RankClocks()  # rank -> time of its last lease or acknowledgement
        self._departed = Departures(self._capacity)  # ranks gone, with what they had left
        steps = -(-self.unleased_rows() // (max(len(ranks), 1) * batch_size))
        for rank in ranks:
            self._capacity.set(rank, steps * batch_size if equal_steps else None)

    @property
    def ranks(self) -> list[int]:
        return sorted(self._capacity)

    def member_count(self) -> int:
        return len(self._capacity)

    def unleased_rows(self) -> int:
        return self._queue.rows

    def outstanding_rows(self) -> int:
        """Rows of the leases handed out and not closed (acknowledged rows included)."""
        return self._out_rows

    def outstanding(self, rank: int | None = None) -> list[Lease]:
        leases = self._leases if rank is None else self._by_rank.get(rank, {})
        return list(leases.values())

    def outstanding_count(self) -> int:
        """Leases handed out and not closed (O(1), for metrics on every lease)."""
        return len(self._leases)

    def steps(self, rank: int) -> int | None:
        """Batches `rank` yields this epoch (None without equal steps: until the data ends)."""
        cap = self._capacity.get(rank)
        return None if cap is None else -(-cap // self._batch)

    @property
    def duplicate_rows(self) -> int:
        """Rows acknowledged again since rows were first requeued (acknowledged since,
        less the distinct consumed rows' growth since), plus those counted before a load."""
        if not self.requeued_rows:
            return self._duplicates_carried
        growth = iv.total(self.consumed()) - self._distinct_from
        return self._duplicates_carried + self._acked_counted - growth

    def consumed(self) -> iv.Intervals:
        if self._dirty:
            self._consumed_norm = iv.normalize(self._consumed)
            self._consumed = list(self._consumed_norm)
            self._dirty = False
        return self._consumed_norm

    def exhausted(self) -> bool:
        """No split is left to lease (leases may still be out)."""
        return not self._queue

    def lease(self, rank: int, now: float = 0.0) -> Lease | None:
        """The next piece for `rank` (restarting its clock at `now`), or None: none left."""
        if rank not in self._capacity:
            raise KeyError(f"rank {rank} is not a member of this epoch")
        if len(self._since) < len(self._capacity):  # the first lease starts every clock
            self._since.start(self._capacity, now)
        room = self._room(rank)
        if room <= 0 and self._departed.pending and self._queue:
            self._grow()  # it ran out of room: the rows of ranks gone are spread now
            room = self._room(rank)
        while room > 0 and (piece := self._queue.take(rank, room)) is not None:
            start, end = piece
            self._out_rows += end - start
            lease = self._leases[self._next_id] = Lease(self._next_id, rank, start, end)
            self._by_rank.setdefault(rank, {})[self._next_id] = lease
            self._next_id += 1
            self._leased[rank] = self._leased.get(rank, 0) + end - start
            self._since.touch(rank, now)
            return lease
        return None

    def ack(
        self, ranges: Iterable[Sequence[int]], rank: int | None = None, now: float = 0.0
    ) -> None:
        """Samples that reached a consumer of `rank` at `now` (restarts its straggler clock)."""
        pairs = [(int(r[0]), int(r[1])) for r in ranges]
        if rank is not None:
            self._since.touch(rank, now)
            self._unstall(rank)  # it made progress: it may take a share again
        self._consumed.extend(pairs)
        self._dirty = True
        if self.requeued_rows:  # after churn a row may come twice (see `duplicate_rows`)
            self._acked_counted += iv.total(pairs)
        if self._queue.requeued_front and pairs:
            # a straggler delivered taken-back rows after all: they leave the queue
            queued = self._queue.rows
            self._queue.drop(iv.normalize(pairs))
            late = queued - self._queue.rows
            if late and self._departed.late(rank, late) and rank in self._capacity:
                # a rank back: its old loop received them, its new one will not
                cap = self._capacity.get(rank)
                self._capacity.set(rank, max(cap - late, self._leased.get(rank, 0)))

    def others_unfinished(self, rank: int) -> bool:
        """Whether another rank holds a lease not all acknowledged (those met are forgotten)."""
        done, finished, unfinished = self.consumed(), [], False
        for lease in self._leases.values():  # (in id order, as snapshots keep them)
            if lease.rank != rank:
                if unfinished := self._unfinished([lease], done):
                    break
                finished.append(lease)
        for lease in finished:
            del self._leases[lease.lease_id], self._by_rank[lease.rank][lease.lease_id]
            self._out_rows -= lease.end - lease.start
        if not unfinished:
            self._index(dict(self._leases))
        return unfinished

    def _take_back(self, rank: int) -> list[tuple[int, int]]:
        """End `rank`'s leases; returns their unacknowledged rest, queued again first."""
        done = self.consumed()
        back: list[tuple[int, int]] = []
        for lease in self._by_rank.pop(rank, {}).values():
            back.extend(iv.subtract(((lease.start, lease.end),), done))
            del self._leases[lease.lease_id]
            self._out_rows -= lease.end - lease.start
        self._queue.put_back(back)
        rows = iv.total(back)
        if rows and not self.requeued_rows:  # duplicates are counted from now on
            self._distinct_from = iv.total(done)
        self.requeued_rows += rows
        return back

    def release(self, rank: int) -> list[tuple[int, int]]:
        """`rank` died or left: returns its unacknowledged rows, queued again first (the
        others' capacities grow once one runs out of room: `rayshard.core.departures`)."""
        back = self._take_back(rank)
        cap = self._capacity.get(rank)  # (settled: its leased rows change)
        if cap is not None and rank not in self._stalled:  # (a stalled one starts afresh)
            kept = self._leased.pop(rank, 0) - iv.total(back)  # the rows its loop received
            self._departed.leave(rank, cap - kept, iv.total(back))
        self._capacity.pop(rank)
        self._stalled.discard(rank)  # (a new process of that rank starts afresh)
        self._since.forget(rank)  # (the first lease starts the members' clocks: see there)
        return back

    def join(self, rank: int, now: float = 0.0) -> None:
        """A rank takes part from `now` on: a new one gets a share (every capacity is
        re-spread), one back the rest of its own (`rayshard.core.departures`)."""
        if rank not in self._capacity:
            rest = self._departed.back(rank)
            self._capacity.set(rank, rest if rest is not None or not self._equal else 0)
            self._leased[rank] = 0
            self._since.touch(rank, now)
            if rest is None:
                self._respread()

    def stragglers(self, now: float, timeout: float, exclude: int | None = None) -> list[int]:
        """Ranks (but `exclude`) silent for `timeout` before `now` holding unacknowledged
        rows or (equal steps) room for queued rows no one else may take."""
        silent = self._since.silent(now, timeout, exclude)
        leasing = [r for r in silent if r in self._by_rank]  # the rest hold no lease
        done = self.consumed() if leasing else ()
        holding = {r for r in leasing if self._unfinished(self._by_rank[r].values(), done)}
        if self._equal and self._queue:
            holding.update(r for r in silent if r in self._capacity and self._may_take(r))
        return sorted(holding)

    def unstall(self, rank: int) -> None:
        """`rank` asks for work: it is alive, and may take a share again."""
        self._unstall(rank)

    def restart(self, rank: int) -> list[tuple[int, int]]:
        """`rank` reads the epoch again (`set_epoch` in its middle): returns its rows not
        acknowledged, queued again first; its capacity stays, so it may lease them again."""
        back = self._take_back(rank)
        if rank in self._capacity:
            self._capacity.settle(rank)  # (before its leased rows change)
        self._leased[rank] = self._leased.get(rank, 0) - iv.total(back)
        return back

    def revoke(self, rank: int) -> list[tuple[int, int]]:
        """`rank` stalls: returns its unacknowledged rows, queued again first for the
        others; it stays a member, its capacity stops at what it kept."""
        back = self.restart(rank)
        if rank in self._capacity:  # (settled by `restart`)
            self._stalled.add(rank)
            if self._equal:
                self._capacity.set(rank, self._leased[rank])
        self._respread()
        return back

    def held(self, rank: int) -> iv.Intervals:
        """The rows leased to `rank` and not taken back (a revoked reader drops the rest)."""
        return iv.normalize((le.start, le.end) for le in self.outstanding(rank))

    def _index(self, leases: dict[int, Lease]) -> None:
        """Keep `leases` (a new dict: one emptied by deletions keeps its table), by rank too."""
        self._leases, self._by_rank = leases, {}
        for i, lease in leases.items():
            self._by_rank.setdefault(lease.rank, {})[i] = lease
        self._out_rows = sum(le.end - le.start for le in leases.values())

    @staticmethod
    def _unfinished(leases: Iterable[Lease], done: iv.Intervals) -> bool:
        return any(iv.subtract(((le.start, le.end),), done) for le in leases)

    def _may_take(self, rank: int) -> bool:
        return rank not in self._stalled and self._room(rank) > 0

    def _room(self, rank: int) -> int:
        cap = self._capacity.get(rank)  # (settled: its leased rows may change next)
        return 1 << 62 if cap is None else cap - self._leased.get(rank, 0)

    def _unstall(self, rank: int) -> None:
        if rank in self._stalled and rank in self._capacity:
            self._capacity.settle(rank)  # (takes no spread made while it stalled)
        self._stalled.discard(rank)

    def _respread(self) -> None:
        """Re-spread what is not leased over the ranks that did not stall: each gets at
        least its leased rows plus its share, in whole batches, and never less than it had
        (`rayshard.core.capacities`); ranks gone read it there, none of them pending now."""
        self._departed.pending.clear()
        if self._equal:
            self._capacity.spread(self.unleased_rows(), self._batch)

    def _grow(self) -> None:
        """Grow every capacity alike by the rest of the ranks gone, at most the rows
        queued, in whole batches per rank (`rayshard.core.departures`)."""
        rows = min(self._departed.pending_rest(), self.unleased_rows())
        self._departed.pending.clear()
        self._capacity.grow(rows, self._batch)

    def to_dict(self) -> dict[str, Any]:
        """The whole book, JSON-safe (the coordinator's journal snapshots hold it)."""
        return lease_snapshots.book_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LeaseBook:
        """The book `to_dict` described."""
        return lease_snapshots.load_book(cls, data, Lease)

    def snapshot(self) -> dict[str, Any]:
        """JSON-safe summary for stats and debugging."""
        return lease_snapshots.book_summary(self)
