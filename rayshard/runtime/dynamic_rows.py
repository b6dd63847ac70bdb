"""A reader's row stream under `dynamic`: lease pieces until none is left, then pad to the
equal step count; with `straggler_timeout_s`, drop rows of work taken back meanwhile.

Padding goes one batch at a time with a lease request in between: if a lost rank's work
comes back (and this rank's capacity grows) while it pads, it reads that work instead of
losing it. After its last step it ends once no rows are left to lease and no other rank
holds unfinished work (either could come back); that wait is after the last batch.

A reader that was held up (its consumer silent, its process stopped, a slow read) for
half the straggler timeout asks which of its rows are still leased to it before it passes
on more: rows the coordinator offered to other ranks are dropped, not delivered twice.
"""

from __future__ import annotations

import collections
import itertools
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import ray

from rayshard.config.loader_config import LoaderConfig
from rayshard.data.arrow_numpy import arrow_of, numpy_of
from rayshard.data.batching import FLUSH, INDEX_KEY, Reads, pad_rows
from rayshard.data.reading_order import Cuts, cut_at_boundaries, cut_pieces, split_boundaries
from rayshard.plan import intervals as iv
from rayshard.plan.pieces import as_pieces
from rayshard.runtime.epoch_waits import wait_for_change
from rayshard.runtime.lease_pacing import LeasePacing
from rayshard.runtime.relay_link import Sent
from rayshard.sources import Source


def dynamic_rows(
    coordinator: Any,
    source: Source,
    splits: Any,
    settings: LoaderConfig,
    key: tuple[int, int, int],
    cancel: Callable[[], threading.Event],
    reads: Reads,
    reader: str = "",
    pacing: LeasePacing | None = None,
    leases: Any = None,
    lease_ids: LeaseIds | None = None,
    boundaries: Cuts | np.ndarray | None = None,
) -> Iterator[Any]:
    """Rows (and `FLUSH` marks) of `key = (generation, epoch, dp_rank)`; `cancel()` is the
    reader thread's stop event. The leased pieces are read by `reads` as one stream
    (`LeaseStream`) that asks for the next lease as the pieces in hand run low (at the last
    one while the coordinator answers quickly; earlier, and for more, when its answers come
    late: `LeasePacing`): the reading threads decode the next lease while this one is
    delivered, as a static rank reads its next piece ahead, and the round trip does not
    stall them. A lease answer without pieces ends that stream and is acted on here; no
    lease is asked for once `cancel()` is set. `reader` names the registration the leases
    serve: once the rank registered again (a newer iterator), they are refused. `pacing`:
    the rank's, kept from epoch to epoch by its reading (default: a new one). `leases`:
    an `AckSender` (the consumer's when the rank reads in it, the reader actor's own):
    lease calls then go through the node's relay whenever its acknowledgements or a
    lease answer ask for it (default: straight). `lease_ids`: the
    ids of the reading's calls (default: new ones, as for a new reading). `boundaries`:
    the splits' `split_boundaries` (or `Cuts`, with its read units'), if the reading
    keeps them."""
    generation, epoch, rank = key
    source = source.for_epoch(epoch, settings.plan.seed)
    batch_size = settings.plan.batch_size
    rows_out, last_index = 0, None
    pad_cache: dict[int, pa.RecordBatch] = {}
    finishing = False  # reached the equal step count: only returned work may follow
    pacing = pacing or lease_pacing(settings, splits)
    count = pacing.base
    boundaries = split_boundaries(splits) if boundaries is None else boundaries
    lease_ids = lease_ids or LeaseIds()

    def ask(pieces: int = count, share: bool = False) -> Sent:
        """A lease call in flight for up to `pieces` (its answer is `answer` of it);
        `share`: a paced ask, granted within a share of what is unleased. It reports the
        time the reading waited for answers since the last call (for `loader.stats()`)."""
        args = (generation, rank, epoch, pieces, finishing, lease_ids())
        options = {"reader": reader, "share": share and not finishing}
        options["waited_s"] = pacing.take_waited()
        if leases is not None:
            return leases.lease(args, options)
        return Sent(coordinator.lease.remote(*args, **options), (args, options), "")

    def answer(call: Sent) -> Any:
        """The answer to lease `call`, the time spent waiting for it counted."""
        began = time.monotonic()
        try:
            return leases.answer(call) if leases is not None else ray.get(call.ref)
        finally:
            pacing.waited(time.monotonic() - began)

    def lease() -> Any:
        return answer(ask())

    def ready(call: Sent) -> bool:
        return bool(ray.wait([call.ref], timeout=0)[0])

    leased = None  # an answer not acted on yet; a new lease is asked for only if None
    change_seen = ""  # the coordinator's change token as of this rank's last wait
    while not cancel().is_set():
        if leased is None:
            leased = lease()
        if leased.wait:
            yield FLUSH  # deliver what we hold: others may be waiting for those rows
            key_now = (generation, epoch)
            change_seen = wait_for_change(coordinator, key_now, change_seen, settings, cancel())
            leased = None
            continue
        if leased.pieces:
            stopped = lambda: cancel().is_set()  # noqa: E731
            stream = LeaseStream(leased, ask, boundaries, stopped, answer, pacing, ready)
            rows = reads(stream.pieces(), settings.columns)
            if settings.straggler_timeout_s is not None:
                held = lambda: ray.get(coordinator.held.remote(generation, rank, epoch))  # noqa: E731
                pause_s = settings.straggler_timeout_s / 2
                rows = drop_taken_back(rows, held, pause_s, leases=stream.taken)
            for batch in rows:
                rows_out += batch.num_rows
                last_index = batch.column(INDEX_KEY)[-1].as_py() if batch.num_rows else last_index
                yield batch
            # An answer without pieces that ended the stream came before its read-ahead
            # was delivered: a rank lost since may have raised this rank's step count.
            ended = stream.ended_by
            leased = ended if ended is not None and ended.wait else None
            continue
        # No pieces, no wait: the step count as of this answer (one asked after the last
        # rows were delivered; a later one brings any change, as after every padding batch).
        steps = leased.steps
        target = 0 if not steps else (steps - 1) * batch_size + 1
        if rows_out >= target:
            if finishing:  # and still, after the others' open leases finished
                return
            # Done, unless a lost rank's work comes back: ask once more as finishing
            # (the coordinator then waits for the others' open leases).
            finishing = True
        else:  # (after finishing too: a rank lost meanwhile raised the count)
            finishing = False
            pad = min(batch_size - rows_out % batch_size, target - rows_out)
            yield from pad_rows(source, pad, last_index, settings.columns, pad_cache)
            rows_out += pad
        leased = None


