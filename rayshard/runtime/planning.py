"""Which plan the coordinator serves: the policy applied to the pure planner (SPEC 6)."""

from __future__ import annotations

import dataclasses

from rayshard.plan import DataLayout, EpochPlan, plan_epoch, plan_remaining
from rayshard.settings import LoaderSettings, by_files_for
from rayshard.state import LoaderState


def epoch_plan(
    settings: LoaderSettings,
    layout: DataLayout,
    dp_size: int,
    epoch: int,
    resume: LoaderState | None = None,
) -> EpochPlan:
    """The plan of `epoch` for `dp_size` ranks, or of its rest when `resume` is that epoch."""
    config = settings.plan
    if settings.policy == "off":
        # Every rank reads everything, each in its own seeded order (the reader shuffles).
        single = _single(settings, layout, epoch, resume)
        ranks = tuple(dataclasses.replace(single.ranks[0], rank=r) for r in range(dp_size))
        return dataclasses.replace(single, world_size=dp_size, ranks=ranks)
    by_files = by_files_for(settings.policy, layout.num_files, dp_size)
    if resume is not None and resume.epoch == epoch:
        return plan_remaining(
            config,
            layout,
            dp_size,
            epoch,
            resume.consumed,
            previous_world_size=resume.world_size,
            by_files=by_files,
        )
    return plan_epoch(config, layout, dp_size, epoch, by_files=by_files)


def _single(
    settings: LoaderSettings, layout: DataLayout, epoch: int, resume: LoaderState | None
) -> EpochPlan:
    config = dataclasses.replace(settings.plan, total_shards=1, expected_world_size=None)
    if resume is not None and resume.epoch == epoch:
        return plan_remaining(config, layout, 1, epoch, resume.consumed, previous_world_size=1)
    return plan_epoch(config, layout, 1, epoch)
