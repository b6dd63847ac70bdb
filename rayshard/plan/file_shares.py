"""Which files each rank reads in file-level modes: whole files split over shards under
the uneven-file policy (Whale's `replicate`, `unbalanced`, `drop`)."""

from __future__ import annotations

import random

from rayshard.plan import intervals as iv
from rayshard.plan.layout import DataLayout
from rayshard.plan.options import PlanConfig, Rotation, Uneven
from rayshard.plan.shards import balanced_range, shard_of


def file_assignments(
    config: PlanConfig, layout: DataLayout, world_size: int, epoch: int, num_shards: int
) -> list[tuple[int | None, iv.Intervals, iv.Intervals, tuple[int, ...] | None]]:
    """(shard, unused, file ranges, file order) per rank in file-level modes."""
    num_files = layout.num_files
    if config.uneven is Uneven.REPLICATE:
        out = []
        for rank in range(world_size):
            order = list(range(num_files))
            random.Random(f"rayshard:{config.seed}:{epoch}:{rank}").shuffle(order)
            # the rank reads the files in its own order (its ranges are a reading order)
            out.append((None, (), iv.concat((f, f + 1) for f in order), tuple(order)))
        return out
    if config.uneven is Uneven.DROP:
        sitting_out = num_files % num_shards
        # The files that sit out move on once per cycle of the rotation that reads every
        # shard once: an epoch, or a block of S/W epochs under the stride rotations. Moving
        # them every epoch under `stride` can stay in step with it and skip files forever
        # (e.g. F=9, S=6, W=2 never reads files 3, 4, 7, 8). One rank's `shift` is
        # `stride` (F=9, S=6, W=1 under `shift` never read files 1, 5, 6).
        blocks = config.rotation in _BLOCK_ROTATIONS or world_size == 1
        cycle = num_shards // world_size if blocks else 1
        start = epoch // cycle * sitting_out % num_files if num_files else 0
        kept = num_files - sitting_out
    else:
        start, kept = 0, num_files
    out = []
    for rank in range(world_size):
        shard = shard_of(config.rotation, rank, epoch, world_size, num_shards)
        lo, hi = balanced_range(shard, num_shards, kept)
        # Positions lo..hi of the kept files, which start at `start` and wrap around.
        files = iv.concat(_wrapped(start + lo, start + hi, num_files) if hi > lo else [])
        out.append((shard, (), files, None))
    return out


_BLOCK_ROTATIONS = (Rotation.STRIDE, Rotation.STRIDE_SHIFT)


def _wrapped(lo: int, hi: int, n: int) -> list[tuple[int, int]]:
    """Positions `[lo, hi)` taken modulo `n` (with `hi - lo <= n`), as up to two ranges."""
    lo, hi = lo % n, (hi - 1) % n + 1
    return [(lo, hi)] if lo < hi else [(lo, n), (0, hi)]


def samples_of_files(layout: DataLayout, files: iv.Intervals) -> iv.Intervals:
    offsets = layout.offsets
    return iv.concat((offsets[a], offsets[b]) for a, b in files)


__all__ = ["file_assignments", "samples_of_files"]
