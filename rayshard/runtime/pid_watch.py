"""Watching a process of this node by its pid: how the coordinator watches the ranks that
read in their own consumer process on its node, and a `NodeWatch` those of its node
(`rayshard.runtime.node_watch`), with no `RankWatch` actor for them.

A process is named by a token, `pid:<node id>:<pid namespace>:<pid>:<start>`: the node's
Ray id, the inode of the process's pid namespace (a process in a container of its own
has pids the watcher's do not mean), its pid, and its start time in clock ticks since
boot (`/proc/<pid>/stat`): a pid the system gave again later names another process,
with another start. `exited(token)` waits on a pidfd (Linux 5.3 and later), which becomes
readable when the process ends, so an event loop waits for many processes with no thread
and no polling. Where pidfds are missing (another system, an older kernel, a sandbox that
refuses the call), where the process is not visible (another pid namespace than its
node's watch) or where `RAYSHARD_WATCH_BY_PID=0`, a process's ranks are watched through
its `RankWatch` actor instead (`rayshard.runtime.process_watch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import select

from rayshard.config.env import parse_bool

log = logging.getLogger(__name__)

PREFIX = "pid:"
ENABLE_VARIABLE = "RAYSHARD_WATCH_BY_PID"


@dataclasses.dataclass(frozen=True)
class Watched:
    """The process a token names."""

    node: str
    namespace: int
    pid: int
    start: int


def pid_namespace() -> int | None:
    """The inode of this process's pid namespace; None if it cannot be read."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot; None if there is none. An
    `OSError` where `/proc` cannot be read (no `/proc`, out of file descriptors)."""
    stat = _stat(pid)
    return None if stat is None else int(stat[19])


def _stat(pid: int) -> list[bytes] | None:
    """The fields of `/proc/<pid>/stat` from field 3 (the state) on; None if no process
    has that pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command before them may hold spaces and parentheses: split after its last ")".
    return stat[stat.rindex(b")") + 2 :].split()


@functools.cache
def pidfds_work() -> bool:
    """Whether this system opens pidfds (asked once per process)."""
    try:
        fd = os.pidfd_open(os.getpid())
    except (AttributeError, OSError):
        return False
    os.close(fd)
    return True


def enabled() -> bool:
    """Whether watching by pid is on here (`RAYSHARD_WATCH_BY_PID`, default on; a value
    that is not yes/no, such as a typo, is a `ConfigError` naming the variable)."""
    return parse_bool(os.environ.get(ENABLE_VARIABLE, "").strip() or "1", ENABLE_VARIABLE)


def token_here(node_id: str) -> str | None:
    """The token of this process on node `node_id`, or None where it cannot be watched
    by pid (see the module docstring)."""
    if not enabled() or not pidfds_work():
        return None
    pid, namespace = os.getpid(), pid_namespace()
    try:
        start = start_ticks(pid)
    except OSError:
        return None
    if start is None or namespace is None:
        return None
    return f"{PREFIX}{node_id}:{namespace}:{pid}:{start}"


def is_token(watch: str | None) -> bool:
    """Whether a rank's `watch` names a process (else a `RankWatch` actor, or nothing)."""
    return bool(watch) and watch.startswith(PREFIX)


def parse(token: str) -> Watched:
    """The process `token` names; a `ValueError` for anything that is not a token."""
    parts = token.removeprefix(PREFIX).rsplit(":", 3) if is_token(token) else []
    if len(parts) != 4 or not parts[0]:
        raise ValueError(f"not a process token: {token!r}")
    return Watched(parts[0], *(int(part) for part in parts[1:]))


