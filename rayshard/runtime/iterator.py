"""The per-worker iterator a training loop holds.

`len()` is exact; iterating yields an epoch, iterating again the next. `state_dict()`
records what this loop *received*, loader-wide: once every rank received as many batches,
any rank's `state_dict()` is a complete checkpoint, on any world size."""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Iterator
from typing import Any

import ray

from rayshard.config.checks import check_int
from rayshard.data.formats import FORMATS
from rayshard.errors import coordinator_gone, epoch_broken, iterator_closed, unwrap_task_error
from rayshard.plan import DataParallelRank
from rayshard.runtime import generations
from rayshard.runtime.acks import AckSender
from rayshard.runtime.block import BatchMeta
from rayshard.runtime.delivery import Delivery, deliver
from rayshard.runtime.fetch import fetch_batches
from rayshard.runtime.holds import Holds


class ShardIterator:
    """One worker's view of a loader (made by `Loader.iterator()`)."""

    def __init__(
        self,
        coordinator: Any,
        registration: dict,
        placement: DataParallelRank,
        delivery: Delivery,
        *,
        blocks_ahead: int = 1,
        ack_interval_s: float = 0.1,
        local_reads: Any = None,
    ) -> None:
        # `delivery`'s arguments were checked by `Loader.iterator` before the rank registered
        self._delivery = delivery
        self._coordinator = coordinator
        self._generation = registration["generation"]
        self._holds = Holds(self, coordinator, registration, placement, local_reads)
        self._placement = placement
        self._loader_key = generations.key_of(coordinator)
        generations.note(*self._registered())
        self._local = local_reads  # a `LocalReads`: this worker reads for itself
        self._blocks_ahead, self._arrow = blocks_ahead, delivery.batch_format == "arrow"
        self._feed: Any = None  # the DeviceFeed of the current epoch (torch format)
        self._stream: Iterator[Any] = iter(())
        self._epoch = int(registration.get("epoch", 0))  # where this rank is
        self._started = False  # whether `_epoch` has begun on this worker
        self._ended = False  # whether this worker received all of `_epoch`
        self._received = 0  # batches of `_epoch` this loop received
        self._length = 0  # batches the started epoch yields (see `_begin`)
        self._exact = True  # whether `_length` is final (static; dynamic with equal steps)
        self._dynamic = bool(registration.get("dynamic", False))
        self._dynamic_steps_checked: int | None = None  # epoch whose step count was re-read
        self._next_length: tuple | None = None  # ((generation, epoch), batches) for len()
        self._iterations = 0  # calls of iter(): a generator of an older call yields nothing
        self._failure: BaseException | None = None  # what ended the current epoch's stream
        self._held: Any = None  # a batch received, not yielded yet (an interrupt came first)
        self._carried: Any = None  # `_held` across a `set_epoch` restart (see `set_epoch`)
        self._closed = False  # `close()` was called: iterating raises
        self._restored_at: int | None = None  # the generation its last restore answered
        self._restarts = 0  # epochs `set_epoch` started again from the middle (for the reader)
        self.samples_received, self.stall_seconds = 0, 0.0
        self.loader_id = name = registration.get("loader", "")  # `name:fingerprint`
        rank, interval = placement.dp_rank, ack_interval_s
        self._acks = AckSender(coordinator, self._generation, rank, interval, loader_name=name)
        weakref.finalize(self, self._acks.end_soon).atexit = False  # dropped: thread ends

    @property
    def epoch(self) -> int:
        """The epoch the current (or, once it is finished, the next) iteration reads."""
        return self._epoch + 1 if self._started and self._ended else self._epoch

    @property
    def placement(self) -> DataParallelRank:
        """World rank, data-parallel rank and model-parallel group of this worker."""
        return self._placement

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration read `epoch` from its start (`dynamic`, mid-epoch: the
        rest, led by a batch an interrupt held back: acknowledged, so in no one's rest)."""
        check_int(epoch, "epoch", minimum=0, error=ValueError)
        restart = epoch == self._epoch and self._started and not self._ended
        self._restarts += restart
        kept = self._carried if epoch == self._epoch and not self._started else None  # (again)
        self._carried = (self._held if self._dynamic else None) if restart else kept
        self._epoch, self._received, self._started, self._failure = epoch, 0, False, None
        self._held = None
        self._iterations += 1  # a generator of an earlier iter() yields nothing more

    def __len__(self) -> int:
        """The batches the current iteration still yields (the next one's, once the current
        epoch is done). Exact for static policies; under `dynamic` exact with equal steps
        and no churn, otherwise the coordinator's current estimate. Asked often by
        frameworks: answered from a cache per (generation, epoch), no remote call."""
        if self._started and not self._ended:
            return max(self._length - self._received, 0) + (self._held is not None)
        key = (self._generation, self.epoch)
        if self._next_length is None or self._next_length[0] != key:
            self._next_length = (key, self._current_length(key[1]))
        return self._next_length[1] + (self._carried is not None)

    def __iter__(self) -> Iterator[Any]:
        """Yield the rest of the current epoch, or the next epoch if this one is done.

        The epoch is decided here (`len()` and `epoch` right after describe exactly what
        this iteration yields). An epoch is done once its last batch was yielded (a loop
        that stops at `len()`, as Lightning's does, gets the next epoch from its next
        `iter()`). Breaking out and iterating again continues the same epoch: batches
        requested or prefetched are kept, not lost. After `close()` it raises."""
        if self._closed:
            raise iterator_closed(self._where())
        if self._failure is not None and not self._ended:
            raise epoch_broken(self._failure, self._epoch, self._received, self._length)
        if self._held is None and (not self._started or self._ended):  # (moves on once begun)
            self._begin(self._epoch + 1 if self._started else self._epoch)
        self._iterations += 1
        return self._yield(self._epoch, self._iterations)

    def _yield(self, epoch: int, iteration: int) -> Iterator[Any]:
        while iteration == self._iterations:
            if self._closed:  # (closed between two batches)
                raise iterator_closed(self._where())
            if self._held is None and not self._receive(epoch):
                return
            # An interrupt or error from here on keeps the batch for the next `iter()`.
            if self._received >= self._length and self._length_final():
                self._end_epoch()  # before the yield: the caller may never ask again
            else:
                self._ended = False  # work returned by a lost rank, past the planned end
            batch, self._held = self._held, None
            yield batch

    def _receive(self, epoch: int) -> bool:
        """Take the stream's next batch into `_held` and acknowledge it; False at its end."""
        reason = generations.superseded(*self._registered())
        if reason is not None:  # nothing taken from the stream: nothing lost
            raise generations.stale_error(self._where(), self._generation, reason)
        waited = time.perf_counter()
        try:
            meta, batch = next(self._stream)
        except StopIteration:
            if self._closed:  # by another thread while this loop waited
                raise iterator_closed(self._where()) from None
            self._end_epoch()
            return False
        except BaseException as error:  # the stream is dead: the epoch did not end with it
            if isinstance(error, Exception) or not getattr(self._stream, "resumable", False):
                self._failure = error  # (an interrupt: only a `resumable` stream goes on)
            raise
        self._received, self._held = self._received + 1, batch
        self._acknowledge(epoch, meta, time.perf_counter() - waited)
        return True

    def _length_final(self) -> bool:
        """Whether the batch just received is the epoch's last, not asking the stream."""
        if not self._exact:
            return False
        if self._dynamic_steps_checked != self._epoch:
            # Under `dynamic` a lost rank's work can grow this rank's step count.
            self._length = max(self._length, self._current_length(self._epoch))
            self._dynamic_steps_checked = self._epoch  # (once answered: an interrupt asks again)
        return self._received >= self._length

    def _current_length(self, epoch: int) -> int:
        length = self._coordinator.length.remote(self._generation, self._placement.dp_rank, epoch)
        with self._coordinator_calls():
            return ray.get(length)

    def _end_epoch(self) -> None:
        """Ended once the coordinator has every batch's acknowledgement (an interrupt in
        the wait leaves the epoch to end again)."""
        with self._coordinator_calls():
            self._acks.flush(wait=True)
        self._ended = True

    @contextlib.contextmanager
    def _coordinator_calls(self) -> Iterator[None]:
        """Ray's `ActorDiedError` of the coordinator raised as `coordinator_gone` says."""
        try:
            yield
        except ray.exceptions.ActorDiedError as error:
            gone = coordinator_gone(error, self._coordinator, self._where())
            if gone is None:
                raise
            raise gone from error

    def stats(self) -> dict:
        """This worker's counters, with the device feed's memory statistics (torch format)."""
        out = {
            "epoch": self._epoch,
            "batches_received": self._received,
            **{"samples_received": self.samples_received, "stall_seconds": self.stall_seconds},
            "ack_interval_asked_s": self._acks.asked_s,  # 0 until the coordinator answered
            "length_exact": self._exact,  # whether `len()` of the started epoch is final
        }
        return out | ({"feed": self._feed.stats().as_dict()} if self._feed is not None else {})

    def state_dict(self) -> dict:
        """JSON-safe loader-wide state as of the batches received (see module docstring)."""
        with self._coordinator_calls():
            self._acks.flush(wait=True)
            state = self._coordinator.state
            return ray.get(state.remote(self._generation, self._epoch, self._received))

    def load_state_dict(self, state: dict) -> None:
        """Resume where `state` was saved: the next iteration yields the rest of its epoch."""
        # Recorded first: none goes out under the new generation (they would count as
        # consumed after the restore), and a rank that read since its last load rewinds.
        self._acks.flush(wait=True)
        try:
            rank = self._placement.dp_rank
            restored = self._coordinator.restore.remote(state, self._restored_at, rank)
            epoch, self._generation = ray.get(restored)
        except ray.exceptions.RayTaskError as error:  # a refused state: its own error
            raise unwrap_task_error(error, f"{self._where()}, load_state_dict") from None
        self._acks.generation = self._restored_at = self._generation
        generations.note(*self._registered())
        self.set_epoch(epoch)
        self._carried = None  # the state says what is read next

    def close(self) -> None:
        """Leave the loader: stop the device feed and the reader; under `dynamic` the rank's
        unfinished leases go back to the queue for the others (once its group's last member
        closed). A no-op after `Loader.shutdown()` or `ray.shutdown()`."""
        self._closed = True
        if self._local is not None:  # first: a feed thread waiting for a batch is let go
            self._local.abandon()
        self._close_feed()
        if self._local is not None:
            self._local.close()
        try:
            self._acks.stop()
        except ray.exceptions.RayActorError:
            pass  # the loader was shut down: coordinator and readers are gone
        finally:
            self._holds.close(self._generation)

    def _registered(self) -> tuple[str, int, int, str]:
        return self._loader_key, self._generation, self._placement.dp_rank, self._holds.reader_name

    def _where(self) -> str:
        return f"loader {self.loader_id!r}, data-parallel rank {self._placement.dp_rank}"

    def _begin(self, epoch: int) -> None:
        """Start `epoch` here; the iterator moves to it only once it started (an error or
        an interrupt before leaves it where it was, so the next `iter()` starts it again)."""
        where = self._where()
        try:  # the coordinator plans the epoch here (under packing it reads token counts)
            self._acks.flush(wait=True)  # (a restart takes back what is not acknowledged)
            self._holds.settle()  # the attaches answered (see `watch_rank`)
            if self._local is not None:
                started = self._local.start(self._generation, epoch, self._arrow, self._acks)
            else:
                call = self._holds.reader.start.remote(self._generation, epoch, self._restarts)
                started = ray.get(call)
        except ray.exceptions.RayTaskError as error:
            raise unwrap_task_error(error, f"{where}, epoch {epoch}") from error
        self._close_feed()  # after the reader moved on: a staging thread waiting is released
        # Under `dynamic` a waiting rank sends its acknowledgements at once (reading here:
        # once its leases ended): at an epoch's end the other ranks wait for exactly those.
        flush = self._acks.flush if self._dynamic else (lambda: None)  # static: sends nothing
        if self._local is not None:
            flush = self._local.when_awaited(flush)
            raw = self._local.batches(epoch, flush=flush, where=where)
        else:
            raw = fetch_batches(
                self._holds.reader,
                self._generation,
                epoch,
                flush=flush,
                where=where,
                blocks_ahead=self._blocks_ahead,
                arrow=self._arrow,
                run=started.get("run"),  # (its block calls: of this reading, none older)
                member=self._placement.world_rank,
            )
        self._stream, self._feed = deliver(raw, self._delivery, flush)
        self._epoch, self._received = epoch, 0
        self._length, self._exact = started["batches"], started["exact"]
        self._dynamic_steps_checked = None if self._dynamic else epoch
        self._started, self._ended, self._failure = True, False, None
        self._held, self._carried = self._carried, None

    def _close_feed(self) -> None:
        if self._feed is not None:
            self._feed.close()
            self._feed = None

    def _acknowledge(self, epoch: int, meta: BatchMeta, stall: float) -> None:
        """Record a received batch, acknowledged in groups (`rayshard.runtime.acks`)."""
        self.samples_received += meta.real
        self.stall_seconds += stall
        received = (self._received, meta.runs, meta.real, meta.nbytes, stall, meta.partial)
        self._acks.add(epoch, *received)


__all__ = ["FORMATS", "ShardIterator"]
