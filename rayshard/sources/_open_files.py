"""The files a process keeps open for one source, one reader per (thread, file).

pyarrow's file readers are not safe to read from several threads at once (a shard reader
with `reader_threads > 1` does), so each thread keeps its own. The set is bounded twice:
by count (`OPEN_FILES_CACHE`, so huge datasets do not exhaust file descriptors) and by
the bytes that remote readers keep buffered between reads (`OPEN_FILES_BUFFERED`), least
recently used first, sparing each thread's latest file (the one it reads).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any

#: How many opened files a process keeps.
OPEN_FILES_CACHE = 64
#: Bytes that a process's open remote files may keep buffered between reads, beyond each
#: reading thread's latest file: Parquet's pre-buffering keeps a file's last row group as
#: stored until its next read, so 64 open files of 128 MB row groups would hold 8 GB.
OPEN_FILES_BUFFERED = 256 << 20


@dataclasses.dataclass(slots=True)
class _OpenFile:
    handle: Any
    remote: bool  # opened on a remote store (not the local cache's copy)
    buffered: int = 0  # bytes it keeps between reads (Parquet's pre-buffered row group)


class OpenFiles:
    """This process's open readers of one source's files (see the module docstring)."""

    def __init__(self) -> None:
        self._open: collections.OrderedDict[tuple[int, int], _OpenFile] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, f: int) -> Any:
        """This thread's reader of file `f`, or None."""
        key = (threading.get_ident(), f)
        with self._lock:
            opened = self._open.get(key)
            if opened is None:
                return None
            self._open.move_to_end(key)
            return opened.handle

    def add(self, f: int, handle: Any, remote: bool) -> None:
        """Keep `handle`, this thread's new reader of file `f`."""
        with self._lock:
            self._open[(threading.get_ident(), f)] = _OpenFile(handle, remote)
            self._evict()

    def buffered(self, f: int, nbytes: Any) -> None:
        """This thread's reader of `f` keeps `nbytes()` bytes buffered now (asked only of
        remote readers)."""
        with self._lock:
            opened = self._open.get((threading.get_ident(), f))
            if opened is not None and opened.remote:
                opened.buffered = nbytes()
                self._evict()

    def drop(self, f: int) -> None:
        """Forget this thread's reader of file `f` (a failed remote read reopens it)."""
        with self._lock:
            self._open.pop((threading.get_ident(), f), None)

    def __len__(self) -> int:
        return len(self._open)

    def _evict(self) -> None:
        """Close the least recently used readers past `OPEN_FILES_CACHE`, then those whose
        buffers take the total past `OPEN_FILES_BUFFERED`, sparing each thread's latest."""
        while len(self._open) > OPEN_FILES_CACHE:
            self._open.popitem(last=False)
        buffered = sum(opened.buffered for opened in self._open.values())
        if buffered <= OPEN_FILES_BUFFERED:
            return
        latest: dict[int, tuple[int, int]] = {}
        for key in reversed(self._open):
            latest.setdefault(key[0], key)
        for key in list(self._open):
            if buffered <= OPEN_FILES_BUFFERED:
                break
            if self._open[key].buffered and latest[key[0]] != key:
                buffered -= self._open.pop(key).buffered
