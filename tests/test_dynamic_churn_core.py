"""`dynamic` at an epoch's end and across churn, in the coordinator's pure core (no Ray):
a rank past its last step waits while rows it could inherit are queued, a rank new to the
loader or back after its epoch was forgotten joins the running epoch, and a rank revoked
as a straggler takes part again once its new process registers."""

from __future__ import annotations

import pyarrow as pa
import pytest

from rayshard.config.loader_config import LoaderConfig
from rayshard.core import commands as cmd
from rayshard.core.coordination import CoordinatorCore
from rayshard.plan import PlanConfig
from rayshard.plan import intervals as iv
from rayshard.sources import TableSource

ROWS, BATCH = 40, 4


def _core(**options) -> CoordinatorCore:
    table = pa.table({"id": pa.array(range(ROWS), pa.int64())})
    source = TableSource(pa.Table.from_batches(table.to_batches(max_chunksize=10)))
    plan = PlanConfig(batch_size=BATCH, equal_steps=options.pop("equal_steps", True))
    return CoordinatorCore("t", source, LoaderConfig(plan=plan, policy="dynamic", **options))


def _drain(core: CoordinatorCore, rank: int, epoch: int, acked: list) -> cmd.Leased:
    """`rank` leases and acknowledges until it gets nothing; the last answer."""
    while (answer := core.apply(cmd.Lease(rank, epoch, 4, finishing=True))).pieces:
        core.apply(cmd.Ack(rank, epoch, 1, answer.pieces))
        acked.extend(answer.pieces)
    return answer


def test_a_rank_past_its_last_step_waits_while_rows_are_queued_and_inherits_a_lost_ranks():
    """Rank 0 read its share while rank 1 had leased nothing yet: it waits (it used to end
    the epoch, and the rows rank 1 lost were spread onto it after it had moved on: lost).
    Rank 1 leases, dies; rank 0's next ask gets those rows; every row comes once."""
    core, acked = _core(), []
    for rank in (0, 1):
        core.apply(cmd.Register(rank, 2, rank, 2))
        core.apply(cmd.StartEpoch(rank, 0))
    assert _drain(core, 0, 0, acked).wait  # rank 1's share is still queued
    taken = core.apply(cmd.Lease(1, 0, 1)).pieces
    assert taken and core.apply(cmd.Lost(1, "reader died")).requeued == taken
    assert not _drain(core, 0, 0, acked).wait
    assert iv.total(acked) == ROWS and iv.normalize(acked) == ((0, ROWS),)
    assert core.epoch_complete(0)


def _read_alone(core: CoordinatorCore, rank: int, epochs: range) -> None:
    for epoch in epochs:
        core.apply(cmd.StartEpoch(rank, epoch))
        _drain(core, rank, epoch, [])
        assert core.epoch_complete(epoch)


def test_a_rank_new_to_a_loader_whose_ranks_all_left_starts_where_they_were():
    """Rank 0 read epochs 0-1 and began 2, then its group restarted with two workers: the
    new rank 1, registering first, starts at epoch 2 (it started at 0, re-reading)."""
    core = _core()
    core.apply(cmd.Register(0, 1, 0, 1))
    _read_alone(core, 0, range(2))
    core.apply(cmd.StartEpoch(0, 2))
    core.forget_past_epochs()
    core.apply(cmd.Lost(0, "group restart"))
    assert core.apply(cmd.Register(1, 2, 1, 2)).epoch == 2
    assert core.apply(cmd.Register(0, 2, 0, 2)).epoch == 2


def test_a_rank_back_after_its_epoch_was_forgotten_joins_the_running_one():
    core = _core()
    for rank in (0, 1):
        core.apply(cmd.Register(rank, 2, rank, 2))
    core.apply(cmd.StartEpoch(0, 0))
    core.apply(cmd.Lost(0, "left"))
    _read_alone(core, 1, range(2))
    core.apply(cmd.StartEpoch(1, 2))
    assert core.forget_past_epochs() == [0]
    assert core.apply(cmd.Register(0, 2, 0, 2)).epoch == 2  # (it was told epoch 0: again)


@pytest.mark.parametrize("equal_steps", [False, True])
def test_a_straggler_lost_and_registered_again_takes_part(equal_steps):
    """Rank 1 was revoked as a straggler, then its process died and came back: it is no
    longer held as stalled (it got no capacity, a length of 0, and the epoch's rest)."""
    core = _core(equal_steps=equal_steps, straggler_timeout_s=5.0)
    for rank in (0, 1):
        core.apply(cmd.Register(rank, 2, rank, 2, 0.0))
        core.apply(cmd.StartEpoch(rank, 0, 0.0))
    assert core.apply(cmd.Lease(1, 0, 1, time=0.0)).pieces
    while (answer := core.apply(cmd.Lease(0, 0, 1, time=1.0))).pieces:
        core.apply(cmd.Ack(0, 0, 1, answer.pieces, 1.0))
    assert core.apply(cmd.Lease(0, 0, 1, time=10.0)).stragglers == (1,)
    core.apply(cmd.Lost(1, "reader died", 11.0))
    core.apply(cmd.Register(1, 2, 1, 2, 12.0))
    assert core.books[0].snapshot()["stalled"] == []


def test_the_core_keeps_the_latest_events_only():
    """Events are kept to the latest `EVENTS_KEPT` (10,000 ranks' first registrations
    alone were 10,000 `rank_joined` events in every snapshot), also through a snapshot."""
    from rayshard.core.snapshots import EVENTS_KEPT

    core = _core()
    world = EVENTS_KEPT + 200
    for rank in range(world):
        core.apply(cmd.Register(rank, world, rank, world, float(rank)))
    events = core.summary()["events"]
    assert len(events) == EVENTS_KEPT and events[-1]["dp_rank"] == world - 1
    restored = _core()
    restored.load_dict(core.to_dict())
    assert list(restored.events) == list(core.events)
    restored.apply(cmd.Lost(0, "gone", 0.0))
    assert len(restored.events) == EVENTS_KEPT and restored.events[-1]["event"] == "rank_lost"


def test_an_epoch_ends_asks_forget_the_same_leases_live_and_after_a_snapshot():
    """The acknowledged leases an ask meets (and forgets) are taken in lease order, which a
    snapshot keeps: a book loaded from one answers and forgets exactly as the live one."""
    from rayshard.core.leases import LeaseBook

    def run(snapshot: bool) -> tuple:
        book = LeaseBook([(0, 10), (10, 20), (20, 30), (30, 40)], [0, 1, 2], 10, equal_steps=False)
        book.lease(0), book.lease(1), book.lease(0)
        book.ack([(0, 10)], 0)
        first = book.others_unfinished(2)
        book = LeaseBook.from_dict(book.to_dict()) if snapshot else book
        book.ack([(10, 20)], 1)
        return first, book.others_unfinished(2), book.to_dict()

    assert run(False) == run(True)
