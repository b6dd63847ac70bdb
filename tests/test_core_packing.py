"""Properties of the pure packing arithmetic (`rayshard.core.packing`), without Ray.

Shares of ranks come from the real planner (`plan_epoch`, `plan_remaining`), so "resume on
any world size" is the loader's own re-planning, with the packing state on top of it.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayshard.core.packing import (
    PackSpec,
    count_rows,
    count_split_rows,
    materialize,
    plan_rows,
    resume_point,
    unpack,
)
from rayshard.errors import DataError
from rayshard.plan import DataLayout, PlanConfig, plan_epoch, plan_remaining
from rayshard.plan import intervals as iv

SEP = 9999


@st.composite
def cases(draw):
    """(document lengths, spec)."""
    lengths = draw(st.lists(st.integers(0, 30), min_size=0, max_size=30))
    split = draw(st.booleans())
    separator = draw(st.sampled_from([None, SEP]))
    longest = max(lengths, default=0) + (separator is not None)
    low = 1 if split else max(1, longest)
    spec = PackSpec(
        seq_len=draw(st.integers(low, low + 30)),
        separator=separator,
        split=split,
        drop_last=split and draw(st.booleans()),
        window=draw(st.integers(1, 4)),
    )
    return lengths, spec


def documents(lengths):
    """Document i: tokens 1000*i + (0, 1, ...), so every token tells its document and place."""
    return {i: np.arange(n, dtype=np.int64) + 1000 * i for i, n in enumerate(lengths)}


def rows_of(order, lengths, spec, offsets=None):
    return list(plan_rows(((i, lengths[i]) for i in order), spec, offsets))


def token_multiset(rows, spec, lengths):
    """(document, token offset) of every token the kept rows carry."""
    out = Counter()
    for row in rows:
        if not row.dropped:
            out.update((s.index, t) for s in row.spans for t in range(s.start, s.end))
    return out


def rank_orders(n, world, consumed=(), previous=None):
    config = PlanConfig(batch_size=1)
    layout = DataLayout.of_samples(n)
    if previous is None:
        plan = plan_epoch(config, layout, world, 0)
    else:
        plan = plan_remaining(config, layout, world, 0, consumed, previous_world_size=previous)
    return [iv.indices(r.ranges) for r in plan.ranks]


@settings(max_examples=300, deadline=None)
@given(cases())
@example(([], PackSpec(seq_len=4)))
@example(([5, 0, 3], PackSpec(seq_len=4, separator=SEP)))
@example(([4, 4, 4], PackSpec(seq_len=4, split=False)))
@example(([3, 3, 3], PackSpec(seq_len=4, drop_last=True)))
def test_pack_then_unpack_returns_every_document(case):
    lengths, spec = case
    docs = documents(lengths)
    rows = rows_of(range(len(lengths)), lengths, spec)
    kept = [r for r in rows if not r.dropped]
    assert all(r.tokens <= spec.seq_len for r in rows)
    if spec.split:  # only the last row may be short
        assert all(r.tokens == spec.seq_len for r in rows[:-1])
    assert count_rows(((i, n) for i, n in enumerate(lengths)), spec) == len(kept)
    if spec.split:
        sizes = np.array([spec.size(n) for n in lengths], dtype=np.int64)
        assert count_split_rows(sizes, spec) == len(kept)
    arrays = materialize(kept, docs, spec) if kept else None
    if spec.drop_last:
        # Tokens of the dropped row are skipped; every other token is delivered once.
        dropped = rows[-1].tokens if rows and rows[-1].dropped else 0
        assert sum(r.tokens for r in kept) + dropped == sum(spec.size(n) for n in lengths)
        return
    back = unpack(arrays["tokens"], arrays["document_ids"], spec) if kept else {}
    for i, tokens in docs.items():
        if len(tokens) or spec.separator is not None:
            np.testing.assert_array_equal(back[i], tokens)
    # position_ids restart at every document and count up inside it, across rows too
    if kept:
        for i in back:
            where = arrays["document_ids"] == i
            np.testing.assert_array_equal(
                arrays["position_ids"][where], np.arange(spec.size(lengths[i]))
            )
        assert (arrays["mask"] == (arrays["document_ids"] >= 0)).all()
    # every document finishes exactly once
    done = [s.index for r in rows for s in r.spans if s.done]
    assert sorted(done) == list(range(len(lengths)))


@settings(max_examples=300, deadline=None)
@given(cases(), st.integers(1, 4), st.integers(1, 4), st.data())
@example(([7, 7, 7], PackSpec(seq_len=4)), 2, 3, None)
def test_resume_at_any_row_on_any_world_size(case, world, new_world, data):
    lengths, spec = case
    n = len(lengths)
    orders = rank_orders(n, world)
    streams = [rows_of(order, lengths, spec) for order in orders]
    # Every rank delivered some of its rows (the rows a consumer received).
    cut = [
        (0 if data is None else data.draw(st.integers(0, len(s)), label="rows")) for s in streams
    ]
    # A dropped last row counts as consumed once its rank reached it (its tokens skipped).
    delivered = [row for s, r in zip(streams, cut) for row in s[:r]]
    done, partial = resume_point(delivered)
    consumed = iv.normalize((i, i + 1) for i in done)
    # Same world size: every rank's resumed stream is exactly its uninterrupted tail.
    rest = rank_orders(n, world, consumed, previous=world)
    for order, stream, r in zip(rest, streams, cut):
        assert rows_of(order, lengths, spec, partial) == stream[r:]
    # Another world size: the rest of the epoch carries every remaining token once.
    moved = rank_orders(n, new_world, consumed, previous=world)
    after = [row for order in moved for row in rows_of(order, lengths, spec, partial)]
    whole = token_multiset([row for s in streams for row in s], spec, lengths)
    if spec.drop_last:  # dropped rows differ per world size: count kept + dropped tokens
        got = Counter()
        for row in delivered + after:
            if not row.dropped:
                got.update((s.index, t) for s in row.spans for t in range(s.start, s.end))
        assert set(got.values()) <= {1}
        assert set(got) <= {(i, t) for i, n_ in enumerate(lengths) for t in range(spec.size(n_))}
        return
    got = token_multiset(delivered + after, spec, lengths)
    assert got == whole
    assert set(whole.values()) <= {1}


def test_no_split_refuses_a_document_longer_than_a_row():
    with pytest.raises(DataError, match="sample 1 has 9 tokens, more than seq_len=8"):
        list(plan_rows([(0, 3), (1, 9)], PackSpec(seq_len=8, split=False)))


def test_first_fit_fills_earlier_rows_before_opening_new_ones():
    rows = list(plan_rows([(0, 6), (1, 6), (2, 2), (3, 2)], PackSpec(seq_len=8, split=False)))
    assert [[s.index for s in r.spans] for r in rows] == [[0, 2], [1, 3]]
