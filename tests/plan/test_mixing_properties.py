"""Weighted mixing without Ray (`rayshard.core.mixing`).

- A mixed epoch holds exactly `counts[s]` samples of every source, whatever ranges it is
  read in, and every prefix is mixed in proportion.
- Same (seed, epoch), same epoch; downsampled subsets change by epoch.
- Upsampling: whole cycles of the source in order, then a seeded remainder.
- Resume at any point on any world size (the planner over the mix's positions) delivers
  the epoch's picks exactly: per-source counts exact, the same multiset of samples.
"""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayshard.core.mixing import Mix, apportion, check_weights
from rayshard.errors import ConfigError
from rayshard.plan import DataLayout, LastBatch, PlanConfig, plan_epoch, plan_remaining
from rayshard.plan import intervals as iv


@st.composite
def mixes(draw, max_sources=4, max_rows=60):
    """Sources of 1..max_rows rows, counts from 0 to 3x the rows (at least one > 0)."""
    s = draw(st.integers(1, max_sources))
    sizes = draw(st.lists(st.integers(1, max_rows), min_size=s, max_size=s))
    counts = [draw(st.integers(0, 3 * n)) for n in sizes]
    if not any(counts):
        counts[0] = 1
    return Mix(tuple(sizes), tuple(counts), seed=draw(st.integers(0, 2**32)))


def whole_epoch(mix: Mix, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    return mix.locate(epoch, 0, mix.total)


@settings(max_examples=200, deadline=None)
@given(mixes(), st.integers(0, 50), st.data())
@example(Mix((5,), (5,)), 0, None)  # one source, one cycle
@example(Mix((3, 7), (0, 1)), 2, None)  # a source left out, a single sample
@example(Mix((0, 4), (0, 6)), 1, None)  # an empty source with count 0
def test_epochs_hold_exact_counts_in_any_ranges(mix, epoch, data):
    source, index = whole_epoch(mix, epoch)
    assert np.bincount(source, minlength=len(mix.counts)).tolist() == list(mix.counts)
    for s in range(len(mix.counts)):
        assert sorted(index[source == s]) == sorted(mix.epoch_picks(epoch, s))
        assert ((index[source == s] >= 0) & (index[source == s] < mix.sizes[s])).all()
    if data is not None:  # read in arbitrary pieces: the same positions
        cuts = sorted(data.draw(st.lists(st.integers(0, mix.total), max_size=6)))
        bounds = [0, *cuts, mix.total]
        pieces = [mix.locate(epoch, a, b) for a, b in zip(bounds, bounds[1:])]
        assert np.concatenate([p[0] for p in pieces]).tolist() == source.tolist()
        assert np.concatenate([p[1] for p in pieces]).tolist() == index.tolist()


@settings(max_examples=100, deadline=None)
@given(mixes())
def test_every_prefix_is_mixed_in_proportion(mix):
    prefix = mix.prefix(np.arange(mix.total + 1))  # (S, T+1)
    share = np.outer(mix.counts, np.arange(mix.total + 1)) / mix.total
    assert (np.abs(prefix - share) <= len(mix.counts)).all()
    assert (np.abs(prefix[0] - share[0]) < 1).all()  # the first source: Bresenham-exact
    assert (np.diff(prefix, axis=1) >= 0).all()
    assert (prefix.sum(axis=0) == np.arange(mix.total + 1)).all()


@settings(max_examples=100, deadline=None)
@given(mixes(), st.integers(0, 1000))
def test_same_seed_and_epoch_same_epoch(mix, epoch):
    again = Mix(mix.sizes, mix.counts, mix.seed)
    for a, b in zip(whole_epoch(mix, epoch), whole_epoch(again, epoch)):
        assert a.tolist() == b.tolist()


@settings(max_examples=100, deadline=None)
@given(st.integers(10, 500), st.data(), st.integers(0, 2**32))
def test_downsampled_subsets_change_by_epoch(n, data, seed):
    count = data.draw(st.integers(1, n - 1))
    mix = Mix((n,), (count,), seed)
    subsets = {tuple(mix.epoch_picks(e, 0)) for e in range(8)}
    assert len(subsets) > 1  # C(n, count) >= 10 subsets: 8 equal draws are ~1e-7 unlikely
    for subset in subsets:
        assert len(set(subset)) == count and list(subset) == sorted(subset)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 80), st.integers(1, 5), st.data(), st.integers(0, 2**32))
