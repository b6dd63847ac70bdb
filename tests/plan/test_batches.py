"""Batches at the end of a shard: last-batch policies, padding, equal steps, `len`.

Counts are checked for shard sizes up to 10^7 with `batch_layouts`; the batches themselves
are enumerated with `iter_batches` for small plans only.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayshard.plan import (
    DataLayout,
    LastBatch,
    PlanConfig,
    Rotation,
    batch_layouts,
    batch_sizes,
    iter_batches,
    padding_indices,
    plan_epoch,
)
from rayshard.plan import intervals as iv

SIZES = st.lists(st.one_of(st.integers(0, 40), st.integers(0, 10**7)), min_size=1, max_size=16)
BATCH = st.one_of(st.integers(1, 8), st.integers(1, 5000))
POLICY = st.sampled_from(list(LastBatch))


def spec_count(n: int, b: int, policy: LastBatch) -> int:
    """Per shard: partial and fill ceil(n/B), drop floor(n/B)."""
    return n // b if policy is LastBatch.DROP else math.ceil(n / b)


@settings(max_examples=400, deadline=None)
@given(SIZES, BATCH, POLICY, st.booleans(), st.booleans())
@example([0], 1, LastBatch.PARTIAL, False, False)
@example([0, 0, 0], 4, LastBatch.FILL, False, True)
@example([5, 0], 4, LastBatch.PARTIAL, False, True)
@example([3, 2], 4, LastBatch.DROP, False, True)
@example([9, 10], 4, LastBatch.DROP, True, True)
def test_batch_counts_follow_spec4(sizes, b, policy, pad, equal):
    layouts = batch_layouts(sizes, b, policy, pad, equal)
    counts = [lay.batches for lay in layouts]
    for n, lay in zip(sizes, layouts):
        # Never invents or loses real samples: delivered + dropped is the shard.
        assert lay.delivered + lay.dropped == n
        assert min(lay.delivered, lay.padded, lay.dropped) >= 0
        stream = lay.delivered + lay.padded
        assert lay.batches == math.ceil(stream / b)
        if lay.batches <= 10_000:  # `batch_sizes` builds a list: keep it small
            assert len(batch_sizes(lay, b)) == lay.batches
    if pad:
        target = math.ceil(max(sizes) / b)
        assert counts == [target] * len(sizes)
        for lay in layouts:  # full batches everywhere, padding repeats the last sample
            assert lay.delivered + lay.padded == target * b
            assert lay.dropped == 0 and lay.pad_mode == "repeat"
        return
    own = [spec_count(n, b, policy) for n in sizes]
    if not equal:
        assert counts == own
    elif policy is LastBatch.DROP:
        assert counts == [min(own)] * len(sizes)  # everyone drops down to the smallest count
    else:
        assert counts == [max(own)] * len(sizes)
    for n, lay in zip(sizes, layouts):
        if policy is LastBatch.DROP:
            assert lay.padded == 0
            assert lay.delivered == lay.batches * b
        elif policy is LastBatch.FILL:
            assert lay.dropped == 0 and lay.pad_mode == "wrap"
            assert lay.delivered + lay.padded == lay.batches * b  # every batch full
        else:
            assert lay.dropped == 0 and lay.pad_mode == "repeat"
            if lay.padded:
                # As little padding as needed: the last batch holds exactly one sample.
                assert lay.delivered + lay.padded == (lay.batches - 1) * b + 1
            else:
                assert lay.delivered == n


@settings(max_examples=200, deadline=None)
@given(SIZES, BATCH, POLICY, st.booleans())
def test_rest_of_an_epoch_never_drops_a_real_sample(sizes, b, policy, pad):
    for lay in batch_layouts(sizes, b, policy, pad, True, allow_drop=False):
        assert lay.dropped == 0
    for n, lay in zip(
        sizes, batch_layouts(sizes, b, LastBatch.DROP, False, False, allow_drop=False)
    ):
        assert lay.batches == math.ceil(n / b)  # `drop` behaves like `partial`


@pytest.mark.parametrize(
    ("policy", "pad", "expected"),
    [
        # N=10 over 3 ranks: shards of 3, 3, 4; B=2; no equal steps.
        (LastBatch.PARTIAL, False, [2, 2, 2]),
        (LastBatch.DROP, False, [1, 1, 2]),
        (LastBatch.FILL, False, [2, 2, 2]),
        (LastBatch.PARTIAL, True, [2, 2, 2]),
    ],
)
def test_batch_counts_example(policy, pad, expected):
    config = PlanConfig(batch_size=2, last_batch=policy, pad_last_batch=pad, equal_steps=False)
    plan = plan_epoch(config, DataLayout.of_samples(10), 3, 0)
    assert [r.batches for r in plan.ranks] == expected


# --- Enumerated batches (small N) -----------------------------------------------------


@st.composite
def small_plans(draw):
    w = draw(st.integers(1, 6))
    rotation = draw(st.sampled_from(list(Rotation)))
    if rotation is Rotation.NONE:
        s = w
    elif rotation in (Rotation.STRIDE, Rotation.STRIDE_SHIFT):
        s = w * draw(st.integers(1, 3))
    else:
        s = draw(st.integers(w, 2 * w))
    config = PlanConfig(
        batch_size=draw(st.integers(1, 7)),
        total_shards=s,
        rotation=rotation,
        last_batch=draw(POLICY),
        pad_last_batch=draw(st.booleans()),
        equal_steps=draw(st.booleans()),
    )
    by_files = draw(st.booleans())
    if by_files:
        rows = draw(st.lists(st.integers(0, 9), min_size=s, max_size=s + 6))
        layout = DataLayout.of_files(rows)
        config = PlanConfig(
            **{
                **config.to_dict(),
                "uneven": draw(st.sampled_from(["unbalanced", "drop", "replicate"])),
            }
        )
    else:
        layout = DataLayout.of_samples(draw(st.integers(0, 60)))
    epoch = draw(st.integers(0, 12))
    return config, layout, w, epoch, by_files


@settings(max_examples=300, deadline=None)
@given(small_plans())
@example((PlanConfig(batch_size=4), DataLayout.of_samples(0), 3, 0, False))  # no samples
@example((PlanConfig(batch_size=2), DataLayout.of_samples(2), 5, 1, False))  # N < W
@example((PlanConfig(batch_size=3, last_batch="fill"), DataLayout.of_samples(2), 4, 0, False))
@example((PlanConfig(batch_size=3, last_batch="drop"), DataLayout.of_samples(7), 2, 0, False))
@example((PlanConfig(batch_size=2, uneven="replicate"), DataLayout.of_files([3, 1]), 4, 2, True))
def test_len_equals_the_batches_actually_enumerated(case):
    config, layout, w, epoch, by_files = case
    plan = plan_epoch(config, layout, w, epoch, by_files=by_files)
    b = config.batch_size
    for rank in plan.ranks:
        batches = list(iter_batches(rank, b))
        assert len(batches) == rank.batches
        flat = [i for idx, _ in batches for i in idx]
        flags = [f for _, fl in batches for f in fl]
        # Real samples first, in reading order, then the marked padding.
        assert flags == [False] * rank.samples + [True] * rank.padded
        assert flat[: rank.samples] == list(iv.indices(rank.ranges))
        assert flat[rank.samples :] == padding_indices(rank)
        assert len(padding_indices(rank)) == rank.padded
        assert all(0 <= i < layout.num_samples for i in flat)
        sizes = [len(idx) for idx, _ in batches]
        assert all(size == b for size in sizes[:-1]) and all(size >= 1 for size in sizes)
        if config.pad_last_batch or config.last_batch is not LastBatch.PARTIAL:
            assert all(size == b for size in sizes)  # fill, drop, pad: only full batches
    if w > 1 and config.equal_steps:
        assert len({r.batches for r in plan.ranks}) == 1


@settings(max_examples=200, deadline=None)
@given(small_plans())
def test_padded_samples_are_what_the_policy_says(case):
    config, layout, w, epoch, by_files = case
    plan = plan_epoch(config, layout, w, epoch, by_files=by_files)
    for rank in plan.ranks:
        pads = padding_indices(rank)
        if not pads:
            continue
        real = list(iv.indices(rank.ranges))
        if config.pad_last_batch or config.last_batch is LastBatch.PARTIAL:
            # Repeat the shard's last sample (or, for an empty shard, some sample).
            expected = real[-1] if real else layout.num_samples - 1
            assert pads == [expected] * len(pads)
        else:  # fill: wrap around to the start of the shard
            assert config.last_batch is LastBatch.FILL
            source = real or list(range(layout.num_samples))
            assert pads == [source[i % len(source)] for i in range(len(pads))]


def test_fill_wraps_to_the_start_of_the_shard():
    config = PlanConfig(batch_size=4, last_batch="fill", equal_steps=False)
    plan = plan_epoch(config, DataLayout.of_samples(10), 2, 0)
    assert list(iter_batches(plan.ranks[0], 4)) == [
        ([0, 1, 2, 3], [False] * 4),
        ([4, 0, 1, 2], [False, True, True, True]),
    ]


def test_pad_last_batch_gives_every_rank_equal_full_batches():
    config = PlanConfig(batch_size=4, pad_last_batch=True)
    plan = plan_epoch(config, DataLayout.of_samples(11), 3, 0)  # shards 3, 4, 4
    assert [r.batches for r in plan.ranks] == [1, 1, 1]
    assert list(iter_batches(plan.ranks[0], 4)) == [([0, 1, 2, 2], [False, False, False, True])]
    assert list(iter_batches(plan.ranks[2], 4)) == [([7, 8, 9, 10], [False] * 4)]


def test_partial_with_equal_steps_marks_as_little_padding_as_needed():
    config = PlanConfig(batch_size=4)
    plan = plan_epoch(config, DataLayout.of_samples(9), 2, 0)  # shards 4, 5
    assert [r.batches for r in plan.ranks] == [2, 2]
    assert list(iter_batches(plan.ranks[0], 4)) == [([0, 1, 2, 3], [False] * 4), ([3], [True])]
    assert list(iter_batches(plan.ranks[1], 4)) == [([4, 5, 6, 7], [False] * 4), ([8], [False])]


def test_drop_with_equal_steps_drops_down_to_the_smallest_count():
    config = PlanConfig(batch_size=2, last_batch="drop")
    plan = plan_epoch(config, DataLayout.of_samples(9), 2, 0)  # shards 4, 5
    assert [(r.batches, r.samples, r.dropped) for r in plan.ranks] == [(2, 4, 0), (2, 4, 1)]
    assert plan.ranks[1].ranges == ((4, 8),)


def test_equal_steps_opt_out():
    config = PlanConfig(batch_size=2, equal_steps=False)
    plan = plan_epoch(config, DataLayout.of_samples(9), 2, 0)
    assert [(r.batches, r.padded) for r in plan.ranks] == [(2, 0), (3, 0)]
