"""Prometheus-compatible metrics through Ray's metrics API (`ray.util.metrics`).

Ray exports them from every process to its metrics agent; a Prometheus scraping the
cluster (see Ray's "Collecting and monitoring metrics") sees them as `ray_rayshard_*`.
Every series is tagged with the loader and, where it applies, the data-parallel rank.

| metric | kind | meaning |
|---|---|---|
| `rayshard_batches` | counter | batches a training loop received |
| `rayshard_bytes` | counter | bytes of those batches |
| `rayshard_consumer_stall_seconds` | counter | time a loop waited for its next batch |
| `rayshard_prefetch_depth` | gauge | batches ready in a reader actor, not yet taken |
| `rayshard_leases_outstanding` | gauge | dynamic leases handed out and not finished |
| `rayshard_reserved_samples` | counter | samples served again after a rank was lost |
"""

from __future__ import annotations

import functools
from typing import Any

_TAGS = ("loader", "rank")


@functools.cache
def _metric(kind: str, name: str, description: str) -> Any:
    from ray.util import metrics

    return getattr(metrics, kind)(name, description=description, tag_keys=_TAGS)


def _tags(loader: str, rank: int | None) -> dict[str, str]:
    return {"loader": loader, "rank": "" if rank is None else str(rank)}


def record_batches(loader: str, rank: int, batches: int, nbytes: int, stall_s: float) -> None:
    """`batches` batches (`nbytes` bytes) reached a training loop, which waited `stall_s`
    seconds for them."""
    tags = _tags(loader, rank)
    _metric("Counter", "rayshard_batches", "batches received by training loops").inc(batches, tags)
    if nbytes > 0:  # 0 when a transform dropped every row (Ray counters refuse 0)
        _metric("Counter", "rayshard_bytes", "bytes received by training loops").inc(nbytes, tags)
    if stall_s > 0:
        _metric(
            "Counter", "rayshard_consumer_stall_seconds", "time training loops waited for data"
        ).inc(stall_s, tags)


def set_prefetch_depth(loader: str, rank: int, depth: int) -> None:
    _metric("Gauge", "rayshard_prefetch_depth", "batches ready in a reader").set(
        depth, _tags(loader, rank)
    )


def set_leases_outstanding(loader: str, count: int) -> None:
    _metric("Gauge", "rayshard_leases_outstanding", "dynamic leases not closed").set(
        count, _tags(loader, None)
    )


def record_reserved(loader: str, samples: int) -> None:
    if samples:
        _metric(
            "Counter", "rayshard_reserved_samples", "samples served again after a rank was lost"
        ).inc(samples, _tags(loader, None))
