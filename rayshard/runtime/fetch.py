"""A consumer's side of the reader actor: the batches of one epoch, fetched as `Block`s
(zero-copy from the object store), each batch already tagged with its `BatchMeta`."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterable, Iterator

import ray

from rayshard.data.batching import Tagged
from rayshard.data.wire import for_arrow, for_user
from rayshard.errors import RayshardError, unwrap_task_error
from rayshard.runtime.block import Block

STALL_FLUSH_S = 0.02  # a consumer waiting this long for a batch sends its pending acks
SETTLE_S = 10.0  # at most this long for each request in flight after a reader's error


def fetch_batches(
    reader: ray.actor.ActorHandle,
    generation: int,
    epoch: int,
    *,
    flush: Callable[[], None],
    where: str,
    blocks_ahead: int = 1,
    arrow: bool = False,
    run: int | None = None,
    member: int | None = None,
) -> Iterator[Tagged]:
    """Tagged numpy batches of `epoch` from `reader`, in order; `blocks_ahead` block
    requests stay in flight beyond the block being consumed (the loader's read-ahead
    budget, `LoaderConfig.blocks_ahead`). While waiting for the reader, `flush()` sends the
    acknowledgements so far (at a `dynamic` epoch's end the other ranks' readers wait for
    exactly that). A reader's error is raised as its rayshard type, `where` naming loader
    and rank. String and binary columns come as numpy object arrays, or with `arrow`
    (`batch_format="arrow"`) as Arrow where that is the same (`wire.for_arrow`). `member`:
    this consumer in the rank's model-parallel group (its world rank)."""
    convert = for_arrow if arrow else for_user
    more, requested = True, 0
    pending: collections.deque = collections.deque()  # (index, request) in flight
    while True:
        while more and len(pending) <= blocks_ahead:
            call = reader.next.remote(generation, epoch, requested, run, member)
            pending.append((requested, call))
            requested += 1
        if not pending:
            return
        index, request = pending.popleft()
        try:
            try:
                ref = ray.get(request, timeout=STALL_FLUSH_S)
            except ray.exceptions.GetTimeoutError:
                flush()
                ref = ray.get(request)
            if ref is not None:
                block: Block = ray.get(ref)
        except ray.exceptions.RayTaskError as error:
            _settle(request for _, request in pending)
            raise unwrap_task_error(error, f"{where}, epoch {epoch}") from error
        except (ray.exceptions.ActorDiedError, ray.exceptions.OwnerDiedError) as error:
            _settle(request for _, request in pending)
            raise RayshardError(
                f"{where}, epoch {epoch}: its reader is gone at block {index} "
                f"({type(error).__name__}: the reader's process, the process that made it "
                "or their node ended, or the loader was shut down); the rank counts as "
                "lost: take a new iterator (under `dynamic` its unfinished leases went "
                "back to the other ranks)"
            ) from error
        if ref is None:
            more = False
            continue
        if (block.generation, block.epoch, block.index) != (generation, epoch, index):
            raise RayshardError(
                f"{where}: asked for block {index} of (generation, epoch) "
                f"{(generation, epoch)} and got block {block.index} of "
                f"{(block.generation, block.epoch)}: take a new iterator"
            )
        for tagged in block.batches:  # string and binary columns: Arrow to numpy here
            yield Tagged(tagged.tag, convert(tagged.batch))


def _settle(requests: Iterable[ray.ObjectRef]) -> None:
    """Take the answers of requests still in flight after a reader's error (they fail
    the same way at once), so that Ray does not log each as an unhandled error."""
    for request in requests:
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(request, timeout=SETTLE_S)
