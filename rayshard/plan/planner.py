"""The planner: a pure function from (configuration, layout, world, epoch, progress) to
which samples every data-parallel rank reads, in how many batches, with what padding.

No clock, no globals; the only randomness (the per-rank file order under `replicate`, and
under `last_batch="drop"` with `shuffled=True` where a rank's dropped samples lie) is seeded
by (seed, epoch, rank).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rayshard.config.checks import check_int
from rayshard.plan import intervals as iv
from rayshard.plan.batches import BatchLayout, batch_layouts
from rayshard.plan.file_shares import file_assignments, samples_of_files
from rayshard.plan.layout import DataLayout
from rayshard.plan.options import PlanConfig
from rayshard.plan.shards import balanced_range, shard_of
from rayshard.plan.validate import validate


@dataclasses.dataclass(frozen=True)
class RankPlan:
    """What one data-parallel rank reads in one epoch.

    `ranges`: the real samples it delivers, half-open, in reading order (dataset order but
    under `shuffle_blocks`); `padded` marked extra samples follow, drawn from `pad_source`
    (cycled). `files`: the file index ranges behind `ranges` in file-level modes;
    `file_order`: the rank's own reading order of files under `replicate`. `order`: on a
    resume on the same world size, the uninterrupted shard's ranges, whose shuffled pieces
    cut to `ranges` are the uninterrupted reading's tail (`batching.reading_pieces`).
    """

    rank: int
    shard: int | None
    ranges: iv.Intervals
    samples: int
    padded: int
    dropped: int
    batches: int
    pad_source: iv.Intervals
    files: iv.Intervals | None = None
    file_order: tuple[int, ...] | None = None
    order: iv.Intervals | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": self.rank,
            "shard": self.shard,
            "ranges": [list(r) for r in self.ranges],
            "samples": self.samples,
            "padded": self.padded,
            "dropped": self.dropped,
            "batches": self.batches,
        }
        if self.files is not None:
            out["files"] = [list(r) for r in self.files]
        if self.file_order is not None:
            out["file_order"] = list(self.file_order)
        return out


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """Every rank's plan for one epoch (or for the rest of one)."""

    epoch: int
    world_size: int
    total_shards: int
    ranks: tuple[RankPlan, ...]

    @property
    def steps(self) -> int:
        """The number of batches the slowest-to-finish rank yields."""
        return max((r.batches for r in self.ranks), default=0)

    def delivered(self) -> iv.Intervals:
        """Every real sample some rank reads (normalized)."""
        return iv.normalize(r for plan in self.ranks for r in plan.ranges)

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "world_size": self.world_size,
            "total_shards": self.total_shards,
            "ranks": [r.to_dict() for r in self.ranks],
        }


def plan_epoch(
    config: PlanConfig,
    layout: DataLayout,
    world_size: int,
    epoch: int,
    *,
    by_files: bool = False,
    shuffled: bool = False,
) -> EpochPlan:
    """Plan one whole epoch for `world_size` data-parallel ranks.

    `by_files=True` splits whole files (file-level modes, with the uneven-file policy);
    otherwise samples are split directly. `shuffled=True` (the samples are read in a
    shuffled order) moves the samples `last_batch="drop"` leaves out with the epoch: a
    seeded window of each rank's share, wrapping around, instead of its tail, so no
    sample is left out of every epoch (PyTorch's `drop_last` over a shuffled sampler).
    """
    validate(config, layout, world_size, by_files=by_files)
    _check_epoch(epoch)
    num_shards = config.shards_for(world_size)
    if by_files:
        assigned = file_assignments(config, layout, world_size, epoch, num_shards)
    else:
        assigned = []
        for rank in range(world_size):
            shard = shard_of(config.rotation, rank, epoch, world_size, num_shards)
            span = balanced_range(shard, num_shards, layout.num_samples)
            assigned.append((shard, iv.concat([span]), None, None))
    sample_ranges = [
        samples_of_files(layout, files) if files is not None else ranges
        for _, ranges, files, _ in assigned
    ]
    layouts = batch_layouts(
        [iv.total(r) for r in sample_ranges],
        config.batch_size,
        config.last_batch,
        config.pad_last_batch,
        config.equal_steps and world_size > 1,
    )
    ranks = tuple(
        rank_plan_for(
            rank,
            shard,
            _without_drop(ranges, lay, config.seed, epoch, rank) if shuffled else ranges,
            lay,
            layout,
            files,
            order,
        )
        for rank, ((shard, _, files, order), ranges, lay) in enumerate(
            zip(assigned, sample_ranges, layouts)
        )
    )
    return EpochPlan(epoch, world_size, num_shards, ranks)


