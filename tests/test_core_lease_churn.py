"""The lease book under churn, without Ray: ranks lease, acknowledge (also late, what was
taken back from them), die, stall, join, and the book is reloaded from its snapshot at
any point. Its kept counts (queued rows, leased rows, the requeued front, duplicates) and
its quick straggler check must equal what a full recount finds, and a reloaded book must
go on exactly as the live one."""

from __future__ import annotations

import base64
import itertools
import json
from unittest import mock

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayshard.core import split_queue
from rayshard.core.leases import LeaseBook
from rayshard.core.rank_clocks import RankClocks
from rayshard.core.split_queue import SplitQueue
from rayshard.plan import intervals as iv

TIMEOUT = 5.0

steps = st.lists(
    st.tuples(
        st.sampled_from(["lease"] * 3 + ["ack", "late_ack"] * 2 + ["revoke", "release", "join"]),
        st.integers(0, 3),  # rank (3 joins)
        st.integers(1, 3),  # pieces to acknowledge
        st.sampled_from([0.5, 2.0, 6.0]),  # time passing
        st.booleans(),  # reload a copy of the book from its snapshot here
    ),
    min_size=10,
    max_size=60,
)


class Model:
    """What every rank holds and was taken back from it, and the rows acknowledged."""

    def __init__(self) -> None:
        self.held: dict[int, list[tuple[int, int]]] = {}
        self.taken: dict[int, list[tuple[int, int]]] = {}  # taken back, not delivered
        self.acked: set[int] = set()
        self.duplicates = 0
        self.requeued = False

    def pieces(self, action: str, rank: int, count: int) -> list[tuple[int, int]]:
        """What `rank` delivers now: its next held pieces, or (late) pieces taken back."""
        store = self.held if action == "ack" else self.taken
        pieces, store[rank] = store.get(rank, [])[:count], store.get(rank, [])[count:]
        for i in (i for piece in pieces for i in range(*piece)):
            self.duplicates += self.requeued and i in self.acked
            self.acked.add(i)
        return pieces

    def ever_leased(self) -> set[int]:
        return {
            i for ps in (*self.held.values(), *self.taken.values()) for p in ps for i in range(*p)
        }


def _apply(book: LeaseBook, op: tuple, clock: float, pieces: list) -> object:
    action, rank = op[0], op[1]
    if action == "join":
        return book.join(rank, clock)
    if action == "lease":
        return book.lease(rank, clock)
    if action in ("ack", "late_ack"):
        return book.ack(pieces, rank, clock)
    return book.release(rank) if action == "release" else book.revoke(rank)


