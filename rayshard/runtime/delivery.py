"""How fetched batches reach the training loop: converted to the iterator's format, and
under the torch format staged by a `DeviceFeed` (pinned host memory, the copy to the
device on a stream of its own), which waits with `flush` as it waits for data."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rayshard.data.batching import Tagged
from rayshard.data.formats import convert_batch, torch_host_batch
from rayshard.runtime.fetch import STALL_FLUSH_S


def deliver(
    raw: Iterable[Tagged],
    fmt: str,
    *,
    nested: tuple[str, ...],
    collate_fn: Any,
    device: Any,
    prefetch_depth: int,
    flush: Callable[[], None],
) -> tuple[Iterator[Tagged], Any]:
    """The stream of tagged batches in `fmt`, and the `DeviceFeed` behind it (torch format;
    else None)."""
    if fmt == "torch":
        from rayshard.device import DeviceFeed

        feed = DeviceFeed(
            (Tagged(meta, torch_host_batch(batch, nested)) for meta, batch in raw),
            device=device,
            prefetch_depth=prefetch_depth,
            collate_fn=collate_fn,
            on_wait=flush,
            on_wait_after_s=STALL_FLUSH_S,
        )
        return feed, feed
    stream = (Tagged(meta, convert_batch(batch, fmt, nested, collate_fn)) for meta, batch in raw)
    return stream, None


__all__ = ["deliver"]
