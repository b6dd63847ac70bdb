"""The row streams a reader batches: a rank's planned rows (static policies, with the
shuffles and the padding), its leased rows (`dynamic`), or its documents packed into rows
of tokens; `epoch_batches` picks one for an epoch as the coordinator started it, the same
in a reader actor and in a consumer that reads for itself (`rayshard.runtime.local_reads`)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import ray

from rayshard.config.loader_config import LoaderConfig
from rayshard.core.planning import rank_pieces
from rayshard.core.sharding import ShardingPolicy
from rayshard.core.shuffle import shuffle_batches
from rayshard.core.shuffle_blocks import block_shuffle
from rayshard.data.batching import Reads, iter_padding, iter_rows_parallel
from rayshard.data.reading_order import Cuts, split_boundaries
from rayshard.device.affinity import reader_pool
from rayshard.runtime.dynamic_rows import LeaseIds, dynamic_rows, lease_pacing
from rayshard.runtime.packing_stage import packed_batches
from rayshard.runtime.pipeline import flush_before_error, reader_batches
from rayshard.runtime.reading_threads import reading_threads
from rayshard.sources import Source


def static_rows(
    source: Source,
    settings: LoaderConfig,
    splits: Any,
    plan: Any,
    epoch: int,
    reads: Reads,
    boundaries: Any = None,
) -> Iterator[pa.RecordBatch]:
    """The rank's planned ranges of `epoch` in reading order (pieces shuffled by
    `shuffle`; read by `reads`), through the block and buffer shuffles when on, then the
    padding rows. `boundaries`: the reading's `Cuts` (or the splits' `split_boundaries`), if
    it keeps them."""
    pieces = rank_pieces(settings, splits, plan, epoch, boundaries)
    source = source.for_epoch(epoch, settings.plan.seed)
    real = reads(pieces, settings.columns)
    if settings.shuffle_blocks:
        real = block_shuffle(real, settings.shuffle_blocks, settings.plan.seed, epoch, plan.rank)
    if settings.shuffle_buffer:
        real = shuffle_batches(real, settings.shuffle_buffer, settings.plan.seed, epoch, plan.rank)
    return itertools.chain(real, iter_padding(source, plan, settings.columns))


def packed_rows(
    settings: LoaderConfig,
    splits: Any,
    plan: Any,
    epoch: int,
    reads: Reads,
    offsets: dict,
    boundaries: Any = None,
) -> Iterator[Any]:
    """The rank's documents (read by `reads`) packed into `plan.batches` batches of packed
    rows (`rayshard.runtime.packing_stage`), skipping the `offsets` tokens already delivered of
    split documents; `boundaries`: as for `static_rows`."""
    packing = settings.packing
    pieces = rank_pieces(settings, splits, plan, epoch, boundaries)
    real = reads(pieces, [packing.column])
    return flush_before_error(
        packed_batches(real, packing, settings.plan.batch_size, offsets, plan.batches)
    )


def epoch_batches(
    started: dict,
    key: tuple[int, int, int],
    *,
    coordinator: Any,
    source: Source,
    splits: Any,
    settings: LoaderConfig,
    cancel: Callable[[], threading.Event],
    reads: Reads,
    batches: Callable[[Iterator[pa.RecordBatch]], Iterator[Any]],
    pacing: Any = None,
    leases: Any = None,
    lease_ids: Any = None,
    boundaries: Any = None,
) -> Iterator[Any]:
    """The batches (and `FLUSH` marks) of `key = (generation, epoch, dp_rank)`, as the
    coordinator's `start_epoch` answered (`started`): packed documents, leased rows under
    `dynamic`, or the static plan's rows. `reads` reads pieces (under `dynamic`, the leases
    as one stream: `dynamic_rows`), `batches(rows)` rebatches
    (and transforms) rows; `cancel()` stops a `dynamic` stream, which `pacing` paces and
    whose lease calls, named by `lease_ids`, `leases` may relay (see `dynamic_rows`);
    `boundaries`: as for `static_rows`."""
    _, epoch, _ = key
    plan = started["plan"]
    if settings.packing is not None:
        partial = started.get("partial") or {}
        stream = packed_rows(settings, splits, plan, epoch, reads, partial, boundaries)
    elif plan is None:
        reader = started.get("reader", "")
        args = (coordinator, source, splits, settings, key, cancel, reads, reader, pacing)
        rows = dynamic_rows(*args, leases=leases, lease_ids=lease_ids, boundaries=boundaries)
        stream = batches(rows)
    else:
        stream = batches(static_rows(source, settings, splits, plan, epoch, reads, boundaries))
    return _then_let_go(stream, source)


def _then_let_go(stream: Iterator[Any], source: Source) -> Iterator[Any]:
    """`stream`, then `source.let_go()` however it ends (read to its end, closed, failed):
    what the source kept decoded for the epoch's reads goes with it."""
    try:
        yield from stream
    finally:
        source.let_go()


