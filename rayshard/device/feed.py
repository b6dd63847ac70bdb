"""`DeviceFeed`: keep `prefetch_depth` batches already on the device, ahead of the model.

A background thread reads host batches (dicts of numpy arrays or tensors), applies
`collate_fn`, packs each batch into one staging buffer and copies it to the device. On CUDA
the buffer is page-locked and comes from a `HostBufferPool`, the copy is non-blocking on a
dedicated stream and an event marks its end; the consumer's stream waits on that event and
`record_stream` keeps the caching allocator from reusing the memory while the consumer's
kernels still read it. A staging buffer goes back to the pool only once its copy event has
completed. Packing uses torch's multi-threaded `copy_` from tensors viewing the host arrays.
On the CPU the same thread and bounded channel run with no staging buffer at all: each
column is handed out as a tensor viewing the host array's memory (under the loader, the
decoded Arrow columns or the object store's), not a copy; do not modify such tensors in
place (`clone()` first).

`batches_delivered` counts batches the consumer received, never those waiting in the
channel, so an iterator's `state_dict()` can resume exactly after them.
"""

from __future__ import annotations

import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from rayshard.config.checks import check_int
from rayshard.data.batching import Tagged
from rayshard.device import _producer
from rayshard.device._channel import CLOSED, EMPTY, Channel
from rayshard.device._stager import Stager
from rayshard.device.pinned_pool import HostBufferPool
from rayshard.errors import ConfigError

Batch = Mapping[str, Any]
CollateFn = Callable[[Any], Batch]


@dataclass(frozen=True)
class FeedStats:
    """What a feed has done so far; `as_dict()` is JSON-safe."""

    device: str
    batches_delivered: int
    stall_seconds: float
    largest_batch_bytes: int
    max_bytes_per_sample: int
    pinned: bool
    pool_bytes: int
    num_buffers: int
    reallocations: int
    # The staging thread's time waiting for the source, packing and starting copies (of
    # which `copy_seconds` in CUDA calls), and blocked handing batches over (see
    # `rayshard.device._producer`).
    source_seconds: float = 0.0
    stage_seconds: float = 0.0
    copy_seconds: float = 0.0
    handover_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_device() -> torch.device:
    """The Ray Train worker's device when running inside Ray, else the CPU. A Ray Train
    worker has imported `ray.train`; elsewhere importing it would cost about 0.9 CPU-s
    (and pandas) on the way to the first batch, to learn it is not one."""
    import sys

    if "ray.train" in sys.modules:
        import ray

        if ray.is_initialized():
            try:
                from ray.train.torch import get_device

                return get_device()
            except Exception:  # not in a Ray Train worker, or no devices assigned
                pass
    return torch.device("cpu")


def check_available(device: torch.device) -> None:
    """A CUDA `device` where CUDA is not available, or whose index this process does not
    see, or another device type this torch build or machine lacks (`mps`, `xpu`), is a
    `ConfigError`. This check initialises the CUDA driver (`cuInit`, no
    context; not with `PYTORCH_NVML_BASED_CUDA_CHECK=1`), so do it after forking workers,
    not before."""
    if device.type in ("cpu", "meta"):
        return
    if device.type != "cuda":  # mps, xpu, ...: its torch module says, else a tensor there
        backend = getattr(getattr(torch, device.type, None), "is_available", None)
        try:
            available = (
                backend() if callable(backend) else torch.empty(0, device=device) is not None
            )
        except Exception:  # noqa: BLE001 - any failure means the device cannot be used
            available = False
        if not available:
            raise ConfigError(
                f"device={str(device)!r} is not available to this torch build or process: "
                "pass device='cpu', 'cuda', or leave device unset"
            )
        return
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device={str(device)!r} but CUDA is not available: pass device='cpu' "
            f"or leave device unset"
        )
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ConfigError(
            f"device={str(device)!r} but this process sees {count} CUDA device(s) "
            f"(indices 0-{count - 1}; CUDA_VISIBLE_DEVICES renumbers them): pass one of "
            f"those, or 'cuda' for the current device"
        )


def _resolve_device(device: torch.device | str | None) -> torch.device:
    """The target device with an explicit CUDA index, so device comparisons are exact."""
    resolved = default_device() if device is None else torch.device(device)
    if resolved.type == "cpu":  # ("cpu:0" is the host too: tensors' device is "cpu")
        return torch.device("cpu")
    check_available(resolved)
    if resolved.type != "cuda":
        return resolved
    if resolved.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return resolved


