"""Which plan the coordinator serves: the sharding policy applied to the pure planner."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rayshard.config.loader_config import LoaderConfig
from rayshard.core.packing import count_rows, count_split_rows
from rayshard.core.sharding import ShardingPolicy, assign
from rayshard.core.shuffle_blocks import along_sequence, global_sequence
from rayshard.core.state import LoaderState
from rayshard.data.reading_order import reading_pieces
from rayshard.plan import EpochPlan, RankPlan, Uneven, plan_remaining
from rayshard.sources.base import Source


def epoch_plan(
    settings: LoaderConfig,
    source: Source,
    dp_size: int,
    epoch: int,
    resume: LoaderState | None = None,
) -> EpochPlan:
    """The plan of `epoch` for `dp_size` ranks, or of its rest when `resume` is that epoch.

    A state at an epoch's start (nothing consumed: saved between epochs, or rewritten by
    `rayshard state skip-epoch`) plans that epoch fresh on this world size, its policy's
    files and drops included. The rest of an epoch is re-planned from the samples
    consumed, under the policy the saving world size had (`file_or_data` may resolve
    otherwise on another): each rank keeps its own remaining samples on the same world
    size (under `shuffle_blocks`, of its own stretch of the sequence), the remainder is
    re-balanced on another. Where every rank reads everything (`off`, and the `file`
    policy's `uneven="replicate"`), resuming mid-epoch gives every rank the rest: what no
    rank consumed.
    """
    arrange = None
    if settings.shuffle_blocks:  # the global shuffle: ranks read along one split sequence
        sequence = global_sequence(source.splits(), settings.plan.seed, epoch)
        arrange = functools.partial(along_sequence, sequence=sequence)
    plan = _epoch_plan(settings, source, dp_size, epoch, resume, arrange)
    return plan if arrange is None else arrange(plan)


def _epoch_plan(
    settings: LoaderConfig,
    source: Source,
    dp_size: int,
    epoch: int,
    resume: LoaderState | None,
    arrange: Callable[[EpochPlan], EpochPlan] | None,
) -> EpochPlan:
    shuffled = settings.reads_shuffled
    assignment = assign(settings.policy, settings.plan, source, dp_size, epoch, shuffled=shuffled)
    if resume is None or resume.epoch != epoch or not (resume.consumed or resume.partial):
        return assignment.plan  # (an epoch's start, on any world size: a fresh epoch)
    saved_world = resume.world_size or dp_size  # (0: unknown, as `state` allows)
    policy = assignment.policy
    if assignment.requested is ShardingPolicy.FILE_OR_DATA and saved_world != dp_size:
        unchecked = dataclasses.replace(settings.plan, expected_world_size=None)
        requested = ShardingPolicy.FILE_OR_DATA
        policy = assign(requested, unchecked, source.layout(), saved_world, epoch).policy
    replicated = policy is ShardingPolicy.FILE and settings.plan.uneven is Uneven.REPLICATE
    if policy is ShardingPolicy.OFF or replicated:
        single = dataclasses.replace(settings.plan, total_shards=1, expected_world_size=None)
        rest = plan_remaining(
            single, source.layout(), 1, epoch, resume.consumed, previous_world_size=1
        ).ranks[0]
        # (every rank reads the rest, in its own order: not one rank's uninterrupted one)
        ranks = tuple(dataclasses.replace(rest, rank=r, order=None) for r in range(dp_size))
        return dataclasses.replace(assignment.plan, ranks=ranks)
    return plan_remaining(
        settings.plan,
        source.layout(),
        dp_size,
        epoch,
        resume.consumed,
        previous_world_size=saved_world,
        by_files=policy is ShardingPolicy.FILE,
        shuffled=shuffled,
        arrange=arrange,
    )


def rank_pieces(
    settings: LoaderConfig, splits: Any, rank: RankPlan, epoch: int, boundaries: Any = None
) -> list:
    """A static rank's reading pieces in reading order (the reader reads them so);
    `boundaries`: the splits' `split_boundaries` (or the reading's `Cuts`), if the caller
    keeps them."""
    return reading_pieces(
        rank.ranges,
        splits,
        shuffle=settings.shuffle,
        rng_key=f"rayshard:{settings.plan.seed}:{epoch}:{rank.rank}",
        boundaries=boundaries,
        order=rank.order,
    )


def packed_plan(
    plan: EpochPlan,
    settings: LoaderConfig,
    splits: Any,
    lengths: np.ndarray,
    offsets: Mapping[int, int],
    epoch: int,
) -> EpochPlan:
    """`plan` with every rank's batch count in packed rows: `ceil(rows / batch_size)`,
    the largest of them for all ranks under equal steps (padding rows marked). `lengths`
    are the tokens of every sample; `offsets` the tokens already delivered of split
    documents (a resume)."""
    spec = settings.packing.spec
    batch_size = settings.plan.batch_size
    counts = []
    for rank in plan.ranks:
        pieces = rank_pieces(settings, splits, rank, epoch)
        # (samples,) dataset indices of the rank in reading order
        order = np.concatenate([np.arange(a, b) for a, b in pieces] or [np.zeros(0, int)])
        if spec.split:
            # (samples,) tokens left of every document, separators counted
            left = lengths[order] + (spec.separator is not None)
            for index, done in offsets.items():
                left[order == index] -= done
            rows = count_split_rows(left, spec)
        else:
            docs = ((int(i), int(lengths[i])) for i in order)
            rows = count_rows(docs, spec, offsets)
        counts.append(-(-rows // batch_size))
    steps = max(counts, default=0)
    ranks = tuple(
        dataclasses.replace(
            rank, batches=steps if settings.plan.equal_steps else own, padded=0, dropped=0
        )
        for rank, own in zip(plan.ranks, counts)
    )
    return dataclasses.replace(plan, ranks=ranks)
