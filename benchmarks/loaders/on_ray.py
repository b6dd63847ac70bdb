"""The loaders on Ray: rayshard (static, `dynamic`, through its reader actors, inside Ray
Train), Ray Data `streaming_split` and Ray Train `get_dataset_shard`."""

from __future__ import annotations

import asyncio
import os
import pickle
import tempfile
import time
import uuid

import numpy as np

from benchmarks._measure import EpochRecord, EpochTimer
from benchmarks.loaders.data import (
    BATCH_SIZE,
    COLUMNS,
    WORLD,
    check_numpy,
)


class EpochBarrier:
    """Harness, not a loader: holds every rank at the start of each epoch until all
    `world` ranks are there, as a DDP loop's collectives do. Ranks that run free keep
    their start-up offsets from one epoch to the next, and an epoch's span (the first
    rank's start to the last rank's end) would count them; the raw scan's and torch's
    processes wait at the same points. `benchmarks._measure` leaves its process out of
    the memory figures."""

    def __init__(self, world: int) -> None:
        self._world = world
        self._arrived: dict[int, int] = {}
        self._all_in: dict[int, asyncio.Event] = {}

    async def wait(self, epoch: int) -> None:
        """Return once all ranks called `wait(epoch)`."""
        self._arrived[epoch] = self._arrived.get(epoch, 0) + 1
        all_in = self._all_in.setdefault(epoch, asyncio.Event())
        if self._arrived[epoch] == self._world:
            all_in.set()
        await all_in.wait()


def epoch_barrier(world: int):
    """A fresh `EpochBarrier` actor for `world` ranks (no CPU asked), started: its
    process start is not in the measured run's launch time."""
    import ray

    barrier = ray.remote(num_cpus=0)(EpochBarrier).remote(world)
    ray.get(barrier.__ray_ready__.remote())
    return barrier


def _rayshard_epochs(iterator_of, rank: int, epochs: int, barrier) -> list[EpochRecord]:
    """A rayshard rank's `epochs` epochs, each started with every rank (`barrier`); the
    iterator is made by `iterator_of()`, its making timed as part of epoch 0."""
    import ray

    ray.get(barrier.wait.remote(0))
    started = time.time()
    batches = iterator_of()
    records = []
    for epoch in range(epochs):
        if epoch:
            ray.get(barrier.wait.remote(epoch))
        timer = EpochTimer(rank, epoch, started if epoch == 0 else None)
        records.append(timer.consume(batches, lambda b: b["id"][~b["_padded"]], check_numpy))
    return records


def _rayshard_rank(loader, rank: int, world: int, epochs: int, barrier) -> list[EpochRecord]:
    def iterator_of():
        return loader.iterator(world_rank=rank, world_size=world, batch_format="numpy")

    return _rayshard_epochs(iterator_of, rank, epochs, barrier)


def _stacked(batches):
    """Ray Data hands a fixed_size_list column to numpy as an object array of per-row
    arrays; a training loop needs the (rows, 128) matrix, so stack it (charged to Ray)."""
    for batch in batches:
        x = batch["x"]
        if x.dtype == object:
            batch["x"] = np.stack(x)
        yield batch


def _ray_data_rank(split, rank: int, epochs: int, barrier) -> list[EpochRecord]:
    import ray

    records = []
    for epoch in range(epochs):
        ray.get(barrier.wait.remote(epoch))
        timer = EpochTimer(rank, epoch)
        batches = _stacked(split.iter_batches(batch_size=BATCH_SIZE, batch_format="numpy"))
        records.append(timer.consume(batches, lambda b: b["id"], check_numpy))
    return records


def _train_loop(config: dict) -> None:
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    shard = ray.train.get_dataset_shard("train")
    records = []
    for epoch in range(config["epochs"]):
        ray.get(config["barrier"].wait.remote(epoch))
        timer = EpochTimer(rank, epoch)
        batches = _stacked(shard.iter_batches(batch_size=BATCH_SIZE, batch_format="numpy"))
        records.append(timer.consume(batches, lambda b: b["id"], check_numpy))
    with open(os.path.join(config["out"], f"rank-{rank}.pkl"), "wb") as handle:
        pickle.dump(records, handle)


# `Loader` options every rayshard loader of the run gets (the benchmark's `--ack-interval`)
LOADER_OPTIONS: dict = {}
# the last `run_rayshard`'s lease calls, from its `loader.stats()`: summed over its ranks
# and epochs ({} before one ran; calls 0 when nothing was leased: not `dynamic`)
LEASE_CALLS: dict = {}
# `ParquetSource` options of every rayshard loader of the run (the benchmark's `--split-rows`)
SOURCE_OPTIONS: dict = {}


def rayshard_source(paths: list[str]):
    """The rayshard loaders' source: the benchmark's columns, and its `SOURCE_OPTIONS`."""
    from rayshard.sources.parquet import ParquetSource

    return ParquetSource(paths, columns=COLUMNS, **SOURCE_OPTIONS)


