"""The six sharding policies (tf.data service's names) as one pure function.

`assign(policy, config, source, world_size, epoch)` says what every data-parallel rank
reads in an epoch; it reads no data. Static policies return an `EpochPlan` (from
`rayshard.plan.plan_epoch`, or built here for `off`); `dynamic` returns the epoch's
ordered split queue for the coordinator to lease; `hint` returns `(num_shards, index)` per
rank for a user pipeline holding `SHARD_HINT` placeholders (see `bind_hints`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

import numpy as np

from rayshard.core.shuffle import split_order
from rayshard.errors import ConfigError
from rayshard.plan import (
    DataLayout,
    EpochPlan,
    PlanConfig,
    RankPlan,
    batch_layouts,
    parse_choice,
    pieces,
    plan_epoch,
    rank_plan_for,
    shard_of,
    validate,
)
from rayshard.plan import intervals as iv
from rayshard.sources.base import Source


class ShardingPolicy(str, Enum):
    """How the data is split over ranks."""

    OFF = "off"
    FILE = "file"
    DATA = "data"
    FILE_OR_DATA = "file_or_data"
    HINT = "hint"
    DYNAMIC = "dynamic"

    @classmethod
    def parse(cls, value: Any) -> ShardingPolicy:
        """A member from its name; `False` is `off` too (YAML 1.1 reads a bare `off` as false)."""
        if value is False:
            return cls.OFF
        return parse_choice(cls, value, "policy")


class _ShardHint:
    """The `SHARD_HINT` placeholder: one object, equal only to itself, that pickles as itself."""

    _instance: _ShardHint | None = None

    def __new__(cls) -> _ShardHint:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "SHARD_HINT"

    def __reduce__(self) -> str:
        return "SHARD_HINT"


SHARD_HINT = _ShardHint()

_NUM_SHARDS_NAMES = frozenset({"num_shards", "num_workers", "world_size", "total_shards"})
_INDEX_NAMES = frozenset({"index", "shard_index", "worker_index", "rank", "shard"})


@dataclasses.dataclass(frozen=True)
class Assignment:
    """What every rank reads in one epoch under one policy.

    - `policy`: the policy in effect (`file_or_data` resolved to `file` or `data`);
      `requested` the one asked for.
    - `plan`: per-rank sample ranges, batch counts and padding (`off`, `file`, `data`).
      Under `off` each rank's `ranges` are the whole dataset as splits in the rank's own
      seeded order (not normalized: reading order).
    - `splits`: the epoch's split queue in lease order (`dynamic`).
    - `hints`: `(num_shards, index)` per rank (`hint`), following the rotation.
    """

    policy: ShardingPolicy
    requested: ShardingPolicy
    epoch: int
    world_size: int
    num_samples: int
    plan: EpochPlan | None = None
    splits: iv.Intervals | None = None
    hints: tuple[tuple[int, int], ...] | None = None

    @property
    def by_files(self) -> bool:
        return self.policy is ShardingPolicy.FILE

    def rank_plan(self, rank: int) -> RankPlan:
        if self.plan is None:
            raise ConfigError(
                f"policy {self.policy.value!r} has no static per-rank plan: ranks get splits "
                "from the coordinator (dynamic) or shard their own pipeline (hint)"
            )
        return self.plan.ranks[rank]

    def ranges(self, rank: int) -> iv.Intervals:
        """The real samples rank `rank` reads this epoch, in reading order."""
        return self.rank_plan(rank).ranges

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "policy": self.policy.value,
            "requested": self.requested.value,
            "epoch": self.epoch,
            "world_size": self.world_size,
            "num_samples": self.num_samples,
        }
        if self.plan is not None:
            out["plan"] = self.plan.to_dict()
        if self.splits is not None:
            out["splits"] = [list(s) for s in self.splits]
        if self.hints is not None:
            out["hints"] = [list(h) for h in self.hints]
        return out


def assign(
    policy: ShardingPolicy | str,
    config: PlanConfig,
    source: Source | DataLayout,
    world_size: int,
    epoch: int,
    *,
    shuffled: bool = False,
) -> Assignment:
    """Who reads what in `epoch` under `policy` (pure: reads metadata, never data).

    `source` is a `Source` (its `layout()` and `splits()` are used) or a bare `DataLayout`
    (splits are then its files, or the whole dataset). `shuffled`: the loader reads in a
    shuffled order, so `last_batch="drop"` leaves out a window that moves with the epoch
    (see `plan_epoch`).
    - `file`: `plan_epoch(..., by_files=True)`; too few files without `replicate` is an error.
    - `data`: `plan_epoch(..., by_files=False)`.
    - `file_or_data`: `file` when there are at least as many files as shards, else `data`.
    - `off`: every rank reads every split, in its own order seeded by (seed, epoch, rank).
    - `hint`: `(num_shards, index)` per rank, index = the rank's shard this epoch.
    - `dynamic`: the splits permuted by read unit with (seed, epoch), for the coordinator.
    """
    requested = ShardingPolicy.parse(policy)
    layout = source.layout() if isinstance(source, Source) else source
    _check_source_world(source, world_size)
    effective = requested
    if requested is ShardingPolicy.FILE_OR_DATA:
        enough = layout.file_rows is not None and layout.num_files >= config.shards_for(world_size)
        effective = ShardingPolicy.FILE if enough else ShardingPolicy.DATA
    common = dict(
        policy=effective,
        requested=requested,
        epoch=epoch,
        world_size=world_size,
        num_samples=layout.num_samples,
    )
    if effective is ShardingPolicy.FILE:
        if layout.file_rows is None:
            raise ConfigError(
                "policy='file' needs a file-based source (Parquet or Arrow files); this one "
                "has no files: use policy='data' or 'file_or_data'"
            )
        plan = plan_epoch(config, layout, world_size, epoch, by_files=True, shuffled=shuffled)
        return Assignment(**common, plan=plan)
    if effective is ShardingPolicy.DATA:
        plan = plan_epoch(config, layout, world_size, epoch, shuffled=shuffled)
        return Assignment(**common, plan=plan)
    if effective is ShardingPolicy.OFF:
        plan = _plan_off(config, layout, _splits_and_units(source), world_size, epoch)
        return Assignment(**common, plan=plan)
    if effective is ShardingPolicy.HINT:
        validate(config, layout, world_size)
        shards = config.shards_for(world_size)
        hints = tuple(
            (shards, shard_of(config.rotation, r, epoch, world_size, shards))
            for r in range(world_size)
        )
        return Assignment(**common, hints=hints)
    queue = dynamic_pieces(config, source, world_size, epoch)
    return Assignment(**common, splits=tuple(pieces.as_tuples(queue)))


def dynamic_pieces(
    config: PlanConfig, source: Source | DataLayout, world_size: int, epoch: int
) -> np.ndarray:
    """`assign`'s `dynamic` queue (the splits' `split_order` by read unit), an (n, 2) array."""
    _check_source_world(source, world_size)
    _check_world(config, source.layout() if isinstance(source, Source) else source, world_size)
    splits, units = _splits_and_units(source)
    return split_order(splits, config.seed, epoch, units=units)


def _splits_and_units(source: Source | DataLayout) -> tuple[np.ndarray, np.ndarray | None]:
    """The splits as an (n, 2) array, and the read units (None: the splits)."""
    if isinstance(source, Source):
        return source.split_array(), source.read_units()
    bounds = source.offsets if source.file_rows is not None else (0, source.num_samples)
    return pieces.between(bounds), None


def _check_source_world(source: Source | DataLayout, world_size: int) -> None:
    """ESPnet3's rule: a sharded dataset built for `dist_world_size` ranks must run on that many."""
    expected = getattr(source, "dist_world_size", None)
    if expected is not None and expected != world_size:
        raise ConfigError(
            f"the dataset was built for dist_world_size={expected} but the job runs with "
            f"world_size={world_size}: set dist_world_size={world_size} on the dataset, or start "
            f"the job with {expected} data-parallel workers"
        )


