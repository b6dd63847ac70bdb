"""A mid-epoch resume under each static policy, without Ray (the coordinator's
`epoch_plan`): the rest is exactly what the uninterrupted epoch had left, planned as the
saving world size planned it; a rank keeps its own rest on the same world size."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayshard.config.loader_config import LoaderConfig
from rayshard.core.planning import epoch_plan
from rayshard.core.state import LoaderState
from rayshard.plan import intervals as iv
from rayshard.sources import TableSource
from rayshard.sources.parquet import ParquetSource


def _consumed(plan, per_rank: int) -> iv.Intervals:
    """What every rank received of `plan` after `per_rank` samples in its reading order."""
    return iv.normalize(p for rank in plan.ranks for p in iv.take(rank.ranges, 0, per_rank))


def _files(folder, sizes) -> ParquetSource:
    start = 0
    for index, rows in enumerate(sizes):
        table = pa.table({"id": pa.array(range(start, start + rows), pa.int64())})
        pq.write_table(table, folder / f"part-{index}.parquet")
        start += rows
    return ParquetSource(str(folder))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 200), st.integers(1, 30), st.integers(1, 4), st.integers(1, 3), st.data())
def test_shuffle_blocks_resumed_on_the_same_world_size_is_the_epochs_tail(
    rows, split, world, batch, data
):
    """Each rank keeps its own stretch of the global sequence minus what it received, so
    ranks that received in step have exactly the uninterrupted epoch's steps left."""
    table = pa.table({"id": pa.array(range(rows), pa.int64())})
    source = TableSource(pa.Table.from_batches(table.to_batches(max_chunksize=split)))
    config = LoaderConfig(batch_size=batch, shuffle_blocks=8, seed=data.draw(st.integers(0, 9)))
    full = epoch_plan(config, source, world, 0)
    steps = data.draw(st.integers(0, max(full.steps - 1, 0)))
    consumed = _consumed(full, steps * batch)
    state = LoaderState("t", 0, config.plan.seed, consumed, world, rows)
    rest = epoch_plan(config, source, world, 0, state)
    for before, after in zip(full.ranks, rest.ranks):
        assert iv.normalize(after.ranges) == iv.normalize(iv.subtract(before.ranges, consumed))
    if consumed:
        assert rest.steps == full.steps - steps


def test_file_or_data_resumes_under_the_policy_the_saving_world_size_had(tmp_path):
    """3 files: `data` on 4 ranks, `file` on 2. A state saved on 4 resumes on 2 (it was
    refused: the rest was planned as `file` on 4, '3 files cannot be split over 4
    shards'); one saved on 2 under `file`, `uneven='drop'` (a file sits out), resumed on
    4, does not read the file that sat out."""
    source = _files(tmp_path, [4, 4, 4])
    for saved, resumed, uneven in ((4, 2, "unbalanced"), (2, 4, "drop")):
        config = LoaderConfig(policy="file_or_data", batch_size=1, uneven=uneven)
        full = epoch_plan(config, source, saved, 1)
        consumed = _consumed(full, 1)
        rest = epoch_plan(config, source, resumed, 1, LoaderState("t", 1, 0, consumed, saved, 12))
        delivered = [p for rank in rest.ranks for p in rank.ranges]
        assert iv.total(delivered) == iv.total(iv.normalize(delivered))  # none twice
        assert iv.normalize(delivered) == iv.subtract(full.delivered(), consumed)


@pytest.mark.parametrize("resumed", [2, 3])
def test_replicate_resumed_gives_every_rank_the_rest(tmp_path, resumed):
    """`uneven='replicate'`: every rank reads every file. Resumed (on any world size),
    every rank reads what no rank received, as under `off` (it was split over the ranks
    on another world size: each rank lost the others' share)."""
    source = _files(tmp_path, [1, 1, 1, 1])
    config = LoaderConfig(policy="file", batch_size=1, uneven="replicate")
    full = epoch_plan(config, source, 2, 0)
    consumed = _consumed(full, 1)
    rest = epoch_plan(config, source, resumed, 0, LoaderState("t", 0, 0, consumed, 2, 4))
    left = iv.subtract(((0, 4),), consumed)
    assert len(rest.ranks) == resumed
    assert all(iv.normalize(rank.ranges) == left for rank in rest.ranks)
