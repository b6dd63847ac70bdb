"""A loader-wide state taken after a rank was lost mid-epoch, once the ranks still here
went on to the next epoch (static policies: nothing hands the lost rank's rest to them):
the state resumes the earlier epoch's rest (repeating what they read of the next one),
not the next epoch, which would lose the lost rank's unread rows for good. A rest a rank
still here left by its loop's choice (`set_epoch` to a later epoch) stays left. Pure: the
coordinator's core without Ray."""

from __future__ import annotations

import pyarrow as pa
import pytest

from rayshard.config.loader_config import LoaderConfig
from rayshard.core import commands as cmd
from rayshard.core.coordination import CoordinatorCore
from rayshard.plan import PlanConfig
from rayshard.plan import intervals as iv
from rayshard.sources import TableSource

ROWS, BATCH = 120, 8


def _core(shuffle: bool = False, registered=(0, 1), **options) -> CoordinatorCore:
    table = pa.table({"id": pa.array(range(ROWS), pa.int64())})
    source = TableSource(pa.Table.from_batches(table.to_batches(max_chunksize=10)))
    plan = PlanConfig(batch_size=BATCH, seed=options.pop("seed", 3))
    settings = LoaderConfig(plan=plan, shuffle=shuffle, **options)
    core = CoordinatorCore("left-behind", source, settings)
    for rank in registered:
        core.apply(cmd.Register(rank, 2, rank, 2))
    return core


def _first(ranges: iv.Intervals, n: int) -> tuple[tuple[int, int], ...]:
    """The first `n` samples of `ranges`, in reading order."""
    out, left = [], n
    for start, end in ranges:
        take = min(left, end - start)
        if take:
            out.append((start, start + take))
        left -= take
    return tuple(out)


def _read(core: CoordinatorCore, rank: int, epoch: int, batches: int | None = None) -> tuple:
    """Rank `rank` starts `epoch` and acknowledges `batches` of it (all by default)."""
    plan = core.apply(cmd.StartEpoch(rank, epoch))
    batches = plan.batches if batches is None else batches
    ids = _first(plan.ranges, batches * BATCH)
    core.apply(cmd.Ack(rank, epoch, batches, ids))
    return ids


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_state_after_a_lost_rank_resumes_its_epochs_rest(shuffle):
    core = _core(shuffle)
    took = _read(core, 1, 0, batches=2)
    core.apply(cmd.Lost(1, "reader died"))
    whole = _read(core, 0, 0)  # rank 0 finishes epoch 0 ...
    _read(core, 0, 1, batches=1)  # ... and takes a batch of epoch 1
    state = core.state_at(1, 1)
    assert state["epoch"] == 0
    assert iv.normalize(state["consumed"]) == iv.normalize([*whole, *took])
    unread = iv.subtract(((0, ROWS),), iv.normalize(state["consumed"]))
    assert iv.total(unread) == ROWS - iv.total(whole) - 2 * BATCH  # rank 1's rest, to read


def test_a_rest_left_by_a_rank_still_here_stays_left():
    """Both ranks went on to epoch 1 by their loops' choice (rank 0 before its epoch 0
    ended): the state is epoch 1's, as before."""
    core = _core(False)
    _read(core, 0, 0, batches=2)
    _read(core, 1, 0)
    first = _read(core, 0, 1, batches=1)
    second = _read(core, 1, 1, batches=1)
    state = core.state_at(1, 1)
    assert state["epoch"] == 1
    assert iv.normalize(state["consumed"]) == iv.normalize([*first, *second])


def test_an_epoch_the_lost_rank_had_finished_is_not_resumed():
    core = _core(False)
    _read(core, 1, 0)
    _read(core, 0, 0)
    _read(core, 1, 1, batches=1)
    core.apply(cmd.Lost(1, "reader died"))
    _read(core, 0, 1)
    _read(core, 0, 2, batches=1)
    state = core.state_at(2, 1)  # epoch 1's rest of rank 1 is behind; epoch 0 was whole
    assert state["epoch"] == 1
    assert iv.total(iv.normalize(state["consumed"])) == ROWS - (ROWS // 2 - BATCH)


@pytest.mark.parametrize("seed", range(8))
def test_a_lost_ranks_rest_in_a_shuffle_blocks_order_is_found(seed):
    """Under `shuffle_blocks` a rank's ranges come in reading order, not sorted: its last
    batch left unread is found all the same."""
    core = _core(shuffle_blocks=3, seed=seed)
    plan = core.apply(cmd.StartEpoch(1, 0))
    core.apply(cmd.Ack(1, 0, plan.batches - 1, _first(plan.ranges, (plan.batches - 1) * BATCH)))
    core.apply(cmd.Lost(1, "reader died"))
    _read(core, 0, 0)
    _read(core, 0, 1, batches=1)
    assert core.state_at(1, 1)["epoch"] == 0


def test_a_rest_the_lost_rank_left_by_going_on_itself_stays_left():
    """Rank 1 went on to epoch 1 by its loop's choice (`set_epoch`), then was lost: its
    rest of epoch 0 was its loop's to leave."""
    core = _core()
    _read(core, 1, 0, batches=2)
    _read(core, 1, 1, batches=1)
    core.apply(cmd.Lost(1, "reader died"))
    _read(core, 0, 0)
    _read(core, 0, 1, batches=1)
    assert core.state_at(1, 1)["epoch"] == 1


def test_a_rank_that_never_registered_leaves_nothing_behind():
    """One process reading rank 0 of 2: rank 1's share was never anyone's to read."""
    core = _core(registered=(0,))
    _read(core, 0, 0)
    taken = _read(core, 0, 1, batches=1)
    state = core.state_at(1, 1)
    assert state["epoch"] == 1 and iv.normalize(state["consumed"]) == iv.normalize(taken)
