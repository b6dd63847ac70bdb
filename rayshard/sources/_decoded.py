"""Decoded chunks kept for the reads that come next, in the reading process.

A reader's pieces are often smaller than the chunks (row groups) they come from: a
`split_rows` below the row group size, `dynamic` leases cut finer than the files, a mixed
source's splits. Each piece's read then needs the same whole chunk, and decoding it again
for every piece multiplies the decoding by the pieces per chunk. `DecodedChunks` keeps the
last few decoded chunks and decodes a chunk that several reading threads ask for at once
only once: the first thread decodes it, the others wait for its result (or its error).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

from rayshard.config.checks import check_int

#: Chunks read in parts that a file source keeps decoded per process, for the parts to come.
DECODED_CHUNKS = 2
_AGAIN: Any = object()  # the decoding thread was interrupted: a waiter decodes for itself


class DecodedChunks:
    """The last `capacity` values that `get` decoded and kept, by key (least recently
    used out)."""

    def __init__(self, capacity: int) -> None:
        check_int(capacity, "capacity", minimum=1, error=ValueError)
        self.capacity = capacity
        self._kept: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._loading: dict[Hashable, Future] = {}  # keys some thread is decoding now
        self._lock = threading.Lock()  # guards `_kept` and `_loading`

    def get(self, key: Hashable, decode: Callable[[], Any], *, keep: bool = True) -> Any:
        """The value of `key`: kept, being decoded by another thread (waited for), or
        `decode()`d here. `keep`: keep it for later calls (False: a kept one is let go).
        An error of `decode` reaches every thread waiting for it and nothing is kept, so
        the next call decodes again; a thread interrupted while decoding (an interrupt, a
        cancelled task) leaves the decoding to the threads that wait."""
        while True:
            with self._lock:
                if key in self._kept:
                    if keep:
                        self._kept.move_to_end(key)
                        return self._kept[key]
                    return self._kept.pop(key)
                loading = self._loading.get(key)
                if loading is None:
                    loading = self._loading[key] = Future()
                    break
            value = loading.result()  # another thread decodes it
            if value is not _AGAIN:
                return value
        outcome: Any = _AGAIN
        try:
            outcome = decode()
        except Exception as error:
            outcome = error
            raise
        finally:
            self._settle(key, loading, outcome, keep)
        return outcome

    def part(self, key: Hashable, decode: Callable[[], Any], *, last: bool) -> Any:
        """`get` for a read of a part of chunk `key` (or of all of it); `last`: the part
        reaches the chunk's end, so in reading order no later part needs it, and it is not
        kept (its memory goes with the rows read from it)."""
        return self.get(key, decode, keep=not last)

    def let_go(self) -> None:
        """Keep nothing more (the reading that needed the kept chunks ended). Best effort:
        it may run in a finalizer, on a thread that holds the lock already."""
        if self._lock.acquire(blocking=False):
            try:
                self._kept.clear()
            finally:
                self._lock.release()

    def _settle(self, key: Hashable, loading: Future, outcome: Any, keep: bool) -> None:
        with self._lock:
            del self._loading[key]
            if isinstance(outcome, Exception):
                loading.set_exception(outcome)
                return
            if keep and outcome is not _AGAIN:
                self._kept[key] = outcome
                while len(self._kept) > self.capacity:
                    self._kept.popitem(last=False)
            loading.set_result(outcome)

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)


__all__ = ["DECODED_CHUNKS", "DecodedChunks"]
