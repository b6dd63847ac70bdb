"""How fetched batches reach the training loop: converted to the iterator's format, and
under the torch format staged by a `DeviceFeed` (pinned host memory, the copy to the
device on a stream of its own), which waits with `flush` as it waits for data."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from rayshard.data.batching import Tagged
from rayshard.data.formats import convert_batch, torch_host_batch
from rayshard.runtime.fetch import STALL_FLUSH_S


@dataclasses.dataclass(frozen=True)
class Delivery:
    """How an iterator hands its batches over (`Loader.iterator`'s arguments, checked):
    the format, jagged `nested` columns, `collate_fn`, the torch `device`, the batches
    staged ahead, and `arrow_types`: the source's type of each column the arrow format
    builds from Python objects (structs, decimals, lists of lists, zoned timestamps),
    which inference would not give back, nor give the same in every batch."""

    batch_format: str = "torch"
    nested: tuple[str, ...] = ()
    collate_fn: Any = None
    device: Any = None
    prefetch_depth: int = 2
    arrow_types: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def deliver(
    raw: Iterable[Tagged], delivery: Delivery, flush: Callable[[], None]
) -> tuple[Iterator[Tagged], Any]:
    """The stream of tagged batches in the delivery's format, and the `DeviceFeed` behind
    it (torch format; else None); the feed waits with `flush` as it waits for data."""
    fmt, nested, collate_fn = delivery.batch_format, delivery.nested, delivery.collate_fn
    if fmt == "torch":
        from rayshard.device import DeviceFeed

        feed = DeviceFeed(
            (Tagged(meta, torch_host_batch(batch, nested)) for meta, batch in raw),
            device=delivery.device,
            prefetch_depth=delivery.prefetch_depth,
            collate_fn=collate_fn,
            on_wait=flush,
            on_wait_after_s=STALL_FLUSH_S,
        )
        return feed, feed
    types = delivery.arrow_types

    def convert(batch: Any) -> Any:
        return convert_batch(batch, fmt, nested, collate_fn, types)

    return _Converted(raw, convert), None


class _Converted:
    """`raw`'s tagged batches, each `convert`ed. Not a generator: an interrupt (Ctrl-C)
    while `raw` waits or a batch is converted ends nothing, the batch is kept for the
    next call; `resumable` (the iterator goes on after an interrupt) if `raw` is too."""

    def __init__(self, raw: Iterable[Tagged], convert: Callable[[Any], Any]) -> None:
        self._raw, self._convert, self._held = iter(raw), convert, None
        self.resumable = getattr(raw, "resumable", False)

    def __iter__(self) -> Iterator[Tagged]:
        return self

    def __next__(self) -> Tagged:
        if self._held is None:
            self._held = next(self._raw)
        meta, batch = self._held
        try:
            converted = Tagged(meta, self._convert(batch))
        except StopIteration as error:  # (not the stream's end: a generator's rule, PEP 479)
            raise RuntimeError(f"converting a batch raised {error!r}") from error
        self._held = None
        return converted


__all__ = ["Delivery", "deliver"]
