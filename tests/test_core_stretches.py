"""Rank stretches with work stealing, without Ray: every queued row is leased once, a rank
reads its own stretch in queue order, an idle rank steals the back half of the fullest,
and a book reloaded from its snapshot steals as the live one would."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.core.leases import LeaseBook
from rayshard.core.stretches import LeaseQueue, RankStretches
from rayshard.plan import intervals as iv


def _pieces(sizes: list[int]) -> np.ndarray:
    ends = np.cumsum(sizes)
    return np.stack([ends - np.asarray(sizes), ends], axis=1).astype(np.int64)


takes = st.lists(st.tuples(st.integers(0, 5), st.integers(1, 40)), min_size=1, max_size=80)


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 30), max_size=40), ranks=st.integers(0, 4), script=takes)
def test_every_row_is_taken_once_and_a_take_finds_rows_while_any_are_queued(sizes, ranks, script):
    stretches = RankStretches(_pieces(sizes), range(ranks))
    total, taken = sum(sizes), []
    for rank, room in [*script, *((r, 1 << 40) for r in range(6) for _ in range(len(sizes)))]:
        queued = stretches.rows
        piece = stretches.take(rank, room)
        assert (piece is None) == (queued == 0)
        if piece is not None:
            assert 0 < piece[1] - piece[0] <= room
            assert stretches.rows == queued - (piece[1] - piece[0])
            taken.append(piece)
        assert iv.total(list(stretches)) == stretches.rows
    assert not stretches and iv.total(taken) == total
    assert iv.normalize(taken) == (((0, total),) if total else ())


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=40), ranks=st.integers(1, 4))
def test_stretches_are_even_by_rows_and_in_queue_order(sizes, ranks):
    pieces = _pieces(sizes)
    stretches = RankStretches(pieces, range(ranks))
    assert [p for r in range(ranks) for p in stretches._run(r).tolist()] == pieces.tolist()
    share = sum(sizes) / ranks
    for rank in range(ranks):  # a stretch ends at the first piece edge past its share
        assert stretches.rows_of(rank) < share + max(sizes)


def test_ranks_taking_in_turns_each_read_their_own_stretch_in_order():
    """What the stretches are for: two ranks alternating read two runs, not every other
    piece (which made each rank decode nearly every row group)."""
    stretches = RankStretches(_pieces([10] * 40), [0, 1])
    taken: dict[int, list] = {0: [], 1: []}
    while stretches:
        for rank in (0, 1):
            piece = stretches.take(rank, 10)
            if piece is not None:
                taken[rank].append(piece)
    assert taken[0] == [(i * 10, i * 10 + 10) for i in range(20)]
    assert taken[1] == [(i * 10, i * 10 + 10) for i in range(20, 40)]


def test_an_idle_rank_steals_the_back_half_of_the_fullest_stretch():
    stretches = RankStretches(_pieces([10] * 12), [0, 1, 2])  # 4 pieces each
    assert stretches.take(1, 10) == (40, 50)
    # rank 3 joined, with no stretch: ranks 0 and 2 hold the most (40 rows), the lower
    # one gives the back half of its stretch
    assert stretches.take(3, 10) == (20, 30)
    assert [stretches.rows_of(r) for r in range(4)] == [20, 30, 40, 10]
    assert [stretches.take(1, 10) for _ in range(3)] == [(50, 60), (60, 70), (70, 80)]
    assert stretches.take(1, 10) == (100, 110)  # its own is empty: rank 2's back half
    assert [stretches.rows_of(r) for r in range(4)] == [20, 10, 20, 10]
    assert stretches.take(1, 5) == (110, 115)  # a piece cut to the room: its rest stays
    assert stretches.take(1, 10) == (115, 120)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=40),
    ranks=st.integers(1, 4),
    script=takes,
    reload_at=st.integers(0, 80),
)
def test_the_fullest_stretch_is_the_full_scans_and_a_reloaded_queue_goes_on_alike(
    sizes, ranks, script, reload_at
):
    """At every step the heap names the full scan's fullest stretch; a copy reloaded
    (through JSON, as a journal snapshot) after any takes, cuts and steals takes the
    rest of the script exactly as the live one does."""
    stretches, copy = RankStretches(_pieces(sizes), range(ranks)), None
    for i, (rank, room) in enumerate(script):
        if i == reload_at:
            copy = RankStretches.from_dict(json.loads(json.dumps(stretches.to_dict())))
            assert list(copy) == list(stretches) and copy.rows == stretches.rows
        for book in (stretches, copy) if copy is not None else (stretches,):
            every = sorted(book._span.keys() | book._cut.keys())
            fullest = max(every, key=lambda r: (book.rows_of(r), -r), default=None)
            full = fullest is not None and book.rows_of(fullest) > 0
            assert book._fullest_rank() == (fullest if full else None)
        taken = stretches.take(rank, room)
        if copy is not None:
            assert copy.take(rank, room) == taken


def test_taken_back_rows_are_leased_first_by_any_rank():
    queue = LeaseQueue.of(_pieces([10] * 4), [0, 1])
    assert queue.take(0, 10) == (0, 10)
    queue.put_back([(0, 10)])
    assert queue.requeued_front == 1 and queue.rows == 40
    assert queue.take(1, 10) == (0, 10)  # rank 1's stretch is (20, 40): the taken back first
    assert queue.take(1, 10) == (20, 30)


def test_a_book_without_ranks_keeps_its_rows_for_a_rank_that_joins():
    book = LeaseBook([(0, 10), (10, 20)], [], batch_size=5, equal_steps=False)
    book.join(4)
    leased = [book.lease(4), book.lease(4), book.lease(4)]
    # (from the stretch held for rank 0, which never came: stolen, its back half first)
    assert [(le.start, le.end) for le in leased[:2]] == [(10, 20), (0, 10)] and leased[2] is None


def test_the_coordinators_ranks_leasing_in_turns_read_their_halves_of_the_queue():
    """Through the coordinator's core (commands, as the actor applies them): two ranks
    asking in turns are granted the two halves of the epoch's `dynamic` queue, each in
    queue order, not every other piece of it."""
    import pyarrow as pa

    from rayshard.config.loader_config import LoaderConfig
    from rayshard.core import commands as cmd
    from rayshard.core.coordination import CoordinatorCore
    from rayshard.core.sharding import dynamic_pieces
    from rayshard.plan import PlanConfig
    from rayshard.sources import TableSource

    table = pa.table({"id": pa.array(range(120), pa.int64())})
    source = TableSource(pa.Table.from_batches(table.to_batches(max_chunksize=10)))
    settings = LoaderConfig(plan=PlanConfig(batch_size=8, seed=5), policy="dynamic")
    core = CoordinatorCore("stretches", source, settings)
    for rank in (0, 1):
        core.apply(cmd.Register(rank, 2, rank, 2, 0.0))
    core.apply(cmd.StartEpoch(0, 0))
    granted: dict[int, list] = {0: [], 1: []}
    leasing = True
    while leasing:
        leasing = False
        for rank in (0, 1):
            pieces = core.apply(cmd.Lease(rank, 0, 1)).pieces
            granted[rank] += pieces
            core.apply(cmd.Ack(rank, 0, len(granted[rank]), tuple(pieces)))
            leasing |= bool(pieces)
    queue = dynamic_pieces(settings.plan, source, 2, 0).tolist()
    assert queue != sorted(queue)  # a seeded order
    assert [list(p) for p in granted[0]] == queue[:6]
    assert [list(p) for p in granted[1]] == queue[6:]


def test_a_rank_named_twice_has_one_stretch_and_every_row_is_leased():
    book = LeaseBook([(0, 20), (20, 40)], [1, 1], batch_size=5, equal_steps=False)
    leased = [book.lease(1) for _ in range(3)]
    assert [(le.start, le.end) for le in leased[:2]] == [(0, 20), (20, 40)] and leased[2] is None
