"""Which epoch a loader-wide state or a new generation resumes from when an earlier epoch
was left unfinished: rows of it that no rank consumed come before the later epoch's.
Read-only questions about a `CoordinatorCore` (`rayshard.core.queries` asks them)."""

from __future__ import annotations

from typing import Any

from rayshard.plan import intervals as iv


def regroup_epoch(core: Any) -> int | None:
    """The epoch a new generation resumes from its own progress (no state loaded): the
    earliest begun that is not complete (a rank that moved on to the next epoch before a
    lost one's last batches were acknowledged: reading its rest again repeats what the
    first rank took of the next epoch, rather than losing those rows), else the latest
    begun; None before any."""
    epochs = sorted({*core.received, *core.started, *core.books})
    for epoch in epochs[:-1]:
        if _unconsumed(core, epoch):
            return epoch
    return epochs[-1] if epochs else None


def left_behind(core: Any, epoch: int) -> int | None:
    """The earliest static epoch before `epoch` whose rows planned for a rank no longer
    here (registered, then lost or gone in that epoch or before it) were never consumed,
    while the ranks still here went on to `epoch`: a state taken now resumes from it
    (what they read since comes again), rather than saying it was complete. Rows a rank
    left by going on to a later epoch itself (`set_epoch`), gone since or not, are its
    loop's choice and do not count; nor do those of a rank that never registered. None if
    there is none."""
    active = set(core.active_ranks())
    gone = set(core.members.world.values()) - active if core.members else set()
    for earlier in sorted(e for e in core.started if e < epoch):
        missing = _unconsumed(core, earlier)
        if missing and any(
            iv.intersect(missing, iv.normalize(rank.ranges))  # (in reading order: sorted)
            for r, rank in enumerate(core.plan(earlier).ranks)
            # registered, then gone while in that epoch or before (one it went past, its
            # loop left by choice)
            if r in gone and core.rank_epoch.get(r, earlier) <= earlier
        ):
            return earlier
    return None


def _unconsumed(core: Any, epoch: int) -> iv.Intervals:
    return iv.subtract(core.epoch_samples(epoch), core.all_consumed(epoch))


__all__ = ["left_behind", "regroup_epoch"]
