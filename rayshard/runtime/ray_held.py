"""Ray calls from rayshard's own threads and finalizers, safe against a `ray.shutdown()`
in another thread.

A check that Ray is up (`ray.is_initialized()`) followed by a call races with a shutdown
in another thread: the core worker can go between the two, and a call or even a dropped
`ObjectRef` then touches a core worker that was shut down, which ends the process
("The core worker has already been shutdown ... The process will exit"). After the
shutdown, a call would start a new local Ray (Ray's auto-init). `ray_held()` holds Ray's
own lock, which `ray.init()` and `ray.shutdown()` hold from start to end, so Ray is either
up for the whole block or down for the whole block.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import ray


def _connect_or_shutdown_lock() -> Any:
    """Ray's lock around `connect()` and `shutdown()` (private: a Ray without it gets a lock
    of our own, and the check alone)."""
    from ray._private import worker

    lock = getattr(worker, "_connect_or_shutdown_lock", None)
    return lock if lock is not None else threading.RLock()


_LOCK = _connect_or_shutdown_lock()


@contextlib.contextmanager
def ray_held(blocking: bool = True) -> Iterator[bool | None]:
    """Hold off `ray.init()` and `ray.shutdown()` for the block and yield whether this
    process is connected to Ray: make Ray calls in the block only when it yields True;
    `ObjectRef`s dropped in the block are safe either way. Reentrant. With
    `blocking=False` it yields None at once when another thread holds the lock (a
    finalizer must never wait: it may run on a thread that `ray.shutdown()` joins)."""
    if not _LOCK.acquire(blocking=blocking):
        yield None
        return
    try:
        yield ray.is_initialized()
    finally:
        _LOCK.release()


__all__ = ["ray_held"]
