"""Half-open interval arithmetic (`rayshard.plan.intervals`) against a plain-set model.

Small coordinates are checked against Python sets; large ones (up to 10^12) only through
arithmetic that never enumerates.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayshard.plan import intervals as iv

SMALL = st.integers(0, 60)
pairs = st.lists(st.tuples(SMALL, SMALL), max_size=8)


def as_set(intervals) -> set[int]:
    return {i for a, b in intervals for i in range(a, b)}


def as_list(intervals) -> list[int]:
    return [i for a, b in intervals for i in range(a, b)]


def is_normalized(intervals) -> bool:
    return all(a < b for a, b in intervals) and all(
        prev_end < start for (_, prev_end), (start, _) in zip(intervals, intervals[1:])
    )


@settings(max_examples=200, deadline=None)
@given(pairs)
@example([])
@example([(5, 5), (3, 1)])
@example([(0, 3), (3, 6)])
def test_normalize_sorts_merges_and_keeps_the_set(raw):
    out = iv.normalize(raw)
    assert is_normalized(out)
    assert as_set(out) == as_set(raw)
    assert iv.normalize(out) == out
    assert iv.total(out) == len(as_set(raw))


@settings(max_examples=200, deadline=None)
@given(pairs)
@example([(0, 3), (3, 6), (10, 10), (6, 8)])
def test_concat_keeps_reading_order_and_merges_only_touching(raw):
    out = iv.concat(raw)
    assert as_list(out) == as_list(raw)
    assert all(a < b for a, b in out)
    assert all(prev_end != start for (_, prev_end), (start, _) in zip(out, out[1:]))


@settings(max_examples=200, deadline=None)
@given(st.lists(SMALL, max_size=30, unique=True), pairs)
@example([], [])
@example([3, 4, 5], [(0, 100)])
def test_subtract_is_set_difference_in_reading_order(order, removed_raw):
    # A reading order of disjoint single-index pieces, possibly unsorted.
    intervals = iv.concat((i, i + 1) for i in order)
    removed = iv.normalize(removed_raw)
    out = iv.subtract(intervals, removed)
    gone = as_set(removed)
    assert as_list(out) == [i for i in order if i not in gone]


@settings(max_examples=200, deadline=None)
@given(st.lists(SMALL, max_size=30, unique=True), pairs)
def test_intersect_is_set_intersection_in_reading_order(order, other_raw):
    intervals = iv.concat((i, i + 1) for i in order)
    other = iv.normalize(other_raw)
    kept = as_set(other)
    assert as_list(iv.intersect(intervals, other)) == [i for i in order if i in kept]


@settings(max_examples=200, deadline=None)
@given(pairs, st.integers(0, 80), st.integers(0, 80))
@example([(10, 20), (0, 5)], 8, 13)
@example([], 0, 5)
def test_take_is_a_slice_of_the_concatenation(raw, begin, stop):
    intervals = iv.concat(raw)
    assert as_list(iv.take(intervals, begin, stop)) == as_list(intervals)[begin:stop]


@settings(max_examples=200, deadline=None)
@given(pairs)
def test_indices_and_total_agree(raw):
    intervals = iv.concat(raw)
    assert list(iv.indices(intervals)) == as_list(intervals)
    assert iv.total(intervals) == len(as_list(intervals))


BIG = st.integers(0, 10**12)


@settings(max_examples=200, deadline=None)
@given(st.lists(BIG, min_size=2, max_size=12, unique=True), st.data())
def test_big_coordinates_split_and_rejoin_without_enumerating(cuts, data):
    """Cut [lo, hi) anywhere: the pieces are disjoint, total the whole, and recombine."""
    cuts = sorted(cuts)
    whole = ((cuts[0], cuts[-1]),)
    pieces = tuple(zip(cuts, cuts[1:]))
    assert iv.concat(pieces) == whole
    assert iv.normalize(reversed(pieces)) == whole
    assert iv.total(pieces) == cuts[-1] - cuts[0]
    chosen = data.draw(st.lists(st.sampled_from(pieces), unique=True))
    removed = iv.normalize(chosen)
    rest = iv.subtract(whole, removed)
    assert iv.total(rest) + iv.total(removed) == iv.total(whole)
    assert iv.intersect(rest, removed) == ()
    assert iv.normalize(rest + removed) == whole
    begin = data.draw(st.integers(0, iv.total(whole)))
    stop = data.draw(st.integers(begin, iv.total(whole)))
    part = iv.take(whole, begin, stop)
    assert iv.total(part) == stop - begin
    if stop > begin:
        assert part == ((cuts[0] + begin, cuts[0] + stop),)


@given(
    st.lists(st.tuples(st.integers(0, 60), st.integers(0, 8)), max_size=12),
    st.lists(st.integers(0, 25), max_size=8),
)
def test_split_is_take_of_every_consecutive_stretch(pairs, sizes):
    intervals = iv.concat((a, a + n) for a, n in pairs)  # in reading order, not sorted
    stretches = iv.split(intervals, sizes)
    position = 0
    assert len(stretches) == len(sizes)
    for size, stretch in zip(sizes, stretches):
        assert stretch == iv.take(intervals, position, position + size)
        position += size


@settings(max_examples=500)
@given(
    steps=st.lists(st.tuples(st.booleans(), SMALL, st.integers(0, 10)), max_size=20),
    start=pairs,
)
def test_a_list_kept_normalized_piece_by_piece_equals_the_set_it_holds(steps, start):
    """`add_into`/`remove_from` (a lease queue's taken-back rows, changed per piece by
    bisection) keep the list normalized and holding exactly the set's indices."""
    merged, model = list(iv.normalize(start)), as_set(iv.normalize(start))
    for add, first, size in steps:
        if add:
            iv.add_into(merged, first, first + size)
            model |= set(range(first, first + size))
        else:
            iv.remove_from(merged, first, first + size)
            model -= set(range(first, first + size))
        assert is_normalized(merged) and as_set(merged) == model
