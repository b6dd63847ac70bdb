"""Transform workers: a rank's transform in `transform_workers` processes instead of one.

The reader still reads, shuffles and rebatches on its own thread; it hands batch `j` to
worker `j % k` and yields the results in batch order, so the output (its order included)
is the one a single reader would produce. Workers are actors created by the reader, on its
node or, with `transform_resources`, wherever Ray finds those resources (CPU-only nodes:
preprocessing scales out past the GPU node); they die with it. A worker process that dies
is restarted by Ray and the calls it had in flight run again (`max_restarts=-1`,
`max_task_retries=-1`); a transform is a function of (batch, ctx), so running it again
gives the same batch.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayshard.batching import FLUSH
from rayshard.errors import TransformError
from rayshard.runtime.transform_stage import apply_transform
from rayshard.transforms import INDEX_KEY, PADDED_KEY, TransformContext


class TransformWorker:
    """Runs the loader's transform on batches sent by a reader."""

    def __init__(self, transform: Any, loader: str, seed: int, rank: int) -> None:
        self._transform, self._loader, self._seed, self._rank = transform, loader, seed, rank

    def apply(self, batch: dict, epoch: int) -> dict:
        ctx = TransformContext(
            loader=self._loader,
            seed=self._seed,
            epoch=epoch,
            rank=self._rank,
            indices=np.asarray(batch[INDEX_KEY]),
            padded=np.asarray(batch[PADDED_KEY]),
        )
        return apply_transform(self._transform, dict(batch), ctx)


def start_workers(
    count: int,
    transform: Any,
    loader: str,
    seed: int,
    rank: int,
    resources: tuple[tuple[str, float], ...] | None = None,
) -> list:
    """`count` transform workers (call from the reader actor): on the reader's node, or,
    with `resources`, wherever Ray finds them (CPU-only nodes, say). Either way the reader
    owns them, so they die with it."""
    if resources is None:
        node = ray.get_runtime_context().get_node_id()
        placement: dict[str, Any] = {
            "num_cpus": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False),
        }
    else:
        wanted = dict(resources)
        placement = {"num_cpus": wanted.pop("CPU", 0), "resources": wanted}
    cls = ray.remote(TransformWorker).options(
        max_restarts=-1, max_task_retries=-1, **placement
    )
    return [cls.remote(transform, loader, seed, rank) for _ in range(count)]


def parallel_transform_stream(
    batches: Iterator[Any], workers: list, epoch: int, ahead: int = 2
) -> Iterator[Any]:
    """The transformed `batches`, in order, `ahead` batches per worker in flight. A `FLUSH`
    waits for every batch before it, then passes on."""
    pending: collections.deque = collections.deque()
    sent = 0
    for batch in batches:
        if batch is FLUSH:
            while pending:
                yield _result(pending.popleft())
            yield FLUSH
            continue
        pending.append(workers[sent % len(workers)].apply.remote(batch, epoch))
        sent += 1
        while len(pending) >= ahead * len(workers):
            yield _result(pending.popleft())
    while pending:
        yield _result(pending.popleft())


def _result(ref: Any) -> dict:
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, TransformError):
            raise error.cause from None  # as a single reader raises it
        raise