class RankReading:
    """What one rank reads with, wherever it reads (a reader actor, or its consumer's own
    threads): the source, its splits, the configuration, the transform and the reading
    threads, made on first use. `epoch(...)` is the rank's batch stream of an epoch."""

    def __init__(
        self,
        coordinator: Any,
        source: Source,
        settings: LoaderConfig,
        dp_rank: int,
        loader_id: str = "",
        transform: Any = None,
    ) -> None:
        self.coordinator, self.source, self.settings = coordinator, source, settings
        self.dp_rank, self.loader_id, self.transform = dp_rank, loader_id, transform
        self._splits: Any = None
        self._boundaries: Any = None
        self._pool: Any = None
        self._threads = 1
        self._pacing: Any = None  # under `dynamic`: lease pacing, kept across epochs
        self._lease_ids = LeaseIds()  # under `dynamic`: its lease calls' ids (see there)

    def splits(self) -> Any:
        """The source's splits as an `(n, 2)` array (`split_array`: at millions of splits,
        a tenth of a list of tuples' memory, and made without a Python step per split)."""
        if self._splits is None:
            self._splits = self.source.split_array()
        return self._splits

    def boundaries(self) -> Cuts:
        """The splits' and the read units' `split_boundaries` (`Cuts`; no read units: no
        pieces joined), made once: every epoch cuts at them."""
        if self._boundaries is None:
            units, splits = self.source.read_units(), split_boundaries(self.splits())
            joins = units is not None and len(units) != len(self._splits)  # a split per unit: none
            self._boundaries = Cuts(splits, split_boundaries(units) if joins else None)
        return self._boundaries

    def pool(self) -> Any:
        """The reading threads: `reading_threads(reader_threads)` of them, pinned by
        `RAYSHARD_AFFINITY_MASK` (thread i on the i-th CPU id; threads past the list keep
        the default affinity). Made in the process that reads, which decides how many."""
        if self._pool is None:
            self._threads = reading_threads(self.settings.reader_threads)
            self._pool = reader_pool(self._threads)
        return self._pool

    @property
    def threads(self) -> int:
        """How many threads read here (decided by `pool()`, in the process that reads)."""
        self.pool()
        return self._threads

    def start_epoch(self, generation: int, epoch: int) -> dict:
        """Ask the coordinator to begin `epoch` for this rank (`Coordinator.start_epoch`),
        with an id of this reading's lease calls taken now: a call of a stream it started
        before (left in flight by a restart) is then refused, not granted to no reader."""
        floor = self._lease_ids()
        return ray.get(self.coordinator.start_epoch.remote(generation, self.dp_rank, epoch, floor))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def thread_reads(self, epoch: int) -> Reads:
        """`epoch`'s pieces read by this process's reading threads (see `thread_reads`)."""
        pool = self.pool()
        return thread_reads(self.source, self.settings, epoch, pool, self._threads)

    def epoch(
        self,
        started: dict,
        generation: int,
        epoch: int,
        *,
        cancel: Callable[[], threading.Event],
        reads: Reads | None = None,
        workers: Callable[[], list] | None = None,
        keep_text: bool = False,
        leases: Any = None,
    ) -> Iterator[Any]:
        """`epoch_batches` of this rank, read by `reads` (default: this process's reading
        threads), rebatched and transformed here or in `workers()`; `keep_text`: see
        `reader_batches`; `leases`: see `dynamic_rows`."""
        settings = self.settings
        if self._pacing is None and started.get("plan") is None:
            self._pacing = lease_pacing(settings, self.splits())
        return epoch_batches(
            started,
            (generation, epoch, self.dp_rank),
            coordinator=self.coordinator,
            source=self.source,
            splits=self.splits(),
            boundaries=self.boundaries(),
            settings=settings,
            cancel=cancel,
            reads=reads or self.thread_reads(epoch),
            pacing=self._pacing,
            leases=leases,
            lease_ids=self._lease_ids,
            batches=lambda rows: reader_batches(
                rows,
                batch_size=settings.plan.batch_size,
                rules=settings.column_rules,
                transform=self.transform,
                workers=workers,
                loader=self.loader_id,
                seed=settings.plan.seed,
                epoch=epoch,
                rank=self.dp_rank,
                keep_text=keep_text,
            ),
        )


def thread_reads(
    source: Source, settings: LoaderConfig, epoch: int, pool: Any, ahead: int
) -> Reads:
    """Pieces of `epoch` read in this process by `pool`'s threads, `ahead` pieces ahead
    (one per thread), in piece order."""
    source = source.for_epoch(epoch, settings.plan.seed)
    return lambda pieces, columns: iter_rows_parallel(source, pieces, columns, pool, ahead)


def length_is_exact(settings: LoaderConfig) -> bool:
    """Whether an epoch's batch count is final when it starts: static policies, and
    `dynamic` with equal steps."""
    return settings.policy is not ShardingPolicy.DYNAMIC or settings.plan.equal_steps
