"""`dynamic` with equal steps, in the coordinator's pure core (no Ray): a rank whose
iterator is closed or dropped mid-epoch and a new iterator of it registering again gets
the rest of the shared epoch, no more. Its new loop counts its batches from its first:
it used to be given a capacity for the whole epoch on top of what the old loop received
(and its returned read-ahead counted again), so a lone rank's new loop yielded 21 batches
of which 11 were all padding. In a world of 2 or 3 ranks in lockstep the old and new
loops of the rank together yield as many batches as each other rank, every row once."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from rayshard.config.loader_config import LoaderConfig
from rayshard.core import commands as cmd
from rayshard.core.coordination import CoordinatorCore
from rayshard.core.leases import LeaseBook
from rayshard.plan import PlanConfig
from rayshard.plan import intervals as iv
from rayshard.sources import TableSource

ROWS, BATCH = 120, 8


def _core(rows: int = ROWS) -> CoordinatorCore:
    table = pa.table({"id": pa.array(range(rows), pa.int64())})
    source = TableSource(pa.Table.from_batches(table.to_batches(max_chunksize=10)))
    settings = LoaderConfig(plan=PlanConfig(batch_size=BATCH), policy="dynamic")
    return CoordinatorCore("t", source, settings)


class Loop:
    """One iterator's loop: it leases up to `ahead` rows past what it yielded, yields a
    batch per step (padding once no rows come) until the step count of its last answer,
    and acknowledges each batch's rows as it yields it."""

    def __init__(self, core: CoordinatorCore, rank: int, world: int, ahead: int) -> None:
        self.core, self.rank, self.ahead = core, rank, ahead
        self.start = core.apply(cmd.Register(rank, world, rank, world)).epoch  # its epoch
        self.length = core.apply(cmd.StartEpoch(rank, 0))
        self.held: list[tuple[int, int]] = []
        self.rows: list[tuple[int, int]] = []
        self.batches = self.padding = 0

    def read_ahead(self) -> None:
        while iv.total(self.held) < self.ahead:
            answer = self.core.apply(cmd.Lease(self.rank, 0, 1))
            self.length = answer.steps if answer.steps is not None else self.length
            if not answer.pieces:
                return
            self.held += list(answer.pieces)

    def step(self) -> bool:
        """Yield one batch; False once the loop is done."""
        if self.batches >= self.length:
            return False
        self.read_ahead()
        batch, need = [], BATCH
        while need and self.held:
            start, end = self.held[0]
            take = min(need, end - start)
            batch.append((start, start + take))
            need -= take
            self.held[0] = (start + take, end)
            if start + take == end:
                self.held.pop(0)
            if need:
                self.read_ahead()
        self.batches += 1
        if batch:
            self.core.apply(cmd.Ack(self.rank, 0, self.batches, tuple(batch)))
            self.rows += batch
        else:
            self.padding += 1
        return True


