"""The coordinator's death watch over the ranks' readers (`rayshard.runtime.coordinator`).

A rank is watched through its reader actor (`ShardReader.watch()` blocks while it lives)
or, when it reads in its consumer, through its key in that process's shared `RankWatch`
(`rayshard.runtime.watch`). One asyncio task per reader waits for the end, of the actor
or of the key, and reports it once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import ray


class ReaderWatches:
    """Watch tasks of one coordinator; `on_end(dp_rank, name)` when a watched reader ends."""

    def __init__(self, namespace: str, on_end: Callable[[int, str], Awaitable[None]]) -> None:
        self._namespace = namespace
        self._on_end = on_end
        self._tasks: dict[str, Any] = {}  # reader name -> the task that watches it
        self._shared: dict[str, str] = {}  # reader name -> the process's watch that has it

    def watch(self, dp_rank: int, name: str, shared: str | None) -> None:
        """Watch reader `name` of `dp_rank`, or its key in the shared watch `shared`
        (once per reader; call inside the event loop)."""
        if name in self._tasks:
            return
        if shared is not None:
            self._shared[name] = shared

        async def watch() -> None:
            try:
                if shared is None:
                    await ray.get_actor(name, namespace=self._namespace).watch.remote()
                else:
                    await ray.get_actor(shared, namespace=self._namespace).watch.remote(name)
            except Exception:  # noqa: BLE001 - any failure of the watch means it is gone
                pass
            await self._on_end(dp_rank, name)

        self._tasks[name] = asyncio.get_event_loop().create_task(watch())

    def actors(self, attached: set[str]) -> list[str]:
        """The reader actors among those watched and `attached` (not shared keys)."""
        return sorted((set(self._tasks) | attached) - set(self._shared))

    def shared_keys(self) -> list[tuple[str, str]]:
        """(shared watch actor, key) of every rank watched that way."""
        return sorted((watch, key) for key, watch in self._shared.items())


__all__ = ["ReaderWatches"]
