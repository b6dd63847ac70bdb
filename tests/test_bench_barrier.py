"""The loader benchmark holds every rank at each epoch's start until all are there
(`benchmarks.loaders.on_ray.EpochBarrier`, the Ray loaders' counterpart of the raw scan's
`multiprocessing` barrier): its logic, in one event loop, no Ray."""

from __future__ import annotations

import asyncio
import time

from benchmarks._measure import HARNESS_PROCESS
from benchmarks.loaders.on_ray import EpochBarrier


def test_no_rank_passes_an_epoch_start_before_every_rank_reached_it() -> None:
    async def run() -> list[tuple[str, int, int]]:
        barrier, log = EpochBarrier(3), []

        async def rank(r: int, epochs: int) -> None:
            for epoch in range(epochs):
                log.append(("arrive", epoch, r))
                await barrier.wait(epoch)
                log.append(("pass", epoch, r))
                await asyncio.sleep(0.001 * r)  # ranks of different speeds

        await asyncio.wait_for(asyncio.gather(*(rank(r, 4) for r in range(3))), timeout=30)
        return log

    log = asyncio.run(run())
    for epoch in range(4):
        arrivals = [i for i, (what, e, _) in enumerate(log) if what == "arrive" and e == epoch]
        passes = [i for i, (what, e, _) in enumerate(log) if what == "pass" and e == epoch]
        assert len(arrivals) == len(passes) == 3
        assert max(arrivals) < min(passes), f"a rank started epoch {epoch} before all arrived"


def test_the_harness_process_name_is_the_barrier_actors() -> None:
    # /proc shows a Ray actor's process as "ray::<class>" cut to 15 characters: the name
    # the memory figures leave out must be the barrier's.
    assert f"ray::{EpochBarrier.__name__}"[:15] == HARNESS_PROCESS


def test_past_the_first_edge_ranks_wait_for_the_watchers_release() -> None:
    # The driver samples memory at each edge while every rank waits (`EdgeWatcher`).
    async def run() -> list[tuple[str, int]]:
        barrier, log, epochs = EpochBarrier(2, watched=True), [], 3

        async def rank(r: int) -> None:
            for edge in range(epochs + 1):  # before each epoch, and after the last
                await barrier.wait(edge)
                log.append(("pass", edge))
                await asyncio.sleep(0.001 * r)

        async def watcher() -> None:
            for edge in range(1, epochs + 1):
                await barrier.all_in(edge)
                log.append(("all in", edge))
                await asyncio.sleep(0.01)  # the sample
                log.append(("release", edge))
                await barrier.release(edge)

        tasks = (*(rank(r) for r in range(2)), watcher())
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
        return log

    log = asyncio.run(run())
    for edge in range(1, 4):
        released = log.index(("release", edge))
        passes = [i for i, entry in enumerate(log) if entry == ("pass", edge)]
        assert len(passes) == 2 and min(passes) > released, f"a rank left edge {edge} early"
        assert log.index(("all in", edge)) > max(
            i for i, entry in enumerate(log) if entry == ("pass", edge - 1)
        )


def test_the_raw_scan_samples_at_each_edge_while_its_ranks_wait(tmp_path) -> None:
    from benchmarks.loaders.data import make_dataset, parquet_files
    from benchmarks.loaders.local import run_raw

    paths = parquet_files(make_dataset(tmp_path, 4_000, files=2, row_group_size=1_000))
    edges: list[tuple[float, float]] = []

    def on_edge() -> None:
        began = time.time()
        time.sleep(0.2)  # a costly sample
        edges.append((began, time.time()))

    records, _ = run_raw(paths, 3, world=2, on_edge=on_edge)
    assert len(edges) == 3  # between the epochs, and after the last
    for epoch in range(3):
        ranks = [r for r in records if r.epoch == epoch]
        began, ended = edges[epoch]
        assert max(r.end for r in ranks) <= began  # every rank had ended the epoch
        if epoch < 2:
            nxt = [r for r in records if r.epoch == epoch + 1]
            assert min(r.start for r in nxt) >= ended  # and none began the next one
