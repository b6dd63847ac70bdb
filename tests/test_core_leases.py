"""The pure lease book of the dynamic policy: no sample lost under any sequence of leases,
acknowledgements, deaths, leaves and joins; equal step capacities without churn."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.core.leases import LeaseBook
from rayshard.plan import intervals as iv


def _splits(sizes):
    out, start = [], 0
    for size in sizes:
        out.append((start, start + size))
        start += size
    return out, start


def _drain(book, ranks):
    """Every live rank leases and acknowledges until nothing is left."""
    progress = True
    while progress:
        progress = False
        for rank in ranks:
            lease = book.lease(rank)
            if lease is not None:
                book.ack([(lease.start, lease.end)])
                progress = True


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 50), min_size=0, max_size=20),
    ranks=st.integers(1, 6),
    batch=st.integers(1, 16),
)
def test_equal_steps_capacity_fits_everything_and_steps_are_equal(sizes, ranks, batch):
    splits, total = _splits(sizes)
    book = LeaseBook(splits, range(ranks), batch, equal_steps=True)
    leased = {r: 0 for r in range(ranks)}
    progress = True
    while progress:
        progress = False
        for rank in range(ranks):
            lease = book.lease(rank)
            if lease is not None:
                leased[rank] += lease.end - lease.start
                book.ack([(lease.start, lease.end)])
                progress = True
    steps = {book.steps(r) for r in range(ranks)}
    assert len(steps) == 1
    (t,) = steps
    assert t == -(-total // (ranks * batch))
    assert all(rows <= t * batch for rows in leased.values())
    assert book.consumed() == ((0, total),) if total else book.consumed() == ()


ops = st.lists(
    st.tuples(
        st.sampled_from(["lease", "ack", "partial_ack", "release", "join"]), st.integers(0, 7)
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=15),
    equal=st.booleans(),
    batch=st.integers(1, 8),
    script=ops,
)
def test_no_sample_is_ever_lost_under_churn(sizes, equal, batch, script):
    splits, total = _splits(sizes)
    book = LeaseBook(splits, range(3), batch, equal_steps=equal)
    alive = {0, 1, 2}
    held: dict[int, list[tuple[int, int]]] = {}
    for op, rank in script:
        if op == "join":
            book.join(rank)
            alive.add(rank)
        elif rank not in alive:
            continue
        elif op == "lease":
            lease = book.lease(rank)
            if lease is not None:
                held.setdefault(rank, []).append((lease.start, lease.end))
        elif op in ("ack", "partial_ack") and held.get(rank):
            start, end = held[rank].pop(0)
            if op == "partial_ack":  # only the head of the lease reached the model
                end = start + (end - start) // 2
            book.ack([(start, end)])
        elif op == "release" and len(alive) > 1:
            book.release(rank)
            alive.discard(rank)
            held.pop(rank, None)
        # Invariant: every sample is consumed, queued, or inside a live lease.
        live = [(le.start, le.end) for le in book.outstanding()]
        covered = iv.normalize([*book.consumed(), *book._queue, *live])
        assert covered == ((0, total),)
    # Then every rank dies (its unacknowledged rest goes back) and a fresh rank joins and
    # drains the queue: all that was not consumed must come out, nothing else.
    newcomer = 99
    book.join(newcomer)
    for rank in alive:
        book.release(rank)
    _drain(book, [newcomer])
    assert book.consumed() == ((0, total),)
    assert not book.others_unfinished(-1)  # (every lease acknowledged: all forgotten)
    assert not book.outstanding() and book.exhausted()


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 30), max_size=15),
    order=st.randoms(use_true_random=False),
    consumed=st.lists(st.tuples(st.integers(0, 450), st.integers(1, 40)), max_size=6),
)
def test_a_resumed_epoch_leases_exactly_what_was_not_consumed_in_split_order(
    sizes, order, consumed
):
    """A book made with what a resumed epoch consumed leases every other row of its
    splits once, in the splits' (shuffled) order, each split's rest as pieces of its own
    (a piece never crosses a split's end: adjacent rests are not joined), and no consumed
    row; empty splits hold nothing."""
    splits, _ = _splits(sizes)
    order.shuffle(splits)
    done = iv.normalize((start, start + size) for start, size in consumed)
    book = LeaseBook(splits, [0], batch_size=7, equal_steps=False, consumed=done)
    leased = []
    while (lease := book.lease(0)) is not None:
        leased.append((lease.start, lease.end))
        book.ack([leased[-1]])
    # without equal steps a lease is one whole piece: the pieces, in order
    assert leased == [piece for split in splits for piece in iv.subtract((split,), done)]
    assert not iv.intersect(iv.normalize(leased), done)
