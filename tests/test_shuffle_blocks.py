"""The streaming global shuffle without Ray: every sample exactly once per epoch
(as the plan without it delivers them), same (seed, epoch) same order, a mid-epoch resume
on another world size finishes the epoch exactly once, blocks are permutations of
consecutive rows, and a rank reads splits from the whole dataset."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rayshard.config.loader_config import LoaderConfig
from rayshard.core.planning import epoch_plan
from rayshard.core.shuffle_blocks import block_shuffle, global_sequence
from rayshard.core.state import LoaderState
from rayshard.errors import ConfigError
from rayshard.plan import PlanConfig
from rayshard.plan import intervals as iv
from rayshard.sources import TableSource


def _source(rows: int, split: int) -> TableSource:
    table = pa.table({"id": pa.array(range(rows), pa.int64())})
    return TableSource(pa.Table.from_batches(table.to_batches(max_chunksize=split)))


def _settings(blocks: int, last_batch: str = "partial", seed: int = 3) -> LoaderConfig:
    plan = PlanConfig(batch_size=4, last_batch=last_batch, seed=seed)
    return LoaderConfig(plan=plan, shuffle_blocks=blocks)


def _check_partition(plan, expected: iv.Intervals) -> None:
    ranges = [r for rank in plan.ranks for r in rank.ranges]
    assert iv.total(ranges) == iv.total(expected), "a sample twice"
    assert iv.normalize(ranges) == expected


cases = st.tuples(
    st.integers(1, 300),  # rows
    st.integers(1, 40),  # split rows
    st.integers(1, 5),  # world size
    st.integers(0, 3),  # epoch
    st.sampled_from(["partial", "drop", "fill"]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
@example((1, 1, 5, 0, "partial"))
def test_every_sample_once_in_the_planned_counts(case):
    rows, split, world, epoch, last = case
    source = _source(rows, split)
    # The same samples as a plan that shuffles pieces (with shuffling, `drop` leaves out
    # the same seeded window of each share, whichever shuffle it is).
    plain = epoch_plan(_settings(0, last).replace(shuffle=True), source, world, epoch)
    mixed = epoch_plan(_settings(8, last), source, world, epoch)
    _check_partition(mixed, plain.delivered())
    for a, b in zip(plain.ranks, mixed.ranks):
        assert (iv.total(a.ranges), a.batches, a.padded) == (
            iv.total(b.ranges),
            b.batches,
            b.padded,
        )
    assert epoch_plan(_settings(8, last), source, world, epoch) == mixed  # deterministic


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases, st.integers(1, 5), st.data())
def test_resume_on_another_world_size_finishes_the_epoch_exactly_once(case, new_world, data):
    rows, split, world, epoch, last = case
    source, config = _source(rows, split), _settings(8, last)
    full = epoch_plan(config, source, world, epoch)
    consumed = []
    for rank in full.ranks:  # each rank received a prefix of its own order
        count = data.draw(st.integers(0, iv.total(rank.ranges)))
        consumed += iv.take(rank.ranges, 0, count)
    state = LoaderState("t", epoch, config.plan.seed, iv.normalize(consumed), world, rows)
    rest = epoch_plan(config, source, new_world, epoch, state)
    if not consumed:  # the epoch's start: planned fresh on the new world (its own drops)
        assert rest == epoch_plan(config, source, new_world, epoch)
        return
    remaining = iv.subtract(full.delivered(), iv.normalize(consumed))
    _check_partition(rest, remaining)


def test_a_rank_reads_from_the_whole_dataset_and_epochs_differ():
    source = _source(10_000, 100)  # 100 splits
    first = epoch_plan(_settings(1000), source, 4, 0).ranks[0].ranges
    spread = {start // 100 for start, _ in first}
    assert max(spread) - min(spread) > 50  # not one contiguous quarter of the dataset
    second = epoch_plan(_settings(1000), source, 4, 1).ranks[0].ranges
    assert first != second
    assert global_sequence(source.splits(), 3, 0) == global_sequence(source.splits(), 3, 0)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(1, 20), min_size=0, max_size=12),
    st.integers(1, 30),
    st.integers(0, 5),
)
def test_blocks_are_permutations_of_consecutive_rows_whatever_the_batches(sizes, block, epoch):
    ids = np.arange(sum(sizes))
    cuts = np.cumsum([0, *sizes])
    batches = [pa.record_batch([pa.array(ids[a:b])], names=["i"]) for a, b in zip(cuts, cuts[1:])]
    out = [i for b in block_shuffle(batches, block, 1, epoch, 0) for i in b.column(0).to_pylist()]
    assert sorted(out) == ids.tolist()
    for start in range(0, len(ids), block):
        assert sorted(out[start : start + block]) == ids[start : start + block].tolist()
    whole = [pa.record_batch([pa.array(ids)], names=["i"])] if len(ids) else []
    again = [i for b in block_shuffle(whole, block, 1, epoch, 0) for i in b.column(0).to_pylist()]
    assert again == out  # the same rows cut into other batches: the same order


def test_shuffle_blocks_is_validated():
    with pytest.raises(ConfigError, match="shuffle_blocks=-1"):
        LoaderConfig(plan=PlanConfig(batch_size=4), shuffle_blocks=-1)
    with pytest.raises(ConfigError, match="needs policy='data'"):
        LoaderConfig(plan=PlanConfig(batch_size=4), shuffle_blocks=8, policy="dynamic")
