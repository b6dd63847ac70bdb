"""Which rank of how many a worker is when `Loader.iterator()` is not told: Ray Train's
context, else what a launcher such as `torchrun` or `accelerate launch` set for this
process (`RANK`, `WORLD_SIZE`), else a single worker. Processes such a launcher starts
outside Ray Train are Ray drivers of their own, each with a coordinator of its own: they
share no lease book, so under `dynamic` each would read the whole epoch. That is refused
in a driver with a launcher's variables (static policies read their planned shards and
need no shared book); Ray's own workers, which inherit the variables of the process that
started Ray, are one job's and share its coordinator."""

from __future__ import annotations

import os

import ray

from rayshard.core.sharding import ShardingPolicy
from rayshard.errors import ConfigError


def train_world() -> tuple[int, int] | None:
    """(world rank, world size) in a Ray Train worker; None elsewhere."""
    try:
        from ray import train

        context = train.get_context()
        return context.get_world_rank(), context.get_world_size()
    except Exception:  # noqa: BLE001 - not inside a Train worker
        return None


def launched_world() -> tuple[int, int] | None:
    """(`RANK`, `WORLD_SIZE`) in a Ray driver a launcher started as one of several
    processes; else None (a Ray worker, or no launcher)."""
    if ray.is_initialized() and ray.get_runtime_context().worker.mode != ray.SCRIPT_MODE:
        return None
    try:
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return (rank, size) if size > 1 and 0 <= rank < size else None


def worker_world(
    world_rank: int | None, world_size: int | None, policy: ShardingPolicy
) -> tuple[int, int]:
    """This worker's (rank, size): as given, else as above (see the module docstring);
    a `ConfigError` for `dynamic` in one of a launcher's processes outside Ray Train, or
    for only one of the two given outside Train (every worker would be rank 0)."""
    launched = launched_world()
    train = train_world() if launched is not None or None in (world_rank, world_size) else None
    if launched is not None and train is None and policy is ShardingPolicy.DYNAMIC:
        raise ConfigError(
            f"policy='dynamic' in process RANK={launched[0]} of WORLD_SIZE={launched[1]} that "
            "a launcher (torchrun, accelerate launch) started outside Ray Train: each such "
            "process is a Ray driver with a coordinator of its own, so every one would read "
            "the whole epoch. Run the loop inside Ray Train (TorchTrainer), or use a static "
            "policy ('data', 'file', ...)"
        )
    if world_rank is not None and world_size is not None:
        return world_rank, world_size
    if train is None and (world_rank is None) != (world_size is None):
        raise ConfigError(
            f"iterator(world_rank={world_rank}, world_size={world_size}) outside Ray "
            "Train: give both (this worker's rank and the number of workers), or neither "
            "for a single worker (or a launcher's RANK and WORLD_SIZE)"
        )
    rank, size = train or launched or (0, 1)
    return (rank if world_rank is None else world_rank, size if world_size is None else world_size)


__all__ = ["launched_world", "train_world", "worker_world"]
