"""Loaders without Ray: a raw pyarrow scan and a torch DataLoader, a process per rank."""

from __future__ import annotations

import bisect
import multiprocessing as mp
import pickle
import threading
import time
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._measure import EpochRecord, EpochTimer
from benchmarks.loaders.data import (
    BATCH_SIZE,
    COLUMNS,
    WORLD,
    check_numpy,
    numpy_columns,
    row_group_halves,
)


def _raw_rank(part, rank: int, epochs: int, barriers, queue) -> None:
    """One raw-scan process: its row groups through `ParquetFile.iter_batches`."""
    start, edge = barriers
    start.wait()
    records = []
    for epoch in range(epochs):
        if epoch:
            _wait_edge(edge)
        timer = EpochTimer(rank, epoch)

        def batches():
            for path, groups in part:
                reader = pq.ParquetFile(path)
                for batch in reader.iter_batches(
                    batch_size=BATCH_SIZE, row_groups=groups, columns=COLUMNS
                ):
                    yield numpy_columns(batch)

        records.append(timer.consume(batches(), lambda b: b["id"], check_numpy))
    _wait_edge(edge)
    queue.put(pickle.dumps(records))


class ParquetRowGroupDataset:
    """A map-style torch Dataset over Parquet files: sample i is row i of the files in
    order. `__getitems__` serves a batch of indices from the decoded row group(s) they
    fall in (the last row group is cached), slicing when the indices are contiguous."""

    def __init__(self, paths: Sequence[str], columns: Sequence[str]) -> None:
        self.columns = list(columns)
        self.groups: list[tuple[str, int]] = []
        self.starts: list[int] = []
        total = 0
        for path in paths:
            meta = pq.ParquetFile(path).metadata
            for group in range(meta.num_row_groups):
                self.groups.append((path, group))
                self.starts.append(total)
                total += meta.row_group(group).num_rows
        self.starts.append(total)
        self._files: dict[str, pq.ParquetFile] = {}
        self._cached: tuple[int, pa.Table] | None = None

    def __len__(self) -> int:
        return self.starts[-1]

    def _group(self, g: int) -> pa.Table:
        if self._cached is None or self._cached[0] != g:
            path, group = self.groups[g]
            if path not in self._files:
                self._files[path] = pq.ParquetFile(path)
            self._cached = (g, self._files[path].read_row_group(group, columns=self.columns))
        return self._cached[1]

    def __getitem__(self, index: int) -> dict:
        return self.__getitems__([index])

    def __getitems__(self, indices: Sequence[int]) -> dict:
        idx = np.asarray(indices, dtype=np.int64)
        pieces = []
        if idx.size and idx[-1] - idx[0] + 1 == idx.size and np.all(np.diff(idx) == 1):
            lo, hi = int(idx[0]), int(idx[-1]) + 1
            g = bisect.bisect_right(self.starts, lo) - 1
            while lo < hi:
                end = min(hi, self.starts[g + 1])
                pieces.append(self._group(g).slice(lo - self.starts[g], end - lo))
                lo, g = end, g + 1
        else:
            for index in idx:
                g = bisect.bisect_right(self.starts, int(index)) - 1
                pieces.append(self._group(g).slice(int(index) - self.starts[g], 1))
        table = pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)
        return numpy_columns(table)


class ContiguousDistributedSampler:
    """DistributedSampler without shuffling, but each rank gets a contiguous block
    (rank r: rows [r*n/W, (r+1)*n/W)), so each process reads only its half of the files."""

    def __init__(self, dataset, num_replicas: int, rank: int) -> None:
        n = len(dataset)
        self.lo, self.hi = rank * n // num_replicas, (rank + 1) * n // num_replicas

    def __iter__(self):
        return iter(range(self.lo, self.hi))

    def __len__(self) -> int:
        return self.hi - self.lo


def _torch_collate(batch: dict) -> dict:
    import torch

    with warnings.catch_warnings():  # Arrow-backed arrays are read-only; nothing writes
        warnings.simplefilter("ignore", UserWarning)
        return {k: torch.from_numpy(v) for k, v in batch.items()}


