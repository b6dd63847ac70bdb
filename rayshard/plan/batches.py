"""Batch counts at the end of a shard: last-batch policies, padding, equal steps.

Everything here works on counts only; which samples pad a shard is `padding_indices`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rayshard.plan.options import LastBatch


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    """How one rank's real samples become batches.

    `delivered` real samples are read (the first ones in reading order), followed by
    `padded` marked extra samples; the stream is cut into batches of `batch_size`, the
    last one possibly short. `dropped` real samples of the shard are not read this epoch.
    """

    delivered: int
    padded: int
    dropped: int
    batches: int
    pad_mode: str  # "repeat" (last sample again) or "wrap" (start of the shard again)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def batch_layouts(
    sizes: Sequence[int],
    batch_size: int,
    last_batch: LastBatch,
    pad_last_batch: bool,
    equal_steps: bool,
    *,
    allow_drop: bool = True,
) -> list[BatchLayout]:
    """Layouts for ranks whose shards hold `sizes` real samples.

    - `pad_last_batch`: every shard is padded (repeating its last sample) to the largest
      shard size rounded up to a multiple of B: equal, full batches everywhere.
    - `partial`: ceil(n/B) batches; `drop`: floor(n/B); `fill`: ceil(n/B) full batches,
      wrapping around to the start of the shard.
    - `equal_steps`: ranks with fewer batches catch up. Under `drop` everyone drops down to
      the smallest count (dropping is what was asked for); under `partial` and `fill` the
      short ranks get marked padding, as little as needed.
    - `allow_drop=False` (used when re-planning the rest of an epoch) never drops a real
      sample: `drop` then behaves like `partial`.
    """
    B = batch_size
    if pad_last_batch:
        target = _ceil_div(max(sizes, default=0), B) * B
        return [BatchLayout(n, target - n, 0, target // B, "repeat") for n in sizes]
    policy = last_batch
    if policy is LastBatch.DROP and not allow_drop:
        policy = LastBatch.PARTIAL
    if policy is LastBatch.DROP:
        counts = [n // B for n in sizes]
        if equal_steps and counts:
            counts = [min(counts)] * len(counts)
        return [BatchLayout(c * B, 0, n - c * B, c, "repeat") for n, c in zip(sizes, counts)]
    counts = [_ceil_div(n, B) for n in sizes]
    steps = max(counts, default=0)
    layouts = []
    for n, c in zip(sizes, counts):
        if equal_steps:
            c = steps
        if policy is LastBatch.FILL:
            layouts.append(BatchLayout(n, c * B - n, 0, c, "wrap"))
        else:
            minimal = 0 if c == 0 else (c - 1) * B + 1
            layouts.append(BatchLayout(n, max(minimal - n, 0), 0, c, "repeat"))
    return layouts


def batch_sizes(layout: BatchLayout, batch_size: int) -> list[int]:
    """The size of every batch of a layout, in order."""
    stream = layout.delivered + layout.padded
    full, rest = divmod(stream, batch_size)
    sizes = [batch_size] * full + ([rest] if rest else [])
    if len(sizes) != layout.batches:
        raise AssertionError(f"internal: {layout} gives {len(sizes)} batches")  # pragma: no cover
    return sizes
