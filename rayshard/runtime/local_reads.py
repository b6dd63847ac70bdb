"""Reading in the consumer's own process: a rank whose only consumer is the training
worker, with no worker processes to feed, reads its batches on a background thread of
that worker instead of in its reader actor.

The batches are the ones the reader actor would make: the same coordinator answer
(`start_epoch`), the same row streams and batching (`rayshard.runtime.row_streams`), so
order, shuffles, padding, leases and acknowledgements are unchanged. What goes away is
the way between two processes: no `ray.put` of each block into the object store, no
fetch through an actor call, and no wait for the reader actor to start before the first
batch. The reader actor is still made: the coordinator watches it, and it dies with the
worker that owns it. `prefetch_depth` batches wait in a bounded channel.
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from rayshard.config.loader_config import LoaderConfig
from rayshard.data.batching import FLUSH, Tagged
from rayshard.data.wire import for_arrow, for_user
from rayshard.device._channel import CLOSED, EMPTY, Channel
from rayshard.errors import (
    RayshardError,
    TransformError,
    coordinator_gone,
    same_kind,
    unwrap_task_error,
)
from rayshard.runtime import process_watch
from rayshard.runtime.block import tag_batch
from rayshard.runtime.fetch import STALL_FLUSH_S
from rayshard.runtime.ray_held import ray_held
from rayshard.runtime.row_streams import RankReading, length_is_exact

_END = object()  # the epoch's last batch was put


class _Failure:
    """What the reading thread raised, with its traceback, delivered after the batches
    made before it."""

    def __init__(self, error: BaseException, trace: str) -> None:
        self.error, self.trace = error, trace

    def raised(self, where: str, epoch: int, coordinator: Any) -> BaseException:
        """The error the consumer raises: a transform's as is (it names loader, rank,
        epoch and samples); the `coordinator`'s death as such; otherwise its rayshard type
        (else `RayshardError`), naming where and carrying the reading thread's traceback."""
        if isinstance(self.error, TransformError):
            return self.error
        gone = coordinator_gone(self.error, coordinator, f"{where}, epoch {epoch}")
        if gone is not None:
            return gone
        unwrapped = unwrap_task_error(self.error, f"{where}, epoch {epoch}")
        if unwrapped is not self.error:  # the coordinator's own error (a refusal), as is
            return unwrapped
        kind = (
            self.error if isinstance(self.error, RayshardError) else RayshardError(repr(self.error))
        )
        return same_kind(
            kind,
            f"{where}, epoch {epoch}: reader failed: {kind}\n--- reader traceback ---\n"
            f"{self.trace}",
        )


def reads_in_consumer(settings: LoaderConfig, consumers: int, transform: Any) -> bool:
    """Whether a rank with `consumers` members reads in its consumer (`consumer_reads`):
    when asked (True), or by default (None) when it is the rank's only consumer and no
    worker process, transform, packing or `reader_num_cpus` is involved (a transform or
    packing stays out of the training process unless asked; CPUs reserved for readers ask
    for reader actors). False: always in the reader actor."""
    wanted = settings.consumer_reads
    if wanted is not None:
        return wanted
    return (
        consumers == 1
        and not settings.reader_num_cpus
        and settings.worker_count == 1
        and settings.transform_resources is None
        and transform is None
        and settings.packing is None
    )


class LocalReads:
    """One rank's reading in this process, one epoch at a time."""

    def __init__(self, reading: RankReading) -> None:
        self._reading = reading
        self._cancel = threading.Event()
        self._channel: Channel | None = None
        self._thread: threading.Thread | None = None
        self._leases_ended = threading.Event()

    def start(self, generation: int, epoch: int, arrow: bool = False, leases: Any = None) -> dict:
        """Begin reading `epoch` (ending any epoch being read). Returns `batches`, the
        batches the epoch yields, and `exact`, whether that count is final. String and
        binary columns are read as Arrow, tagged, and converted as a reader actor's
        consumer converts them (`fetch_batches`; `arrow`: for `batch_format="arrow"`).
        `leases`: the consumer's `AckSender`, whose relay `dynamic` lease calls share."""
        self.stop()
        reading = self._reading
        started = reading.start_epoch(generation, epoch)
        cancel = self._cancel = threading.Event()
        stream = reading.epoch(
            started, generation, epoch, cancel=lambda: cancel, keep_text=True, leases=leases
        )
        self._channel = Channel(reading.settings.prefetch_depth)
        self._leases_ended = threading.Event()
        self._thread = threading.Thread(
            target=_produce,
            args=(
                stream,
                self._channel,
                cancel,
                for_arrow if arrow else for_user,
                self._leases_ended,
            ),
            daemon=True,
        )
        self._thread.start()
        return {"batches": started["batches"], "exact": length_is_exact(reading.settings)}

    def batches(self, epoch: int, *, flush: Callable[[], None], where: str) -> Iterator[Tagged]:
        """The started epoch's batches in order, each tagged with its `BatchMeta`. While
        waiting for one, `flush()` sends the acknowledgements so far (under `dynamic` the
        other ranks may wait for exactly those). An error of the reading thread is raised
        after the batches made before it, `where` naming loader and rank. Bound to this
        epoch's channel now: a later `start()` ends it rather than feeding it."""
        channel, coordinator = self._channel, self._reading.coordinator
        return iter(()) if channel is None else _Drained(channel, epoch, flush, where, coordinator)

    def when_awaited(self, flush: Callable[[], None]) -> Callable[[], None]:
        """`flush` for a consumer waiting for a batch of the started epoch, called only
        once the reading passed a `FLUSH` (under `dynamic`: a lease answer to wait, given
        once no piece is left for this rank) or ended: from then on the other ranks may
        wait for this rank's acknowledgements (its open leases), so a wait sends them at
        once. Before, no one waits for them, and they go every `ack_interval_s`: a consumer
        that outpaces its reading waits at every piece, and a call each time would cost the
        coordinator and this process more than the reading of a small piece."""
        ended = self._leases_ended
        return lambda: flush() if ended.is_set() else None

    def stop(self) -> None:
        """End the epoch being read: the thread stops at its next batch."""
        self.abandon()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._channel = self._thread = None

    def abandon(self) -> None:
        """Tell the reading thread to stop at its next batch, without waiting for it."""
        self._cancel.set()
        if self._channel is not None:
            self._channel.close()

    def close(self) -> None:
        """Stop reading and release the reading threads."""
        self.stop()
        self._reading.close()


