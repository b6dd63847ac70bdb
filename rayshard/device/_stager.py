"""Move one host batch to the device: the per-batch work of the feed's staging thread.

CUDA: pack into a pinned pool buffer, one non-blocking copy on a side stream, an event
after it. The buffer waits in `pending` until its event completes and only then returns
to the pool; before a batch is staged at most `prefetch_depth` copies stay pending, so the
pool never holds more than `prefetch_depth + 1` buffers. CPU: no staging buffer and no
copy, each column is a tensor viewing the host array (object-store memory under the
loader; see `_staging.host_tensor`). Other devices: pack into a fresh host buffer, moved
with `.to(device)`.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rayshard.device import _staging
from rayshard.device.pinned_pool import HostBufferPool, PoolStats


@dataclass(frozen=True)
class Staged:
    """A batch on the device and, on CUDA, the event that marks the end of its copy."""

    batch: dict[str, torch.Tensor]
    event: Any | None = None  # torch.cuda.Event


class Stager:
    """Stages batches for one device; `stage` runs on the staging thread, `deliver` on
    the consumer's."""

    def __init__(
        self, device: torch.device, prefetch_depth: int, pool: HostBufferPool | None = None
    ) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        # Only CUDA targets stage through the pool: elsewhere the staging copy is the batch.
        self.pool = (pool or HostBufferPool(pinned=True)) if self.cuda else None
        self._owns_pool = pool is None  # (a pool passed in is the caller's to keep)
        self._ended_stats: PoolStats | None = None
        self.stream = torch.cuda.Stream(device=device) if self.cuda else None
        self._max_pending = prefetch_depth
        self._pending: deque[tuple[Any, torch.Tensor]] = deque()
        self._lock = threading.Lock()  # guards the byte statistics read by the consumer
        self.largest_batch_bytes = 0
        self.max_bytes_per_sample = 0
        self.copy_seconds = 0.0  # in CUDA calls: waiting for old copies, allocating, copying

    def thread_context(self) -> contextlib.AbstractContextManager[Any]:
        """Make the staging thread's current CUDA device the target device."""
        return torch.cuda.device(self.device) if self.cuda else contextlib.nullcontext()

    def stage(self, host: Mapping[str, Any]) -> Staged:
        """Pack `host` into a staging buffer and start its copy to the device."""
        layout = _staging.plan_layout(host, self.device)
        self._record(layout)
        if self.device.type == "cpu":
            return Staged(_staging.host_views(layout))
        if not self.cuda:
            buffer = torch.empty(layout.nbytes, dtype=torch.uint8)
            _staging.fill(buffer, layout)
            moves = _staging.moved(layout, self.device)
            return Staged(_staging.views(buffer.to(self.device), layout, moves))
        began = time.perf_counter()
        self._reclaim(keep=self._max_pending)
        buffer = self.pool.acquire(layout.nbytes, layout.num_samples)
        copying = False
        try:
            filling = time.perf_counter()
            _staging.fill(buffer, layout)
            filled = time.perf_counter()
            with torch.cuda.stream(self.stream):
                # First the tensors moved on their own (a blocking move waits for this
                # stream), then the batch's one copy; the event covers both.
                moves = _staging.moved(layout, self.device)
                on_device = torch.empty(layout.nbytes, dtype=torch.uint8, device=self.device)
                copying = True
                on_device.copy_(buffer[: layout.nbytes], non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.stream)
        except BaseException:
            if not copying:
                self.pool.release(buffer)
            else:  # the queued copy reads the buffer until it ends; if the stream cannot be
                # waited for (a broken context), the buffer never returns to the pool
                with contextlib.suppress(Exception):
                    self.stream.synchronize()
                    self.pool.release(buffer)
            raise
        self._pending.append((event, buffer))
        self.copy_seconds += (filling - began) + (time.perf_counter() - filled)
        return Staged(_staging.views(on_device, layout, moves), event)

    def deliver(self, staged: Staged) -> dict[str, torch.Tensor]:
        """Make the consumer's current stream wait for the copy and own the memory."""
        if staged.event is not None:
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_event(staged.event)
            batch = staged.batch  # a dict, or the tuple or list a `collate_fn` made
            for value in batch.values() if isinstance(batch, Mapping) else batch:
                for tensor in _device_memory(value, self.device):
                    tensor.record_stream(consumer)
        return staged.batch

    def drain(self) -> None:
        """Wait for every pending copy and return its buffer (the thread is ending); a pool
        of the stager's own is emptied, so its pinned blocks go back to torch's host cache
        for the next feed (an epoch's) rather than staying locked until this one is freed."""
        if self.pool is None:
            return
        self._reclaim(keep=0)
        if self._owns_pool:
            self._ended_stats = self.pool.stats()
            self.pool.clear()

    def pool_stats(self) -> PoolStats | None:
        """The pool's statistics (once the feed ended, as they were then)."""
        if self.pool is None:
            return None
        return self._ended_stats or self.pool.stats()

    def _reclaim(self, keep: int) -> None:
        """Release buffers whose copy finished; block on the oldest beyond `keep` pending."""
        while self._pending:
            event, buffer = self._pending[0]
            if len(self._pending) > keep:
                event.synchronize()
            elif not event.query():
                break
            self._pending.popleft()
            self.pool.release(buffer)

    def _record(self, layout: _staging.Layout) -> None:
        with self._lock:
            self.largest_batch_bytes = max(self.largest_batch_bytes, layout.nbytes)
            if layout.num_samples:
                per_sample = math.ceil(layout.nbytes / layout.num_samples)
                self.max_bytes_per_sample = max(self.max_bytes_per_sample, per_sample)


def _device_memory(value: Any, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Plain tensors holding `value`'s memory on `device`, for `record_stream` (which older
    torch takes for plain tensors only): itself; a jagged tensor's values, offsets and
    lengths; one part of a strided nested tensor (its parts view one buffer); each of a list
    of per-row tensors."""
    if isinstance(value, list):
        return tuple(tensor for item in value for tensor in _device_memory(item, device))
    if not isinstance(value, torch.Tensor) or value.device != device:
        return ()
    if not value.is_nested:
        return (value,)
    if value.layout == torch.jagged:
        parts = (value.values(), value.offsets(), value.lengths())
        return tuple(part for part in parts if part is not None)
    return (value.select(0, 0),) if value.size(0) else ()
