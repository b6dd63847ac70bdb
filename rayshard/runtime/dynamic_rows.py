"""A reader's row stream under `dynamic`: lease pieces until none is left, then pad to the
equal step count; with `straggler_timeout_s`, drop rows of work taken back meanwhile.

Padding goes one batch at a time with a lease request in between: if a lost rank's work
comes back (and this rank's capacity grows) while it pads, it reads that work instead of
losing it. After its last step it ends only once no other rank holds unfinished work that
could come back; that wait is after the last batch, so it never holds up a collective.

A reader that was held up (its consumer silent, its process stopped, a slow read) for
half the straggler timeout asks which of its rows are still leased to it before it passes
on more: rows the coordinator offered to other ranks are dropped, not delivered twice.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import ray

from rayshard.config.loader_config import LoaderConfig
from rayshard.data.batching import FLUSH, INDEX_KEY, Reads, pad_rows, reading_pieces
from rayshard.plan import intervals as iv
from rayshard.sources import Source


def dynamic_rows(
    coordinator: Any,
    source: Source,
    splits: list,
    settings: LoaderConfig,
    key: tuple[int, int, int],
    cancel: Callable[[], threading.Event],
    reads: Reads,
) -> Iterator[Any]:
    """Rows (and `FLUSH` marks) of `key = (generation, epoch, dp_rank)`, each lease's pieces
    read by `reads`; `cancel()` is the reader thread's stop event."""
    generation, epoch, rank = key
    source = source.for_epoch(epoch, settings.plan.seed)
    batch_size = settings.plan.batch_size
    rows_out, last_index = 0, None
    pad_cache: dict[int, pa.RecordBatch] = {}
    finishing = False  # reached the equal step count: only returned work may follow
    # Enough pieces per lease call to fill one object's worth of batches.
    sizes = sorted(end - start for start, end in splits) or [1]
    count = max(1, -(-settings.block_batches * batch_size // sizes[len(sizes) // 2]))
    # Each call has its own id: Ray retries a call in flight when the coordinator restarts,
    # and the retry must get the answer the first call was given (journaled), not more.
    calls = (f"{uuid.uuid4().hex}:{n}" for n in itertools.count())
    while not cancel().is_set():
        leased = ray.get(
            coordinator.lease.remote(generation, rank, epoch, count, finishing, next(calls))
        )
        if leased.wait:
            yield FLUSH  # deliver what we hold: others may be waiting for those rows
            cancel().wait(settings.lease_poll_s)
            continue
        if leased.pieces:
            parts = reading_pieces(list(leased.pieces), splits, shuffle=False, rng_key="")
            rows = reads(parts, settings.columns)
            if settings.straggler_timeout_s is not None:
                held = lambda: ray.get(coordinator.held.remote(generation, rank, epoch))  # noqa: E731
                rows = drop_taken_back(rows, held, settings.straggler_timeout_s / 2)
            for batch in rows:
                rows_out += batch.num_rows
                last_index = int(np.asarray(batch.column(INDEX_KEY))[-1])
                yield batch
            continue
        if finishing:
            return
        steps = ray.get(coordinator.steps.remote(generation, rank, epoch))
        target = 0 if not steps else (steps - 1) * batch_size + 1
        if rows_out >= target:
            # Done, unless a lost rank's work comes back: ask once more as finishing
            # (the coordinator then waits for the others' open leases).
            finishing = True
            continue
        pad = min(batch_size - rows_out % batch_size, target - rows_out)
        yield from pad_rows(source, pad, last_index, settings.columns, pad_cache)
        rows_out += pad


def drop_taken_back(
    rows: Iterator[pa.RecordBatch],
    held: Callable[[], Any],
    pause_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[pa.RecordBatch]:
    """`rows` of one lease; after any pause of `pause_s` or more (between two batches, or
    since the lease came), only those still leased to this rank (`held()`, intervals from
    the coordinator) go on, this batch and every later one."""
    kept: iv.Intervals | None = None
    last = clock()
    for batch in rows:
        now = clock()
        if now - last >= pause_s:
            kept = iv.normalize(held())
        last = now
        if kept is not None:
            batch = keep_rows(batch, kept)
            if batch.num_rows == 0:
                continue
        yield batch


def keep_rows(batch: pa.RecordBatch, kept: iv.Intervals) -> pa.RecordBatch:
    """The rows of `batch` whose `_index` lies in `kept`."""
    index = np.asarray(batch.column(INDEX_KEY))
    mask = np.zeros(index.shape, dtype=bool)
    for start, end in kept:
        mask |= (index >= start) & (index < end)
    return batch if mask.all() else batch.filter(pa.array(mask))


__all__ = ["drop_taken_back", "dynamic_rows", "keep_rows"]
