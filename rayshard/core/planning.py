"""Which plan the coordinator serves: the sharding policy applied to the pure planner."""

from __future__ import annotations

import dataclasses

from rayshard.plan import EpochPlan, plan_remaining
from rayshard.settings import LoaderSettings
from rayshard.sharding import ShardingPolicy, assign
from rayshard.shuffle_blocks import along_sequence, global_sequence
from rayshard.sources import Source
from rayshard.state import LoaderState


def epoch_plan(
    settings: LoaderSettings,
    source: Source,
    dp_size: int,
    epoch: int,
    resume: LoaderState | None = None,
) -> EpochPlan:
    """The plan of `epoch` for `dp_size` ranks, or of its rest when `resume` is that epoch.

    The rest of an epoch is re-planned from the samples consumed (SPEC 7): each rank keeps
    its own remaining samples on the same world size, the remainder is re-balanced on
    another. Under `off` every rank reads everything, so resuming it mid-epoch skips, for
    every rank, what any rank consumed.
    """
    plan = _epoch_plan(settings, source, dp_size, epoch, resume)
    if settings.shuffle_blocks:  # the global shuffle: ranks read along one split sequence
        return along_sequence(plan, global_sequence(source.splits(), settings.plan.seed, epoch))
    return plan


def _epoch_plan(
    settings: LoaderSettings,
    source: Source,
    dp_size: int,
    epoch: int,
    resume: LoaderState | None,
) -> EpochPlan:
    assignment = assign(settings.policy, settings.plan, source, dp_size, epoch)
    if resume is None or resume.epoch != epoch:
        return assignment.plan
    if assignment.policy is ShardingPolicy.OFF:
        single = dataclasses.replace(settings.plan, total_shards=1, expected_world_size=None)
        rest = plan_remaining(
            single, source.layout(), 1, epoch, resume.consumed, previous_world_size=1
        ).ranks[0]
        ranks = tuple(dataclasses.replace(rest, rank=r) for r in range(dp_size))
        return dataclasses.replace(assignment.plan, ranks=ranks)
    return plan_remaining(
        settings.plan,
        source.layout(),
        dp_size,
        epoch,
        resume.consumed,
        previous_world_size=resume.world_size,
        by_files=assignment.policy is ShardingPolicy.FILE,
    )
