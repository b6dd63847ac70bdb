"""The actor that stands for the ranks a process reads for in its consumer (`consumer_reads`).

Such a rank needs no reader process, but the coordinator still needs something to watch.
One `RankWatch` per process serves every rank that process reads for, whatever loader
(`rayshard.runtime.process_watch` makes it): a rank's watch is a key, the rank's reader
name. It is made by the process, dies with it (Ray ends an actor whose owner dies), and
`watch(key)` blocks while it lives and the key is not ended, as a `ShardReader`'s
`watch()` does. It imports nothing beyond the standard library, so it starts as fast as
a Ray actor can; it is an async actor, so waiting watches hold no threads. A process the
coordinator can watch by its pid needs none: on the coordinator's node it watches the
pid itself (`rayshard.runtime.pid_watch`), on another node through that node's
`NodeWatch` (`rayshard.runtime.node_watch`).
"""

from __future__ import annotations

import asyncio


class RankWatch:
    """A stand-in reader for the coordinator's death watch: `watch(key)`, `end_watch(key)`."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Event] = {}
        self._stopped: set[str] = set()

    async def watch(self, key: str) -> None:
        """Blocks while the actor lives, until `end_watch(key)` (at once if it came first)."""
        if key in self._stopped:
            return
        await self._waiting.setdefault(key, asyncio.Event()).wait()

    async def end_watch(self, key: str) -> None:
        """Release the watch of `key` (the rank left, or its iterator was dropped)."""
        self._stopped.add(key)
        waiting = self._waiting.pop(key, None)
        if waiting is not None:
            waiting.set()

    async def keys(self) -> list[str]:
        """Keys watched now (for tests and diagnostics)."""
        return sorted(self._waiting)


__all__ = ["RankWatch"]
