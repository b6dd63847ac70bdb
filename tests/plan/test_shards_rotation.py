"""Balanced shards and shard rotation across epochs, incl. `stride_shift`."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayshard.plan import (
    DataLayout,
    PlanConfig,
    Rotation,
    balanced_range,
    balanced_ranges,
    plan_epoch,
    shard_of,
)
from rayshard.plan import intervals as iv

N = st.one_of(st.integers(0, 100), st.integers(0, 10**7))
EPOCH = st.one_of(st.integers(0, 50), st.integers(0, 10**9))


@settings(max_examples=300, deadline=None)
@given(N, st.integers(1, 2000))
@example(0, 1)
@example(0, 7)
@example(3, 8)  # fewer samples than shards
@example(10**7, 3)
def test_balanced_shards_are_disjoint_covering_and_within_one(n, s):
    ranges = balanced_ranges(s, n)
    assert len(ranges) == s
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    # Consecutive: each shard starts where the previous ended (disjoint and covering).
    assert all(a_end == b_start for (_, a_end), (b_start, _) in zip(ranges, ranges[1:]))
    sizes = [end - start for start, end in ranges]
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1
    assert sum(sizes) == n
    assert iv.normalize(ranges) == (((0, n),) if n else ())
    for i in {0, s // 2, s - 1}:
        assert balanced_range(i, s, n) == (i * n // s, (i + 1) * n // s)


def rotations_and_world(draw, rotation: Rotation):
    w = draw(st.integers(1, 24))
    if rotation is Rotation.NONE:
        s = w
    elif rotation in (Rotation.STRIDE, Rotation.STRIDE_SHIFT):
        s = w * draw(st.integers(1, 8))
    else:
        s = draw(st.integers(w, 4 * w))
    return w, s


@st.composite
def world(draw, rotations=tuple(Rotation)):
    rotation = draw(st.sampled_from(rotations))
    w, s = rotations_and_world(draw, rotation)
    return rotation, w, s


@settings(max_examples=300, deadline=None)
@given(world(), EPOCH)
def test_in_one_epoch_no_two_ranks_share_a_shard(case, epoch):
    rotation, w, s = case
    shards = [shard_of(rotation, r, epoch, w, s) for r in range(w)]
    assert all(0 <= x < s for x in shards)
    assert len(set(shards)) == w


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), EPOCH)
def test_none_keeps_every_rank_on_its_own_shard(w, epoch):
    assert [shard_of(Rotation.NONE, r, epoch, w, w) for r in range(w)] == list(range(w))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), EPOCH)
def test_shift_with_s_equal_w_shows_every_rank_every_shard_over_s_epochs(w, first):
    for r in range(w):
        seen = [shard_of(Rotation.SHIFT, r, e, w, w) for e in range(first, first + w)]
        assert sorted(seen) == list(range(w))


@settings(max_examples=200, deadline=None)
@given(world(rotations=(Rotation.STRIDE,)), EPOCH)
def test_stride_every_window_of_s_over_w_epochs_covers_every_shard_once(case, first):
    _, w, s = case
    block = s // w
    seen = [
        shard_of(Rotation.STRIDE, r, e, w, s) for e in range(first, first + block) for r in range(w)
    ]
    assert sorted(seen) == list(range(s))


def test_stride_with_s_equal_w_never_rotates():
    """Stride does not make every rank see every shard."""
    assert {shard_of(Rotation.STRIDE, 1, e, 4, 4) for e in range(20)} == {1}


@settings(max_examples=300, deadline=None)
@given(world(rotations=(Rotation.STRIDE_SHIFT,)), st.integers(0, 10**6))
@example((Rotation.STRIDE_SHIFT, 4, 4), 0)  # S == W: must still rotate (unlike stride)
@example((Rotation.STRIDE_SHIFT, 1, 5), 3)
@example((Rotation.STRIDE_SHIFT, 2, 16), 7)
def test_stride_shift_every_block_covers_every_shard_exactly_once(case, block_index):
    """Blocks are the aligned runs of S/W epochs `[b*S/W, (b+1)*S/W)`."""
    _, w, s = case
    length = s // w
    epochs = range(block_index * length, (block_index + 1) * length)
    seen = [shard_of(Rotation.STRIDE_SHIFT, r, e, w, s) for e in epochs for r in range(w)]
    assert sorted(seen) == list(range(s))


@settings(max_examples=300, deadline=None)
@given(world(rotations=(Rotation.STRIDE_SHIFT,)), st.integers(0, 10**6))
@example((Rotation.STRIDE_SHIFT, 4, 4), 0)
@example((Rotation.STRIDE_SHIFT, 3, 12), 1)
def test_stride_shift_every_rank_sees_every_shard_once_per_s_aligned_epochs(case, start_block):
    """From the start of any block, each rank reads each of the S shards exactly once in S
    epochs; from any epoch at all, within S + S/W epochs."""
    _, w, s = case
    length = s // w
    first = start_block * length
    for r in range(w):
        seen = [shard_of(Rotation.STRIDE_SHIFT, r, e, w, s) for e in range(first, first + s)]
        assert sorted(seen) == list(range(s))
    for offset in range(length):
        for r in range(w):
            epochs = range(first + offset, first + offset + s + length)
            assert {shard_of(Rotation.STRIDE_SHIFT, r, e, w, s) for e in epochs} == set(range(s))


@pytest.mark.parametrize(
    ("rotation", "w", "s", "expected"),
    [
        # rank 0 and 1, epochs 0..5
        (Rotation.NONE, 2, 2, [[0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]]),
        (Rotation.SHIFT, 2, 2, [[0, 1, 0, 1, 0, 1], [1, 0, 1, 0, 1, 0]]),
        (Rotation.SHIFT, 2, 3, [[0, 1, 2, 0, 1, 2], [1, 2, 0, 1, 2, 0]]),
        (Rotation.STRIDE, 2, 4, [[0, 2, 0, 2, 0, 2], [1, 3, 1, 3, 1, 3]]),
        (Rotation.STRIDE_SHIFT, 2, 4, [[0, 2, 1, 3, 2, 0], [1, 3, 2, 0, 3, 1]]),
        (Rotation.STRIDE_SHIFT, 2, 2, [[0, 1, 0, 1, 0, 1], [1, 0, 1, 0, 1, 0]]),
    ],
)
def test_rotation_tables(rotation, w, s, expected):
    """The rotation formulas on small tables (and the docstring's for stride_shift)."""
    assert [[shard_of(rotation, r, e, w, s) for e in range(6)] for r in range(w)] == expected


@settings(max_examples=100, deadline=None)
@given(world(rotations=(Rotation.STRIDE, Rotation.STRIDE_SHIFT)), N, st.integers(0, 1000))
def test_planned_samples_of_a_block_cover_the_dataset_exactly_once(case, n, block_index):
    """The same coverage seen through the planner, with interval arithmetic for big N."""
    rotation, w, s = case
    config = PlanConfig(total_shards=s, rotation=rotation, batch_size=7)
    layout = DataLayout.of_samples(n)
    length = s // w
    pieces = []
    for e in range(block_index * length, (block_index + 1) * length):
        plan = plan_epoch(config, layout, w, e)
        assert [r.shard for r in plan.ranks] == [shard_of(rotation, r, e, w, s) for r in range(w)]
        pieces.extend(rng for r in plan.ranks for rng in r.ranges)
    assert iv.total(pieces) == n
    assert iv.normalize(pieces) == (((0, n),) if n else ())
