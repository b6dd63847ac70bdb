"""Sample-id sets as numpy runs (`rayshard.plan.id_runs`): `union` gives exactly the pairs
`intervals.normalize` gives, and a `RunSet` fed any stream of pairs holds their set."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.plan import id_runs as ir
from rayshard.plan import intervals as iv

SMALL = st.integers(0, 60)
pairs = st.lists(st.tuples(SMALL, SMALL), max_size=8)


def as_set(intervals) -> set[int]:
    return {i for a, b in intervals for i in range(a, b)}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(SMALL, SMALL), max_size=30))
def test_union_gives_the_pairs_normalize_gives(given_pairs):
    runs = ir.union(ir.as_runs(given_pairs))
    assert runs.dtype == np.int64 and runs.shape == (len(runs), 2)
    assert ir.to_intervals(runs) == iv.normalize(given_pairs)


@settings(max_examples=100, deadline=None)
@given(st.lists(pairs, max_size=12), st.lists(st.tuples(SMALL, SMALL), max_size=4))
def test_a_run_set_holds_the_set_of_every_pair_added(groups, first):
    held = ir.RunSet(first)
    for group in groups:
        held.add(np.array(group, dtype=np.int64).reshape(-1, 2) if group else [])
    everything = [*first, *(p for group in groups for p in group)]
    assert held.merged() == iv.normalize(everything)
    assert as_set(held.merged()) == as_set(everything)


def test_a_run_set_merges_a_scattered_stream_as_it_grows():
    """A shuffled epoch acknowledges about one pair per sample: the set is merged as it
    grows, not kept one pair per sample until a snapshot."""
    n = 4 * ir.MERGE_FLOOR
    order = [(i * 7919) % n for i in range(n)]  # every sample once, scattered
    held = ir.RunSet()
    for start in range(0, n, 64):
        held.add([(i, i + 1) for i in order[start : start + 64]])
        assert len(held) <= n // 2 + ir.MERGE_FLOOR + 64
    assert held.merged() == ((0, n),)
    assert len(held) == 1
