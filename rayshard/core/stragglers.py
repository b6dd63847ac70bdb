"""Stragglers under `dynamic`: a rank that holds leases and goes silent for
`straggler_timeout_s` has its unacknowledged work offered to the ranks that ask for more.

Pure: the clock comes in with the lease request that asks (a journaled command), so a
replayed journal takes the same decisions. The straggler stays a member: it may come back,
and what it delivers of the work taken from it counts as duplicates, within
`late_rows_bound`; its reader drops what it had not yet made into batches.
"""

from __future__ import annotations

from rayshard.config.loader_config import LoaderConfig
from rayshard.core.leases import LeaseBook
from rayshard.plan import intervals as iv

TRANSFORM_AHEAD = 2  # calls per transform worker in flight (`parallel_transform_stream`)
GROUP_BATCHES = 16  # batches per transform worker call at most (`GroupSize`)


def reoffer(
    book: LeaseBook, requester: int, now: float, timeout: float
) -> list[tuple[int, iv.Intervals]]:
    """`requester` found no work at `now`: take back the unacknowledged rows of every other
    rank silent for `timeout` (no lease taken, no batch acknowledged). Returns each such
    rank with the rows put back at the front of the queue."""
    book.unstall(requester)
    return [
        (rank, tuple(book.revoke(rank)))
        for rank in book.stragglers(now, timeout, exclude=requester)
    ]


def late_rows_bound(settings: LoaderConfig) -> int:
    """Rows of revoked work a straggler may still deliver once it wakes: what had already
    passed its reader's check when it went silent. Blocks (of `block_batches` batches): the
    read-ahead budget's `blocks_ahead` ready in the object store and the block being
    filled; `blocks_ahead + 1` its consumer requested and the one it is going through; the
    rebatching remainder (one batch); the device feed's `prefetch_depth` batches (torch
    format); batches in its transform (or reader) workers' calls and the group being filled
    for the next call. Counted each time a rank straggles."""
    per_block = settings.block_batches
    ahead = settings.blocks_ahead
    workers = settings.worker_count if settings.worker_count > 1 else 0
    in_workers = (TRANSFORM_AHEAD * workers + 1) * GROUP_BATCHES if workers else 0
    batches = (2 * ahead + 3) * per_block + 1 + settings.prefetch_depth + in_workers
    return batches * settings.plan.batch_size


__all__ = ["late_rows_bound", "reoffer"]