def _check(book: LeaseBook, model: Model, total: int, clock: float) -> None:
    queue = list(book._queue)
    live = book.outstanding()
    done = book.consumed()
    assert book.unleased_rows() == iv.total(queue)
    assert book.outstanding_rows() == sum(le.end - le.start for le in live)
    for rank in {le.rank for le in live} | set(book._capacity) | {9}:
        assert book.outstanding(rank) == [le for le in live if le.rank == rank]
    # no acknowledged row waits in the queue; past the requeued front, no queued row was
    # ever leased (so none can be acknowledged while queued: the front is all to check)
    assert not iv.intersect(iv.normalize(queue), done)
    ever = model.ever_leased()
    front = book._queue.requeued_front
    assert not any(i in ever for p in queue[front:] for i in range(*p))
    assert all(any(i in ever for i in range(*p)) for p in queue[:front])  # and no more
    assert book._queue.returned.front_rows == iv.normalize(queue[:front])  # kept merged
    assert iv.normalize([*done, *queue, *((le.start, le.end) for le in live)]) == ((0, total),)
    assert book.duplicate_rows == model.duplicates
    assert len(book._since) == len(book._since.to_list())  # its count of ranks with a clock
    assert iv.total(done) == len(model.acked)
    # the quick straggler check names the ranks a scan of every lease names
    queued_room = {
        r
        for r in book._capacity
        if book._equal and queue and r not in book._stalled and book._room(r) > 0
    }
    for exclude in (None, 0, 1):
        full = sorted(
            r
            for r, since in book._since.to_list()
            if r != exclude
            and clock - since >= TIMEOUT
            and (
                r in queued_room
                or any(iv.subtract(((le.start, le.end),), done) for le in live if le.rank == r)
            )
        )
        assert book.stragglers(clock, TIMEOUT, exclude) == full


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=10),
    equal=st.booleans(),
    batch=st.integers(1, 6),
    script=steps,
)
# A straggler's work goes to another rank, which delivers it; the straggler delivers it
# late (duplicates), with the book reloaded between the two deliveries.
@example(
    sizes=[18, 6],
    equal=False,
    batch=3,
    script=[
        ("lease", 2, 1, 1.0, False),
        ("revoke", 2, 1, 6.0, False),
        ("lease", 1, 1, 0.5, False),
        ("ack", 1, 1, 0.5, False),
        ("late_ack", 2, 1, 0.5, True),
        ("lease", 0, 1, 6.0, True),
        ("late_ack", 2, 1, 0.5, False),
    ],
)
def test_kept_counts_equal_a_recount_and_a_reloaded_book_goes_on_alike(sizes, equal, batch, script):
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    book = LeaseBook(list(zip(offsets, offsets[1:])), range(3), batch, equal_steps=equal)
    copy: LeaseBook | None = None
    model = Model()
    clock = 0.0
    for op in script:
        action, rank, count, dt, reload_here = op
        clock += dt
        if reload_here:  # from here on a copy reloaded now goes in lockstep
            copy = LeaseBook.from_dict(book.to_dict())
        if action != "join" and rank not in book._capacity:
            continue  # not a member: the coordinator refuses its calls
        pieces = model.pieces(action, rank, count) if action in ("ack", "late_ack") else []
        result = _apply(book, op, clock, pieces)
        if copy is not None:
            assert _apply(copy, op, clock, pieces) == result
            assert copy.to_dict() == book.to_dict()
        if action == "lease" and result is not None:
            model.held.setdefault(rank, []).append((result.start, result.end))
        elif action in ("release", "revoke"):
            model.requeued |= bool(result)
            model.taken.setdefault(rank, []).extend(model.held.pop(rank, []))
        _check(book, model, offsets[-1], clock)


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(st.tuples(st.integers(0, 2**62), st.integers(1, 2**20)), max_size=50),
    front=st.integers(0, 60),
)
def test_a_queue_saved_packed_loads_as_it_was(pieces, front):
    """A snapshot holds the queue as packed numbers (`packed`, JSON-safe): loaded, it has
    the same pieces, in order, rows and requeued front."""
    queue = SplitQueue([(start, start + size) for start, size in pieces], front)
    saved = queue.packed()
    assert json.loads(json.dumps(saved)) == saved
    # the journal's format (`pack_pieces`): base64 of little-endian int64 pairs, in order
    as_journaled = np.array(list(queue), dtype="<i8").reshape(-1, 2).tobytes()
    assert saved == base64.b64encode(as_journaled).decode("ascii")
    loaded = SplitQueue.loaded(saved, queue.requeued_front)
    assert list(loaded) == list(queue) and loaded.rows == queue.rows
    assert loaded.requeued_front == queue.requeued_front
    assert loaded.front_rows == queue.front_rows
    assert SplitQueue.loaded(saved).requeued_front == len(pieces)  # (none kept: all)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), max_size=40),
    front=st.integers(0, 5),
    ops=st.lists(st.tuples(st.sampled_from(["take", "back", "save"]), st.integers(1, 40))),
)
def test_a_queue_is_its_pieces_in_order_through_takes_put_backs_and_saves(sizes, front, ops):
    """Against a plain list of pieces: taking (cutting a piece to the room), putting back
    and saving then loading (`packed`) keep the same pieces in the same order, the same
    rows and emptiness, past the pieces the queue turns into tuples ahead of a take."""
    with mock.patch.object(split_queue, "TAKEN_AHEAD", 3):  # its edges met often
        _run_queue_against_a_list(sizes, front, ops)


def _run_queue_against_a_list(sizes: list, front: int, ops: list) -> None:
    offsets = list(itertools.accumulate(sizes, initial=0))
    model = list(zip(offsets, offsets[1:]))
    queue = SplitQueue(model, front)
    out: list[tuple[int, int]] = []
    for op, n in ops:
        if op == "take" and model:
            start, end = model.pop(0)
            if end - start > n:
                model.insert(0, (start + n, end))
                end = start + n
            assert queue.take(n) == (start, end)
            out.append((start, end))
        elif op == "back" and out:
            returned, out = out[-n:], out[:-n]
            queue.put_back(returned)
            model[:0] = returned
        elif op == "save":
            front = queue.requeued_front
            queue = SplitQueue.loaded(queue.packed(), front)
            assert queue.requeued_front == front
        assert list(queue) == model
        assert queue.rows == iv.total(model) and bool(queue) == bool(model)