class _Drained:
    """`LocalReads.batches` of one epoch's channel: an iterator, not a generator, so an
    interrupt while it waits (Ctrl-C) leaves it able to go on where it was."""

    resumable = True

    def __init__(
        self,
        channel: Channel,
        epoch: int,
        flush: Callable[[], None],
        where: str,
        coordinator: Any,
    ) -> None:
        self._channel, self._epoch, self._flush, self._where = channel, epoch, flush, where
        self._coordinator = coordinator  # a failure may be its death (`coordinator_gone`)
        self._ended_by: Any = None  # the end, or the failure, once taken (given every time)

    def __iter__(self) -> Iterator[Tagged]:
        return self

    def __next__(self) -> Tagged:
        item = self._ended_by
        if item is None:
            item = self._channel.get(timeout=STALL_FLUSH_S)
        if item is EMPTY:
            self._flush()
            item = self._channel.get()
        if item is CLOSED or item is _END:
            self._ended_by = item
            raise StopIteration
        if isinstance(item, _Failure):
            self._ended_by = item
            raise item.raised(self._where, self._epoch, self._coordinator) from item.error
        return item


def _produce(
    stream: Iterator[Any],
    channel: Channel,
    cancel: threading.Event,
    convert: Callable[[dict], dict],
    flushed: threading.Event,
) -> None:
    """Move `stream`'s batches into `channel`, tagged, then `convert`ed, until it ends,
    fails, or is cancelled; `flushed` is set at the stream's first `FLUSH` (a reader
    actor's cue to publish a block; see `LocalReads.when_awaited`) and at its end."""
    try:
        for batch in stream:
            if batch is FLUSH:
                flushed.set()
                continue
            meta, batch = tag_batch(batch)
            if cancel.is_set() or not channel.put(Tagged(meta, convert(batch))):
                return
        flushed.set()
        channel.put(_END)
    except BaseException as error:  # noqa: BLE001 - delivered to the consumer in order
        flushed.set()
        channel.put(_Failure(error, traceback.format_exc()))
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()


def abandon_rank(local_reads: Any, watch: Any, key: str) -> None:
    """An iterator dropped without `close()`: its reading thread is told to stop (not
    waited for: this runs in the garbage collector) and its key in the process's watch is
    released, so the coordinator treats the rank as lost and hands its unfinished work to
    the others, as when a watch actor of its own ended with it. After `ray.shutdown()`
    there is nothing left to release. A finalizer must not wait: if Ray's lock is busy
    (another thread's Ray calls, or Ray starting or shutting down), a thread of its own
    releases the key once it is free."""
    if local_reads is not None:
        local_reads.abandon()
    if not _release_key(watch, key, blocking=False):
        later = threading.Thread(
            target=_release_key, args=(watch, key), daemon=True, name="rayshard-release"
        )
        with contextlib.suppress(RuntimeError):  # the interpreter exits: Ray goes with it
            later.start()


def _release_key(watch: Any, key: str, blocking: bool = True) -> bool:
    """Release `key` in `watch` if Ray is up (see `ray_held`), and in this process's
    bookkeeping (`process_watch.release`); False if Ray's lock or the bookkeeping's was
    busy and `blocking` is False: nothing was done."""
    with ray_held(blocking) as up:
        if up is None:
            return False
        return process_watch.release(key, watch if up else None, blocking) is not False


__all__ = ["LocalReads", "abandon_rank", "reads_in_consumer"]
