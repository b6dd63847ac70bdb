"""A dynamic reader's row stream without Ray: its leases read as one stream (the next
lease asked for only when a reading thread wants its first piece), and the straggler
filter (after a pause of half the straggler timeout it asks which rows are still leased
to it and drops the rest)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from rayshard.core.commands import Leased
from rayshard.data.batching import iter_rows_parallel
from rayshard.runtime.dynamic_rows import LeaseStream, drop_taken_back, keep_rows
from rayshard.runtime.lease_pacing import LeasePacing
from rayshard.sources import TableSource


def _batch(start: int, rows: int) -> pa.RecordBatch:
    ids = np.arange(start, start + rows)
    return pa.RecordBatch.from_arrays(
        [pa.array(ids), pa.array(ids), pa.array(np.zeros(rows, dtype=bool))],
        names=["id", "_index", "_padded"],
    )


def test_keep_rows_keeps_only_held_samples():
    kept = keep_rows(_batch(0, 10), ((2, 4), (8, 20)))
    assert kept.column("_index").to_pylist() == [2, 3, 8, 9]
    whole = _batch(0, 4)
    assert keep_rows(whole, ((0, 10),)) is whole


def test_rows_after_a_pause_are_filtered_by_what_is_still_held():
    ticks = iter([0.0, 0.1, 0.2, 5.0, 5.1])  # the pause comes before the third batch
    asked = []

    def held():
        asked.append(1)
        return [[20, 25]]

    batches = [_batch(0, 10), _batch(10, 10), _batch(20, 10), _batch(30, 10)]
    out = list(drop_taken_back(iter(batches), held, 1.0, clock=lambda: next(ticks)))
    ids = [i for b in out for i in b.column("_index").to_pylist()]
    assert ids == [*range(20), 20, 21, 22, 23, 24]  # batch 30..39 was taken back: dropped
    assert len(asked) == 1


def test_no_pause_no_question():
    ticks = iter(float(t) for t in range(10))
    out = list(drop_taken_back(iter([_batch(0, 5)]), lambda: [], 100.0, clock=lambda: next(ticks)))
    assert out[0].num_rows == 5


def test_a_lease_taken_after_the_answer_is_asked_about_again():
    # The pause comes before the second batch; the third batch's rows were leased after
    # the coordinator's answer: asked again, they go on rather than being dropped.
    ticks = iter([0.0, 0.1, 5.0, 5.1, 5.2])
    answers = iter([[[0, 15]], [[10, 30]]])
    leases = iter([1, 2, 2])
    out = drop_taken_back(
        iter([_batch(0, 10), _batch(10, 10), _batch(20, 10)]),
        lambda: next(answers),
        1.0,
        clock=lambda: next(ticks),
        leases=lambda: next(leases),
    )
    ids = [i for b in out for i in b.column("_index").to_pylist()]
    assert ids == [*range(15), *range(20, 30)]  # 15..19 taken back; the newer lease kept


class Answers:
    """A coordinator's lease answers in turn: `__call__` asks (a call in flight, counted),
    `answer` awaits one (counted too)."""

    def __init__(self, *answers: Leased) -> None:
        self.answers, self.calls, self.awaited = iter(answers), 0, 0
        self.counts: list[int] = []
        self.shares: list[bool] = []

    def __call__(self, count: int = 1, share: bool = False) -> Leased:
        self.calls += 1
        self.counts.append(count)
        self.shares.append(share)
        return next(self.answers)

    def answer(self, call: Leased) -> Leased:
        self.awaited += 1
        return call


def test_lease_stream_asks_as_the_last_piece_goes_out_and_awaits_when_read_past_it():
    answers = Answers(Leased(pieces=((10, 25),)), Leased(wait=True))
    stream = LeaseStream(
        Leased(pieces=((0, 10), (30, 40))),
        answers,
        [0, 10, 20, 30, 40],
        lambda: False,
        answers.answer,
    )
    pieces = stream.pieces()
    assert next(pieces) == (0, 10)
    assert answers.calls == 0  # not the first lease's last piece: nothing asked yet
    assert next(pieces) == (30, 40)
    # Asked as the last piece went out (its round trip overlaps that piece's reading),
    # not awaited until the reading wants a piece past it.
    assert (answers.calls, answers.awaited, stream.taken()) == (1, 0, 1)
    assert next(pieces) == (10, 20)  # cut at the split boundary 20
    assert (answers.awaited, stream.taken()) == (1, 2)
    assert answers.calls == 1  # (10, 20) is not the second lease's last piece
    assert list(pieces) == [(20, 25)]
    assert stream.ended_by == Leased(wait=True)  # the answer that ended it, for the caller
    assert (answers.calls, answers.awaited) == (2, 2)


def test_a_stopped_lease_stream_asks_for_nothing_more():
    answers = Answers(Leased(pieces=((10, 20),)))
    stream = LeaseStream(Leased(pieces=((0, 10),)), answers, [0, 10, 20], lambda: True)
    assert list(stream.pieces()) == []  # stopped: nothing more is read
    assert (answers.calls, stream.ended_by) == (0, None)


def test_a_stream_stopped_while_a_lease_is_asked_never_awaits_it():
    stopped = []
    answers = Answers(Leased(pieces=((10, 20),)))
    stream = LeaseStream(
        Leased(pieces=((0, 10),)), answers, [0, 10, 20], lambda: bool(stopped), answers.answer
    )
    pieces = stream.pieces()
    assert next(pieces) == (0, 10)
    stopped.append(True)
    assert list(pieces) == []
    assert (answers.calls, answers.awaited, stream.ended_by) == (1, 0, None)


def test_a_paced_stream_stopped_with_pieces_in_hand_reads_no_more_and_awaits_nothing():
    # Late answers: the next lease is asked as the first piece goes out (2 still in hand).
    pacing = LeasePacing(base=1, piece_rows=10, round_trip_s=1.0, seconds_per_row=1e-3)
    stopped = []
    answers = Answers(Leased(pieces=((30, 40),)))
    stream = LeaseStream(
        Leased(pieces=((0, 10), (10, 20), (20, 30))),
        answers,
        [0, 10, 20, 30, 40],
        lambda: bool(stopped),
        answers.answer,
        pacing,
        ready=lambda call: True,
    )
    pieces = stream.pieces()
    assert next(pieces) == (0, 10)
    assert answers.calls == 1 and answers.shares == [True]  # asked early, as a share
    stopped.append(True)
    assert list(pieces) == []
    assert (answers.awaited, stream.ended_by) == (0, None)


def test_an_empty_answer_to_an_early_ask_is_left_to_the_caller_to_ask_again():
    # Paced: the ask goes out with rows in hand (a share, offered no straggler's work). Its
    # answer without pieces ends the stream once the hand is read, but is not acted on:
    # `ended_by` stays None, so the caller asks again with nothing in hand.
    pacing = LeasePacing(base=1, piece_rows=10, round_trip_s=1.0, seconds_per_row=1e-3)
    answers = Answers(Leased())
    stream = LeaseStream(
        Leased(pieces=((0, 10), (10, 20))),
        answers,
        [0, 10, 20],
        lambda: False,
        answers.answer,
        pacing,
        ready=lambda call: True,
    )
    assert list(stream.pieces()) == [(0, 10), (10, 20)]
    assert (answers.calls, answers.shares, stream.ended_by) == (1, [True], None)


def test_an_ask_with_nothing_in_hand_is_a_plain_one_even_when_paced():
    pacing = LeasePacing(base=1, piece_rows=10, round_trip_s=1.0, seconds_per_row=1e-3)
    answers = Answers(Leased(wait=True))
    stream = LeaseStream(
        Leased(pieces=((0, 10),)), answers, [0, 10], lambda: False, answers.answer, pacing
    )
    assert list(stream.pieces()) == [(0, 10)]
    assert (answers.shares, stream.ended_by) == ([False], Leased(wait=True))


def test_reading_threads_take_the_next_lease_before_this_one_is_delivered():
    # One reading thread, as a `dynamic` reader has by default: the first lease's rows are
    # not handed on before the next lease was taken (its piece then reads meanwhile), and
    # the one after it is already asked for.
    table = pa.table({"id": pa.array(range(40), pa.int64())})
    source = TableSource(pa.Table.from_batches(table.to_batches(max_chunksize=10)))
    answers = Answers(Leased(pieces=((10, 20),)), Leased())
    stream = LeaseStream(
        Leased(pieces=((0, 10),)), answers, [0, 10, 20, 30, 40], lambda: False, answers.answer
    )
    with ThreadPoolExecutor(1) as pool:
        rows = iter_rows_parallel(source, stream.pieces(), ["id"], pool, 1)
        first = next(rows)
        # the second lease taken, the third asked, while the first one's rows were not out
        assert (answers.calls, answers.awaited) == (2, 1)
        assert first.column("id").to_pylist() == list(range(10))
        assert [i for b in rows for i in b.column("id").to_pylist()] == list(range(10, 20))
    assert stream.ended_by == Leased()