def plan_remaining(
    config: PlanConfig,
    layout: DataLayout,
    world_size: int,
    epoch: int,
    consumed: Sequence[Sequence[int]],
    *,
    previous_world_size: int | None = None,
    by_files: bool = False,
    shuffled: bool = False,
    arrange: Callable[[EpochPlan], EpochPlan] | None = None,
) -> EpochPlan:
    """Plan the rest of `epoch` after the real samples in `consumed` were delivered.

    With an unchanged world size every rank keeps its own shard minus what was consumed,
    so with ranks that consumed in step the result is the tail of the uninterrupted plan.
    On a different world size the remaining samples are re-balanced over the new ranks
    (balanced slices of what is left, in dataset order). Either way every sample of the
    epoch not yet consumed is read exactly once; the rest of an epoch never drops a real
    sample (a `drop` policy behaves like `partial` for it). `shuffled` as for `plan_epoch`:
    the samples the uninterrupted epoch drops are not read. `arrange` is what the caller
    does to a fresh plan after `plan_epoch` (the global shuffle's stretches), done to the
    uninterrupted plan first, so a rank keeps its own arranged samples.
    """
    consumed_set = iv.normalize(consumed)
    if previous_world_size is None:
        previous_world_size = world_size
    saved = dataclasses.replace(config, expected_world_size=None)  # (the saving job's size)
    full = plan_epoch(
        saved, layout, previous_world_size, epoch, by_files=by_files, shuffled=shuffled
    )
    full = full if arrange is None else arrange(full)
    if world_size == previous_world_size:
        kept = [
            (r.shard, iv.subtract(r.ranges, consumed_set), r.files, r.file_order)
            for r in full.ranks
        ]
    else:
        validate(config, layout, world_size, by_files=False, check_expected=False)
        remaining = iv.subtract(full.delivered(), consumed_set)
        left = iv.total(remaining)
        sizes = (
            hi - lo for lo, hi in (balanced_range(r, world_size, left) for r in range(world_size))
        )
        kept = [(None, ranges, None, None) for ranges in iv.split(remaining, sizes)]
    layouts = batch_layouts(
        [iv.total(ranges) for _, ranges, _, _ in kept],
        config.batch_size,
        config.last_batch,
        config.pad_last_batch,
        config.equal_steps and world_size > 1,
        allow_drop=False,
    )
    ranks = tuple(
        rank_plan_for(rank, shard, ranges, lay, layout, files, order)
        for rank, ((shard, ranges, files, order), lay) in enumerate(zip(kept, layouts))
    )
    if world_size == previous_world_size:
        # Padding continues the uninterrupted plan's (same source, past the padding already
        # yielded), so the rest is its tail also for ranks whose real samples ran out; a
        # shuffled reading orders the rest as the uninterrupted one (`RankPlan.order`).
        ranks = tuple(
            dataclasses.replace(
                r, pad_source=_rotated(f.pad_source, f.padded - r.padded), order=f.ranges
            )
            for r, f in zip(ranks, full.ranks)
        )
    return EpochPlan(epoch, world_size, full.total_shards, ranks)


def padding_indices(plan: RankPlan) -> list[int]:
    """The sample indices of a rank's `padded` samples, in order (cycling `pad_source`)."""
    size = iv.total(plan.pad_source)
    if plan.padded == 0 or size == 0:
        return []
    # one pass over the source's first `padded` samples, repeated (a small source pads
    # a long tail: one `take` per turn of the cycle was the cost of the plan tests)
    cycle = list(iv.indices(iv.take(plan.pad_source, 0, min(plan.padded, size))))
    return (cycle * -(-plan.padded // len(cycle)))[: plan.padded]


def iter_batches(plan: RankPlan, batch_size: int) -> Iterator[tuple[list[int], list[bool]]]:
    """A rank's batches in dataset order as (sample indices, padded flags). For small plans."""
    stream = [(i, False) for i in iv.indices(plan.ranges)]
    stream += [(i, True) for i in padding_indices(plan)]
    for start in range(0, len(stream), batch_size):
        chunk = stream[start : start + batch_size]
        yield [i for i, _ in chunk], [p for _, p in chunk]


def _rotated(source: iv.Intervals, offset: int) -> iv.Intervals:
    """`source` as a cycle starting `offset` positions in (no change for `offset <= 0`)."""
    size = iv.total(source)
    if size == 0 or offset <= 0:
        return source
    offset %= size
    return iv.concat(iv.take(source, offset, size) + iv.take(source, 0, offset))


def _without_drop(
    ranges: iv.Intervals, lay: BatchLayout, seed: int, epoch: int, rank: int
) -> iv.Intervals:
    """`ranges` without the `lay.dropped` samples of a window at a seeded position that
    wraps around the end (in reading order), so every sample is left out equally often."""
    size = iv.total(ranges)
    if lay.dropped == 0 or size == 0:
        return ranges
    start = random.Random(f"rayshard-drop:{seed}:{epoch}:{rank}").randrange(size)
    end = start + lay.dropped
    if end <= size:
        return iv.concat(iv.take(ranges, 0, start) + iv.take(ranges, end, size))
    return iv.take(ranges, end - size, start)


def _check_epoch(epoch: int) -> None:
    check_int(epoch, "epoch", minimum=0)


def rank_plan_for(
    rank: int,
    shard: int | None,
    ranges: iv.Intervals,
    lay: BatchLayout,
    layout: DataLayout,
    files: iv.Intervals | None,
    order: tuple[int, ...] | None,
) -> RankPlan:
    """A rank's plan from its ranges (in reading order) and batch layout: the first
    `lay.delivered` samples are read, padding comes from `pad_source` (the delivered
    samples cycled for `wrap`, else the last one; the dataset's when none)."""
    delivered = iv.take(ranges, 0, lay.delivered)
    if lay.pad_mode == "wrap":
        pad_source = delivered or iv.concat([(0, layout.num_samples)])
    elif delivered:
        last = delivered[-1][1] - 1
        pad_source = ((last, last + 1),)
    elif layout.num_samples:
        pad_source = ((layout.num_samples - 1, layout.num_samples),)
    else:
        pad_source = ()
    return RankPlan(
        rank=rank,
        shard=shard,
        ranges=delivered,
        samples=lay.delivered,
        padded=lay.padded,
        dropped=lay.dropped,
        batches=lay.batches,
        pad_source=pad_source,
        files=files,
        file_order=order,
    )
