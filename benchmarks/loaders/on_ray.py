"""The loaders on Ray: rayshard (static, `dynamic`, through its reader actors, inside Ray
Train), Ray Data `streaming_split` and Ray Train `get_dataset_shard`."""

from __future__ import annotations

import asyncio
import os
import pickle
import tempfile
import threading
import time
import uuid
from collections.abc import Callable

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
    the memory figures.

    Ranks call `wait(e)` before epoch e and `wait(epochs)` after the last one. If
    `watched` (the harness's), from edge 1 on the driver's `EdgeWatcher` sees `all_in(e)`,
    samples memory while the ranks wait, and `release(e)`s them: every epoch gets a
    sample at its start and end, outside its timed span."""

    def __init__(self, world: int, watched: bool = False) -> None:
        self._world, self._watched = world, watched
        self._arrived: dict[int, int] = {}
        self._all_in: dict[int, asyncio.Event] = {}
        self._released: dict[int, asyncio.Event] = {}

    async def wait(self, epoch: int) -> None:
        """Return once all ranks called `wait(epoch)` (and, if watched, past edge 0, the
        watcher released it)."""
        self._arrived[epoch] = self._arrived.get(epoch, 0) + 1
        all_in = self._all_in.setdefault(epoch, asyncio.Event())
        if self._arrived[epoch] == self._world:
            all_in.set()
        await all_in.wait()
        if self._watched and epoch:
            await self._released.setdefault(epoch, asyncio.Event()).wait()

    async def all_in(self, epoch: int) -> None:
        """Return once all ranks are waiting at `epoch`'s edge."""
        await self._all_in.setdefault(epoch, asyncio.Event()).wait()

    async def release(self, epoch: int) -> None:
        """Let the ranks waiting at `epoch`'s edge go."""
        self._released.setdefault(epoch, asyncio.Event()).set()


def epoch_barrier(world: int):
    """A fresh `EpochBarrier` actor for `world` ranks (no CPU asked), watched (an
    `EdgeWatcher` must release its edges), started: its process start is not in the
    measured run's launch time."""
    import ray

    barrier = ray.remote(num_cpus=0)(EpochBarrier).remote(world, watched=True)
    ray.get(barrier.__ray_ready__.remote())
    return barrier


class EdgeWatcher:
    """The driver's side of an `EpochBarrier` over `epochs` epochs: at each edge past the
    first (between two epochs, and after the last), `on_edge()` runs while every rank
    waits, then the ranks go. A thread; leaving the `with` stops it."""

    def __init__(self, barrier, epochs: int, on_edge: Callable[[], object] | None) -> None:
        self.barrier, self.epochs, self.on_edge = barrier, epochs, on_edge
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="epoch-edges", daemon=True)

    def __enter__(self) -> EdgeWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        for edge in range(1, self.epochs + 1):
            if not self._get(self.barrier.all_in.remote(edge)):
                return  # the run ended (or failed) before the ranks got here
            if self.on_edge is not None:
                self.on_edge()
            self._get(self.barrier.release.remote(edge))

    def _get(self, ref) -> bool:
        import ray

        while not self._stop.is_set():
            if ray.wait([ref], timeout=0.5)[0]:
                ray.get(ref)
                return True
        return False


def _edge(barrier, epoch: int) -> None:
    """Wait at `epoch`'s edge with the other ranks (`epochs`: the edge after the last)."""
    import ray

    ray.get(barrier.wait.remote(epoch))


def _rayshard_epochs(iterator_of, rank: int, epochs: int, barrier) -> list[EpochRecord]:
    """A rayshard rank's `epochs` epochs, each started with every rank (`barrier`); the
    iterator is made by `iterator_of()`, its making timed as part of epoch 0."""
    _edge(barrier, 0)
    started = time.time()
    batches = iterator_of()
    records = []
    for epoch in range(epochs):
        if epoch:
            _edge(barrier, epoch)
        timer = EpochTimer(rank, epoch, started if epoch == 0 else None)
        records.append(timer.consume(batches, lambda b: b["id"][~b["_padded"]], check_numpy))
    _edge(barrier, epochs)
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
    records = []
    for epoch in range(epochs):
        _edge(barrier, epoch)
        timer = EpochTimer(rank, epoch)
        batches = _stacked(split.iter_batches(batch_size=BATCH_SIZE, batch_format="numpy"))
        records.append(timer.consume(batches, lambda b: b["id"], check_numpy))
    _edge(barrier, epochs)
    return records


