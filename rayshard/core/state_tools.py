"""Inspect and rewrite a saved loader state: the pure half of `rayshard state`.

No Ray, no I/O: every function takes a `LoaderState` and returns a summary or a new state
whose `to_dict()` passes `LoaderState.from_dict` strictly. Rewrites keep the loader id,
the seed and the sample count, so the loader that saved the state still accepts it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from rayshard.config.checks import check_int
from rayshard.core.state import STATE_VERSION, LoaderState
from rayshard.errors import ConfigError
from rayshard.plan import DataLayout, PlanConfig, validate
from rayshard.plan import intervals as iv


def check(state: LoaderState) -> LoaderState:
    """`state` if its facts agree with each other, else a `ConfigError` naming the value.

    `from_dict` checks the shape of a state; this checks what a resume relies on: a
    non-negative epoch and sample count, and consumed samples inside `[0, num_samples)`.
    """
    check_int(state.epoch, "epoch", minimum=0, fix="epochs count from 0")
    check_int(state.num_samples, "num_samples", minimum=0)
    check_int(state.world_size, "world_size", minimum=0, fix="0 means unknown")
    if state.consumed and (state.consumed[0][0] < 0 or state.consumed[-1][1] > state.num_samples):
        lo, hi = state.consumed[0][0], state.consumed[-1][1]
        raise ConfigError(
            f"consumed samples span [{lo}, {hi}), outside the dataset's [0, {state.num_samples}):"
            " the state was edited by hand or saved for another dataset"
        )
    return state


def summarize(
    state: LoaderState,
    layout: DataLayout | None = None,
    splits: Sequence[Sequence[int]] | None = None,
    *,
    labels: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Where the loader stands, as a JSON-safe dict.

    `remaining` counts the samples of `epoch` not yet delivered (a `drop` last-batch policy
    may leave up to a batch per rank of them out). `world_size` is the size the consumed
    samples were planned for (0: unknown). Per-split progress needs split boundaries:
    `splits` as `(start, end)` sample ranges (e.g. Parquet row groups), or else the files
    of `layout`; `labels` names each split. A `layout` of another sample count is refused.
    """
    check(state)
    if layout is not None and layout.num_samples != state.num_samples:
        raise ConfigError(
            f"the data has {layout.num_samples} samples but the state was saved for "
            f"{state.num_samples}: give the dataset the loader was reading"
        )
    if splits is None and layout is not None and layout.file_rows is not None:
        offsets = layout.offsets
        splits = [(a, b) for a, b in zip(offsets, offsets[1:]) if b > a]
    consumed = iv.total(state.consumed)
    n = state.num_samples
    summary: dict[str, Any] = {
        "version": STATE_VERSION,
        "loader": state.loader,
        "epoch": state.epoch,
        "seed": state.seed,
        "world_size": state.world_size,
        "num_samples": n,
        "consumed": consumed,
        "consumed_fraction": consumed / n if n else 0.0,
        "remaining": n - consumed,
        "consumed_intervals": [list(pair) for pair in state.consumed],
        "splits": None,
    }
    if splits is not None:
        summary["splits"] = _split_progress(state, splits, labels)
    return summary


def skip_to_next_epoch(state: LoaderState) -> LoaderState:
    """The state at the start of the next epoch: `epoch + 1`, nothing consumed.

    The samples of the current epoch not yet delivered are skipped for good.
    """
    return _rewrite(state, epoch=check(state).epoch + 1, consumed=(), partial=())


def set_epoch(state: LoaderState, epoch: int) -> LoaderState:
    """The state at the start of `epoch` (>= 0), nothing consumed.

    Consumed samples belong to the epoch that consumed them, so they are dropped even when
    `epoch` is the current one: that restarts the current epoch from its beginning.
    """
    check(state)
    epoch = check_int(epoch, "epoch", minimum=0, type_error=TypeError)
    return _rewrite(state, epoch=epoch, consumed=(), partial=())


def retarget(state: LoaderState, world_size: int) -> LoaderState:
    """The state with its world-size hint set to `world_size` (>= 1); all else kept.

    The hint tells the planner on how many ranks the consumed samples were planned. A
    resume on exactly the hint continues every rank's own shard of that plan minus what
    was consumed (the tail of the uninterrupted epoch when the hint is true). A resume on
    any other size re-balances the rest of the epoch (samples not consumed) over the new
    ranks, in dataset order and without shards. So retarget to the size you resume on to
    keep regular shards, or away from it to force the even re-balance; the hint is
    irrelevant once nothing of the epoch is consumed. Exactly-once holds either way.

    A resume re-plans the epoch on the hint, so a state that records its loader
    (`made_by`) is checked first: a hint its `total_shards` and `rotation` cannot plan is
    a `ConfigError` naming the fix (a `file` policy's file count is not recorded, so not
    checked here).
    """
    check(state)
    world_size = check_int(world_size, "world_size", minimum=1, type_error=TypeError)
    if state.consumed and state.made_by:
        facts = json.loads(state.made_by)
        if facts.get("policy") not in ("off", "dynamic"):
            fields = {field.name for field in dataclasses.fields(PlanConfig)}
            config = PlanConfig(**{key: facts[key] for key in fields & facts.keys()})
            layout = DataLayout.of_samples(state.num_samples)
            try:
                validate(config, layout, world_size, check_expected=False)
            except ConfigError as error:
                raise ConfigError(
                    f"the state's loader cannot plan its epoch on world_size={world_size}, "
                    f"so a resume would fail ({error}): retarget to a size it can plan, or "
                    f"to the size saved ({state.world_size})"
                ) from None
    return _rewrite(state, world_size=world_size)


def _rewrite(state: LoaderState, **changes: Any) -> LoaderState:
    """A new state with `changes`, round-tripped through the strict loader."""
    new = dataclasses.replace(state, **changes)
    return check(LoaderState.from_dict(new.to_dict(), expect_loader=state.loader))


def _split_progress(
    state: LoaderState, splits: Sequence[Sequence[int]], labels: Sequence[str] | None
) -> list[dict[str, Any]]:
    """Consumed / total samples of every split, in the order given."""
    if labels is not None and len(labels) != len(splits):
        raise ConfigError(f"{len(labels)} labels for {len(splits)} splits: give one per split")
    out = []
    for i, (start, end) in enumerate(splits):
        start, end = int(start), int(end)
        if not 0 <= start <= end <= state.num_samples:
            raise ConfigError(
                f"split {i} [{start}, {end}) is outside the dataset's [0, {state.num_samples})"
                ": the split boundaries are of another dataset"
            )
        done = iv.total(iv.intersect(((start, end),), state.consumed))
        size = end - start
        status = "done" if done == size else "untouched" if done == 0 else "partial"
        out.append(
            {
                "split": i,
                "label": labels[i] if labels is not None else None,
                "start": start,
                "end": end,
                "consumed": done,
                "total": size,
                "status": status,
            }
        )
    return out
