"""Which epochs every rank received (`rayshard.runtime.epoch_ends`), without Ray: under
static policies the end is read from the core's journaled counts, so a coordinator
restarted between two ranks' last acknowledgements still sees the epoch end (and compacts
its journal there)."""

from __future__ import annotations

import pyarrow as pa

from rayshard.config.loader_config import LoaderConfig
from rayshard.core import commands as cmd
from rayshard.core.coordination import CoordinatorCore
from rayshard.plan import PlanConfig
from rayshard.runtime.epoch_ends import EpochEnds
from rayshard.sources import TableSource


def _core(ranks: int) -> CoordinatorCore:
    table = pa.table({"id": pa.array(range(96), pa.int64())})
    source = TableSource(pa.Table.from_batches(table.to_batches(max_chunksize=8)))
    core = CoordinatorCore("ends", source, LoaderConfig(plan=PlanConfig(batch_size=8)))
    for rank in range(ranks):
        core.apply(cmd.Register(rank, ranks, rank, ranks))
        core.apply(cmd.StartEpoch(rank, 0))
    return core


def _finish(core: CoordinatorCore, ends: EpochEnds, rank: int) -> bool:
    """Rank `rank` acknowledges its whole epoch 0; whether that ended the epoch."""
    plan = core.plan(0).ranks[rank]
    core.apply(cmd.Ack(rank, 0, plan.batches, tuple(plan.ranges)))
    return ends.acked(core, core.members.generation, 0, rank, plan.batches)


def test_a_static_epoch_ends_across_a_coordinator_restart():
    core = _core(2)
    assert not _finish(core, EpochEnds(), 0)
    restarted = EpochEnds()  # a new coordinator process: rank 0 will not acknowledge again
    assert _finish(core, restarted, 1)
    assert restarted.ended(core.members.generation, 0)


def test_a_lost_rank_that_finished_does_not_stand_for_one_still_reading():
    core = _core(3)
    ends = EpochEnds()
    assert not _finish(core, ends, 0) and not _finish(core, ends, 1)
    core.apply(cmd.Lost(1, "reader died"))
    core.apply(cmd.Register(1, 3, 1, 3))  # its new process reads the epoch again
    core.apply(cmd.StartEpoch(1, 0))
    assert not _finish(core, ends, 2)  # rank 1's new process has not received it all
    assert _finish(core, ends, 1)
