"""A consumer's side of the reader: the batches of one epoch, fetched in blocks from the
reader actor (zero-copy from the object store), each with its metadata split off into a
`BatchMeta` that travels with it (`Tagged`)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
import ray

from rayshard.data.batching import INDEX_KEY, PADDED_KEY, Tagged
from rayshard.errors import unwrap_task_error
from rayshard.runtime.packing_stage import COMPLETED_KEY, PARTIAL_KEY
from rayshard.runtime.transform_stage import DROPPED_KEY

STALL_FLUSH_S = 0.02  # a consumer waiting this long for a batch sends its pending acks


class BatchMeta(NamedTuple):
    """What a consumer acknowledges for a batch: its sample ids and padding flags, its
    bytes, the samples a transform dropped from it, and (packing) the documents it
    finished with the split ones' progress."""

    ids: np.ndarray
    padded: np.ndarray
    nbytes: int
    dropped: np.ndarray | None
    packed: tuple | None


def fetch_batches(
    reader: ray.actor.ActorHandle,
    generation: int,
    epoch: int,
    *,
    flush: Callable[[], None],
    where: str,
) -> Iterator[Tagged]:
    """Numpy batches of `epoch` from `reader`, in order, each tagged with its `BatchMeta`;
    two block requests stay in flight. While waiting for the reader, `flush()` sends the
    acknowledgements so far (at an epoch's end the other ranks' readers wait for exactly
    that). A reader's error is raised as its rayshard type, `where` naming loader and rank."""
    more, requested = True, 0
    pending: collections.deque = collections.deque()  # requests in flight
    while True:
        while more and len(pending) < 2:
            pending.append(reader.next.remote(generation, epoch, requested))
            requested += 1
        if not pending:
            return
        request = pending.popleft()
        try:
            try:
                ref = ray.get(request, timeout=STALL_FLUSH_S)
            except ray.exceptions.GetTimeoutError:
                flush()
                ref = ray.get(request)
        except ray.exceptions.RayTaskError as error:
            raise unwrap_task_error(error, f"{where}, epoch {epoch}") from error
        if ref is None:
            more = False
            continue
        for batch in ray.get(ref):
            yield tag_batch(batch)


def tag_batch(batch: dict) -> Tagged:
    """`batch` (a reader's numpy batch) tagged with its `BatchMeta`; the keys that only the
    metadata needs are taken out of it."""
    dropped = batch.pop(DROPPED_KEY, None)  # a transform's filter: consumed too
    # packing: documents finished in this batch, and split ones delivered so far
    packed = None
    if COMPLETED_KEY in batch:
        packed = (batch.pop(COMPLETED_KEY), batch.pop(PARTIAL_KEY))
    nbytes = sum(getattr(value, "nbytes", 0) for value in batch.values())
    return Tagged(BatchMeta(batch[INDEX_KEY], batch[PADDED_KEY], nbytes, dropped, packed), batch)