def _run(world: int, switching: list[int], *, after: int, ahead: int, drop: bool):
    """Every rank's loop steps in lockstep; after `after` steps each rank of `switching`
    leaves its iterator (closed: a leave, then a new registration; dropped: the new
    registration replaces it) and goes on with a new one. Returns each rank's batches
    (old and new loops together), its all-padding batches and every row received."""
    core = _core()
    loops = {rank: Loop(core, rank, world, ahead) for rank in range(world)}
    steps = dict.fromkeys(loops, 0)
    padding = dict.fromkeys(loops, 0)
    rows: list[tuple[int, int]] = []
    for _ in range(after):
        for loop in loops.values():
            loop.step()
    for rank in switching:
        old = loops[rank]
        steps[rank], padding[rank] = old.batches, old.padding
        rows += old.rows
        if not drop:
            core.apply(cmd.Lost(rank, "left"))
        loops[rank] = Loop(core, rank, world, ahead)
        assert loops[rank].length == old.length - old.batches  # the rest, in lockstep
    while any([loop.step() for loop in loops.values()]):
        pass
    for rank, loop in loops.items():
        steps[rank] += loop.batches
        padding[rank] += loop.padding
        rows += loop.rows
    return steps, padding, rows


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("ahead", [8, 48, ROWS])
def test_a_lone_ranks_new_iterator_gets_the_rest_of_the_epoch(drop, ahead):
    """The hunter's case: 15 batches, the first iterator reads 5 (having leased up to
    the whole epoch ahead); the new one is 10 batches long, every one of them rows."""
    steps, padding, rows = _run(1, [0], after=5, ahead=ahead, drop=drop)
    assert steps == {0: 15} and padding == {0: 0}
    assert iv.total(rows) == ROWS and iv.normalize(rows) == ((0, ROWS),)


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("ahead", [8, 24, 48])
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("every_rank", [False, True])
def test_ranks_back_with_new_iterators_keep_the_steps_equal(world, every_rank, ahead, drop):
    """One rank, or every rank one after the other, takes a new iterator after 3 steps:
    every rank yields the epoch's equal step count, `ceil(rows / (W*B))`, its padding
    no more than the rows leave over, and every row comes once."""
    switching = list(range(world)) if every_rank else [0]
    steps, padding, rows = _run(world, switching, after=3, ahead=ahead, drop=drop)
    equal = -(-ROWS // (world * BATCH))
    assert set(steps.values()) == {equal}
    assert sum(padding.values()) <= world * equal - -(-ROWS // BATCH)
    assert iv.total(rows) == ROWS and iv.normalize(rows) == ((0, ROWS),)


@pytest.mark.parametrize("after", [2, 4, 6, 7])
def test_a_group_restarted_without_a_state_reads_the_rest_of_its_epoch(after):
    """Both ranks of a group are lost after `after` of their 8 steps (a Train group's
    workers killed) and register again: each new iterator starts in the epoch its rank
    was in (past half of it, it started the next one, its received count taken against
    the rest's step count, and the rest of the epoch was never read), the loops take
    equal steps and every row comes once."""
    core = _core()
    loops = [Loop(core, rank, 2, 8) for rank in range(2)]
    for _ in range(after):
        for loop in loops:
            loop.step()
    rows = [r for loop in loops for r in loop.rows]
    for rank in range(2):
        core.apply(cmd.Lost(rank, "reader died"))
    loops = [Loop(core, rank, 2, 8) for rank in range(2)]
    assert [loop.start for loop in loops] == [0, 0]
    while any([loop.step() for loop in loops]):
        pass
    assert [loop.batches for loop in loops] == [8 - after] * 2
    rows += [r for loop in loops for r in loop.rows]
    assert iv.total(rows) == ROWS and iv.normalize(rows) == ((0, ROWS),)


@pytest.mark.parametrize("drop", [False, True])
def test_a_ranks_new_iterator_after_its_whole_share_starts_the_next_epoch(drop):
    """Rank 1 received its 8 batches (all of its share, the last one short) and rank 0 its
    7th when rank 1 takes a new iterator (its old one closed, or dropped and replaced): the
    new one starts epoch 1. (Counting a finished loop's batches anew gave it a step of
    epoch 0's slack, one step more than rank 0: a DDP hang.)"""
    core = _core()
    loops = [Loop(core, rank, 2, 8) for rank in range(2)]
    for _ in range(7):
        for loop in loops:
            loop.step()
    loops[1].step()
    assert loops[1].batches == 8 and iv.total(loops[1].rows) < 64  # (a short last batch)
    if not drop:
        core.apply(cmd.Lost(1, "left"))
    assert core.apply(cmd.Register(1, 2, 1, 2)).epoch == 1


def test_a_lost_loops_late_acknowledgement_leaves_its_new_iterator_in_its_epoch():
    """Rank 1's process dies with its 6th batch received but not acknowledged, and that
    acknowledgement comes after the loss: the new iterator still starts epoch 0, with the
    rest (a lost loop's count no longer moves, or it counted as done past half)."""
    core = _core()
    loops = [Loop(core, rank, 2, 8) for rank in range(2)]
    for _ in range(5):
        for loop in loops:
            loop.step()
    received = len(loops[1].rows)
    loops[1].core = _AcksHeld(core)
    loops[1].step()
    core.apply(cmd.Lost(1, "reader died"))
    core.apply(cmd.Ack(1, 0, 6, tuple(loops[1].rows[received:])))
    new = Loop(core, 1, 2, 8)
    assert new.start == 0 and new.length == 2


@pytest.mark.parametrize("acks_come", ["before", "after"])
def test_acknowledgements_of_a_dropped_iterator_that_come_late_leave_the_new_ones_rest(
    acks_come,
):
    """An iterator dropped, not closed: its reader dies before the acknowledgements of its
    5 batches reach the coordinator, and they come before, or after, the new iterator of
    the rank begins its epoch. Its rows are not read again, and the new loop's step count
    leaves them out (it was 15 then, the last 5 batches all padding)."""
    core = _core()
    old = Loop(core, 0, 1, 88)
    old.core = _AcksHeld(core)
    for _ in range(5):
        old.step()
    old.core = core
    assert core.apply(cmd.Lost(0, "reader died")).requeued  # nothing of it acknowledged
    received = tuple(old.rows)
    if acks_come == "before":
        core.apply(cmd.Ack(0, 0, 5, received))
    new = Loop(core, 0, 1, 8)
    if acks_come == "after":
        assert new.length == 15  # as the book stood: the rows may come again
        core.apply(cmd.Ack(0, 0, 5, received))
    while new.step():
        pass
    assert new.batches == 10 and new.padding == 0
    rows = [*received, *new.rows]
    assert iv.total(rows) == ROWS and iv.normalize(rows) == ((0, ROWS),)


class _AcksHeld:
    """The coordinator, but for the acknowledgements: held back (they come late)."""

    def __init__(self, core: CoordinatorCore) -> None:
        self.core = core

    def apply(self, command):
        return cmd.Noted() if isinstance(command, cmd.Ack) else self.core.apply(command)


def _book(world: int) -> LeaseBook:
    return LeaseBook([(i, i + 10) for i in range(0, ROWS, 10)], range(world), BATCH)


def test_a_rank_back_after_the_others_took_its_rows_matches_their_steps():
    """Rank 1 ran out of room while rank 0 was away: rank 0's rows were spread, the
    others' step counts grew. Rank 0, back, gets that share on top of its read-ahead, as
    each of them got it on top of theirs: in lockstep the loops end at the same step."""
    book = _book(3)
    for rank in range(3):  # each leases to its capacity (40 rows), receives 3 batches
        leases = [book.lease(rank) for _ in range(4)]
        assert book.lease(rank) is None and iv.total([(le.start, le.end) for le in leases]) == 40
        first = leases[0].start
        book.ack([(first, first + 20), (first + 20, first + 24)], rank)
    assert {book.steps(rank) for rank in range(3)} == {5}
    assert iv.total(book.release(0)) == 16  # its read-ahead, queued first
    assert book.steps(1) == 5  # not spread while no rank needs room: rank 0 may be back
    assert book.lease(1) is not None  # out of room: rank 0's rows are spread now
    assert book.steps(1) == book.steps(2) == 6
    book.join(0)
    assert book.steps(0) == 6 - 3  # its new loop: as many steps as the others have left


@pytest.mark.parametrize("reload", [False, True])
def test_a_rank_back_before_any_other_ran_out_of_room_finds_them_as_it_left_them(reload):
    """Rank 0 leaves and comes back (its book saved and loaded between, as a journal
    snapshot does): rank 1's capacity never grew, rank 0's new loop gets the rest of its
    own share, and the book saved after matches the live one's."""
    book = _book(2)
    for rank in (0, 1):
        for _ in range(4):
            lease = book.lease(rank)
        book.ack([(lease.start, lease.end)], rank)  # one piece of the 4 leased received
    book.release(0)
    book.lease(1)  # rank 1 still has room: nothing is spread
    if reload:
        book = LeaseBook.from_dict(book.to_dict())
    book.join(0)
    assert book.steps(1) == 8 and book.steps(0) == (64 - 10) // BATCH + 1
    assert LeaseBook.from_dict(book.to_dict()).to_dict() == book.to_dict()


@pytest.mark.parametrize("lost_at", [1, 3])
@pytest.mark.parametrize("aheads", [(8, ROWS, ROWS), (ROWS, 8, 24, ROWS)])
def test_the_survivors_of_a_loss_keep_equal_steps(aheads, lost_at):
    """The last rank is lost for good (its reader died) after `lost_at` steps, the others
    reading ahead as far as `aheads` say. Once one of them runs out of room, their
    capacities grow alike by what the lost rank's had left: their step counts stay equal,
    and every row comes once. (A share of the queue on top of what each had leased gave
    fewer steps to a rank that had leased less.) A loop at its last step asks once more,
    as a reader does before it ends."""
    core, world = _core(), len(aheads)
    loops = [Loop(core, rank, world, ahead) for rank, ahead in enumerate(aheads)]
    rows: list[tuple[int, int]] = []
    for _ in range(lost_at):
        for loop in loops:
            loop.step()
    rows += loops.pop().rows
    core.apply(cmd.Lost(world - 1, "reader died"))
    while True:
        for loop in loops:
            if loop.batches >= loop.length:
                loop.read_ahead()
        if not any([loop.step() for loop in loops]):
            break
    assert len({loop.batches for loop in loops}) == 1
    rows += [r for loop in loops for r in loop.rows]
    assert iv.total(rows) == ROWS and iv.normalize(rows) == ((0, ROWS),)


@pytest.mark.parametrize("snapshot", ["none", "to_dict", "reload"])
def test_a_late_acknowledgement_decides_alike_across_a_snapshot(snapshot):
    """A rank gone with 20 rows given back, a new rank's spread, then the old loop's late
    acknowledgement of 10 of them: the rank back gets the same capacity whether or not a
    journal snapshot (or a restarted coordinator's reload) came in between (it got 10
    steps live and 9 after a snapshot: the late rows came off the rest alone)."""
    book = LeaseBook([(i, i + 10) for i in range(0, 120, 10)], range(2), 8)
    first = [book.lease(0) for _ in range(3)]
    book.ack([(first[0].start, first[0].end)], 0)
    back = book.release(0)
    book.join(2)
    if snapshot == "to_dict":
        book.to_dict()
    elif snapshot == "reload":
        book = LeaseBook.from_dict(json.loads(json.dumps(book.to_dict())))
    book.ack([back[0]], 0)
    book.join(0)
    assert {rank: book.steps(rank) for rank in book.ranks} == {0: 9, 1: 8, 2: 7}


def test_a_reloaded_book_decides_as_the_live_one_whatever_the_churn():
    """Random leases, acknowledgements (late ones of ranks gone too), losses, joins,
    revokes and restarts: a book saved and loaded after every step gives the same answers
    as one never saved (318 of 3,000 seeds differed before late rows came off both the
    rest and the read-ahead)."""
    for seed in range(100):
        assert _churn(seed, reload=False) == _churn(seed, reload=True), seed


def _churn(seed: int, reload: bool, world: int = 3) -> list:
    rnd = random.Random(seed)
    book = LeaseBook([(i, i + 10) for i in range(0, 240, 10)], range(world), 8)
    held: dict = {r: [] for r in range(world)}
    late: dict = {r: [] for r in range(world)}
    members, trace = set(range(world)), []
    for _ in range(120):
        op = rnd.choice(["lease"] * 5 + ["ack"] * 4 + ["release", "join", "revoke", "restart"])
        rank = rnd.randrange(world)
        if op == "lease" and rank in members:
            lease = book.lease(rank)
            trace.append(None if lease is None else (lease.start, lease.end))
            held[rank] += [] if lease is None else [(lease.start, lease.end)]
        elif op == "ack" and rank in members and held[rank]:
            book.ack([held[rank].pop(0)], rank)
        elif op == "ack" and late[rank] and rnd.random() < 0.5:
            book.ack([late[rank].pop(0)], rank)
        elif op == "release" and rank in members:
            trace.append(tuple(book.release(rank)))
            members.discard(rank)
            late[rank], held[rank] = late[rank] + held[rank], []
        elif op == "join" and rank not in members:
            book.join(rank)
            members.add(rank)
        elif op == "revoke" and rank in members:
            back = iv.normalize(book.revoke(rank))
            kept = [p for p in held[rank] if iv.subtract((p,), back) == (p,)]
            late[rank], held[rank] = late[rank] + kept, []
        elif op == "restart" and rank in members:
            book.restart(rank)
            held[rank] = []
        trace.append(tuple(book.steps(r) for r in sorted(members)))
        if reload:
            book = LeaseBook.from_dict(json.loads(json.dumps(book.to_dict())))
    return trace
