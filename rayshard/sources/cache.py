"""A local disk cache of remote files for the file sources, and bounded read retries.

`FileCache(cache_dir, cache_limit)` keeps whole remote files (S3, GCS, ... through
`pyarrow.fs`) on local disk so that later epochs read them locally. A file is downloaded
to a temporary name in the cache folder and renamed into place, so several readers on one
node share the folder and never see a partial file; the least recently used files are
evicted once the folder holds more than `cache_limit` bytes (the file being read is never
evicted). `prefetch()` downloads the next file in the background while the current one is
read. Local files are never cached.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from rayshard.config.checks import check_int
from rayshard.errors import ConfigError, DataError

T = TypeVar("T")

#: Attempts of a remote read before the error reaches the loop, and the first back-off.
READ_ATTEMPTS = 6
FIRST_BACKOFF_S = 0.25


def is_remote(fs: pafs.FileSystem) -> bool:
    return not isinstance(fs, pafs.LocalFileSystem)


# How stores phrase a refusal: pyarrow's S3 ("AWS Error ACCESS_DENIED"), S3's own code,
# GCS ("PERMISSION_DENIED"), local files and HTTP ("Permission denied", "Forbidden").
_DENIED = ("ACCESS_DENIED", "AccessDenied", "PERMISSION_DENIED", "Permission denied", "Forbidden")


def is_denied(error: BaseException) -> bool:
    """Whether `error` is the store refusing access: permanent, retrying cannot help."""
    return isinstance(error, PermissionError) or any(m in str(error) for m in _DENIED)


def with_retries(
    call: Callable[[], T], *, remote: bool, on_retry: Callable[[], None] | None = None
) -> T:
    """`call()`, retried on I/O errors of a remote filesystem with exponential back-off
    (READ_ATTEMPTS attempts, waits of 0.25, 0.5, 1, 2, 4 s: about 8 s of outage ride
    through); local errors, refusals (`is_denied`: not retried) and the last remote one are
    raised as they are."""
    attempt = 0
    while True:
        try:
            return call()
        except (pa.ArrowException, OSError) as error:
            attempt += 1
            if not remote or attempt >= READ_ATTEMPTS or is_denied(error):
                raise
            if on_retry is not None:
                on_retry()
            time.sleep(FIRST_BACKOFF_S * 2 ** (attempt - 1))


class FileCache:
    """Whole remote files cached under `cache_dir`, at most `cache_limit` bytes."""

    def __init__(self, cache_dir: str | os.PathLike, cache_limit: int) -> None:
        check_int(cache_limit, "cache_limit", minimum=1, fix="a number of bytes, e.g. 50 << 30")
        self.cache_dir = os.path.abspath(os.fspath(cache_dir))
        self.cache_limit = cache_limit
        try:
            os.makedirs(self.cache_dir, exist_ok=True)
        except OSError as error:
            raise ConfigError(
                f"cache_dir={self.cache_dir!r} cannot be created ({error}): pass a writable folder"
            ) from error
        self._init_process_state()

    def _init_process_state(self) -> None:
        self._lock = threading.Lock()
        self._pool: Any = None
        self._pending: dict[str, Any] = {}
        self.stats = {"hits": 0, "downloads": 0, "bytes_fetched": 0, "evictions": 0}

    def __getstate__(self) -> dict[str, Any]:
        return {"cache_dir": self.cache_dir, "cache_limit": self.cache_limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    def local_path(self, fs: pafs.FileSystem, path: str, version: str = "") -> str:
        """The cached copy of `path` (downloaded first if it is not there yet). Threads of
        this process that ask for one file at once download it once: the others wait for
        that download (or a prefetch of it), and try themselves only if it failed.

        `version` ("size:mtime" when the source was made) is part of the copy's name, so
        a file rewritten in the store is never read from an older copy; a download whose
        size differs from it is a `DataError` (the file changed since)."""
        target = self._target(fs, path, version)
        while True:
            with self._lock:
                pending = self._pending.get(target)
                cached = pending is None and os.path.exists(target)
                if pending is None and not cached:
                    mine: concurrent.futures.Future = concurrent.futures.Future()
                    self._pending[target] = mine
                    break
            if cached:
                os.utime(target)  # most recently used
                with self._lock:
                    self.stats["hits"] += 1
                return target
            with contextlib.suppress(pa.ArrowException, OSError):  # then: try ourselves
                pending.result()
        try:
            self._download(fs, path, target, version)
        except BaseException as error:
            self._settle(target, mine, error)
            raise
        self._settle(target, mine, None)
        return target

    def prefetch(self, fs: pafs.FileSystem, path: str, version: str = "") -> None:
        """Download `path` in the background unless it is cached or on its way."""
        target = self._target(fs, path, version)
        with self._lock:
            if target in self._pending or os.path.exists(target):
                return
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="rayshard-cache"
                )
            # Registered before the download can end: it takes this lock to forget itself.
            self._pending[target] = self._pool.submit(
                self._download_quietly, fs, path, target, version
            )

    def _settle(self, target: str, future: Any, error: BaseException | None) -> None:
        """Forget `target`'s download, then wake its waiters: in this order, a woken waiter
        finds the file (or tries itself), never the finished download again."""
        self._forget(target)
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    def _forget(self, target: str) -> None:
        with self._lock:
            self._pending.pop(target, None)

    def _download_quietly(self, fs: pafs.FileSystem, path: str, target: str, version: str) -> None:
        """A prefetch: forgets itself before its future completes (see `_settle`)."""
        try:
            # the read retries, and reports
            with contextlib.suppress(pa.ArrowException, OSError, DataError):
                self._download(fs, path, target, version)
        finally:
            self._forget(target)

    def _target(self, fs: pafs.FileSystem, path: str, version: str) -> str:
        digest = hashlib.sha1(f"{fs.type_name}:{path}:{version}".encode()).hexdigest()[:16]
        return os.path.join(self.cache_dir, f"{digest}-{os.path.basename(path)}")

    def _download(self, fs: pafs.FileSystem, path: str, target: str, version: str) -> None:
        expected = version.split(":", 1)[0]

        def fetch() -> int:
            handle, temporary = tempfile.mkstemp(dir=self.cache_dir, prefix=".partial-")
            try:
                with os.fdopen(handle, "wb") as out, fs.open_input_stream(path) as remote:
                    shutil.copyfileobj(remote, out, 8 << 20)
                    size = out.tell()
                if expected.isdigit() and size != int(expected):
                    raise DataError(
                        f"{path}: the store holds {size} bytes of it, {expected} when the "
                        "source was made: the file changed since; make the source (and the "
                        "loader) again to read the new data. Rows delivered before it stay "
                        "delivered"
                    )
                os.replace(temporary, target)  # whole or nothing: readers never see a part
            except BaseException:
                if os.path.exists(temporary):
                    os.unlink(temporary)
                raise
            return size

        size = with_retries(fetch, remote=True)
        with self._lock:
            self.stats["downloads"] += 1
            self.stats["bytes_fetched"] += size
        self._evict(keep=target)

    def _evict(self, keep: str) -> None:
        """Remove the least recently used files until the folder fits `cache_limit`."""
        entries = []
        for name in os.listdir(self.cache_dir):
            if name.startswith(".partial-"):
                continue
            full = os.path.join(self.cache_dir, name)
            try:
                info = os.stat(full)
            except FileNotFoundError:
                continue  # another reader evicted it
            entries.append((info.st_mtime, info.st_size, full))
        total = sum(size for _, size, _ in entries)
        for _, size, full in sorted(entries):
            if total <= self.cache_limit:
                break
            if full == keep:
                continue
            try:
                os.unlink(full)  # open handles keep reading the unlinked file (POSIX)
            except FileNotFoundError:
                pass
            else:
                with self._lock:  # reading threads evict after their downloads, at once
                    self.stats["evictions"] += 1
            total -= size


__all__ = ["FileCache", "is_denied", "is_remote", "with_retries"]
