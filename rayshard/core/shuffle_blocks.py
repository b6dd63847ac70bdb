"""A streaming global shuffle with bounded memory, in two pure steps.

1. Plan: the epoch's splits are permuted for `(seed, epoch)` into one global sequence
   shared by every rank; each rank keeps its planned number of samples but takes them as
   consecutive stretches of that sequence (rank 0 the first ones, and so on), so a rank
   reads splits from the whole dataset, not from one contiguous shard. Resuming an epoch
   (on any world size) lays the samples not yet consumed out in the same sequence order.
2. Read: a rank's rows are cut into shuffle blocks of `block_rows` consecutive rows
   (several splits each) and each block is permuted, so at most one block is held.

Like MosaicML Streaming's `py1b` (shuffled shards, shuffle blocks spanning several of
them). Everything is a function of (seed, epoch, the plan); no clock, no global state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from rayshard.core.shuffle import epoch_rng
from rayshard.data.arrow_numpy import arrow_of
from rayshard.plan import EpochPlan
from rayshard.plan import intervals as iv

_SEQUENCE = 3
_BLOCKS = 4


def global_sequence(splits: Sequence[tuple[int, int]], seed: int, epoch: int) -> iv.Intervals:
    """Every sample, as the splits permuted for (seed, epoch), in that order."""
    # (S,) split positions in the epoch's order
    order = epoch_rng(seed, epoch, None, _SEQUENCE).permutation(len(splits))
    return iv.concat(tuple(splits[i]) for i in order)


def along_sequence(plan: EpochPlan, sequence: iv.Intervals) -> EpochPlan:
    """`plan` with each rank's samples taken, in its planned count, as the next stretch of
    the samples the plan delivers laid out in `sequence` order (exactly once: the stretches
    partition them)."""
    # the delivered samples, in sequence order
    ordered = iv.intersect(sequence, plan.delivered())
    stretches = iv.split(ordered, (iv.total(rank.ranges) for rank in plan.ranks))
    ranks = (dataclasses.replace(r, ranges=s) for r, s in zip(plan.ranks, stretches))
    return dataclasses.replace(plan, ranks=tuple(ranks))


def block_shuffle(
    batches: Iterable[pa.RecordBatch], block_rows: int, seed: int, epoch: int, rank: int
) -> Iterator[pa.RecordBatch]:
    """The rows of `batches`, each run of `block_rows` consecutive rows (the last one may
    be shorter) permuted; holds at most one block plus one input batch. The output depends
    only on the row sequence (not on how it is cut into batches), seed, epoch and rank."""
    rng = epoch_rng(seed, epoch, rank, _BLOCKS)
    queue: list[pa.RecordBatch] = []
    queued = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        queue.append(batch)
        queued += batch.num_rows
        while queued >= block_rows:
            table = pa.Table.from_batches(queue)
            block, rest = table.slice(0, block_rows), table.slice(block_rows)
            yield from _permuted(block, rng)
            queue = [b for b in rest.combine_chunks().to_batches() if b.num_rows]
            queued -= block_rows
    if queued:
        yield from _permuted(pa.Table.from_batches(queue), rng)


def _permuted(block: pa.Table, rng: np.random.Generator) -> Iterator[pa.RecordBatch]:
    # (rows,) a permutation of the block's rows
    order = rng.permutation(block.num_rows)
    yield from block.take(arrow_of(order)).combine_chunks().to_batches()


__all__ = ["along_sequence", "block_shuffle", "global_sequence"]
