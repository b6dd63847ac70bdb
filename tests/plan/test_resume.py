"""Resuming an epoch from progress (`plan_remaining`).

- Same world size, ranks that consumed in step: the rest equals the tail of the
  uninterrupted plan (same samples, same batch count, same padding).
- Any consumption, same or different world size: every real sample the uninterrupted epoch
  delivers is read exactly once overall (consumed before, or planned now), and the rest of
  an epoch never drops a real sample.
Big N is handled with interval arithmetic; small plans are also enumerated batch by batch.
"""

from __future__ import annotations

import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayshard.errors import ConfigError
from rayshard.plan import (
    DataLayout,
    LastBatch,
    PlanConfig,
    Rotation,
    iter_batches,
    plan_epoch,
    plan_remaining,
    validate,
)
from rayshard.plan import intervals as iv

N = st.one_of(st.integers(0, 64), st.integers(0, 10**7))


@st.composite
def configs(draw, max_w=32, uneven=("unbalanced", "drop")):
    w = draw(st.integers(1, max_w))
    rotation = draw(st.sampled_from(list(Rotation)))
    if rotation is Rotation.NONE:
        s = w
    elif rotation in (Rotation.STRIDE, Rotation.STRIDE_SHIFT):
        s = w * draw(st.integers(1, 4))
    else:
        s = draw(st.integers(w, 3 * w))
    config = PlanConfig(
        batch_size=draw(st.one_of(st.integers(1, 8), st.integers(1, 10**5))),
        total_shards=s,
        rotation=rotation,
        last_batch=draw(st.sampled_from(list(LastBatch))),
        pad_last_batch=draw(st.booleans()),
        equal_steps=draw(st.booleans()),
        uneven=draw(st.sampled_from(uneven)),
    )
    return config, w


@st.composite
def epochs(draw, max_w=32, small=False):
    config, w = draw(configs(max_w=max_w))
    s = config.shards_for(w)
    by_files = draw(st.booleans())
    if by_files:
        f = draw(st.integers(s, s + 12))
        top = 6 if small else 10**6
        layout = DataLayout.of_files(draw(st.lists(st.integers(0, top), min_size=f, max_size=f)))
    else:
        layout = DataLayout.of_samples(draw(st.integers(0, 60) if small else N))
    return config, layout, w, draw(st.integers(0, 20)), by_files


def stream_length(rank) -> int:
    return rank.samples + rank.padded


def in_step_progress(full, k: int, batch_size: int):
    """Real samples consumed when every rank has yielded k batches (or all of its own)."""
    consumed = []
    for rank in full.ranks:
        done = min(k, rank.batches) * batch_size
        consumed.extend(iv.take(rank.ranges, 0, min(done, rank.samples)))
    return consumed


@settings(max_examples=300, deadline=None)
@given(epochs(), st.booleans(), st.data())
@example(
    (PlanConfig(batch_size=4), DataLayout.of_samples(0), 3, 0, False), False, None
)  # no samples
@example((PlanConfig(batch_size=4), DataLayout.of_samples(2), 5, 1, False), False, None)  # N < W
@example(
    (PlanConfig(batch_size=4, last_batch="drop"), DataLayout.of_samples(30), 2, 1, False),
    True,
    None,
)
def test_same_world_resume_equals_the_tail_of_the_uninterrupted_plan(case, shuffled, data):
    config, layout, w, epoch, by_files = case
    b = config.batch_size
    full = plan_epoch(config, layout, w, epoch, by_files=by_files, shuffled=shuffled)
    ks = [0, full.steps] + ([data.draw(st.integers(0, full.steps))] if data else [])
    for k in ks:  # k = 0: nothing consumed; k = steps: everything consumed
        consumed = in_step_progress(full, k, b)
        rest = plan_remaining(
            config, layout, w, epoch, consumed, by_files=by_files, shuffled=shuffled
        )
        assert rest.steps == full.steps - k
        for before, after in zip(full.ranks, rest.ranks, strict=True):
            done = min(k, before.batches) * b
            assert after.shard == before.shard
            assert after.batches == before.batches - min(k, before.batches)
            assert after.ranges == iv.take(before.ranges, min(done, before.samples), before.samples)
            assert after.samples == max(before.samples - done, 0)
            assert stream_length(after) == max(stream_length(before) - done, 0)
            assert after.dropped == 0
        if k == full.steps:
            assert all(r.batches == 0 and r.samples == 0 for r in rest.ranks)


@settings(max_examples=150, deadline=None)
@given(epochs(max_w=6, small=True), st.booleans(), st.data())
def test_same_world_resume_enumerates_the_tail_batch_for_batch(case, shuffled, data):
    config, layout, w, epoch, by_files = case
    b = config.batch_size
    full = plan_epoch(config, layout, w, epoch, by_files=by_files, shuffled=shuffled)
    k = data.draw(st.integers(0, full.steps))
    consumed = in_step_progress(full, k, b)
    rest = plan_remaining(config, layout, w, epoch, consumed, by_files=by_files, shuffled=shuffled)
    for before, after in zip(full.ranks, rest.ranks, strict=True):
        tail = list(iter_batches(before, b))[k:]
        resumed = list(iter_batches(after, b))
        assert len(resumed) == after.batches == len(tail)
        assert resumed == tail


