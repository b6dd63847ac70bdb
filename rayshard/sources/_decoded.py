"""Decoded chunks kept for the reads that come next, in the reading process.

A reader's pieces are often smaller than the chunks (row groups) they come from: a
`split_rows` below the row group size, a mixed source's picks, leases cut finer than the
files. Each piece's read then needs the same whole chunk, and decoding it again for every
piece multiplies the decoding by the pieces per chunk. `DecodedChunks` keeps the last few
decoded chunks and decodes a chunk that several reading threads ask for at once only
once: the first thread decodes it, the others wait for its result (or its error).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

from rayshard.config.checks import check_int


class DecodedChunks:
    """The last `capacity` values that `get` decoded, by key (least recently used out)."""

    def __init__(self, capacity: int) -> None:
        check_int(capacity, "capacity", minimum=1, error=ValueError)
        self.capacity = capacity
        self._kept: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._loading: dict[Hashable, Future] = {}  # keys some thread is decoding now
        self._lock = threading.Lock()  # guards `_kept` and `_loading`

    def get(self, key: Hashable, decode: Callable[[], Any]) -> Any:
        """The value of `key`: kept, being decoded by another thread (waited for), or
        `decode()`d here and kept. An error of `decode` reaches every thread waiting for
        it, and nothing is kept: the next `get` decodes again."""
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
            loading = self._loading.get(key)
            owner = loading is None
            if owner:
                loading = self._loading[key] = Future()
        if not owner:
            return loading.result()
        try:
            value = decode()
        except BaseException as error:
            with self._lock:
                del self._loading[key]
            loading.set_exception(error)
            raise
        with self._lock:
            self._kept[key] = value
            while len(self._kept) > self.capacity:
                self._kept.popitem(last=False)
            del self._loading[key]
        loading.set_result(value)
        return value

    def part(self, key: Hashable, decode: Callable[[], Any], *, last: bool) -> Any:
        """`get` for a read of a part of chunk `key`; `last`: the part reaches the chunk's
        end, so in reading order no later part needs it, and it is no longer kept (its
        memory goes with the rows read from it)."""
        value = self.get(key, decode)
        if last:
            with self._lock:
                self._kept.pop(key, None)
        return value

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)


__all__ = ["DecodedChunks"]
