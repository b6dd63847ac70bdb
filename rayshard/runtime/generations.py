"""The newest generation of each loader that an iterator of this process took part in.

A loader's coordinator refuses every call of an older generation (`StaleClientError`), but
a static rank reads its planned share without calling it per batch: an iterator made
before another iterator of the same loader in this process started a new generation (a
notebook that took a new iterator for another world size, and went on with the old one)
would read on through the rows of a plan no longer in force, rows the new world reads too.
Each iterator notes its generation here and checks it before every batch: a dictionary
lookup, no remote call. Processes that do not share memory learn it from the coordinator
at their next call, as before (a Ray Train restart replaces the old processes anyway).
"""

from __future__ import annotations

import threading
from typing import Any

from rayshard.errors import StaleClientError

_newest: dict[str, int] = {}  # coordinator actor id -> newest generation noted here
_lock = threading.Lock()


def key_of(coordinator: Any) -> str:
    """The coordinator's actor id: the same across the actor's restarts, new per loader."""
    return coordinator._actor_id.hex()


def note(key: str, generation: int) -> None:
    """An iterator of this process is at `generation` of the loader of `key`."""
    with _lock:
        if generation > _newest.get(key, 0):
            _newest[key] = generation


def newer(key: str, generation: int) -> int | None:
    """The newest generation noted for `key` if it is newer than `generation`."""
    newest = _newest.get(key, 0)
    return newest if newest > generation else None


def stale_error(where: str, generation: int, newest: int) -> StaleClientError:
    return StaleClientError(
        f"{where}: this iterator is of generation {generation}, and another iterator of the "
        f"same loader in this process started generation {newest} (another world size, or "
        "a restored state): its plan is no longer in force, and reading on would repeat rows "
        "the new generation reads; use the newer iterator"
    )


__all__ = ["key_of", "newer", "note", "stale_error"]