def watchable(token: str, node_id: str) -> bool:
    """Whether a process of node `node_id` can watch the process of `token`: it is of the
    same node and pid namespace, pidfds work here, and this `/proc` shows that namespace's
    processes. A process that has already ended (or whose pid names another one now) is
    watchable: its watch ends at once, and its rank is lost, since a dead worker cannot
    fall back to a `RankWatch`. A live pid `/proc` does not show (`hidepid`) is not."""
    watched = parse(token)
    if (watched.node, watched.namespace) != (node_id, pid_namespace()) or not pidfds_work():
        return False
    try:
        if os.readlink("/proc/self") != str(os.getpid()):  # a `/proc` of another namespace
            return False
        fd = os.pidfd_open(watched.pid)
    except ProcessLookupError:  # no such process: it ended, and its parent reaped it
        return True
    except OSError:
        return False
    try:
        if start_ticks(watched.pid) is not None:  # shown in `/proc` (it, or its pid's heir)
            return True
        return bool(select.select([fd], [], [], 0)[0])  # readable: it ended meanwhile
    except OSError:
        return False
    finally:
        os.close(fd)


async def exited(token: str) -> None:
    """Return once the process of `token` has ended: at once if it already has, or if its
    pid names another process now. Never on an error of this process's own (no file
    descriptor left, say): a live process taken for dead would have its work served
    twice. Without a pidfd it polls `/proc` every `POLL_S`."""
    watched = parse(token)
    try:
        fd = os.pidfd_open(watched.pid)
    except ProcessLookupError:  # no such process: it ended, and its parent reaped it
        return
    except OSError:  # out of descriptors, or refused: watch the slow way
        await _polled_exit(watched)
        return
    try:
        # With the pidfd open: ended already (readable, or its pid names another now)?
        if _ended_by_fd(fd, watched):
            return
        loop = asyncio.get_running_loop()
        ended = loop.create_future()
        try:
            loop.add_reader(fd, lambda: ended.done() or ended.set_result(None))
        except OSError:  # the loop cannot take one more descriptor: the slow way
            await _polled_exit(watched)
            return
        try:
            await ended
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


async def exited_or_ended(token: str, ended: asyncio.Event) -> None:
    """Return once the process of `token` has ended or `ended` is set (its watch was
    released): `exited` raced against the release. An error of the watch (a bug) is
    logged, and the process is then watched by polling: it never passes for an end."""
    waits = [asyncio.ensure_future(exited(token)), asyncio.ensure_future(ended.wait())]
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if waits[0] in done and waits[0].exception() is not None:  # a bug: say so
            log.warning("watching process %s failed: %r", token, waits[0].exception())
            waits[0] = asyncio.ensure_future(_polled_exit(parse(token)))
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


POLL_S = 1.0  # how often `exited` looks at `/proc` when it has no pidfd


def _ended(watched: Watched) -> bool:
    """Whether the process of `watched` ended: its pid names no process or another one,
    or it is dead (X) or a zombie (Z) of one thread its parent has not reaped yet (a
    process whose main thread ended shows Z too while its other threads live); False when
    `/proc` cannot be read (an error here says nothing of that process)."""
    try:
        stat = _stat(watched.pid)
        if stat is None or int(stat[19]) != watched.start or stat[0] == b"X":
            return True
        return stat[0] == b"Z" and _threads(watched.pid) in (None, 1)
    except OSError:
        return False


def _threads(pid: int) -> int | None:
    """The threads of process `pid` (`/proc/<pid>/status`); None if it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            lines = handle.read().splitlines()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return next((int(line.split()[1]) for line in lines if line.startswith(b"Threads:")), 1)


def _ended_by_fd(fd: int, watched: Watched) -> bool:
    """Whether the process of `watched`, its pidfd `fd` open, ended: the pidfd is readable
    (every thread of it ended; a main thread's end alone does not count) or its pid names
    another process now (the pidfd was opened on that one)."""
    with contextlib.suppress(OSError):  # `/proc` unreadable here: the pidfd alone decides
        stat = _stat(watched.pid)
        if stat is None or int(stat[19]) != watched.start:
            return True
    return bool(select.select([fd], [], [], 0)[0])


async def _polled_exit(watched: Watched) -> None:
    """Return once the process of `watched` has ended, polling `/proc`."""
    while not _ended(watched):
        await asyncio.sleep(POLL_S)


__all__ = [
    "ENABLE_VARIABLE",
    "POLL_S",
    "Watched",
    "enabled",
    "exited",
    "exited_or_ended",
    "is_token",
    "parse",
    "pid_namespace",
    "pidfds_work",
    "start_ticks",
    "token_here",
    "watchable",
]
