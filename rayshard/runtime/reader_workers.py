"""Reader workers: the processes that read and transform a rank's data for its reader.

With `reader_workers=k` (k > 1) the reader sends piece `i` of its reading order to worker
`i % k` (`read`: decode the piece's rows) and takes the record batches back in piece order;
it shuffles, pads and rebatches them as a lone reader does, then sends its batches to the
workers in turns, a group of consecutive batches per call (`apply_batches`: the transform,
`rayshard.runtime.transform_workers`), and delivers the results in batch order. The reader
keeps the state and the order, so the batches (their order included) are the ones
`reader_workers=1` makes. `transform_workers=k` alone uses the same workers for the
transform only.

Workers are actors created by the reader, on its node or, with `transform_resources`,
wherever Ray finds those resources (CPU-only nodes: preprocessing scales out past the GPU
node); the reader owns them, so they die with it. A worker process that dies is restarted
by Ray and the calls it had in flight run again (`max_restarts=-1`, `max_task_retries=-1`):
a piece reads as the same rows every time, and a transform is a function of (batch, ctx).

With `reader_threads=n` each worker reads up to n pieces at once (a threaded actor), as the
reader's own threads do without workers; its transform still runs one batch at a time.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayshard.data.batching import Reads, in_piece_order, iter_rows
from rayshard.data.transforms import INDEX_KEY, PADDED_KEY, TransformContext
from rayshard.data.wire import for_wire
from rayshard.errors import RayshardError, TransformError
from rayshard.runtime.remote import remote_class
from rayshard.runtime.transform_stage import apply_transform
from rayshard.sources import Source


class ReaderWorker:
    """Reads pieces of the loader's source and runs its transform, for one reader."""

    def __init__(self, source: Source, transform: Any, loader: str, seed: int, rank: int) -> None:
        self._source, self._transform = source, transform
        self._loader, self._seed, self._rank = loader, seed, rank
        self._epoch_source: tuple[int, Source] | None = None  # (epoch, source as read then)
        self._one_transform = threading.Lock()  # reads may run in threads; transforms not

    def read(
        self, piece: tuple[int, int], columns: Sequence[str] | None, epoch: int
    ) -> list[pa.RecordBatch]:
        """The record batches of one piece as `epoch` reads it, tagged like the reader's."""
        known = self._epoch_source
        if known is None or known[0] != epoch:
            self._source.let_go()  # what the last epoch's parts kept decoded (`Source.let_go`)
            known = self._epoch_source = (epoch, self._source.for_epoch(epoch, self._seed))
        return list(iter_rows(known[1], [piece], columns))

    def apply_batches(
        self, batches: list[dict], epoch: int
    ) -> tuple[list[dict], TransformError | None, float]:
        """The transform of consecutive batches of `epoch`, with the context a reader
        would give each: their results in order, the error that stopped the call (the
        batches before it keep their results), and the seconds the transform took."""
        results: list[dict] = []
        with self._one_transform:
            start = time.perf_counter()
            for batch in batches:
                ctx = TransformContext(
                    loader=self._loader,
                    seed=self._seed,
                    epoch=epoch,
                    rank=self._rank,
                    indices=np.asarray(batch[INDEX_KEY]),
                    padded=np.asarray(batch[PADDED_KEY]),
                )
                try:
                    result = apply_transform(self._transform, dict(batch), ctx)
                    results.append(for_wire(result))  # bytes and str columns: Arrow
                except TransformError as error:
                    return results, error, time.perf_counter() - start
            return results, None, time.perf_counter() - start


def start_workers(
    count: int,
    source: Source,
    transform: Any,
    loader: str,
    seed: int,
    rank: int,
    resources: tuple[tuple[str, float], ...] | None = None,
    threads: int = 1,
) -> list:
    """`count` reader workers (call from the reader actor), each reading with `threads`
    threads: on the reader's node, or, with `resources`, wherever Ray finds them (CPU-only
    nodes, say). Either way the reader owns them, so they die with it."""
    if resources is None:
        node = ray.get_runtime_context().get_node_id()
        placement: dict[str, Any] = {
            "num_cpus": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False),
        }
    else:
        placement = actor_resources(resources)
    cls = remote_class(ReaderWorker).options(
        max_restarts=-1, max_task_retries=-1, max_concurrency=threads, **placement
    )
    return [cls.remote(source, transform, loader, seed, rank) for _ in range(count)]


def actor_resources(resources: tuple[tuple[str, float], ...]) -> dict[str, Any]:
    """`transform_resources` as Ray's actor options: CPUs and GPUs by their keywords (Ray
    refuses them inside `resources`), the rest as custom resources."""
    wanted = dict(resources)
    return {
        "num_cpus": wanted.pop("CPU", 0),
        "num_gpus": wanted.pop("GPU", 0),
        "resources": wanted,
    }


def worker_reads(workers: list, epoch: int, threads: int = 1) -> Reads:
    """Reads of `epoch` by `workers` (of `threads` threads each): piece `i` of a call by
    worker `i % k`, `threads + 1` pieces per worker in flight (one queued behind those being
    read), the record batches in piece order."""

    def reads(
        pieces: Sequence[tuple[int, int]], columns: Sequence[str] | None
    ) -> Iterator[pa.RecordBatch]:
        turn = itertools.count()

        def submit(piece: tuple[int, int]) -> _Call:
            worker = workers[next(turn) % len(workers)]
            return _Call(worker.read.remote(piece, columns, epoch))

        return in_piece_order(pieces, submit, (threads + 1) * len(workers))

    return reads


class _Call:
    """A worker call in flight; `result()` waits for it (`worker_result`)."""

    def __init__(self, ref: Any) -> None:
        self._ref = ref

    def result(self) -> Any:
        return worker_result(self._ref)


def worker_result(ref: Any) -> Any:
    """The value of a worker call; a rayshard error it raised (a `DataError` of the data,
    a `TransformError`) is raised as itself, as the reader raises it when it does the work."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, RayshardError):
            raise error.cause from None
        raise


__all__ = ["ReaderWorker", "start_workers", "worker_reads", "worker_result"]