@st.composite
def progress(draw, full):
    """Arbitrary per-rank progress: each rank consumed some prefix of its real samples."""
    consumed = []
    for rank in full.ranks:
        if rank.samples and draw(st.booleans()):
            cut = draw(st.sampled_from([0, rank.samples, draw(st.integers(0, rank.samples))]))
            consumed.extend(iv.take(rank.ranges, 0, cut))
    return consumed


def assert_exactly_once(config, full, consumed, rest):
    b = config.batch_size
    planned = [rng for rank in rest.ranks for rng in rank.ranges]
    both = list(consumed) + planned
    # Exactly once: nothing twice, and together exactly what the full epoch delivers.
    assert iv.total(iv.normalize(both)) == iv.total(both)
    assert iv.normalize(both) == full.delivered()
    for rank in rest.ranks:
        assert rank.dropped == 0  # the rest of an epoch never drops a real sample
        assert rank.samples == iv.total(rank.ranges)
        assert math.ceil(stream_length(rank) / b) == rank.batches
    if rest.world_size > 1 and config.equal_steps:
        assert len({r.batches for r in rest.ranks}) == 1


@settings(max_examples=300, deadline=None)
@given(epochs(), st.integers(1, 40), st.booleans(), st.data())
@example((PlanConfig(batch_size=3), DataLayout.of_samples(10), 2, 0, False), 5, False, None)
@example(
    (PlanConfig(batch_size=3, last_batch="drop"), DataLayout.of_samples(10), 3, 0, False),
    1,
    False,
    None,
)
@example(
    (PlanConfig(batch_size=3, last_batch="drop"), DataLayout.of_samples(10), 3, 2, False),
    2,
    True,
    None,
)
def test_resume_on_any_world_size_reads_every_remaining_sample_exactly_once(
    case, new_w, shuffled, data
):
    config, layout, w, epoch, by_files = case
    full = plan_epoch(config, layout, w, epoch, by_files=by_files, shuffled=shuffled)
    consumed = data.draw(progress(full)) if data else []
    try:  # the new world must be a valid world for this configuration too
        validate(config, layout, new_w, check_expected=False)
    except ConfigError:
        new_w = w
    rest = plan_remaining(
        config,
        layout,
        new_w,
        epoch,
        consumed,
        previous_world_size=w,
        by_files=by_files,
        shuffled=shuffled,
    )
    assert rest.world_size == new_w and len(rest.ranks) == new_w
    assert_exactly_once(config, full, consumed, rest)
    if new_w != w:
        # Re-planned slices are balanced over the new ranks.
        sizes = [r.samples for r in rest.ranks]
        assert max(sizes) - min(sizes) <= 1


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 200), st.integers(1, 12), st.integers(1, 12), st.integers(1, 9), st.data())
def test_resume_with_new_world_default_shards(n, w, new_w, b, data):
    """The common case: one shard per rank, restart on a different number of workers."""
    config = PlanConfig(batch_size=b)
    layout = DataLayout.of_samples(n)
    full = plan_epoch(config, layout, w, 3)
    consumed = data.draw(progress(full))
    rest = plan_remaining(config, layout, new_w, 3, consumed, previous_world_size=w)
    assert_exactly_once(config, full, consumed, rest)
    # Enumerated: the new ranks' real samples are the remaining ones, each once.
    real = sorted(
        i for r in rest.ranks for idx, pad in iter_batches(r, b) for i, p in zip(idx, pad) if not p
    )
    assert real == sorted(set(range(n)) - set(iv.indices(iv.normalize(consumed))))


def test_everything_consumed_leaves_nothing_to_read():
    config = PlanConfig(batch_size=4)
    layout = DataLayout.of_samples(10)
    full = plan_epoch(config, layout, 3, 0)
    for new_w in (3, 2, 5):
        rest = plan_remaining(config, layout, new_w, 0, [(0, 10)], previous_world_size=3)
        assert [(r.samples, r.padded, r.batches) for r in rest.ranks] == [(0, 0, 0)] * new_w
    assert full.steps == 1


def test_resume_example_from_two_to_three_ranks():
    config = PlanConfig(batch_size=2)
    layout = DataLayout.of_samples(12)  # ranks read [0,6) and [6,12)
    rest = plan_remaining(config, layout, 3, 0, [(0, 2), (6, 8)], previous_world_size=2)
    assert [r.ranges for r in rest.ranks] == [((2, 4),), ((4, 6), (8, 9)), ((9, 12),)]
    assert [r.batches for r in rest.ranks] == [2, 2, 2]