def _rayshard_loader(paths: list[str], **options):
    from rayshard.loader import Loader

    return Loader(
        rayshard_source(paths),
        batch_size=BATCH_SIZE,
        name=f"bench-{uuid.uuid4().hex[:8]}",
        shuffle=False,
        prefetch_depth=2,
        columns=COLUMNS,
        **{"policy": "data", **LOADER_OPTIONS, **options},
    )


def run_rayshard(
    paths: list[str], epochs: int, world: int = WORLD, rank_cpus: int = 0, **options
) -> tuple[list[EpochRecord], float]:
    """rayshard with one Ray task per rank consuming numpy batches, each asking Ray for
    `rank_cpus` CPUs; `options` go to the `Loader` (default: the `data` policy, each rank
    reading in its consumer, with as many reading threads as its task's CPUs, at least 1)."""
    import ray

    loader = _rayshard_loader(paths, **options)
    try:
        task = ray.remote(num_cpus=rank_cpus)(_rayshard_rank)
        barrier = epoch_barrier(world)
        started = time.time()
        refs = [task.remote(loader, rank, world, epochs, barrier) for rank in range(world)]
        records = [r for rank in ray.get(refs) for r in rank]
        calls = loader.stats().get("lease_calls", {}).values()
        LEASE_CALLS.update({k: sum(c[k] for c in calls) for k in ("calls", "paced")})
        return records, started
    finally:
        loader.shutdown()


def run_rayshard_cpus(paths, epochs, world=WORLD):
    """rayshard with each rank's task asking Ray for its share of the cores (this machine's
    or Ray's CPUs, the fewer), as a Train worker given `resources_per_worker={"CPU": n}`
    does: it reads with that many threads (the default `reader_threads`)."""
    import ray

    cores = min(os.cpu_count() or 1, int(ray.cluster_resources().get("CPU", 1)))
    return run_rayshard(paths, epochs, world, rank_cpus=max(1, cores // world))


def run_rayshard_dynamic(paths, epochs, world=WORLD):
    """rayshard under `dynamic`: pieces leased from the coordinator as ranks ask."""
    return run_rayshard(paths, epochs, world, policy="dynamic")


def run_rayshard_actor(paths, epochs, world=WORLD):
    """rayshard reading in its reader actors (object-store blocks), not in the consumers."""
    return run_rayshard(paths, epochs, world, consumer_reads=False)


def _rayshard_train_loop(config: dict) -> None:
    import ray.train

    import rayshard.train

    rank = ray.train.get_context().get_world_rank()
    records = _rayshard_epochs(
        lambda: rayshard.train.iterator(config["loader"], batch_format="numpy"),
        rank,
        config["epochs"],
        config["barrier"],
    )
    with open(os.path.join(config["out"], f"rank-{rank}.pkl"), "wb") as handle:
        pickle.dump(records, handle)


def run_rayshard_train(paths, epochs, world=WORLD):
    """rayshard inside a `TorchTrainer` (one Train worker per rank)."""
    loader = _rayshard_loader(paths)
    try:
        return _fit(_rayshard_train_loop, {"loader": loader}, epochs, world)
    finally:
        loader.shutdown()


def _ray_dataset(paths: list[str]):
    """The Ray Data loaders' dataset. `ray.data` is imported here, not when Ray starts:
    it adds about 50 MB to the driver, which the rayshard loaders' memory would count."""
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    return ray.data.read_parquet(paths).select_columns(COLUMNS)


def run_ray_data(
    paths: list[str], epochs: int, world: int = WORLD
) -> tuple[list[EpochRecord], float]:
    import ray

    splits = _ray_dataset(paths).streaming_split(world, equal=True)
    task = ray.remote(num_cpus=0)(_ray_data_rank)
    barrier = epoch_barrier(world)
    started = time.time()
    refs = [task.remote(split, rank, epochs, barrier) for rank, split in enumerate(splits)]
    return [r for rank in ray.get(refs) for r in rank], started


def run_ray_train(
    paths: list[str], epochs: int, world: int = WORLD
) -> tuple[list[EpochRecord], float]:
    dataset = _ray_dataset(paths)
    return _fit(_train_loop, {}, epochs, world, datasets={"train": dataset})


def _fit(loop, config: dict, epochs: int, world: int, datasets=None):
    """Run `loop` in a `TorchTrainer` of `world` CPU workers; each writes its records."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    barrier = epoch_barrier(world)
    with tempfile.TemporaryDirectory(prefix="rayshard-bench-train-") as out:
        trainer = TorchTrainer(
            loop,
            train_loop_config={**config, "epochs": epochs, "out": out, "barrier": barrier},
            scaling_config=ScalingConfig(num_workers=world, use_gpu=False),
            datasets=datasets,
            run_config=RunConfig(name=f"bench-{uuid.uuid4().hex[:8]}", storage_path=out),
        )
        started = time.time()
        trainer.fit()
        records = []
        for rank in range(world):
            with open(os.path.join(out, f"rank-{rank}.pkl"), "rb") as handle:
                records += pickle.load(handle)
    return records, started
