"""Watching a process by its pid (`rayshard.runtime.pid_watch`) and the coordinator's
watches over such processes (`ReaderWatches`), without Ray: real child processes that
sleep, are killed, become zombies and are reaped."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys

import pytest

from rayshard.errors import ConfigError
from rayshard.runtime import pid_watch
from rayshard.runtime.iterator_args import check_iterator_args
from rayshard.runtime.reader_watches import ReaderWatches
from tests.timeouts import EVENT_TIMEOUT_S

pytestmark = pytest.mark.skipif(not pid_watch.pidfds_work(), reason="no pidfds on this system")

NODE = "a" * 56  # a node id's length


def sleeper() -> subprocess.Popen:
    """A child process that lives until it is killed."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])


def run_reaping(run, processes: list[subprocess.Popen]) -> None:
    """`asyncio.run(run())`, then kill and reap `processes`, whether it passed or failed."""
    try:
        asyncio.run(run())
    finally:
        for process in processes:
            process.kill()
            process.wait()


def token_of(process: subprocess.Popen, node: str = NODE) -> str:
    """The token the child would send (it shares this process's pid namespace)."""
    start = pid_watch.start_ticks(process.pid)
    return f"pid:{node}:{pid_watch.pid_namespace()}:{process.pid}:{start}"


def token_with(watched: pid_watch.Watched, **changes) -> str:
    """A token of `watched`, some of its parts changed."""
    parts = {**dataclasses.asdict(watched), **changes}
    return "pid:{node}:{namespace}:{pid}:{start}".format(**parts)


async def still_waiting(awaitable: asyncio.Future) -> bool:
    """Whether `awaitable` is still waiting after the loop ran a while (it is not one
    that can end by itself: its process sleeps for an hour)."""
    await asyncio.sleep(0.05)
    return not awaitable.done()


def test_a_token_names_this_process_and_its_start():
    token = pid_watch.token_here(NODE)
    watched = pid_watch.parse(token)
    start = pid_watch.start_ticks(os.getpid())
    assert watched == pid_watch.Watched(NODE, pid_watch.pid_namespace(), os.getpid(), start)
    assert token_with(watched) == token
    assert pid_watch.is_token(token) and not pid_watch.is_token("rayshard-watch-1-0")
    assert not pid_watch.is_token("") and not pid_watch.is_token(None)
    assert pid_watch.watchable(token, NODE)
    assert not pid_watch.watchable(token, "b" * 56)  # another node's process
    # The pid given to another: the process ended, and watching it ends at once (its rank
    # is lost: a dead worker cannot fall back to a `RankWatch`).
    stale = token_with(watched, start=watched.start + 1)
    assert pid_watch.watchable(stale, NODE)
    contained = token_with(watched, namespace=watched.namespace + 1)  # another pid namespace
    assert not pid_watch.watchable(contained, NODE)


@pytest.mark.parametrize("value", ["0", "false", "no", "off", " OFF "])
def test_watching_by_pid_can_be_turned_off(monkeypatch, value):
    monkeypatch.setenv(pid_watch.ENABLE_VARIABLE, value)
    assert pid_watch.token_here(NODE) is None
    for on in ("1", "on", ""):  # (set but empty: the default, on)
        monkeypatch.setenv(pid_watch.ENABLE_VARIABLE, on)
        assert pid_watch.token_here(NODE) is not None


def test_a_watch_by_pid_value_that_is_not_yes_or_no_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv(pid_watch.ENABLE_VARIABLE, "of")  # a typo: not silently on
    with pytest.raises(ConfigError, match=r"RAYSHARD_WATCH_BY_PID='of' is not a yes/no value"):
        pid_watch.enabled()
    with pytest.raises(ConfigError, match=r"RAYSHARD_WATCH_BY_PID"):  # before registering
        check_iterator_args(0, 1, "numpy", None, None)


@pytest.mark.parametrize(
    "bad", ["pid:", "pid:n:1:2", "pid::3:1:2", "rayshard-watch-1", "pid:n:3:x:2", "n:3:1:2"]
)
def test_what_is_not_a_token_is_refused(bad):
    with pytest.raises(ValueError):
        pid_watch.parse(bad)


def test_exited_returns_when_the_process_dies_even_before_it_is_reaped():
    process = sleeper()
    token = token_of(process)

    async def run() -> None:
        ended = asyncio.ensure_future(pid_watch.exited(token))
        assert await still_waiting(ended)
        process.kill()  # a zombie until `wait()` below: it has ended all the same
        await asyncio.wait_for(ended, EVENT_TIMEOUT_S)

    try:
        asyncio.run(run())
        assert process.poll() is not None  # reaped only now
    finally:
        process.kill()
        process.wait()


