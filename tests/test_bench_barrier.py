"""The loader benchmark holds every rank at each epoch's start until all are there
(`benchmarks.loaders.on_ray.EpochBarrier`, the Ray loaders' counterpart of the raw scan's
`multiprocessing` barrier): its logic, in one event loop, no Ray."""

from __future__ import annotations

import asyncio

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
