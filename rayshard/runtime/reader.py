"""The shard reader: one Ray actor per data-parallel rank, created by (and placed on the
node of) the worker it feeds, so it shares that worker's fate. (A rank whose worker reads
for itself has a `RankWatch` instead: `rayshard.runtime.local_reads`.)

It owns the rank's shard state (generation, epoch, cursor), reads and batches in its own
process on a background thread, and keeps `prefetch_depth` batches ready in the object
store. Static policies read the rank's planned ranges; `dynamic` leases split pieces from
the coordinator until none is left, then pads to the equal step count. Every member of
the rank's model-parallel group fetches the same batches, read once and dropped when the
last member took them (or closed its iterator); the rank leaves when its last member does.
A threaded actor: consumers block in `next()` while the reader thread works; `watch()`
blocks for the coordinator's death watch. `_cond` guards every field below it.
"""

from __future__ import annotations

import itertools
import threading
import traceback
from collections.abc import Iterator
from typing import Any

import ray

from rayshard.data.batching import FLUSH, Reads, Tagged
from rayshard.data.wire import for_wire
from rayshard.errors import (
    RayshardError,
    StaleClientError,
    TransformError,
    coordinator_gone,
    same_kind,
    unwrap_task_error,
)
from rayshard.runtime.acks import AckSender
from rayshard.runtime.block import Block, shipped_bytes, tag_batch
from rayshard.runtime.metrics import set_prefetch_depth
from rayshard.runtime.reader_workers import start_workers, worker_reads
from rayshard.runtime.reading_threads import threads_for_cpus
from rayshard.runtime.row_streams import RankReading, length_is_exact