def test_exited_returns_at_once_for_a_reaped_pid_or_a_pid_of_another_process():
    process = sleeper()
    token = token_of(process)
    alive = pid_watch.token_here(NODE)
    watched = pid_watch.parse(alive)
    stale = token_with(watched, start=watched.start + 1)  # this pid, another start
    process.kill()
    process.wait()
    # Watchable (its watch then ends at once): the worker behind it cannot fall back.
    assert pid_watch.watchable(token, NODE) and pid_watch.watchable(stale, NODE)

    async def run() -> None:
        await asyncio.wait_for(pid_watch.exited(token), EVENT_TIMEOUT_S)
        await asyncio.wait_for(pid_watch.exited(stale), EVENT_TIMEOUT_S)

    asyncio.run(run())


def test_without_a_descriptor_exited_polls_and_never_takes_a_live_process_for_dead(
    monkeypatch,
):
    """An error of the watcher's own (here: no file descriptor left for a pidfd, nor for
    reading `/proc` at first) says nothing of the process: it is watched by polling."""
    import errno

    process = sleeper()
    token = token_of(process)
    real_open = open

    def no_descriptor(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(pid_watch.os, "pidfd_open", no_descriptor)
    monkeypatch.setattr(pid_watch, "POLL_S", 0.01)

    async def run() -> None:
        monkeypatch.setattr("builtins.open", no_descriptor)
        ended = asyncio.ensure_future(pid_watch.exited(token))
        assert await still_waiting(ended)
        monkeypatch.setattr("builtins.open", real_open)
        assert await still_waiting(ended)
        process.kill()
        await asyncio.wait_for(ended, EVENT_TIMEOUT_S)

    run_reaping(run, [process])


@pytest.mark.parametrize("failing", ["add_reader", "a bug in exited"])
def test_a_loop_that_cannot_take_the_pidfd_polls_and_never_takes_a_live_process_for_dead(
    monkeypatch, failing
):
    """The event loop refusing the pidfd (epoll full: `OSError`), or any error inside
    `exited` (a bug), is the watcher's own: the process is watched by polling, and only
    its real end ends the watch."""
    import errno

    process = sleeper()
    token = token_of(process)

    def refused(*args, **kwargs):
        if failing == "add_reader":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise RuntimeError("a bug")

    if failing == "add_reader":
        monkeypatch.setattr(asyncio.selector_events.BaseSelectorEventLoop, "add_reader", refused)
    else:
        monkeypatch.setattr(pid_watch.os, "pidfd_open", refused)
    monkeypatch.setattr(pid_watch, "POLL_S", 0.01)

    async def run() -> None:
        released = asyncio.Event()
        ended = asyncio.ensure_future(pid_watch.exited_or_ended(token, released))
        assert await still_waiting(ended)
        process.kill()
        await asyncio.wait_for(ended, EVENT_TIMEOUT_S)
        assert not released.is_set()

    run_reaping(run, [process])


def test_reader_watches_end_a_process_key_at_its_death_or_its_end():
    """The coordinator's side: each key watched by pid ends once, at its process's
    death or at `end(key)` (also one that came first), and ends no other key; only an
    `end` is reported as released (a group member's death is a loss, its release not)."""
    processes = [sleeper(), sleeper()]
    ended: list[tuple[int, str]] = []
    released: dict[str, bool] = {}

    async def on_end(dp_rank: int, name: str, by_release: bool) -> None:
        ended.append((dp_rank, name))
        released[name] = by_release

    async def run() -> None:
        watches = ReaderWatches("namespace", on_end, NODE)
        watches.end("early")  # released before it was watched: ends at once
        watches.watch(0, "a", token_of(processes[0]))
        watches.watch(1, "b", token_of(processes[1]))
        watches.watch(2, "c", token_of(processes[1]))  # another key of that process
        watches.watch(3, "early", token_of(processes[1]))
        watches.watch(0, "a", token_of(processes[0]))  # once per key
        await wait_for(lambda: ended == [(3, "early")])
        assert watches.counts()["watched_by_pid"] == 3
        assert watches.shared_keys() == []  # nothing for `Loader.shutdown` to release
        assert watches.actors({"a", "b", "c", "early", "reader-9"}) == ["reader-9"]
        processes[0].kill()
        await wait_for(lambda: ended[1:] == [(0, "a")])
        assert watches.end("c") == 2  # its rank, for the coordinator to record at once
        await wait_for(lambda: ended[2:] == [(2, "c")])
        assert watches.end("c") is None and watches.end("a") is None  # already ended
        assert set(watches._ended) == {"b"}  # ended keys keep nothing
        assert watches.counts()["watched_by_pid"] == 1  # "b": its process lives on, its watch too
        assert len(ended) == 3
        assert released == {"early": True, "a": False, "c": True}

    run_reaping(run, processes)


async def wait_for(condition, timeout_s: float = EVENT_TIMEOUT_S) -> None:
    """Let the loop run until `condition()` holds."""

    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), timeout_s)
