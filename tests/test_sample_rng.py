"""Per-sample generators: the streams are numpy's `Philox(key=...)` streams of before the
fast construction (users' augmentations must not change), and `spawn` is reproducible."""

from __future__ import annotations

import pickle

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayshard.data.transforms import TransformContext, sample_rng

DOMAIN = 0x7261797368617264


def reference_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The construction every release before the fast one used, written out here."""
    word = np.random.SeedSequence([DOMAIN, seed, epoch]).generate_state(1, np.uint64)[0]
    key = np.array([int(word), index], dtype=np.uint64)
    return np.random.Generator(np.random.Philox(key=key))


def draws(rng: np.random.Generator) -> list:
    return [
        rng.integers(0, 2**62, 3).tolist(),
        rng.random(5).tolist(),
        rng.normal(size=3).tolist(),
        rng.permutation(7).tolist(),
        rng.integers(0, 10, dtype=np.int32),  # consumes half a 64-bit word
        rng.random(),
    ]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**63 - 1),
    epoch=st.integers(0, 10**6),
    indices=st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=6),
)
@example(seed=0, epoch=0, indices=[0, 1, 2**62, 2**63 - 1])
def test_streams_equal_the_keyed_philox_streams(seed, epoch, indices):
    ctx = TransformContext("L:x", seed, epoch, 0, np.array(indices), np.zeros(len(indices), bool))
    for row, index in enumerate(indices):
        want = reference_rng(seed, epoch, index)
        got = sample_rng(seed, epoch, index)
        assert str(got.bit_generator.state) == str(want.bit_generator.state)
        assert draws(got) == draws(want)
        assert draws(ctx.rng(row)) == draws(reference_rng(seed, epoch, index))
    for index in (2**63, 2**64 - 1):  # beyond int64: sample_rng takes them too
        assert draws(sample_rng(seed, epoch, index)) == draws(reference_rng(seed, epoch, index))


def test_streams_pinned_to_values_drawn_before_the_fast_construction():
    """Drawn with the code of commit d78da2a (Philox(key=...)), not recomputed."""
    pinned = {
        (0, 0, 0): (
            [2358251784950502409, 542231731068055383, 542793566645021633],
            -0.6166186642683488,
        ),
        (7, 1, 5000): (
            [1957584871771832612, 2191031178332867353, 881559947989929360],
            -0.7977194354861169,
        ),
        (2**63 - 1, 10**6, 2**40): (
            [2367142239585053194, 3622112219612752285, 3597123421667120935],
            -1.655072294363062,
        ),
        (123, 4, 2**63): (
            [383927513219155564, 1206369853212938403, 1398485098535313296],
            -1.1798569937666938,
        ),
    }
    for (seed, epoch, index), (ints, normal) in pinned.items():
        rng = sample_rng(seed, epoch, index)
        assert rng.integers(0, 2**62, 3).tolist() == ints
        assert rng.normal() == normal


def test_spawned_generators_are_reproducible():
    """`rng.spawn(n)` derives children from the sample's key: the same on every call of
    `sample_rng`, new ones on a second spawn, distinct across samples (before, they came
    from OS entropy and differed on every run)."""
    first = [g.random(2).tolist() for g in sample_rng(3, 1, 9).spawn(2)]
    again = sample_rng(3, 1, 9)
    assert [g.random(2).tolist() for g in again.spawn(2)] == first
    assert [g.random(2).tolist() for g in again.spawn(2)] != first  # a second spawn: new ones
    other = [g.random(2).tolist() for g in sample_rng(3, 1, 10).spawn(2)]
    assert other != first and first[0] != first[1]
    ctx = TransformContext("L:x", 3, 1, 0, np.array([4, 9]), np.zeros(2, bool))
    assert [g.random(2).tolist() for g in ctx.rng(1).spawn(2)] == first


def test_generator_pickles_and_continues_its_stream():
    rng = sample_rng(5, 2, 77)
    rng.random(3)
    copy = pickle.loads(pickle.dumps(rng))
    assert copy.random(4).tolist() == rng.random(4).tolist()
