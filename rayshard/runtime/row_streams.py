"""The row streams a reader batches: a rank's planned rows (static policies, with the
shuffles and the padding), or its documents packed into rows of tokens."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from rayshard.batching import Reads, iter_padding, reading_pieces
from rayshard.core.planning import rank_pieces
from rayshard.runtime.packing_stage import packed_batches
from rayshard.runtime.pipeline import flush_before_error
from rayshard.settings import LoaderSettings
from rayshard.shuffle import shuffle_batches
from rayshard.shuffle_blocks import block_shuffle
from rayshard.sources import Source


def static_rows(
    source: Source, settings: LoaderSettings, splits: Any, plan: Any, epoch: int, reads: Reads
) -> Iterator[pa.RecordBatch]:
    """The rank's planned ranges of `epoch` in reading order (pieces shuffled by
    `shuffle`; read by `reads`), through the block and buffer shuffles when on, then the
    padding rows."""
    pieces = reading_pieces(
        plan.ranges,
        splits,
        shuffle=settings.shuffle,
        rng_key=f"rayshard:{settings.plan.seed}:{epoch}:{plan.rank}",
    )
    source = source.for_epoch(epoch, settings.plan.seed)
    real = reads(pieces, settings.columns)
    if settings.shuffle_blocks:
        real = block_shuffle(real, settings.shuffle_blocks, settings.plan.seed, epoch, plan.rank)
    if settings.shuffle_buffer:
        real = shuffle_batches(real, settings.shuffle_buffer, settings.plan.seed, epoch, plan.rank)
    return itertools.chain(real, iter_padding(source, plan, settings.columns))


def packed_rows(
    settings: LoaderSettings,
    splits: Any,
    plan: Any,
    epoch: int,
    reads: Reads,
    offsets: dict,
) -> Iterator[Any]:
    """The rank's documents (read by `reads`) packed into `plan.batches` batches of packed
    rows (`rayshard.runtime.packing_stage`), skipping the `offsets` tokens already delivered of
    split documents."""
    packing = settings.packing
    pieces = rank_pieces(settings, splits, plan, epoch)
    real = reads(pieces, [packing.column])
    return flush_before_error(
        packed_batches(real, packing, settings.plan.batch_size, offsets, plan.batches)
    )
