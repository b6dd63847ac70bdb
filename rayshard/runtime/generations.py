"""The newest generation of each loader that an iterator of this process took part in, and
the newest registration of each of its data-parallel ranks made here.

A loader's coordinator refuses every call of an older generation (`StaleClientError`), but
a static rank reads its planned share without calling it per batch: an iterator made
before another iterator of the same loader in this process started a new generation (a
notebook that took a new iterator for another world size, and went on with the old one)
would read on through the rows of a plan no longer in force, rows the new world reads too;
so would an iterator of a rank after a newer iterator of the same rank took it over.
Each iterator notes its generation here and checks it before every batch: a dictionary
lookup, no remote call. Processes that do not share memory learn it from the coordinator
at their next call, as before (a Ray Train restart replaces the old processes anyway).
It also keeps the iterators each loader made in this process (weakly), which
`Loader.shutdown()` closes before it stops the actors.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from rayshard.errors import StaleClientError

_newest: dict[str, int] = {}  # coordinator actor id -> newest generation noted here
_holder: dict[tuple[str, int], tuple[int, str]] = {}  # (id, dp rank) -> (generation, reader)
_made: dict[str, weakref.WeakSet] = {}  # coordinator actor id -> iterators made here
_lock = threading.Lock()


def key_of(coordinator: Any) -> str:
    """The coordinator's actor id: the same across the actor's restarts, new per loader."""
    return coordinator._actor_id.hex()


def note(key: str, generation: int, dp_rank: int, reader: str) -> None:
    """An iterator of this process registered (or restored) `dp_rank` at `generation` of
    the loader of `key`, reading through `reader` (the members of a model-parallel group
    share theirs)."""
    with _lock:
        _newest[key] = max(_newest.get(key, 0), generation)
        if generation >= _holder.get((key, dp_rank), (0, ""))[0]:
            _holder[(key, dp_rank)] = (generation, reader)


def made(key: str, iterator: Any) -> None:
    """The loader of `key` made `iterator` in this process (held weakly)."""
    with _lock:
        _made.setdefault(key, weakref.WeakSet()).add(iterator)


def made_here(key: str) -> list:
    """The iterators the loader of `key` made in this process that are still referenced;
    forgotten here (the loader is shutting down)."""
    with _lock:
        return list(_made.pop(key, ()))


def superseded(key: str, generation: int, dp_rank: int, reader: str) -> str | None:
    """What superseded an iterator of this registration in this process, or None."""
    newest = _newest.get(key, 0)
    if newest > generation:
        return (
            f"another iterator of the same loader in this process started generation {newest} "
            "(another world size, or a restored state)"
        )
    if _holder.get((key, dp_rank), (generation, reader)) != (generation, reader):
        return f"a newer iterator of data-parallel rank {dp_rank} in this process took it over"
    return None


def stale_error(where: str, generation: int, reason: str) -> StaleClientError:
    return StaleClientError(
        f"{where}: this iterator (generation {generation}) is superseded: {reason}; its plan "
        "is no longer in force, and reading on would repeat rows the newer iterator reads: "
        "use the newer iterator"
    )


__all__ = ["key_of", "made", "made_here", "note", "stale_error", "superseded"]