class ShardReader:
    """Reads one data-parallel rank's share into batches in the object store."""

    def __init__(self, reading: RankReading, consumers: int) -> None:
        self._reading = reading  # source, configuration, transform, reading threads
        self._coordinator, self._source = reading.coordinator, reading.source
        self._settings, self._dp_rank = reading.settings, reading.dp_rank
        self._loader_name = reading.loader_id
        self._transform = reading.transform  # fn(batch, ctx), run on the reader thread
        self._consumers = consumers
        self._workers: list | None = None  # reader workers, made on first use
        self._stopped = threading.Event()
        self._cond = threading.Condition()
        self._key: tuple[int, int] | None = None  # (generation, epoch) being read
        self._starting: tuple[int, int] | None = None  # a start() in progress
        self._batches: int | None = None  # expected batches of the epoch (static: exact)
        self._final: int | None = None  # batches produced, once the reader thread is done
        self._ready: dict[int, Any] = {}  # block index -> ObjectRef
        self._ready_batches: dict[int, int] = {}  # block index -> its batches
        self._taken: dict[int, set] = {}  # block index -> the members that fetched it
        self._closed: set = set()  # members that closed their iterators (count as taken)
        self._next_to_read = 0
        self._low_water = 0  # lowest index some consumer still needs
        self._restarts = 0  # the most restarts of an epoch a consumer asked for
        self._run = 0  # readings begun: a consumer's block calls name the one it started
        self._error: BaseException | None = None
        self._stop_error: StaleClientError | None = None  # `stop()`'s, for later starts
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()
        # `dynamic` lease calls' way: through the node's relay once an answer asks for it
        # (it sends no acknowledgement groups: its consumers do; generation unused)
        self._leases = AckSender(self._coordinator, 0, self._dp_rank, 0, self._loader_name)

    def start(self, generation: int, epoch: int, restarts: int = 0) -> dict:
        """Begin (or join) reading `epoch`; idempotent for the members of one group, also
        when they call at the same moment (the second waits for the first's start). A
        consumer's count of `restarts` above the last one seen reads the epoch again from
        its start (`set_epoch` in its middle; a group's members each ask once).

        Returns `batches`, the batches the epoch yields, and `exact`: whether that count is
        final (static policies; `dynamic` with equal steps) or an estimate."""
        key = (generation, epoch)
        with self._cond:
            self._cond.wait_for(lambda: self._starting is None)
            if self._stop_error is not None:  # (a member died: the group reads no more)
                raise self._stop_error
            if self._key == key and restarts <= self._restarts:
                return self._started_info()
            again, self._restarts = self._key == key, max(self._restarts, restarts)
            if self._key is not None and key < self._key:
                raise StaleClientError(
                    f"reader of rank {self._dp_rank} is at (generation, epoch) {self._key}; "
                    f"a client asked for {key}: take a new iterator"
                )
            self._starting = key
        if again:  # the old reading stops (its waiting calls end) before its rows come back
            self._stop_thread()
        try:
            self._begin_epoch(generation, epoch)
        finally:
            with self._cond:
                self._starting = None
                self._cond.notify_all()
        with self._cond:
            return self._started_info()

    def _gauge_depth(self) -> None:
        """`rayshard_prefetch_depth`: batches ready here, as a block is added, taken or an
        epoch's are dropped (under `_cond`)."""
        set_prefetch_depth(self._loader_name, self._dp_rank, sum(self._ready_batches.values()))

    def _started_info(self) -> dict:
        exact = length_is_exact(self._settings)
        return {"batches": self._batches, "exact": exact, "run": self._run}

    def _begin_epoch(self, generation: int, epoch: int) -> None:
        started = self._reading.start_epoch(generation, epoch)
        batches = started["batches"]
        stream = self._reading.epoch(
            started,
            generation,
            epoch,
            cancel=lambda: self._cancel,  # the event made below
            reads=self._reads(epoch),
            workers=self._workers_ if self._separate_workers() else None,
            keep_text=True,  # string and binary columns ship as Arrow: `for_wire` below
            leases=self._leases,
        )
        self._stop_thread()
        with self._cond:
            self._key, self._batches, self._final = (generation, epoch), batches, None
            self._run += 1
            self._ready.clear()
            self._ready_batches.clear()
            self._gauge_depth()
            self._taken.clear()
            self._next_to_read = self._low_water = 0
            self._error = None
            self._cancel = threading.Event()
            self._thread = threading.Thread(
                target=self._read_loop,
                args=(stream, self._cancel, (generation, epoch)),
                daemon=True,
            )
            self._thread.start()
            self._cond.notify_all()  # consumers still waiting on the previous epoch: it ended

    def next(
        self, generation: int, epoch: int, index: int, run: int | None = None, member: Any = None
    ) -> Any:
        """The ObjectRef of block `index` of `epoch` (a list of batches; waits until it is
        read), or None past the end of the epoch, or for a call of an earlier reading of
        it (`run`, as `start` answered, not the current one: a stream `set_epoch` dropped).
        `member`: the group member asking (its world rank)."""
        with self._cond:
            if self._key != (generation, epoch):
                raise StaleClientError(
                    f"batch {index} of (generation, epoch) {(generation, epoch)} requested from a "
                    f"reader at {self._key}: call start() first or take a new iterator"
                )
            self._cond.wait_for(
                lambda: (
                    self._key != (generation, epoch)
                    or run not in (None, self._run)
                    or index in self._ready
                    or self._error is not None
                    or (self._final is not None and index >= self._final)
                )
            )
            if self._key != (generation, epoch) or run not in (None, self._run):
                return None  # the group moved on (another epoch, or this one again): over
            if index not in self._ready:
                if self._error is None:
                    return None
                if isinstance(self._error, TransformError):
                    raise self._error  # names loader, rank, epoch and samples already
                raise same_kind(
                    self._error,
                    f"reader failed at block {index} of epoch {epoch}: {self._error}",
                ) from self._error
            ref = self._ready[index]
            self._taken.setdefault(index, set()).add(member)
            self._drop_taken()
            return ref

    def _drop_taken(self) -> None:
        """Drop the blocks every member took, or closed before taking (under `_cond`)."""
        for index in sorted(self._ready):
            if len(self._taken.get(index, set()) | self._closed) < self._consumers:
                break
            del self._ready[index], self._ready_batches[index]
            self._taken.pop(index, None)
            self._low_water = max(self._low_water, index + 1)
            self._cond.notify_all()
        self._gauge_depth()

    def close_member(self, member: Any) -> bool:
        """A member of the group closed its iterator: the others read on without it (what
        it did not take is not kept for it). Whether it was the last one open: the rank
        then leaves and `stop()` ends the reader."""
        with self._cond:
            self._closed.add(member)
            self._drop_taken()
            return len(self._closed) >= self._consumers

    def watch(self) -> None:
        """Blocks while the reader lives: the coordinator's death watch."""
        self._stopped.wait()

    def stop(self, why: str = "") -> None:
        """End the reader thread and release the watch (graceful leave; `why`: a member
        died, `member_watch`). Consumers waiting for a block, and any `start()` from now
        on (a member at an epoch's end), get a `StaleClientError`."""
        self._stop_thread()
        self._leases.stop()
        left = "its rank left the loader (its iterators were closed): take a new iterator"
        with self._cond:  # (an epoch read to its end stays served to its end)
            self._stop_error = StaleClientError(why or left)
            if self._final is None:
                self._error = self._error or self._stop_error
            self._cond.notify_all()
        self._stopped.set()

    def _reads(self, epoch: int) -> Reads:
        """How `epoch`'s pieces are read, in piece order: by the reader workers
        (`reader_workers` > 1, `reader_threads` threads each), else by reader threads here."""
        if self._settings.reader_workers > 1:
            return worker_reads(self._workers_(), epoch, self._worker_threads())
        return self._reading.thread_reads(epoch)

    def _read_loop(
        self, batches: Iterator[Any], cancel: threading.Event, key: tuple[int, int]
    ) -> None:
        """Batches go to the object store as `Block`s (one `ray.put` and one fetch per
        block, not per batch): a block closes at `block_batches` batches or `object_bytes`
        bytes, whichever comes first. Index `i` of `next()` is block `i`."""
        settings = self._settings
        per_object = settings.block_batches
        ahead = settings.blocks_ahead  # the read-ahead budget, in whole blocks
        block: list[Tagged] = []
        block_bytes = 0
        try:
            for batch in itertools.chain(batches, [FLUSH]):
                if batch is not FLUSH:
                    block.append(tag_batch(for_wire(batch)))
                    block_bytes += shipped_bytes(block[-1].batch, block[-1].tag.nbytes)
                full = len(block) >= per_object or block_bytes >= settings.object_bytes
                if not block or (batch is not FLUSH and not full):
                    continue
                with self._cond:
                    self._cond.wait_for(
                        lambda: cancel.is_set() or self._next_to_read - self._low_water < ahead
                    )
                    if cancel.is_set():
                        return
                    index = self._next_to_read
                ref = ray.put(Block.of(key, index, block))
                count, block, block_bytes = len(block), [], 0
                with self._cond:
                    self._ready[index] = ref
                    self._ready_batches[index] = count
                    self._next_to_read += 1
                    self._gauge_depth()
                    self._cond.notify_all()
            with self._cond:
                self._final = self._next_to_read
                self._cond.notify_all()
        except BaseException as error:  # noqa: BLE001 - reported to every consumer
            if cancel.is_set():  # an epoch left behind (its thread outlived the join):
                return  # its error (a late lease call refused, say) is not the new one's
            trace = traceback.format_exc()
            if isinstance(error, StaleClientError):  # the coordinator refused: no Ray trace
                error = unwrap_task_error(error, "coordinator")
            error = coordinator_gone(error, self._coordinator, "the reader") or error
            with self._cond:
                # A rayshard error (`DataError`: unreadable data; the coordinator's death)
                # keeps its type, the reader thread's traceback in the message. A
                # transform's names loader, rank, epoch and samples, with its traceback.
                if isinstance(error, TransformError):
                    self._error = error
                else:
                    kind = error if isinstance(error, RayshardError) else RayshardError(repr(error))
                    self._error = same_kind(kind, f"{kind}\n--- reader traceback ---\n{trace}")
                self._cond.notify_all()

    def _separate_workers(self) -> bool:
        """Whether the transform runs in worker processes rather than in this reader."""
        settings = self._settings
        return settings.worker_count > 1 or settings.transform_resources is not None

    def _workers_(self) -> list:
        """The reader workers, started on first use; they live as long as the reader."""
        if self._workers is None:
            settings = self._settings
            threads = self._worker_threads() if settings.reader_workers > 1 else 1
            parts = (self._source, self._transform, self._loader_name, settings.plan.seed)
            resources = settings.transform_resources
            self._workers = start_workers(
                settings.worker_count, *parts, self._dp_rank, resources=resources, threads=threads
            )
        return self._workers

    def _worker_threads(self) -> int:
        """Reading threads per reader worker: as configured, or by `reading_threads`' rule
        for a Ray worker, the CPUs each asks for (`transform_resources`; none: 1)."""
        settings = self._settings
        if settings.reader_threads is not None:
            return settings.reader_threads
        return threads_for_cpus(dict(settings.transform_resources or ()).get("CPU", 0))

    def _stop_thread(self) -> None:
        thread = self._thread
        if thread is not None:
            self._cancel.set()
            with self._cond:
                self._cond.notify_all()
            thread.join(timeout=30)
