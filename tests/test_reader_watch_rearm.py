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


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)
