"""Decoded chunks kept for the reads that come next, in the reading process.

A reader's pieces are often smaller than the chunks (row groups) they come from: a
`split_rows` below the row group size, `dynamic` leases cut finer than the files, a mixed
source's splits. Each piece's read then needs the same whole chunk, and decoding it again
for every piece multiplies the decoding by the pieces per chunk. `DecodedChunks` keeps the
last few decoded chunks and decodes a chunk that several reading threads ask for at once
only once: the first thread decodes it, the others wait for its result (or its error).

Reading threads take their pieces in order but reach `part` in any order: the part that
reaches a chunk's end may come before an earlier part read by another thread. A reader
that says which parts it has started (`expect`) keeps the chunk until they are read.
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
        self._expected: collections.Counter[Hashable] = collections.Counter()  # parts started
        self._ended: set[Hashable] = set()  # keys whose last part was read before others
        self._lock = threading.Lock()  # guards all of the above

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

    def expect(self, key: Hashable) -> None:
        """A read of a part of chunk `key` was started (the reading thread calls `part`
        later): the chunk is kept until it is read, whatever part comes first."""
        with self._lock:
            self._expected[key] += 1

    def part(self, key: Hashable, decode: Callable[[], Any], *, last: bool) -> Any:
        """`get` for a read of a part of chunk `key` (or of all of it); `last`: the part
        reaches the chunk's end, so in reading order no later part needs it, and it is not
        kept (its memory goes with the rows read from it), unless a part `expect`ed is
        still to be read: then the chunk goes with the last of those."""
        with self._lock:
            self._expected[key] -= 1
            if self._expected[key] > 0:  # another part started is still to be read
                self._ended.update((key,) if last else ())
                last = False
            else:
                del self._expected[key]
                last = last or key in self._ended
                self._ended.discard(key)
        return self.get(key, decode, keep=not last)

    def let_go(self) -> None:
        """Keep nothing more (the reading that needed the kept chunks ended). Best effort:
        it may run in a finalizer, on a thread that holds the lock already."""
        if self._lock.acquire(blocking=False):
            try:
                self._kept.clear()
                self._expected.clear()
                self._ended.clear()
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