def _torch_rank(paths, world: int, rank: int, epochs: int, barriers, queue) -> None:
    """One torch DataLoader process (num_workers=0) over its contiguous half."""
    import torch.utils.data

    start, edge = barriers
    start.wait()
    records = []
    dataset = None
    for epoch in range(epochs):
        if epoch:
            _wait_edge(edge)
        timer = EpochTimer(rank, epoch)
        dataset = dataset or ParquetRowGroupDataset(paths, COLUMNS)  # footers: timed
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=BATCH_SIZE,
            sampler=ContiguousDistributedSampler(dataset, world, rank),
            num_workers=0,
            collate_fn=_torch_collate,
        )

        def check(batch):
            check_numpy({"x": batch["x"].numpy()})

        records.append(timer.consume(loader, lambda b: b["id"].numpy(), check))
    _wait_edge(edge)
    queue.put(pickle.dumps(records))


EDGE_TIMEOUT_S = 1800


def _wait_edge(edge: tuple) -> None:
    """A rank at an epoch edge (between two epochs, or after the last): wait for every
    rank and the driver (`arrive`), then for the driver's go (`go`)."""
    arrive, go = edge
    arrive.wait(timeout=EDGE_TIMEOUT_S)
    go.wait(timeout=EDGE_TIMEOUT_S)


def _watch_edges(edge: tuple, epochs: int, on_edge: Callable[[], object] | None) -> None:
    """The driver at each of the `epochs` edges past the first: once every rank is there,
    `on_edge()` (the forced memory sample) while they wait, then let them go. A broken
    barrier (a rank died) breaks the other one too, so no rank waits forever."""
    arrive, go = edge
    try:
        for _ in range(epochs):
            arrive.wait(timeout=EDGE_TIMEOUT_S)
            if on_edge is not None:
                on_edge()
            go.wait(timeout=EDGE_TIMEOUT_S)
    except threading.BrokenBarrierError:
        arrive.abort()
        go.abort()


def _run_processes(
    target: Callable,
    args_of_rank: Callable[[int], tuple],
    epochs: int,
    world: int,
    on_edge: Callable[[], object] | None = None,
):
    """Spawn one process per rank; they start together after their imports, and each
    epoch together (as the Ray loaders' ranks do, `on_ray.EpochBarrier`, with the driver
    sampling memory at each edge while they wait)."""
    context = mp.get_context("spawn")
    start, queue = context.Barrier(world + 1), context.Queue()
    edge = (context.Barrier(world + 1), context.Barrier(world + 1))
    barriers = (start, edge)
    procs = [
        context.Process(target=target, args=(*args_of_rank(r), r, epochs, barriers, queue))
        for r in range(world)
    ]
    for proc in procs:
        proc.start()
    start.wait(timeout=120)
    watcher = threading.Thread(target=_watch_edges, args=(edge, epochs, on_edge), daemon=True)
    watcher.start()
    started = time.time()
    try:
        records = [pickle.loads(queue.get(timeout=1800)) for _ in procs]
    finally:
        watcher.join(timeout=5)  # past the last edge already, unless a rank failed
        if watcher.is_alive():
            edge[0].abort()
            edge[1].abort()
            watcher.join()
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"{target.__name__} process exited with {proc.exitcode}")
    return [r for rank in records for r in rank], started


def run_raw(
    paths: list[str], epochs: int, world: int = WORLD, on_edge: Callable[[], object] | None = None
) -> tuple[list[EpochRecord], float]:
    parts = row_group_halves(paths, world)
    return _run_processes(_raw_rank, lambda r: (parts[r],), epochs, world, on_edge)


def run_torch(
    paths: list[str], epochs: int, world: int = WORLD, on_edge: Callable[[], object] | None = None
) -> tuple[list[EpochRecord], float]:
    return _run_processes(_torch_rank, lambda r: (paths, world), epochs, world, on_edge)
