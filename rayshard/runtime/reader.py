"""The shard reader: one Ray actor per data-parallel rank, placed on its worker's node.

It owns the rank's shard state (generation, epoch, cursor), reads and batches in its own
process on a background thread, and keeps `prefetch_depth` batches ready in the object
store. Every member of the rank's model-parallel group fetches the same batches, which
are read once and dropped when the last member took them.

A threaded actor (`max_concurrency` = 4 + consumers): consumers block in `next()` while the
reader thread works. `_cond` guards every field below it.
"""

from __future__ import annotations

import itertools
import threading
import traceback
from typing import Any

import ray

from rayshard.batching import iter_padding, iter_rows, reading_pieces, rebatch
from rayshard.errors import RayshardError, StaleClientError
from rayshard.plan import RankPlan
from rayshard.settings import LoaderSettings
from rayshard.shuffle import shuffle_batches
from rayshard.sources import Source


class ShardReader:
    """Reads one data-parallel rank's plan into batches in the object store."""

    def __init__(
        self,
        coordinator: Any,
        source: Source,
        settings: LoaderSettings,
        dp_rank: int,
        consumers: int,
    ) -> None:
        self._coordinator = coordinator
        self._source = source
        self._settings = settings
        self._dp_rank = dp_rank
        self._consumers = consumers
        self._splits = source.splits()
        self._cond = threading.Condition()
        self._key: tuple[int, int] | None = None  # (generation, epoch) being read
        self._plan: RankPlan | None = None
        self._ready: dict[int, Any] = {}  # batch index -> ObjectRef
        self._taken: dict[int, int] = {}  # batch index -> consumers that fetched it
        self._next_to_read = 0
        self._low_water = 0  # lowest index some consumer still needs
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()

    def start(self, generation: int, epoch: int) -> dict:
        """Begin (or join) reading `epoch`; idempotent for the members of one group."""
        with self._cond:
            if self._key == (generation, epoch):
                return {"batches": self._plan.batches, "samples": self._plan.samples}
            if self._key is not None and (generation, epoch) < self._key:
                raise StaleClientError(
                    f"reader of rank {self._dp_rank} is at (generation, epoch) {self._key}; "
                    f"a client asked for {(generation, epoch)}: take a new iterator"
                )
        plan = ray.get(self._coordinator.rank_plan.remote(generation, self._dp_rank, epoch))
        self._stop_thread()
        with self._cond:
            self._key, self._plan = (generation, epoch), plan
            self._ready.clear()
            self._taken.clear()
            self._next_to_read = self._low_water = 0
            self._error = None
            self._cancel = threading.Event()
            self._thread = threading.Thread(
                target=self._read_loop, args=(plan, epoch, self._cancel), daemon=True
            )
            self._thread.start()
        return {"batches": plan.batches, "samples": plan.samples}

    def next(self, generation: int, epoch: int, index: int) -> Any:
        """The ObjectRef of batch `index` of `epoch` (waits until it is read)."""
        with self._cond:
            if self._key != (generation, epoch):
                raise StaleClientError(
                    f"batch {index} of (generation, epoch) {(generation, epoch)} requested from a "
                    f"reader at {self._key}: call start() first or take a new iterator"
                )
            self._cond.wait_for(lambda: index in self._ready or self._error is not None)
            if index not in self._ready:
                raise RayshardError(
                    f"reader of data-parallel rank {self._dp_rank} failed at batch {index} of "
                    f"epoch {epoch}: {self._error}"
                ) from self._error
            ref = self._ready[index]
            self._taken[index] = self._taken.get(index, 0) + 1
            if self._taken[index] >= self._consumers:
                del self._ready[index], self._taken[index]
                self._low_water = max(self._low_water, index + 1)
                self._cond.notify_all()
            return ref

    def _read_loop(self, plan: RankPlan, epoch: int, cancel: threading.Event) -> None:
        settings = self._settings
        key = f"rayshard:{settings.plan.seed}:{epoch}:{plan.rank}"
        try:
            pieces = reading_pieces(
                plan.ranges, self._splits, shuffle=settings.shuffle, rng_key=key
            )
            real = iter_rows(self._source, pieces, settings.columns)
            if settings.shuffle_buffer:
                real = shuffle_batches(
                    real, settings.shuffle_buffer, settings.plan.seed, epoch, plan.rank
                )
            rows = itertools.chain(real, iter_padding(self._source, plan, settings.columns))
            for batch in rebatch(rows, settings.plan.batch_size):
                with self._cond:
                    self._cond.wait_for(
                        lambda: (
                            cancel.is_set()
                            or self._next_to_read - self._low_water < settings.prefetch_depth
                        )
                    )
                    if cancel.is_set():
                        return
                ref = ray.put(batch)
                with self._cond:
                    self._ready[self._next_to_read] = ref
                    self._next_to_read += 1
                    self._cond.notify_all()
        except BaseException as error:  # noqa: BLE001 - reported to every consumer
            with self._cond:
                self._error = RayshardError(f"{error!r}\n{traceback.format_exc()}")
                self._cond.notify_all()

    def _stop_thread(self) -> None:
        thread = self._thread
        if thread is not None:
            self._cancel.set()
            with self._cond:
                self._cond.notify_all()
            thread.join(timeout=30)
