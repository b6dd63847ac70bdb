"""The actor that stands for a rank that reads in its consumer (`consumer_reads`).

Such a rank needs no reader process, but the coordinator still needs something to watch:
this actor is made by the worker, dies with it (Ray ends an actor whose owner dies), and
`watch()` blocks while it lives, as a `ShardReader`'s does. It imports nothing beyond the
standard library, so it starts as fast as a Ray actor can.
"""

from __future__ import annotations

import threading


class RankWatch:
    """A stand-in reader for the coordinator's death watch: `watch()` and `stop()`."""

    def __init__(self) -> None:
        self._stopped = threading.Event()

    def watch(self) -> None:
        """Blocks while the actor lives (or until `stop()`)."""
        self._stopped.wait()

    def stop(self) -> None:
        """Release the watch (graceful leave)."""
        self._stopped.set()


__all__ = ["RankWatch"]
