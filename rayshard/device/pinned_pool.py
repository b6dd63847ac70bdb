"""A pool of reusable host staging buffers, page-locked when CUDA is present.

Allocating and freeing page-locked memory synchronises the device, so (as in DALI) pinned
buffers are kept and only ever grow: a request larger than every free buffer reallocates
one, over-allocating by `growth_factor`. A pinned buffer is rounded up to a power of two,
the block torch's caching host allocator page-locks for it anyway, so `pool_bytes` is the
memory the pool's buffers really lock and all of it is usable. Ordinary host memory is
cheap to allocate, so a non-pinned buffer shrinks to the request when the request is below
`shrink_threshold` times its size (0 never shrinks, 1 always does). Statistics record the
largest batch and the largest bytes-per-sample seen, which is the number to pass back as
`bytes_per_sample_hint` so the next run presizes and never reallocates.
"""

from __future__ import annotations

import math
import threading
import warnings
from dataclasses import dataclass

import torch

from rayshard.config.checks import check_int
from rayshard.device import env


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool's memory use, JSON-safe via `dataclasses.asdict`."""

    pinned: bool
    num_buffers: int
    in_use: int
    pool_bytes: int
    largest_batch_bytes: int
    max_bytes_per_sample: int
    allocations: int
    reallocations: int


class HostBufferPool:
    """Reusable flat `uint8` host tensors: `acquire(nbytes)` one, `release(buffer)` it back.

    A buffer's capacity is its `numel()`; callers carve typed views out of it. Thread-safe:
    a staging thread acquires and releases while the consumer reads `stats()`.
    """

    def __init__(
        self,
        *,
        pinned: bool | None = None,
        growth_factor: float | None = None,
        shrink_threshold: float | None = None,
    ) -> None:
        self.pinned = _resolve_pinned(pinned)
        self.growth_factor = (
            env.host_growth_factor()
            if growth_factor is None
            else env.check_growth_factor(growth_factor, "growth_factor")
        )
        self.shrink_threshold = (
            env.host_shrink_threshold()
            if shrink_threshold is None
            else env.check_shrink_threshold(shrink_threshold, "shrink_threshold")
        )
        self._lock = threading.Lock()
        self._free: list[torch.Tensor] = []
        self._in_use: dict[int, torch.Tensor] = {}
        self._largest_batch = 0
        self._max_per_sample = 0
        self._allocations = 0
        self._reallocations = 0

    def presize(self, bytes_per_sample_hint: int, batch_size: int, count: int = 1) -> None:
        """Make sure `count` free buffers hold `bytes_per_sample_hint * batch_size` bytes."""
        for name, value in (
            ("bytes_per_sample_hint", bytes_per_sample_hint),
            ("batch_size", batch_size),
            ("count", count),
        ):
            check_int(value, name, minimum=0)
        nbytes = bytes_per_sample_hint * batch_size
        if nbytes == 0 or count == 0:
            return
        with self._lock:
            self._free.sort(key=_capacity, reverse=True)
            for index in range(count):
                if index < len(self._free):
                    if _capacity(self._free[index]) < nbytes:
                        self._free[index] = self._allocate(nbytes)
                        self._reallocations += 1
                else:
                    self._free.append(self._allocate(nbytes))
                    self._allocations += 1

    def acquire(self, nbytes: int, num_samples: int | None = None) -> torch.Tensor:
        """A free buffer of at least `nbytes` (best fit), grown or shrunk by the pool's rules."""
        check_int(nbytes, "nbytes", minimum=0, error=ValueError)
        with self._lock:
            self._largest_batch = max(self._largest_batch, nbytes)
            if num_samples:
                self._max_per_sample = max(self._max_per_sample, math.ceil(nbytes / num_samples))
            buffer = self._take(nbytes)
            self._in_use[id(buffer)] = buffer
            return buffer

    def release(self, buffer: torch.Tensor) -> None:
        """Give back a buffer from `acquire`; releasing a foreign or free buffer is an error."""
        with self._lock:
            if self._in_use.pop(id(buffer), None) is None:
                raise ValueError(
                    "release() got a buffer this pool did not hand out or that was already "
                    "released: release each acquired buffer exactly once"
                )
            self._free.append(buffer)

    def clear(self) -> None:
        """Drop every free buffer (buffers still in use stay accounted until released)."""
        with self._lock:
            self._free.clear()

    def stats(self) -> PoolStats:
        """Current memory statistics of the pool."""
        with self._lock:
            buffers = [*self._free, *self._in_use.values()]
            return PoolStats(
                pinned=self.pinned,
                num_buffers=len(buffers),
                in_use=len(self._in_use),
                pool_bytes=sum(_capacity(b) for b in buffers),
                largest_batch_bytes=self._largest_batch,
                max_bytes_per_sample=self._max_per_sample,
                allocations=self._allocations,
                reallocations=self._reallocations,
            )

    def _take(self, nbytes: int) -> torch.Tensor:
        fitting = [b for b in self._free if _capacity(b) >= nbytes]
        if fitting:
            buffer = min(fitting, key=_capacity)
            self._remove_free(buffer)
            if not self.pinned and nbytes < self.shrink_threshold * _capacity(buffer):
                self._reallocations += 1
                return self._allocate(nbytes)
            return buffer
        grown = max(nbytes, math.ceil(nbytes * self.growth_factor))
        if self._free:
            # Grow the largest free buffer rather than adding one: the pool stays as small
            # as the number of buffers in flight.
            self._remove_free(max(self._free, key=_capacity))
            self._reallocations += 1
        else:
            self._allocations += 1
        return self._allocate(grown)

    def _remove_free(self, buffer: torch.Tensor) -> None:
        for index, candidate in enumerate(self._free):
            if candidate is buffer:
                del self._free[index]
                return

    def _allocate(self, nbytes: int) -> torch.Tensor:
        if self.pinned:  # torch page-locks the next power of two anyway: use all of it
            nbytes = _power_of_two_ceil(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pinned)


def _capacity(buffer: torch.Tensor) -> int:
    return buffer.numel()


def _power_of_two_ceil(nbytes: int) -> int:
    """The smallest power of two >= `nbytes` (0 stays 0): the block torch's caching host
    allocator page-locks for a pinned request of `nbytes`."""
    return 1 << (nbytes - 1).bit_length() if nbytes > 1 else nbytes


_warned_no_pinning = False


def _resolve_pinned(pinned: bool | None) -> bool:
    """Pin when asked and possible; on CPU-only torch fall back to ordinary memory (warn once)."""
    global _warned_no_pinning
    available = torch.cuda.is_available()
    if pinned is None:
        return available
    if pinned and not available:
        if not _warned_no_pinning:
            _warned_no_pinning = True
            warnings.warn(
                "pinned=True but CUDA is not available: staging buffers use ordinary host "
                "memory (page-locking only helps copies to a GPU)",
                RuntimeWarning,
                stacklevel=3,
            )
        return False
    return bool(pinned)
