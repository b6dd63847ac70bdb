"""`ReaderWatches` arms a reader's watch anew once its earlier watch ended: a reader name
watched again is not left unwatched (real child processes watched by pid, no Ray)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from rayshard.runtime import pid_watch
from rayshard.runtime.reader_watches import ReaderWatches
from tests.timeouts import EVENT_TIMEOUT_S

pytestmark = pytest.mark.skipif(not pid_watch.pidfds_work(), reason="no pidfds on this system")

NODE = "b" * 56


def _token(child: subprocess.Popen) -> str:
    start = pid_watch.start_ticks(child.pid)
    return f"pid:{NODE}:{pid_watch.pid_namespace()}:{child.pid}:{start}"


def _run_with_children(count: int, scenario) -> list[tuple[int, str]]:
    """Run `scenario(watches, children, ends)` with `count` sleeping child processes;
    returns the ends the watches reported (dp rank, reader name)."""
    children = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        for _ in range(count)
    ]
    ends: list[tuple[int, str]] = []

    async def run() -> None:
        async def ended(dp_rank: int, name: str) -> None:
            ends.append((dp_rank, name))

        await scenario(ReaderWatches("ns", ended, NODE), children, ends)

    try:
        asyncio.run(run())
    finally:
        for child in children:
            child.kill()
            child.wait()
    return ends


def test_a_reader_watched_again_after_its_watch_ended_is_watched_anew():
    async def scenario(watches, children, ends) -> None:
        first = _token(children[0])
        children[0].kill()
        watches.watch(0, "reader-1", first)
        await asyncio.wait_for(_until(lambda: len(ends) == 1), EVENT_TIMEOUT_S)
        watches.watch(0, "reader-1", _token(children[1]))  # the same name, watched again
        await asyncio.sleep(0.2)
        assert watches.counts()["watched_by_pid"] == 1 and len(ends) == 1
        children[1].kill()
        await asyncio.wait_for(_until(lambda: len(ends) == 2), EVENT_TIMEOUT_S)

    assert _run_with_children(2, scenario) == [(0, "reader-1"), (0, "reader-1")]


def test_ended_watches_leave_only_their_names_and_no_key_counts_as_an_actor():
    """A loop that takes an iterator per epoch watches a reader per epoch: an ended one's
    entries go (they grew without end), and `Loader.shutdown`'s lists stay right: an
    ended process key is no actor to kill, also when the membership still names it."""

    async def scenario(watches, children, ends) -> None:
        for epoch, child in enumerate(children):
            watches.watch(0, f"reader-{epoch}", _token(child))
            child.kill()
            await asyncio.wait_for(_until(lambda n=epoch + 1: len(ends) == n), EVENT_TIMEOUT_S)
            await asyncio.sleep(0.01)  # (its task ends after reporting)
        assert not watches._tasks and not watches._shared and not watches._ranks
        assert watches.actors({"reader-2", "reader-x"}) == ["reader-x"]
        assert watches.shared_keys() == [] and watches.counts()["watched_by_pid"] == 0
        assert watches.end("reader-1") is None  # a late end of an ended key: nothing
        assert not watches._ended

    ends = _run_with_children(3, scenario)
    assert [name for _, name in ends] == ["reader-0", "reader-1", "reader-2"]


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)
