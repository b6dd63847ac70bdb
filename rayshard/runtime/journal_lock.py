"""The coordinator's hold on its journal (`rayshard.runtime.journal`): an exclusive record
lock (`fcntl.lockf`) on a file beside it, `<journal>.lock` (the journal itself is replaced
by each compaction), held for the coordinator's life. A second live coordinator given the
same journal path is refused at its start, naming the path, rather than both writing one
file (a restart of either would replay the other's commands). A restarted coordinator (Ray
starts the actor again, in a new process) takes the lock over: the kernel releases a
process's locks when it ends. Record locks belong to a process, so one process may take
one again (as tests run a coordinator and its restart in one process). Where the file
system has no locks (`ENOLCK`: some network mounts) the journal is used unlocked, with a
warning.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import time
from typing import IO

from rayshard.errors import ConfigError

log = logging.getLogger(__name__)

TAKEOVER_S = 10.0  # how long a restarted coordinator waits for its predecessor's lock
_RETRY_S = 0.1
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}


class JournalLock:
    """The lock of the journal at `journal_path`."""

    def __init__(self, journal_path: str) -> None:
        self.journal_path = journal_path
        self.path = f"{journal_path}.lock"
        self._handle: IO | None = None

    def take(self, wait_s: float = 0.0) -> None:
        """Hold the lock from now on, waiting up to `wait_s` for another process to let it
        go (a restarted coordinator's predecessor, still ending); a `ConfigError` if it
        does not."""
        deadline = time.monotonic() + wait_s
        while self._handle is None:
            handle = self._locked()
            if handle is not None and _same_file(handle, self.path):
                self._handle = handle
            elif handle is not None:  # removed (its coordinator shut down) meanwhile
                handle.close()
            elif time.monotonic() >= deadline:
                raise self._held_error()
            else:
                time.sleep(_RETRY_S)

    def check_free(self) -> None:
        """Refuse (a `ConfigError`) a journal another live coordinator holds (the driver's
        check, before its coordinator starts); takes nothing."""
        if self._handle is None and os.path.exists(self.path):
            handle = self._locked()
            if handle is None:
                raise self._held_error()
            handle.close()  # (this process held no lock on it: closing releases its own)

    def release(self, *, remove: bool) -> None:
        """Let the lock go (the coordinator journals nothing more), removing its file first
        if `remove` (the journal is removed too)."""
        if self._handle is not None:
            if remove:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.path)
            self._handle.close()
            self._handle = None

    def _locked(self) -> IO | None:
        """The lock file, open and locked by this process; None if another holds it."""
        try:
            handle = open(self.path, "a")  # noqa: SIM115 - kept open while held
        except OSError as error:
            raise ConfigError(
                f"journal_path={self.journal_path!r}: its lock file {self.path} cannot be "
                f"opened ({error}): choose a journal_path in a folder the coordinator can write"
            ) from None
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in _NO_LOCKS:
                log.warning("journal %s: this file system has no locks (%s)", self.path, error)
                return handle
            handle.close()
            if error.errno in (errno.EACCES, errno.EAGAIN):
                return None
            raise
        return handle

    def _held_error(self) -> ConfigError:
        return ConfigError(
            f"journal_path={self.journal_path!r} is in use: another live coordinator holds "
            f"{self.path}; give each loader its own journal_path (or shut the other loader "
            "down first)"
        )


def _same_file(handle: IO, path: str) -> bool:
    """Whether `handle` is still the file at `path` (not one removed since it was opened)."""
    try:
        here, there = os.fstat(handle.fileno()), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


__all__ = ["TAKEOVER_S", "JournalLock"]
