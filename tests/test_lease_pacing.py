"""A `dynamic` reader's lease pacing without Ray: with quick answers it asks as the last
piece goes out, for the base count; with late answers it asks earlier and for more, never
more than its guided self-scheduling share of what is unleased; and a lease stream paced
this way over a simulated slow coordinator (a clock of its own, no wall time) reads every
piece once, with one call in flight at most and far less time stalled."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayshard.core.commands import Leased
from rayshard.runtime.dynamic_rows import LeaseStream
from rayshard.runtime.lease_pacing import LeasePacing


def test_quick_answers_leave_the_ask_at_the_last_piece_for_the_base_count():
    pacing = LeasePacing(base=2, piece_rows=100)
    for step in range(400):
        pacing.pulled(100, step * 0.4)  # 4 ms per row: the base reads for 0.8 s
    assert pacing.seconds_per_row > 0
    pacing.answered(0.0, 0.005, unleased=10_000, ranks=2)  # under min_round_trip_s
    assert pacing.ahead_rows() == 0.0
    assert pacing.should_ask(0) and not pacing.should_ask(1)
    assert pacing.count() == 2 and not pacing.paced()


def test_a_lease_asks_for_min_lease_s_of_reading_within_its_share():
    # Pieces read in 1 ms: one lease call per piece would cost the coordinator and the
    # reader about as much CPU as the reading. Asked at the last piece still (not paced).
    pacing = LeasePacing(base=1, piece_rows=100)
    for step in range(400):
        pacing.pulled(100, step * 0.001)  # 10 µs per row
    pacing.answered(0.0, 0.005, unleased=1_000_000, ranks=2)  # quick answers
    assert not pacing.paced() and pacing.should_ask(0) and not pacing.should_ask(1)
    assert pacing.min_lease_s == 0.25
    assert pacing.lease_rows() == pytest.approx(pacing.min_lease_s / 1e-5)  # 25,000 rows
    assert pacing.count() == 250
    pacing.answered(0.0, 0.005, unleased=2_000, ranks=2)  # the tail: a quarter of 2,000
    assert pacing.count() == 5
    pacing.answered(0.0, 0.005, unleased=100, ranks=2)
    assert pacing.count() == 1  # never below the base
    pacing.answered(0.0, 0.005, unleased=-1, ranks=2)  # no share known (an old journal)
    assert pacing.count() == 1  # then no lease grows for its call's cost


def test_late_answers_ask_earlier_and_for_more():
    pacing = LeasePacing(base=1, piece_rows=1_000)
    for step in range(30):
        pacing.pulled(1_000, step * 0.01)  # 10 µs per row
    pacing.answered(0.0, 0.1, unleased=10_000_000, ranks=4)
    assert abs(pacing.ahead_rows() - 1.5 * 0.1 / 1e-5) < 1e-6  # 15,000 rows
    assert pacing.should_ask(15_000) and not pacing.should_ask(15_001)
    assert pacing.count() == 30  # two ahead spans of 15,000 rows, in pieces of 1,000
    assert pacing.paced()


def test_time_stalled_for_an_answer_is_not_reading_pace():
    pacing = LeasePacing(base=1, piece_rows=100, window_s=0.005, first_pieces=1)
    pacing.pulled(100, 0.0)
    pacing.pulled(100, 1.0, stalled_s=0.99)
    assert abs(pacing.seconds_per_row - 0.0001) < 1e-12


def test_waits_for_answers_are_reported_once_with_the_next_ask():
    pacing = LeasePacing(base=1, piece_rows=10)
    pacing.waited(0.5)
    pacing.waited(0.25)
    pacing.waited(-0.1)  # a clock that stepped back adds nothing
    assert pacing.take_waited() == 0.75
    assert pacing.take_waited() == 0.0  # reported once


def test_a_rank_that_stops_within_its_read_ahead_is_never_paced():
    # A consumer that holds after its first batches: its reading fills the read-ahead
    # (fewer pieces than `first_pieces`), then pulls nothing; however late the answers, it
    # asks as an unpaced rank does, so it holds no more than its read-ahead and one lease.
    pacing = LeasePacing(base=1, piece_rows=10)
    for step in range(pacing.first_pieces):
        pacing.pulled(10, step * 1.0)  # even a whole second of reading apart
        pacing.answered(0.0, 5.0, unleased=10**6, ranks=2)
        assert not pacing.paced() and pacing.count() == 1
    pacing.pulled(10, 100.0)  # the consumer went on: now it is measured
    assert pacing.paced()


def test_the_time_between_two_streams_is_not_reading_time():
    pacing = LeasePacing(base=1, piece_rows=100, first_pieces=2)
    for now in (0.0, 0.01, 0.02):
        pacing.pulled(100, now)
    assert abs(pacing.seconds_per_row - 1e-4) < 1e-12
    pacing.answered(0.0, 0.1, unleased=7, ranks=3)
    pacing.new_stream(unleased=5_000, ranks=2)  # an epoch ended; the next begins 3 s later
    assert (pacing.unleased, pacing.ranks) == (5_000, 2)  # the new stream's first answer
    for now in (3.0, 3.01, 3.02):
        pacing.pulled(100, now)
    assert abs(pacing.seconds_per_row - 1e-4) < 1e-12


def test_a_burst_of_pulls_is_paced_over_the_reading_time_around_it():
    # Reading threads starting take 32 pieces at once, then one every 10 ms: the pace is
    # measured over 0.25 s windows, so the burst cannot read as a pace near zero.
    pacing = LeasePacing(base=1, piece_rows=1_000)
    now = 0.0
    for _ in range(33):
        pacing.pulled(1_000, now)
    for _ in range(60):
        now += 0.01
        pacing.pulled(1_000, now)
    assert 1e-5 / 3 < pacing.seconds_per_row <= 1e-5 * (1 + 1e-9)
    pacing.answered(0.0, 5.0, unleased=10**12, ranks=1)  # a very late answer
    assert pacing.ahead_rows() == pacing.max_pieces * 1_000  # in hand: 256 pieces at most


def test_a_hold_up_moves_the_pace_by_its_share_of_the_reading_time():
    # Steady reading at 10 µs a row, then one piece after the reading was held up 1 s (its
    # consumer slow, its threads descheduled): that window closes on time with 1,000 rows.
    # Averaged per window (as before), that window made the pace 13x slower and leases as
    # much shorter; summed, it weighs its 1 s against the earlier windows' reading.
    pacing = LeasePacing(base=1, piece_rows=1_000)
    now = 0.0
    for _ in range(200):
        now += 0.01
        pacing.pulled(1_000, now)
    assert pacing.seconds_per_row == pytest.approx(1e-5)
    rows_before = pacing.lease_rows()
    now += 1.0
    pacing.pulled(1_000, now)
    assert 1e-5 < pacing.seconds_per_row < 5e-5  # the average per window: 1.3e-4
    assert pacing.lease_rows() > rows_before / 5
    for _ in range(100):  # the reading goes on at 20 µs a row: the pace follows it
        now += 0.02
        pacing.pulled(1_000, now)
    assert pacing.seconds_per_row == pytest.approx(2e-5, rel=0.01)


@given(
    base=st.integers(1, 8),
    piece_rows=st.integers(1, 50_000),
    round_trip_s=st.floats(0.0, 5.0),
    seconds_per_row=st.floats(1e-9, 1e-3),
    unleased=st.integers(0, 10_000_000),
    ranks=st.integers(1, 10_000),
)
def test_an_ask_never_takes_more_than_its_share_of_what_is_unleased(
    base, piece_rows, round_trip_s, seconds_per_row, unleased, ranks
):
    pacing = LeasePacing(base=base, piece_rows=piece_rows, seconds_per_row=seconds_per_row)
    pacing.answered(0.0, round_trip_s, unleased=unleased, ranks=ranks)
    count = pacing.count()
    assert base <= count <= max(base, pacing.max_pieces)
    if count > base:  # grown: within one piece of the share
        assert (count - 1) * piece_rows < unleased / (2 * ranks)


@dataclasses.dataclass
class _Call:
    at: float
    leased: Leased


class _SlowCoordinator:
    """Leases pieces in order from a queue; every answer is ready `round_trip_s` after its
    ask on a simulated clock, which the reading advances by `seconds_per_row` per row."""

    def __init__(self, pieces: int, piece_rows: int, round_trip_s: float, seconds_per_row: float):
        self.queue = [(i * piece_rows, (i + 1) * piece_rows) for i in range(pieces)]
        self.round_trip_s, self.seconds_per_row = round_trip_s, seconds_per_row
        self.now, self.stalled_s, self.in_flight, self.counts = 0.0, 0.0, 0, []
        self.piece_rows, self.shares = piece_rows, []
        self.grants: list[tuple[int, int]] = []  # (rows granted, rows unleased before)

    def first(self, count: int) -> Leased:
        return self._grant(count)

    def _grant(self, count: int, share: bool = False) -> Leased:
        unleased = sum(end - start for start, end in self.queue)
        if share:  # as the coordinator does: a piece, and on while under half the rest
            pieces = -(-unleased // 2 // self.piece_rows) if unleased else 0
            count = min(count, max(1, pieces))
        pieces, self.queue = tuple(self.queue[:count]), self.queue[count:]
        self.grants.append((sum(end - start for start, end in pieces), unleased))
        rest = sum(end - start for start, end in self.queue)
        return Leased(pieces=pieces, unleased=rest, ranks=1)

    def ask(self, count: int, share: bool = False) -> _Call:
        assert self.in_flight == 0, "a second lease call in flight"
        self.in_flight += 1
        self.counts.append(count)
        self.shares.append(share)
        return _Call(self.now, self._grant(count, share))

    def ready(self, call: _Call) -> bool:
        return self.now >= call.at + self.round_trip_s

    def answer(self, call: _Call) -> Leased:
        if self.now < call.at + self.round_trip_s:
            self.stalled_s += call.at + self.round_trip_s - self.now
            self.now = call.at + self.round_trip_s
        self.in_flight -= 1
        return call.leased

    def read(self, piece: tuple[int, int]) -> None:
        self.now += (piece[1] - piece[0]) * self.seconds_per_row


def _read_epoch(paced: bool, round_trip_s: float) -> tuple[_SlowCoordinator, list]:
    coordinator = _SlowCoordinator(400, 1_000, round_trip_s, seconds_per_row=1e-5)
    pacing = LeasePacing(base=1, piece_rows=1_000) if paced else None
    stream = LeaseStream(
        coordinator.first(1),
        coordinator.ask,
        [],
        lambda: False,
        coordinator.answer,
        pacing,
        coordinator.ready,
        clock=lambda: coordinator.now,
    )
    read = []
    for piece in stream.pieces():
        coordinator.read(piece)
        read.append(piece)
    assert stream.ended_by == Leased(unleased=0, ranks=1)
    return coordinator, read


def test_a_paced_stream_over_late_answers_reads_every_piece_once_and_stalls_far_less():
    unpaced, read_unpaced = _read_epoch(paced=False, round_trip_s=0.1)
    paced, read_paced = _read_epoch(paced=True, round_trip_s=0.1)
    every_piece = [(i * 1_000, (i + 1) * 1_000) for i in range(400)]
    assert read_unpaced == every_piece and read_paced == every_piece
    # Without pacing each lease of one 10 ms piece stalls for the rest of a 100 ms round trip.
    assert unpaced.stalled_s > 400 * 0.08
    assert paced.stalled_s < unpaced.stalled_s / 5
    assert max(paced.counts) > 1 and set(unpaced.counts) == {1}
    assert any(paced.shares) and not any(unpaced.shares)
    # Every grant within the guided self-scheduling share (one rank: half the unleased rows)
    # or the base piece.
    assert all(rows <= max(1_000, unleased / 2 + 1_000) for rows, unleased in paced.grants)


def test_a_paced_stream_with_quick_answers_asks_at_the_last_piece_for_min_lease_s():
    # Pieces of 10 ms: once the pace is measured, each ask is for 250 ms of reading.
    paced, read = _read_epoch(paced=True, round_trip_s=0.002)
    unpaced, _ = _read_epoch(paced=False, round_trip_s=0.002)
    assert read == [(i * 1_000, (i + 1) * 1_000) for i in range(400)]
    assert unpaced.counts == [1] * 400
    assert max(paced.counts) == 25 and len(paced.counts) < 400 / 8  # from 400 calls
    assert not any(paced.shares)  # asked with nothing in hand: plain asks
    assert paced.stalled_s == unpaced.stalled_s == 0.0  # each answered within its piece
    # The last answer's share bounds each ask: one rank, half the unleased rows.
    assert all(rows <= max(1_000, unleased / 2 + 1_000) for rows, unleased in paced.grants)


def test_a_paced_ask_with_a_lease_of_one_row_group_in_hand_is_shared():
    """A lease of 200 small splits of one row group is read as two pieces (the run, then
    its last split), so the early ask still goes out with rows in hand, shared, as when
    every split was a piece: not as an idle rank's ask (no share cap, a straggler's work
    offered)."""
    import numpy as np

    from rayshard.data.reading_order import Cuts, split_boundaries

    splits = [(a, a + 64) for a in range(0, 32_768 * 4, 64)]
    cuts = Cuts(split_boundaries(splits), np.arange(0, 32_768 * 5, 32_768))
    lease = Leased(pieces=tuple(splits[:200]), unleased=10**6, ranks=2)
    for boundaries in (cuts, cuts.splits):  # joined, or every split read on its own
        pacing = LeasePacing(base=4, piece_rows=64, round_trip_s=0.05, seconds_per_row=1e-5)
        shares, ticks = [], iter(range(10**6))

        def ask(count, share, shares=shares):
            shares.append(share)
            return Leased(unleased=0, ranks=2)

        clock = lambda t=ticks: next(t) * 1e-4  # noqa: E731
        stream = LeaseStream(lease, ask, boundaries, lambda: False, pacing=pacing, clock=clock)
        read = list(stream.pieces())
        assert [i for a, b in read for i in range(a, b)] == list(range(200 * 64))
        assert shares == [True], (boundaries is cuts, shares)