class DeviceFeed(Iterator[dict[str, torch.Tensor]]):
    """Iterate `source`'s batches as dicts of tensors on `device`, `prefetch_depth` ahead.

    Order is preserved; an exception from `source` or `collate_fn` is raised by `next()`
    right after every batch before it has been delivered. The staging thread starts on
    the first `next()` (or `start()`); `close()` (or leaving a `with` block) stops it.
    Staged columns of one batch share one allocation (on the CPU: each column views its
    source array), so keeping one column alive keeps that memory alive. `on_wait` is
    called whenever `next()` has waited `on_wait_after_s` for a batch and goes on
    waiting (the loader sends its pending acknowledgements then). A source item that is a
    `rayshard.data.batching.Tagged(tag, batch)` comes out as `Tagged(tag, staged batch)`: the
    tag travels with its batch through the staging thread.
    """

    resumable = True  # an interrupt (Ctrl-C) in `next()` loses no batch: the next call goes on

    def __init__(
        self,
        source: Iterable[Any],
        *,
        device: torch.device | str | None = None,
        prefetch_depth: int = 2,
        collate_fn: CollateFn | None = None,
        pool: HostBufferPool | None = None,
        bytes_per_sample_hint: int = 0,
        batch_size: int = 0,
        cpus: Iterable[int] | None = None,
        on_wait: Callable[[], None] | None = None,
        on_wait_after_s: float = 0.0,
    ) -> None:
        check_int(
            prefetch_depth,
            "prefetch_depth",
            minimum=1,
            fix="2 is the default; raise it when batch times vary more than two batches can hide",
        )
        self.device = _resolve_device(device)
        self.prefetch_depth = prefetch_depth
        self._source = iter(source)
        self._collate_fn = collate_fn
        self._stager = Stager(self.device, prefetch_depth, pool)
        if self._stager.pool is not None:
            # As many buffers as can be in use at once (see `_stager`), sized from the hint.
            self._stager.pool.presize(bytes_per_sample_hint, batch_size, prefetch_depth + 1)
        self._cpus = None if cpus is None else frozenset(cpus)
        self._on_wait = on_wait  # called when `next()` waited `on_wait_after_s` for a batch
        self._on_wait_after_s = on_wait_after_s
        self._channel = Channel(prefetch_depth)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._finished = False
        self._held: Any = None  # a batch taken from the channel, not yet handed over
        self._error: BaseException | None = None  # the source's failure, taken, not raised
        self._delivered = 0
        self._stall = 0.0
        self._phases = _producer.Phases()
        # The thread holds no reference to the feed, so an abandoned feed is collected
        # and this finalizer stops the thread.
        self._finalizer = weakref.finalize(self, _producer.shutdown, self._stop, self._channel)

    @property
    def batches_delivered(self) -> int:
        """Batches `next()` has returned to the consumer (prefetched ones not counted)."""
        return self._delivered

    def start(self) -> DeviceFeed:
        """Start staging now rather than at the first `next()` (to warm the queue up)."""
        if self._thread is None and not self._finished:
            self._thread = threading.Thread(
                target=_producer.produce,
                args=(
                    self._source,
                    self._collate_fn,
                    self._stager,
                    self._channel,
                    self._stop,
                    self._phases,
                ),
                kwargs={"cpus": self._cpus},
                name="rayshard-device-feed",
                daemon=True,
            )
            _producer.LIVE[self._thread] = (self._stop, self._channel)
            self._thread.start()
        return self

    def __iter__(self) -> DeviceFeed:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self._finished and self._error is None:
            raise StopIteration
        if self._held is None and self._error is None:  # (else: kept past an interrupt)
            self.start()
            waited_from = time.perf_counter()
            if self._on_wait is None:
                item = self._channel.get()
            else:
                item = self._channel.get(timeout=self._on_wait_after_s)
                if item is EMPTY:
                    self._on_wait()
                    item = self._channel.get()
            self._stall += time.perf_counter() - waited_from
            if item is _producer.END or item is CLOSED:
                self.close()
                raise StopIteration
            if isinstance(item, _producer.Failure):
                self._error = item.error
            else:
                self._held = item
        if self._error is not None:  # raised once, after the thread is stopped
            self.close()
            error, self._error = self._error, None
            if isinstance(error, StopIteration):  # (not the end: a collate_fn's, PEP 479)
                raise RuntimeError(f"staging a batch raised {error!r}") from error
            raise error
        item = self._held
        if isinstance(item, Tagged):  # the source's metadata, handed through with its batch
            out = Tagged(item.tag, self._stager.deliver(item.batch))
        else:
            out = self._stager.deliver(item)
        self._held, self._delivered = None, self._delivered + 1  # (after an interrupt: kept)
        return out

    def close(self, timeout: float = 10.0) -> None:
        """Stop the staging thread and drop prefetched batches; safe to call twice."""
        self._finished = True
        self._finalizer()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                warnings.warn(
                    f"DeviceFeed.close(timeout={timeout}): the staging thread is still inside "
                    f"the source's next(); it exits when that call returns",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def __enter__(self) -> DeviceFeed:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def stats(self) -> FeedStats:
        """Memory statistics, delivered count and total consumer wait (stall) time."""
        pool = self._stager.pool_stats()
        return FeedStats(
            device=str(self.device),
            batches_delivered=self._delivered,
            stall_seconds=self._stall,
            largest_batch_bytes=self._stager.largest_batch_bytes,
            max_bytes_per_sample=self._stager.max_bytes_per_sample,
            pinned=pool.pinned if pool else False,
            pool_bytes=pool.pool_bytes if pool else 0,
            num_buffers=pool.num_buffers if pool else 0,
            reallocations=pool.reallocations if pool else 0,
            source_seconds=self._phases.source,
            stage_seconds=self._phases.stage,
            copy_seconds=self._stager.copy_seconds,
            handover_seconds=self._phases.handover,
        )