def test_upsampling_repeats_whole_cycles_then_a_seeded_remainder(n, cycles, data, seed):
    remainder = data.draw(st.integers(0, n - 1))
    mix = Mix((n,), (cycles * n + remainder,), seed)
    picks = mix.epoch_picks(3, 0)
    assert picks[: cycles * n].tolist() == list(range(n)) * cycles
    tail = picks[cycles * n :].tolist()
    assert len(set(tail)) == remainder and tail == sorted(tail)
    assert collections.Counter(picks.tolist()) == collections.Counter(
        {i: cycles + (i in tail) for i in range(n)}
    )


@settings(max_examples=150, deadline=None)
@given(
    mixes(max_rows=40),
    st.integers(1, 6),
    st.integers(1, 6),
    st.integers(1, 9),
    st.integers(0, 20),
    st.data(),
)
def test_resume_anywhere_on_any_world_size_keeps_counts_exact(mix, w, w2, b, epoch, data):
    config = PlanConfig(batch_size=b, last_batch=LastBatch.PARTIAL)
    layout = DataLayout.of_samples(mix.total)
    full = plan_epoch(config, layout, w, epoch)
    consumed = []
    for rank in full.ranks:  # each rank received some prefix of its samples
        consumed.extend(iv.take(rank.ranges, 0, data.draw(st.integers(0, rank.samples))))
    rest = plan_remaining(config, layout, w2, epoch, consumed, previous_world_size=w)
    delivered = [*consumed, *(r for rank in rest.ranks for r in rank.ranges)]
    assert iv.total(delivered) == iv.total(iv.normalize(delivered)) == mix.total  # once each
    got = collections.Counter()
    for a, b_ in delivered:
        source, index = mix.locate(epoch, a, b_)
        got.update(zip(source.tolist(), index.tolist()))
    want = collections.Counter()
    for s in range(len(mix.counts)):
        want.update((s, i) for i in mix.epoch_picks(epoch, s).tolist())
    assert got == want
    per_source = collections.Counter(s for s, _ in got.elements())
    assert [per_source[s] for s in range(len(mix.counts))] == list(mix.counts)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**9), st.lists(st.floats(0, 1e6), min_size=1, max_size=6))
def test_apportion_is_exact_and_within_one_of_the_quota(total, weights):
    if not any(weights):
        weights[0] = 1.0
    counts = apportion(total, weights)
    assert sum(counts) == total
    for c, w in zip(counts, weights):
        assert abs(c - total * w / math.fsum(weights)) < 1 + 1e-6 * total


@pytest.mark.parametrize(
    ("weights", "words"),
    [
        ([0.7, -0.3], ["weights[1]=-0.3", "negative", "use 0"]),
        ([0.0, 0.0], ["all zero", "positive weight"]),
        ([0.7, 0.2, 0.1], ["3 value(s)", "2 sources", "one weight per source"]),
        ([0.5], ["1 value(s)", "2 sources"]),
        ([float("nan"), 1.0], ["weights[0]=nan", "finite"]),
        ("0.7,0.3", ["list of numbers"]),
    ],
)
def test_bad_weights_name_the_value_and_the_fix(weights, words):
    with pytest.raises(ConfigError) as error:
        check_weights(weights, 2)
    for word in words:
        assert word in str(error.value)


def test_numpy_weights_are_numbers():
    weights = list(np.array([0.7, 0.3], dtype=np.float32))
    assert check_weights(weights, 2) == pytest.approx((0.7, 0.3))
    assert check_weights([np.int64(3), np.float16(1)], 2) == (3.0, 1.0)
    assert apportion(10, check_weights(weights, 2)) == (7, 3)
    with pytest.raises(ConfigError, match=r"weights\[0\]=np.float32\(nan\) is not a finite"):
        check_weights([np.float32("nan"), 1.0], 2)
    with pytest.raises(ConfigError, match="is not a finite number"):
        check_weights([np.bool_(True), 1.0], 2)
    assert check_weights(np.array([0.7, 0.3]), 2) == pytest.approx((0.7, 0.3))  # an array
    with pytest.raises(ConfigError, match="must be a list of numbers"):
        check_weights(np.array([[0.7, 0.3]]), 2)
