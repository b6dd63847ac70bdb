"""Balanced shard ranges and which shard a rank reads in an epoch."""

from __future__ import annotations

from rayshard.plan.options import Rotation


def balanced_range(index: int, num_shards: int, num_items: int) -> tuple[int, int]:
    """Shard `index` of `num_shards` over `num_items`: `[floor(i*N/S), floor((i+1)*N/S))`."""
    return index * num_items // num_shards, (index + 1) * num_items // num_shards


def balanced_ranges(num_shards: int, num_items: int) -> list[tuple[int, int]]:
    """All shards: disjoint, covering `[0, num_items)`, sizes within one of each other."""
    return [balanced_range(i, num_shards, num_items) for i in range(num_shards)]


def shard_of(rotation: Rotation, rank: int, epoch: int, world_size: int, num_shards: int) -> int:
    """The shard rank `rank` reads in `epoch`.

    - `none`: `r` forever (needs S == W).
    - `shift`: `(r + e) % S`; with S == W every rank sees every shard over S epochs.
    - `stride`: `(e*W + r) % S` (needs S % W == 0); every block of S/W epochs covers every
      shard exactly once, but with S == W it never rotates.
    - `stride_shift`: `stride` whose blocks are shifted by one shard per block:
      `(j*W + r + b) % S` with `b = e // (S/W)`, `j = e % (S/W)`. Each block still covers
      every shard once, and over S blocks every rank sees every shard.
    """
    if rotation is Rotation.NONE:
        return rank
    if rotation is Rotation.SHIFT:
        return (rank + epoch) % num_shards
    if rotation is Rotation.STRIDE:
        return (epoch * world_size + rank) % num_shards
    block_len = num_shards // world_size
    block, step = divmod(epoch, block_len)
    return (step * world_size + rank + block) % num_shards
