"""A shuffled static reading resumed on the same world size reads the rest in the
uninterrupted reading's order (the README: the resumed rows are the tail of the
uninterrupted stream). The rest's own pieces permuted with the same key came in another
order: fewer or differently cut pieces give another permutation. Pure: the real planner
and `reading_pieces`, no Ray."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.data.reading_order import reading_pieces
from rayshard.plan import DataLayout, PlanConfig, plan_epoch, plan_remaining
from rayshard.plan import intervals as iv


def _rows(pieces) -> list[int]:
    return [i for lo, hi in pieces for i in range(lo, hi)]


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 300),
    world=st.integers(1, 4),
    unit=st.integers(1, 40),
    batch=st.integers(1, 9),
    seed=st.integers(0, 3),
    data=st.data(),
)
def test_a_shuffled_rank_resumed_on_the_same_world_reads_the_uninterrupted_tail(
    n, world, unit, batch, seed, data
):
    config, layout = PlanConfig(batch_size=batch), DataLayout.of_samples(n)
    splits = [(lo, min(lo + unit, n)) for lo in range(0, n, unit)]

    def order(rank, ranges, rest_of=None):
        key = f"rayshard:{seed}:0:{rank}"
        return _rows(reading_pieces(ranges, splits, shuffle=True, rng_key=key, order=rest_of))

    full = [order(r.rank, r.ranges) for r in plan_epoch(config, layout, world, 0).ranks]
    steps = data.draw(st.integers(0, max(len(rows) for rows in full) // batch + 1))
    consumed = iv.normalize((i, i + 1) for rows in full for i in rows[: steps * batch])
    rest = plan_remaining(config, layout, world, 0, consumed)
    for rank, rows in zip(rest.ranks, full):
        assert order(rank.rank, rank.ranges, rank.order) == rows[steps * batch :]


def test_rows_of_a_rank_outside_its_order_come_after_it_none_lost():
    """`order` is the uninterrupted shard; should a plan give a rank rows outside it (a
    re-arrangement after the resume), they are read after the ordered ones, not dropped."""
    splits = [(lo, lo + 5) for lo in range(0, 30, 5)]
    pieces = reading_pieces([(0, 10), (20, 30)], splits, shuffle=True, rng_key="k", order=[(0, 10)])
    assert sorted(_rows(pieces)) == [*range(10), *range(20, 30)]
    assert set(_rows(pieces[:2])) == set(range(10))  # the ordered ones first
