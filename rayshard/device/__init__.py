"""Feeding the device: pinned staging, side-stream copies, prefetch, affinity."""

from rayshard.device.affinity import (
    allowed_cpus,
    cpus_for_thread,
    parse_affinity_mask,
    pin_current_thread,
    reader_pool,
)

# The feed and the pool need torch; load them on first use so that processes which only
# need the affinity helpers (shard readers) do not import torch.
_LAZY = {
    "DeviceFeed": "rayshard.device.feed",
    "FeedStats": "rayshard.device.feed",
    "default_device": "rayshard.device.feed",
    "HostBufferPool": "rayshard.device.pinned_pool",
    "PoolStats": "rayshard.device.pinned_pool",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rayshard.device' has no attribute {name!r}")


__all__ = [
    "DeviceFeed",
    "FeedStats",
    "HostBufferPool",
    "PoolStats",
    "allowed_cpus",
    "cpus_for_thread",
    "default_device",
    "parse_affinity_mask",
    "pin_current_thread",
    "reader_pool",
]
