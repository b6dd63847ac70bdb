"""Feeding the device (SPEC section 9): pinned staging, side-stream copies, prefetch, affinity."""

from rayshard.device.affinity import (
    allowed_cpus,
    cpus_for_thread,
    parse_affinity_mask,
    pin_current_thread,
    reader_pool,
)
from rayshard.device.feed import DeviceFeed, FeedStats, default_device
from rayshard.device.pinned_pool import HostBufferPool, PoolStats

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