class LeaseIds:
    """Ids of one rank reading's lease calls, "<reading>:<n>", n rising across its streams
    and epochs. Ray's retry of a call in flight (after a coordinator restart), or its
    resend straight past a relay that failed, keeps its id and gets the answer the first
    was given (journaled), not more; a call the reading went past (delivered late by a
    frozen relay, or of a stream it abandoned) is refused (`Lease.check_after`) rather
    than granted to no reader. Safe from several threads (one count)."""

    def __init__(self) -> None:
        self._reading, self._numbers = uuid.uuid4().hex, itertools.count()

    def __call__(self) -> str:
        return f"{self._reading}:{next(self._numbers)}"

    def __reduce__(self) -> tuple:
        """A copy (a `RankReading` pickled into its reader actor) is a new reading: two
        readings with one id would get each other's answers. (Also: `itertools.count`
        itself does not pickle in every Python.)"""
        return LeaseIds, ()


def lease_pacing(settings: LoaderConfig, splits: Any) -> LeasePacing:
    """A rank's lease pacing: without it, enough pieces per call to fill one object's worth
    of batches (pieces of the splits' median size; `splits`: pairs, or an `(n, 2)` array)."""
    spans = as_pieces(splits)
    sizes = np.sort(spans[:, 1] - spans[:, 0]) if len(spans) else np.ones(1, np.int64)
    median = max(1, int(sizes[len(sizes) // 2]))
    base = max(1, -(-settings.block_batches * settings.plan.batch_size // median))
    return LeasePacing(base=base, piece_rows=median)


class LeaseStream:
    """The pieces of consecutive leases, with one lease call in flight at most. The next
    lease is asked for (`ask(count, share)`, a call in flight) as the pieces in hand run low, and
    its answer awaited (`answer(call)`) only when the reading wants a piece past them: the
    round trip overlaps the reading instead of stalling it. How low, and how many pieces
    to ask for, `pacing` decides from measured round trips (without it, or with quick
    answers: as the last piece of a lease goes out, for `base` pieces). `ready(call)` says,
    without waiting, whether an answer came (the round trip is measured by it). Nothing is
    asked once `stopped()`. `taken()` counts the leases whose answers were taken;
    `ended_by` is the answer without pieces (wait, or none left) that ended the stream
    (None if stopped)."""

    def __init__(
        self,
        first: Any,
        ask: Callable[[int, bool], Any],
        boundaries: Cuts | np.ndarray,
        stopped: Callable[[], bool],
        answer: Callable[[Any], Any] = lambda call: call,
        pacing: LeasePacing | None = None,
        ready: Callable[[Any], bool] = lambda call: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._first, self._ask, self._answer, self._ready = first, ask, answer, ready
        self._cuts, self._stopped, self._clock = Cuts.of(boundaries), stopped, clock
        self._pacing = pacing or LeasePacing(
            base=1, piece_rows=1, min_round_trip_s=math.inf, min_lease_s=0.0
        )
        self._taken = 1
        self._asked_out = False  # an answer without pieces came: ask nothing more
        self.ended_by: Any = None

    def pieces(self) -> Iterator[tuple[int, int]]:
        pacing, hand = self._pacing, collections.deque()
        pacing.new_stream(self._first.unleased, self._first.ranks)
        in_hand = self._note(self._first, hand)  # rows of the pieces in `hand`
        call, asked_at, stalled_s, shared = None, 0.0, 0.0, False
        while hand and not self._stopped():
            piece = hand.popleft()
            in_hand -= piece[1] - piece[0]
            if call is None and not self._asked_out and pacing.should_ask(in_hand):
                share = pacing.paced() and in_hand > 0  # asked early, with rows in hand
                call, asked_at, shared = self._ask(pacing.count(), share), self._clock(), share
            pacing.pulled(piece[1] - piece[0], self._clock(), stalled_s)
            stalled_s = 0.0
            yield piece
            if call is None or self._stopped():
                # Once stopped nothing more is read; a lease in flight stays this rank's
                # until it leaves, as a partly read one does.
                continue
            ready = self._ready(call)
            if ready or not hand:
                waited = not ready
                waited_from = self._clock()
                leased = self._answer(call)
                now = self._clock()
                stalled_s = now - waited_from if waited else 0.0
                pacing.answered(asked_at, now, leased.unleased, leased.ranks, waited)
                self._taken += 1
                call = None
                in_hand += self._note(leased, hand, shared)
        if self._stopped():
            self.ended_by = None

    def _note(self, leased: Any, hand: collections.deque, shared: bool = False) -> int:
        """Pieces of `leased` go in `hand`, cut at split boundaries, those that continue
        one another inside a read unit joined (`cut_pieces`; returns their rows);
        an answer without any ends the stream once the hand is read. That of an early
        (`shared`) ask is not acted on (`ended_by` stays None): the caller asks again
        with nothing in hand, when a straggler's work may be offered."""
        if not leased.pieces:
            self._asked_out = True
            self.ended_by = None if shared else leased
        # The last piece stays on its own: an early ask then goes out with rows in hand
        # (shared), as when every split was a piece, not after one joined piece took all.
        pieces = cut_at_boundaries(leased.pieces, self._cuts.splits)
        hand.extend(cut_pieces(pieces[:-1], self._cuts) + pieces[-1:])
        return sum(end - start for start, end in leased.pieces)

    def taken(self) -> int:
        """The leases taken so far."""
        return self._taken


def drop_taken_back(
    rows: Iterator[pa.RecordBatch],
    held: Callable[[], Any],
    pause_s: float,
    clock: Callable[[], float] = time.monotonic,
    leases: Callable[[], int] = lambda: 0,
) -> Iterator[pa.RecordBatch]:
    """`rows` of this rank's leases; after any pause of `pause_s` or more (between two
    batches, or since the rows began), only those still leased to this rank (`held()`,
    intervals from the coordinator) go on, this batch and every later one. `leases()`
    counts the leases taken so far: once one more was taken after that answer, `held()` is
    asked again, so a newer lease's rows are not dropped as if taken back."""
    kept: iv.Intervals | None = None
    kept_after = 0  # leases taken when `kept` was asked for
    last = clock()
    for batch in rows:
        now = clock()
        if now - last >= pause_s or (kept is not None and leases() != kept_after):
            kept_after = leases()
            kept = iv.normalize(held())
        last = now
        if kept is not None:
            batch = keep_rows(batch, kept)
            if batch.num_rows == 0:
                continue
        yield batch


def keep_rows(batch: pa.RecordBatch, kept: iv.Intervals) -> pa.RecordBatch:
    """The rows of `batch` whose `_index` lies in `kept`."""
    index = numpy_of(batch.column(INDEX_KEY))
    mask = np.zeros(index.shape, dtype=bool)
    for start, end in kept:
        mask |= (index >= start) & (index < end)
    return batch if mask.all() else batch.filter(arrow_of(mask))


__all__ = [
    "LeaseIds",
    "LeaseStream",
    "drop_taken_back",
    "dynamic_rows",
    "keep_rows",
    "lease_pacing",
]