def _train_loop(config: dict) -> None:
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    shard = ray.train.get_dataset_shard("train")
    records = []
    for epoch in range(config["epochs"]):
        _edge(config["barrier"], epoch)
        timer = EpochTimer(rank, epoch)
        batches = _stacked(shard.iter_batches(batch_size=BATCH_SIZE, batch_format="numpy"))
        records.append(timer.consume(batches, lambda b: b["id"], check_numpy))
    _edge(config["barrier"], config["epochs"])
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


# What every runner takes: (paths, epochs, world, on_edge), `on_edge` called at each epoch
# edge past the first while the ranks wait (the memory sampler's forced sample).
OnEdge = Callable[[], object] | None


def run_rayshard(
    paths: list[str],
    epochs: int,
    world: int = WORLD,
    on_edge: OnEdge = None,
    rank_cpus: int = 0,
    **options,
) -> tuple[list[EpochRecord], float]:
    """rayshard with one Ray task per rank consuming numpy batches, each asking Ray for
    `rank_cpus` CPUs; `options` go to the `Loader` (default: the `data` policy, each rank
    reading in its consumer, with as many reading threads as its task's CPUs, at least 1)."""
    import ray

    loader = _rayshard_loader(paths, **options)
    try:
        task = ray.remote(num_cpus=rank_cpus)(_rayshard_rank)
        barrier = epoch_barrier(world)
        with EdgeWatcher(barrier, epochs, on_edge):
            started = time.time()
            refs = [task.remote(loader, rank, world, epochs, barrier) for rank in range(world)]
            records = [r for rank in ray.get(refs) for r in rank]
        calls = loader.stats().get("lease_calls", {}).values()
        LEASE_CALLS.update({k: sum(c[k] for c in calls) for k in ("calls", "paced")})
        return records, started
    finally:
        loader.shutdown()


def run_rayshard_cpus(paths, epochs, world=WORLD, on_edge: OnEdge = None):
    """rayshard with each rank's task asking Ray for its share of the cores (this machine's
    or Ray's CPUs, the fewer), as a Train worker given `resources_per_worker={"CPU": n}`
    does: it reads with that many threads (the default `reader_threads`)."""
    import ray

    cores = min(os.cpu_count() or 1, int(ray.cluster_resources().get("CPU", 1)))
    return run_rayshard(paths, epochs, world, on_edge, rank_cpus=max(1, cores // world))


def run_rayshard_dynamic(paths, epochs, world=WORLD, on_edge: OnEdge = None):
    """rayshard under `dynamic`: pieces leased from the coordinator as ranks ask."""
    return run_rayshard(paths, epochs, world, on_edge, policy="dynamic")


def run_rayshard_actor(paths, epochs, world=WORLD, on_edge: OnEdge = None):
    """rayshard reading in its reader actors (object-store blocks), not in the consumers."""
    return run_rayshard(paths, epochs, world, on_edge, consumer_reads=False)


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


def run_rayshard_train(paths, epochs, world=WORLD, on_edge: OnEdge = None):
    """rayshard inside a `TorchTrainer` (one Train worker per rank)."""
    loader = _rayshard_loader(paths)
    try:
        return _fit(_rayshard_train_loop, {"loader": loader}, epochs, world, on_edge)
    finally:
        loader.shutdown()


def _ray_dataset(paths: list[str]):
    """The Ray Data loaders' dataset. `ray.data` is imported here, not when Ray starts:
    it adds about 50 MB to the driver, which the rayshard loaders' memory would count."""
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    return ray.data.read_parquet(paths).select_columns(COLUMNS)


def run_ray_data(
    paths: list[str], epochs: int, world: int = WORLD, on_edge: OnEdge = None
) -> tuple[list[EpochRecord], float]:
    import ray

    splits = _ray_dataset(paths).streaming_split(world, equal=True)
    task = ray.remote(num_cpus=0)(_ray_data_rank)
    barrier = epoch_barrier(world)
    with EdgeWatcher(barrier, epochs, on_edge):
        started = time.time()
        refs = [task.remote(split, rank, epochs, barrier) for rank, split in enumerate(splits)]
        return [r for rank in ray.get(refs) for r in rank], started


def run_ray_train(
    paths: list[str], epochs: int, world: int = WORLD, on_edge: OnEdge = None
) -> tuple[list[EpochRecord], float]:
    dataset = _ray_dataset(paths)
    return _fit(_train_loop, {}, epochs, world, on_edge, datasets={"train": dataset})


def _fit(loop, config: dict, epochs: int, world: int, on_edge: OnEdge, datasets=None):
    """Run `loop` in a `TorchTrainer` of `world` CPU workers; each writes its records."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    barrier = epoch_barrier(world)
    with (
        tempfile.TemporaryDirectory(prefix="rayshard-bench-train-") as out,
        EdgeWatcher(barrier, epochs, on_edge),
    ):
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