def _leased_rows(queue: SplitQueue) -> list[tuple[int, int]]:
    return list(queue)[: queue.requeued_front]


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.integers(1, 20), min_size=1, max_size=8),
    ops=st.lists(st.tuples(st.sampled_from(["take", "back", "drop"]), st.integers(1, 25))),
)
def test_taken_back_rows_stay_in_the_queues_front_pieces(pieces, ops):
    offsets = [0]
    for size in pieces:
        offsets.append(offsets[-1] + size)
    queue = SplitQueue(zip(offsets, offsets[1:]))
    out: list[tuple[int, int]] = []  # taken, not put back
    back_rows: set[int] = set()  # rows put back and still queued
    for op, n in ops:
        if op == "take" and queue:
            out.append(queue.take(n))
        elif op == "back" and out:
            returned, out = out[-n:], out[:-n]
            queue.put_back(returned)
            back_rows |= {i for p in returned for i in range(*p)}
        elif op == "drop":
            received = iv.normalize((i, i + 1) for i in sorted(back_rows)[::n])
            queue.drop(received)
            back_rows -= {i for p in received for i in range(*p)}
        queued = {i for p in queue for i in range(*p)}
        back_rows &= queued
        assert queue.rows == len(queued)
        front = {i for p in _leased_rows(queue) for i in range(*p)}
        assert back_rows <= front
        assert queue.front_rows == iv.normalize(_leased_rows(queue))


def test_a_negative_rank_moves_no_other_ranks_clock():
    clocks = RankClocks([[0, 1.0], [1, 2.0]])
    with pytest.raises(ValueError, match="rank -1 is negative"):
        clocks.touch(-1, 9.0)
    assert clocks.to_list() == [[0, 1.0], [1, 2.0]] and clocks.silent(7.0, 5.0) == [0, 1]


class EagerBook(LeaseBook):
    """The book as it was before capacities were spread lazily: every spread sets every
    sharing rank's capacity at once (the reference `rayshard.core.capacities` must equal)."""

    def _respread(self) -> None:
        if not self._equal:
            return super()._respread()
        caps = self._capacity.as_dict()
        super()._respread()  # (recorded for the ranks gone: `rayshard.core.departures`)
        ranks = [r for r in sorted(caps) if r not in self._stalled] or sorted(caps)
        if not ranks:
            return
        share = -(-self.unleased_rows() // (len(ranks) * self._batch)) * self._batch
        for r in ranks:
            held = self._leased.get(r, 0)
            spare = max(caps[r] - held, 0)
            self._capacity.set(r, held + spare + max(share - spare, 0))


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=10),
    batch=st.integers(1, 6),
    script=steps,
)
def test_capacities_spread_lazily_equal_capacities_spread_at_once(sizes, batch, script):
    """Spreads recorded and taken by each rank when it is next read (O(log W) a spread)
    give every rank, after every call, the capacity a pass over every rank gave."""
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    splits = list(zip(offsets, offsets[1:]))
    books = [cls(splits, range(3), batch, equal_steps=True) for cls in (LeaseBook, EagerBook)]
    model, clock = Model(), 0.0
    for action, rank, count, dt, compare in script:
        clock += dt
        if action != "join" and rank not in books[0]._capacity:
            continue
        pieces = model.pieces(action, rank, count) if action in ("ack", "late_ack") else []
        results = [_apply(book, (action, rank), clock, pieces) for book in books]
        if count == 3:  # (a rank asking for work: it may take a share again)
            for book in books:
                book.unstall(rank)
        assert results[0] == results[1]
        if compare:  # (now and then: reading every rank settles them all)
            assert books[0].to_dict() == books[1].to_dict()
        if action == "lease" and results[0] is not None:
            model.held.setdefault(rank, []).append((results[0].start, results[0].end))
        elif action in ("release", "revoke"):
            model.requeued |= bool(results[0])
            model.taken.setdefault(rank, []).extend(model.held.pop(rank, []))
    assert books[0].to_dict() == books[1].to_dict()