def _plan_off(
    config: PlanConfig, layout: DataLayout, split_units: tuple, world_size: int, epoch: int
) -> EpochPlan:
    """Every rank reads everything, splits in its own seeded order (by read unit, as
    `dynamic`'s: `split_units` is `_splits_and_units`), batched as usual."""
    splits, units = split_units
    _check_world(config, layout, world_size)
    n = layout.num_samples
    layouts = batch_layouts(
        [n] * world_size,
        config.batch_size,
        config.last_batch,
        config.pad_last_batch,
        config.equal_steps and world_size > 1,
    )
    ranks = []
    for rank, lay in enumerate(layouts):
        order = tuple(pieces.as_tuples(split_order(splits, config.seed, epoch, rank, units=units)))
        ranks.append(rank_plan_for(rank, None, order, lay, layout, None, None))
    return EpochPlan(epoch, world_size, 1, tuple(ranks))


def _check_world(config: PlanConfig, layout: DataLayout, world_size: int) -> None:
    """The world checks of policies that ignore shards and rotation (`off`, `dynamic`)."""
    free = dataclasses.replace(config, total_shards=None, rotation="shift")
    validate(free, DataLayout.of_samples(layout.num_samples), world_size)


# -- the hint policy: placeholders in a user's pipeline --------------------------------------


