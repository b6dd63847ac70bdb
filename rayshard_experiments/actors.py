"""The experiment's actors: a training-shaped consumer per rank and one recorder."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import numpy as np
import ray


class Recorder:
    """Per-second, per-rank throughput and stall time, events, and the coverage audit."""

    def __init__(self, num_samples: int) -> None:
        self._start = time.time()
        # (time, rank, samples, bytes, stall seconds) per batch, and (time, event): put in
        # seconds of the schedule's clock by `summary`, whenever `mark_start` came
        self._records: list[tuple[float, int, int, int, float]] = []
        self._events: list[tuple[float, dict]] = []
        self._counts: dict[int, np.ndarray] = {}
        self._num_samples = num_samples
        self._finished: set[int] = set()
        self._delivered: set[int] = set()  # ranks that have consumed at least one batch

    def mark_start(self, when: float) -> None:
        """Measure times from `when` (the moment the schedule's clock starts)."""
        self._start = when

    def batches(self, rank: int, records: list[tuple[float, int, int, float]]) -> None:
        """(time, samples, bytes, stall seconds) of batches a rank consumed."""
        for when, samples, nbytes, stall in records:
            self._delivered.add(rank)
            self._records.append((when, rank, samples, nbytes, stall))

    def batch(self, rank: int, epoch: int, ids: Any, record: tuple) -> None:
        """One batch a rank received: its sample ids and (time, samples, bytes, stall)."""
        self.ids(epoch, ids)
        self.batches(rank, [record])

    def ids(self, epoch: int, ids: Any) -> None:
        counts = self._counts.setdefault(epoch, np.zeros(self._num_samples, dtype=np.int32))
        np.add.at(counts, np.asarray(ids, dtype=np.int64), 1)

    def event(self, kind: str, **details: Any) -> None:
        self._events.append((time.time(), {"event": kind, **details}))

    def failures(self) -> list[dict]:
        """The `rank_failed` events: a rank whose loop raised (its error named)."""
        return [event for _, event in self._events if event["event"] == "rank_failed"]

    def delivered(self) -> list[int]:
        """The ranks that have consumed at least one batch."""
        return sorted(self._delivered)

    def finished(self, rank: int) -> None:
        self._finished.add(rank)

    def summary(self) -> dict:
        audit = {
            epoch: {
                "seen": int(c.sum()),
                "lost": int((c == 0).sum()),
                "duplicates": int(np.clip(c - 1, 0, None).sum()),
            }
            for epoch, c in sorted(self._counts.items())
        }
        seconds: dict[tuple[int, int], np.ndarray] = collections.defaultdict(
            lambda: np.zeros(4)  # samples, batches, bytes, stall seconds
        )
        for when, rank, samples, nbytes, stall in self._records:
            seconds[(max(int(when - self._start), 0), rank)] += (samples, 1, nbytes, stall)
        rows = [
            {
                "second": s,
                "rank": r,
                "samples": int(v[0]),
                "batches": int(v[1]),
                "bytes": int(v[2]),
                "stall_s": round(float(v[3]), 4),
            }
            for (s, r), v in sorted(seconds.items())
        ]
        events = [{"t": round(when - self._start, 3), **e} for when, e in self._events]
        return {
            "throughput": rows,
            "events": events,
            "audit": audit,
            "finished": sorted(self._finished),
            "delivered": sorted(self._delivered),
        }


class Consumer:
    """One rank: iterates the loader epoch after epoch with a simulated step time. Every
    batch goes to the recorder as the iterator hands it over (its `collate_fn`), in one
    call carrying its ids (the audit) and its timing, awaited before the loader counts the
    batch received and its acknowledgement can go out: a rank killed at any point has
    reported every batch the coordinator may count as delivered to it."""

    def __init__(self, loader: Any, rank: int, recorder: Any, epochs: int, step_time_s: float):
        self._rank, self._recorder = rank, recorder
        self._epochs, self._step = epochs, step_time_s
        self._asked = time.perf_counter()  # when the loop last asked for a batch
        self._iterator = loader.iterator(
            world_rank=rank, world_size=rank + 1, batch_format="numpy", collate_fn=self._report
        )
        self._leave = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self, first_epoch: int) -> None:
        self._iterator.set_epoch(first_epoch)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def leave(self) -> None:
        """Graceful leave: stop after the current batch and hand back unfinished work."""
        self._leave.set()
        self._done.wait(60)
        self._iterator.close()

    def wait(self) -> bool:
        return self._done.wait(3600)

    def _report(self, batch: dict) -> dict:
        """The iterator's `collate_fn`: the batch's ids and timing to the recorder."""
        stall = time.perf_counter() - self._asked
        real = ~batch["_padded"]
        record = (time.time(), int(real.sum()), sum(v.nbytes for v in batch.values()), stall)
        ray.get(
            self._recorder.batch.remote(
                self._rank, self._iterator.epoch, batch["_index"][real], record
            )
        )
        return batch

    def _loop(self) -> None:
        try:
            while self._iterator.epoch < self._epochs and not self._leave.is_set():
                self._asked = time.perf_counter()
                for _batch in self._iterator:
                    if self._leave.is_set():
                        break
                    time.sleep(self._step)  # the model's step
                    self._asked = time.perf_counter()
            self._recorder.finished.remote(self._rank)
        except Exception as error:  # noqa: BLE001 - the thread's end would hide it
            self._recorder.event.remote("rank_failed", rank=self._rank, error=repr(error)[:2000])
        finally:
            self._done.set()
