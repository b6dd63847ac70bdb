"""Data-parallel groups: only data-parallel ranks split the data.

Under model, pipeline or tensor parallelism, the ranks of one model-parallel group must
receive identical batches. Ranks are mapped from (world rank, world size) to
(data-parallel rank, data-parallel size); everything else plans on the latter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rayshard.config.checks import check_int
from rayshard.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class DataParallelRank:
    """Where a world rank sits: its data-parallel rank and the model-parallel group it shares."""

    world_rank: int
    world_size: int
    dp_rank: int
    dp_size: int
    group: tuple[int, ...]  # the world ranks that receive the same batches

    @property
    def is_group_leader(self) -> bool:
        """The lowest world rank of the group: the one whose reader serves the group."""
        return self.world_rank == min(self.group)


def data_parallel_rank(
    world_rank: int,
    world_size: int,
    model_parallel_size: int = 1,
    groups: Sequence[Sequence[int]] | None = None,
) -> DataParallelRank:
    """Map a world rank to its data-parallel rank.

    Without `groups`, model-parallel groups are consecutive blocks of `model_parallel_size`
    ranks (Megatron's layout): world rank `w` has data-parallel rank `w // m`. With explicit
    `groups` (each a model-parallel group of world ranks), the data-parallel rank is the
    index of the group holding `world_rank`; the groups must partition `range(world_size)`
    into equal sizes.
    """
    check_int(world_size, "world_size", minimum=1)
    if not 0 <= world_rank < world_size:
        raise ConfigError(
            f"world_rank={world_rank} is outside [0, world_size={world_size}): "
            "pass the rank of this worker in the training world"
        )
    if groups is None:
        m = model_parallel_size
        if m < 1 or world_size % m:
            raise ConfigError(
                f"model_parallel_size={m} does not divide world_size={world_size}: "
                f"use a divisor of {world_size} (e.g. {_divisors(world_size)})"
            )
        first = world_rank // m * m
        return DataParallelRank(
            world_rank, world_size, world_rank // m, world_size // m, tuple(range(first, first + m))
        )
    normalized = [tuple(int(r) for r in g) for g in groups]
    _check_groups(normalized, world_size)
    for index, group in enumerate(normalized):
        if world_rank in group:
            return DataParallelRank(world_rank, world_size, index, len(normalized), group)
    raise AssertionError("unreachable: groups were checked to cover every rank")  # pragma: no cover


def _check_groups(groups: list[tuple[int, ...]], world_size: int) -> None:
    seen: dict[int, int] = {}
    for index, group in enumerate(groups):
        for rank in group:
            if rank in seen:
                raise ConfigError(
                    f"world rank {rank} is in model-parallel groups {seen[rank]} and {index}: "
                    "each rank must belong to exactly one group"
                )
            seen[rank] = index
    missing = sorted(set(range(world_size)) - seen.keys())
    extra = sorted(seen.keys() - set(range(world_size)))
    if missing or extra:
        raise ConfigError(
            f"model-parallel groups {groups} do not partition range(world_size={world_size}): "
            f"missing ranks {missing}, ranks out of range {extra}"
        )
    sizes = sorted({len(g) for g in groups})
    if len(sizes) > 1:
        raise ConfigError(
            f"model-parallel groups have different sizes {sizes}: every group must have the "
            "same number of ranks"
        )


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