@dataclasses.dataclass(frozen=True)
class Hinted:
    """A pipeline factory call with `SHARD_HINT` placeholders, built per rank by `bind_hints`.

    Keyword placeholders are filled by name (`num_shards`/`num_workers`/`world_size` get
    the shard count, `index`/`shard_index`/`worker_index`/`rank` the index); positional
    ones in order: the first is the shard count, the second the index (tf.data's
    `shard(SHARD_HINT, SHARD_HINT)`).
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        positional = sum(a is SHARD_HINT for a in self.args)
        unknown = [
            k
            for k, v in self.kwargs.items()
            if v is SHARD_HINT and k not in _NUM_SHARDS_NAMES | _INDEX_NAMES
        ]
        if unknown:
            raise ConfigError(
                f"SHARD_HINT given for {unknown}: keyword placeholders must be named one of "
                f"{sorted(_NUM_SHARDS_NAMES | _INDEX_NAMES)}, or pass them positionally"
            )
        named = sum(v is SHARD_HINT for v in self.kwargs.values())
        if positional > 2:
            raise ConfigError(
                f"{positional} positional SHARD_HINT placeholders: at most two "
                "(num_shards, then index)"
            )
        if positional + named == 0:
            raise ConfigError(
                "the hint policy needs SHARD_HINT in the pipeline call, e.g. "
                "hinted(make_pipeline, num_shards=SHARD_HINT, index=SHARD_HINT)"
            )


def hinted(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Hinted:
    """Record `fn(*args, **kwargs)` with `SHARD_HINT` placeholders, to build once per rank."""
    return Hinted(fn, args, dict(kwargs))


def bind_hints(pipeline: Hinted | Callable[[int, int], Any], num_shards: int, index: int) -> Any:
    """Build a rank's pipeline: placeholders replaced by `(num_shards, index)`.

    `pipeline` is a `Hinted` call, or any callable taking `(num_shards, index)`.
    """
    if not 0 <= index < num_shards:
        raise ConfigError(f"index={index} is not in the range 0 <= index < num_shards={num_shards}")
    if not isinstance(pipeline, Hinted):
        if not callable(pipeline):
            raise ConfigError(
                f"the hint policy needs a hinted(...) call or a callable (num_shards, index), "
                f"got {type(pipeline).__name__}"
            )
        return pipeline(num_shards, index)
    values = iter((num_shards, index))
    args = tuple(next(values) if a is SHARD_HINT else a for a in pipeline.args)
    kwargs = {
        k: (num_shards if k in _NUM_SHARDS_NAMES else index) if v is SHARD_HINT else v
        for k, v in pipeline.kwargs.items()
    }
    return pipeline.fn(*args, **kwargs)
