"""Seeded shuffling: the order of splits in an epoch, and a bounded row buffer in a rank.

Pure functions of (input, seed, epoch, rank); no clock, no globals. Randomness comes from
numpy generators seeded by `SeedSequence([seed, epoch, rank, purpose])`, so the same
inputs give the same order on every run (with the same numpy), a different epoch or rank
gives a different one, and the split order and the buffer never share a stream.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from rayshard.config.checks import check_int
from rayshard.data.arrow_numpy import arrow_of

T = TypeVar("T")

_SPLIT_ORDER = 1
_BUFFER = 2
_LEASES = 3


def epoch_rng(
    seed: int, epoch: int, rank: int | None = None, purpose: int = 0
) -> np.random.Generator:
    """A generator for one (seed, epoch, rank); `rank=None` is the one shared by all ranks."""
    check_int(seed, "seed", minimum=0, integral=True)
    check_int(epoch, "epoch", minimum=0, integral=True)
    rank_key = 0 if rank is None else int(rank) + 1
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch), rank_key, purpose]))


def split_order(
    splits: Sequence[T], seed: int, epoch: int, rank: int | None = None, *, units: Any = None
) -> list[T]:
    """`splits` permuted for this (seed, epoch, rank); `rank=None` gives the global order.
    An array of pieces (`rayshard.plan.pieces`) comes back as an array, permuted alike.
    `units` (ranges sorted by start, `Source.read_units`; `splits` then an array): the
    units are permuted instead, each one's splits kept together and in order, so a run of
    them is one read (a row group decoded once) rather than parts of many; with as many
    units as splits (one split each), the order without them."""
    rng = epoch_rng(seed, epoch, rank, _SPLIT_ORDER)
    if units is not None and len(splits) and 0 < len(units) != len(splits):
        splits, units = np.asarray(splits), np.asarray(units, dtype=np.int64).reshape(-1, 2)
        slot = np.empty(len(units), dtype=np.int64)  # (u,) each unit's place in the order
        slot[rng.permutation(len(units))] = np.arange(len(units))
        # (n,) the unit each split starts in
        unit = np.maximum(np.searchsorted(units[:, 0], splits[:, 0], side="right") - 1, 0)
        return splits[np.argsort(slot[unit], kind="stable")]
    # (n,) a permutation of split positions
    order = rng.permutation(len(splits))
    if isinstance(splits, np.ndarray):
        return splits[order]
    return [splits[i] for i in order]


def lease_order(pieces: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """A `dynamic` epoch's pieces (an `(n, 2)` array) in its `shuffle=True` leasing order:
    permuted for (seed, epoch) by a stream of its own, apart from `split_order`'s."""
    return pieces[epoch_rng(seed, epoch, None, _LEASES).permutation(len(pieces))]


def shuffle_batches(
    batches: Iterable[pa.RecordBatch],
    buffer_rows: int,
    seed: int,
    epoch: int,
    rank: int | None = None,
    *,
    emit_rows: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """Rows of `batches` in a seeded, locally shuffled order, holding at most `buffer_rows`.

    tf.data's shuffle buffer, vectorised: whenever `buffer_rows` rows are buffered, a random
    `emit_rows` of them (default a quarter of the buffer) are yielded as one batch, and
    reading goes on. At the end the rest comes out in a random order. Every row comes out
    exactly once. The output depends only on the sequence of input rows (not on how they
    are cut into batches), the seed, the epoch and the rank. `buffer_rows <= 1` passes the
    input through unchanged.
    """
    check_int(buffer_rows, "buffer_rows", minimum=0, integral=True)
    if buffer_rows <= 1:
        yield from batches
        return
    step = max(1, buffer_rows // 4) if emit_rows is None else emit_rows
    check_int(step, "emit_rows", minimum=1, integral=True)
    step = min(step, buffer_rows)
    rng = epoch_rng(seed, epoch, rank, _BUFFER)
    queue: list[pa.RecordBatch] = []
    queued = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        queue.append(batch)
        queued += batch.num_rows
        while queued >= buffer_rows:
            table = pa.Table.from_batches(queue)
            window, rest = table.slice(0, buffer_rows), table.slice(buffer_rows)
            # (step,) distinct positions of the window, in random order
            chosen = rng.choice(buffer_rows, size=step, replace=False)
            keep = np.ones(buffer_rows, dtype=bool)
            keep[chosen] = False
            yield _one_batch(window.take(arrow_of(chosen)))
            queue = _batches(window.filter(arrow_of(keep))) + _batches(rest)
            queued -= step
    if queued:
        table = pa.Table.from_batches(queue)
        # (queued,) the rest, in random order
        order = rng.permutation(queued)
        for start in range(0, queued, step):
            yield _one_batch(table.take(arrow_of(order[start : start + step])))


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches, schema=table.schema).combine_chunks().to_batches()[0]


def _batches(table: pa.Table) -> list[pa.RecordBatch]:
    return [b for b in table.combine_chunks().to_batches() if b.num_rows]
