"""The lease book's ranks gone (`rayshard.core.departures`) read the spreads and growths of
the members' capacities (`rayshard.core.capacities`), kept there once: a spread or growth
made while every member stalled (taken by each capacity at once) reaches a rank away too,
a snapshot reads the book without changing it, and the lazy capacities equal a pass over
every rank at every spread, ranks gone and back included."""

from __future__ import annotations

import copy
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.core.leases import LeaseBook
from rayshard.plan import intervals as iv

BATCH = 8


def _book(world: int) -> LeaseBook:
    return LeaseBook([(i, i + 10) for i in range(0, 120, 10)], range(world), BATCH)


def _away(book: LeaseBook, rank: int) -> int:
    """What `rank`, away, would get back now (its rest, the growths and shares since)."""
    return book._departed._rest(book._departed._left[rank])


def test_a_share_spread_while_every_member_stalled_reaches_a_rank_away():
    """Capacities 64 (120 rows, 2 ranks); rank 0 leaves, 10 rows received of 30 leased
    (rest 54, 20 given back); rank 1 stalls holding nothing: the 110 rows queued are spread
    over it alone, 112 at once. Rank 0, away, is owed that share on top of its read-ahead
    (20 + 112), as a spread with a rank not stalled would give it."""
    book = _book(2)
    first = [book.lease(0) for _ in range(3)]
    book.ack([(first[0].start, first[0].end)], 0)
    book.release(0)
    assert _away(book, 0) == 54
    book.revoke(1)  # (every member stalled)
    assert book._capacity.get(1) == 112
    assert _away(book, 0) == 20 + 112
    book.join(0)
    assert book.steps(0) == -(-132 // BATCH)


def test_a_growth_while_every_member_stalled_reaches_a_rank_away():
    """Rank 1 stalls (its share went to rank 0: capacity 120), rank 0 leaves with a rest
    of 110 pending, then rank 1, stalled and out of room, asks: every capacity grows by
    the 110 rows queued, in whole batches (112), at once; rank 0's rest by as much."""
    book = _book(2)
    book.revoke(1)
    first = [book.lease(0) for _ in range(3)]
    book.ack([(first[0].start, first[0].end)], 0)
    book.release(0)
    assert _away(book, 0) == 110 and book._departed.pending == {0}
    assert book.lease(1) is not None
    assert book._capacity.get(1) == 112 and not book._departed.pending
    assert _away(book, 0) == 110 + 112
    book.join(0)
    assert book.steps(0) == -(-222 // BATCH)


def test_a_snapshot_reads_the_ranks_gone_without_changing_them():
    """`to_dict` holds each rank's rest as of now and leaves the live records alone: a
    record taken from a snapshot and the live one owe the same rows later."""
    book = _book(3)
    first = [book.lease(0) for _ in range(3)]
    book.ack([(first[0].start, first[0].end)], 0)
    back = book.release(0)
    book.join(3)  # a share spread while rank 0 is away
    live = copy.deepcopy(book._departed._left)
    saved = book.to_dict()
    assert book._departed._left == live
    loaded = LeaseBook.from_dict(json.loads(json.dumps(saved)))
    for copy_ in (book, loaded):
        copy_.revoke(1)  # a spread after the snapshot
        copy_.ack([back[0]], 0)  # a late acknowledgement
    assert _away(book, 0) == _away(loaded, 0)
    assert loaded.to_dict() == book.to_dict()


class EagerBook(LeaseBook):
    """Every spread sets each sharing rank's capacity at once (a pass over every rank),
    as the book did before capacities were spread lazily; the spread is still recorded,
    for the ranks gone, the members' capacities set past it."""

    def _respread(self) -> None:
        if not self._equal:
            super()._respread()
            return
        caps = self._capacity.as_dict()
        ranks = [r for r in sorted(caps) if r not in self._stalled] or sorted(caps)
        share = -(-self.unleased_rows() // (max(len(ranks), 1) * self._batch)) * self._batch
        super()._respread()
        for r in ranks:
            held = self._leased.get(r, 0)
            spare = max(caps[r] - held, 0)
            self._capacity.set(r, held + spare + max(share - spare, 0))


ACTIONS = ["lease"] * 4 + ["ack"] * 2 + ["late", "release", "join", "revoke", "all"]


@settings(max_examples=200, deadline=None)
@given(
    script=st.lists(
        st.tuples(st.sampled_from(ACTIONS), st.integers(0, 3), st.booleans()),
        min_size=10,
        max_size=80,
    )
)
def test_lazy_capacities_and_ranks_gone_equal_a_spread_at_once(script):
    """Leases, acknowledgements (late ones too), losses, rejoins, stalls, every member
    stalling: the book and its eager twin lease alike, have the same capacities and owe
    the ranks gone the same rests (snapshots compared now and then)."""
    books = [LeaseBook([(i, i + 10) for i in range(0, 120, 10)], range(3), BATCH)]
    books.append(EagerBook([(i, i + 10) for i in range(0, 120, 10)], range(3), BATCH))
    held: dict[int, list] = {}
    late: dict[int, list] = {}
    for action, rank, compare in script:
        member = rank in books[0]._capacity
        if action == "lease" and member:
            got = [None if (g := b.lease(rank)) is None else (g.start, g.end) for b in books]
            assert got[0] == got[1]
            if got[0] is not None:
                held.setdefault(rank, []).append(got[0])
        elif action == "ack" and held.get(rank):
            piece = held[rank].pop(0)
            for b in books:
                b.ack([piece], rank)
        elif action == "late" and late.get(rank):
            piece = late[rank].pop(0)
            for b in books:
                b.ack([piece], rank)
        elif action == "release" and member:
            assert books[0].release(rank) == books[1].release(rank)
            late[rank] = late.get(rank, []) + held.pop(rank, [])
        elif action == "join" and not member:
            for b in books:
                b.join(rank)
        elif action in ("revoke", "all") and member:
            for r in sorted(books[0]._capacity) if action == "all" else [rank]:
                back = [iv.normalize(b.revoke(r)) for b in books]
                assert back[0] == back[1]
                kept = [p for p in held.pop(r, []) if iv.subtract((p,), back[0]) == (p,)]
                late[r] = late.get(r, []) + kept
        caps = [b._capacity.as_dict() for b in books]
        assert caps[0] == caps[1]
        gone = [{r: _away(b, r) for r in b._departed._left} for b in books]
        assert gone[0] == gone[1]
        if compare:
            assert books[0].to_dict() == books[1].to_dict()
