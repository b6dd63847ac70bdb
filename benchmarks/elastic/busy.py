"""One rank's reading while the coordinator is busy (see `benchmarks/elastic_bench.py`):
caller actors keep `inflight` cheap calls (`ping`) queued at the coordinator, as many
ranks' acknowledgements do at scale, and one rank reads two epochs in this process under
`dynamic` (lease calls, each waiting its turn in that queue; paced when answers come
late) and under
`data` (no call per piece). The queue wait a probe call sees is reported beside it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROW_GROUP = 32_768
BATCH = 1024
EPOCHS = 2  # per loader: the first, and one after it (steady state)


class _Pinger:
    """Keeps `inflight` `ping` calls queued at the coordinator until `halt()`."""

    def __init__(self, coordinator) -> None:
        self.coordinator, self.stopping, self.calls, self.tasks = coordinator, False, 0, []

    async def start(self, inflight: int) -> bool:
        async def loop() -> None:
            while not self.stopping:
                await self.coordinator.ping.remote()
                self.calls += 1

        self.tasks = [asyncio.ensure_future(loop()) for _ in range(inflight)]
        return True

    async def halt(self) -> int:
        self.stopping = True
        await asyncio.gather(*self.tasks)
        return self.calls


def _read_epoch(path: Path, policy: str, inflight: int, callers: int) -> dict:
    import ray

    from rayshard.loader import Loader
    from rayshard.sources.parquet import ParquetSource

    loader = Loader(
        ParquetSource([str(path)], columns=["id", "x"]),
        batch_size=BATCH,
        policy=policy,
        name=f"busy-{uuid.uuid4().hex[:8]}",
    )
    pingers = []
    try:
        iterator = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        if inflight:
            pingers = [
                ray.remote(num_cpus=0)(_Pinger).remote(loader._coordinator) for _ in range(callers)
            ]
            ray.get([p.start.remote(inflight // callers) for p in pingers])
        ray.get(loader._coordinator.trace.remote(True))  # records every lease call
        sent = time.time()
        ray.get(loader._coordinator.ping.remote())
        wait = time.time() - sent
        walls, covered, total = [], True, pq.ParquetFile(path).metadata.num_rows
        for _ in range(EPOCHS):  # the second: a rank's lease pacing measured already
            began, seen = time.time(), []
            for batch in iterator:
                seen.append(batch["id"])
            walls.append(time.time() - began)
            ids = np.concatenate(seen) if seen else np.zeros(0, dtype=np.int64)
            covered = covered and len(ids) == total == len(np.unique(ids))
        rows = len(ids)
        traced = ray.get(loader._coordinator.trace.remote(False))
        pings = sum(ray.get([p.halt.remote() for p in pingers]))
    finally:
        for pinger in pingers:
            ray.kill(pinger)
        loader.shutdown()
    return {
        "policy": policy,
        "inflight": inflight,
        "queue_wait_s": wait,
        "rows": rows,
        "seconds": walls,
        "rows_per_s": rows / walls[0],
        "steady_rows_per_s": rows / walls[-1],
        "pings": pings,
        "lease_calls": sum(1 for _, kind, _, _ in traced if kind == "lease"),
        "coverage_ok": covered,
    }


def run_busy(workdir: Path, rows: int, levels: Sequence[int], callers: int = 2) -> dict:
    """Both policies at every level of calls kept queued; rows/s and the ratio of `dynamic`
    to `data` at the same level."""
    path = workdir / "busy.parquet"
    x = np.random.default_rng(0).standard_normal(rows)
    table = pa.table({"id": np.arange(rows, dtype=np.int64), "x": x})
    pq.write_table(table, path, row_group_size=ROW_GROUP)
    runs = [_read_epoch(path, p, k, callers) for k in levels for p in ("data", "dynamic")]
    for run in runs:
        (same,) = [r for r in runs if r["inflight"] == run["inflight"] and r["policy"] == "data"]
        run["vs_data"] = run["rows_per_s"] / same["rows_per_s"]
        run["steady_vs_data"] = run["steady_rows_per_s"] / same["steady_rows_per_s"]
    return {"config": {"rows": rows, "levels": list(levels), "callers": callers}, "runs": runs}
