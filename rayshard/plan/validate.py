"""Start-up checks that the planner can make: each error names the values and a fix."""

from __future__ import annotations

from collections.abc import Sequence

from rayshard.config.checks import check_int
from rayshard.errors import ConfigError
from rayshard.plan import intervals as iv
from rayshard.plan.layout import DataLayout
from rayshard.plan.options import PlanConfig, Rotation, Uneven


def validate(
    config: PlanConfig,
    layout: DataLayout,
    world_size: int,
    *,
    by_files: bool = False,
    check_expected: bool = True,
) -> None:
    """Raise `ConfigError` if `config` cannot plan `layout` over `world_size` ranks."""
    check_int(world_size, "world_size", minimum=1)
    expected = config.expected_world_size
    if check_expected and expected is not None and expected != world_size:
        raise ConfigError(
            f"the configuration expects world_size={expected} but the job runs with "
            f"world_size={world_size} data-parallel ranks (its workers over the model-parallel "
            f"group size): set expected_world_size={world_size} (or remove it), or start the "
            f"job with {expected} data-parallel ranks"
        )
    shards = config.shards_for(world_size)
    replicate = by_files and config.uneven is Uneven.REPLICATE
    if not replicate:
        _check_rotation(config.rotation, shards, world_size)
    if by_files and not replicate and layout.num_files < shards:
        raise ConfigError(
            f"{layout.num_files} files cannot be split over {shards} shards "
            f"(world_size={world_size}): a file-level mode needs at least one file per shard. "
            "Use uneven='replicate' (every rank reads every file), the 'data' policy, "
            f"or split the data into at least {shards} files"
        )


def _check_rotation(rotation: Rotation, shards: int, world_size: int) -> None:
    if world_size > shards:
        raise ConfigError(
            f"world_size={world_size} exceeds total_shards={shards}: each rank needs a shard "
            f"of its own in every epoch (set total_shards to at least {world_size}, "
            "or leave it unset for one shard per rank)"
        )
    if rotation is Rotation.NONE and shards != world_size:
        raise ConfigError(
            f"rotation='none' needs total_shards == world_size, got total_shards={shards} and "
            f"world_size={world_size}: leave total_shards unset, or use rotation='stride'"
        )
    if rotation in (Rotation.STRIDE, Rotation.STRIDE_SHIFT) and shards % world_size:
        lower = shards // world_size * world_size
        options = f"{lower} or {lower + world_size}" if lower else str(world_size)
        raise ConfigError(
            f"total_shards={shards} is not a multiple of world_size={world_size}: "
            f"{rotation.value} rotation needs total_shards % world_size == 0 (try {options})"
        )


def check_not_empty(layout: DataLayout, what: str = "the dataset") -> None:
    """Empty data is a configuration error at start-up."""
    if layout.num_samples == 0:
        raise ConfigError(
            f"{what} has no samples: check the paths and filters, or pass a non-empty source"
        )


def check_coverage(shard_ranges: Sequence[Sequence[tuple[int, int]]], num_samples: int) -> None:
    """A shard function must split `[0, num_samples)` into disjoint, covering parts.

    `shard_ranges[i]` are the sample ranges of shard `i`.
    """
    sizes = [iv.total(ranges) for ranges in shard_ranges]
    flat = sorted(
        (start, end, shard) for shard, ranges in enumerate(shard_ranges) for start, end in ranges
    )
    for (_, a_end, a_shard), (b_start, b_end, b_shard) in zip(flat, flat[1:]):
        if b_start < a_end:
            span = f"[{b_start}, {min(a_end, b_end)})"
            where = (
                f"shard {a_shard} lists samples {span} twice"
                if a_shard == b_shard
                else f"shards {a_shard} and {b_shard} overlap at samples {span}"
            )
            raise ConfigError(f"{where}: every sample must belong to exactly one shard")
    if sum(sizes) != num_samples or any(s < 0 or e > num_samples for s, e, _ in flat):
        covered = iv.normalize((s, e) for s, e, _ in flat)
        missing = iv.subtract(((0, num_samples),), covered)
        outside = iv.subtract(covered, ((0, num_samples),))
        raise ConfigError(
            f"shard sizes {sizes} add up to {sum(sizes)}, not to the {num_samples} samples of "
            f"the dataset (missing {list(missing)[:5]}"
            + (f", outside [0, {num_samples}): {list(outside)[:5]}" if outside else "")
            + "): the shard function must cover every sample exactly once"
        )
