"""`ReaderWatches` arms a reader's watch anew once its earlier watch ended: a reader name
watched again is not left unwatched (real child processes watched by pid, no Ray)."""

from __future__ import annotations

import asyncio

import pytest

from rayshard.runtime import pid_watch
from rayshard.runtime.reader_watches import ReaderWatches
from tests.test_pid_tokens import NODE, run_reaping, sleeper, token_of, wait_for

pytestmark = pytest.mark.skipif(not pid_watch.pidfds_work(), reason="no pidfds on this system")


def _run_with_children(count: int, scenario) -> list[tuple[int, str]]:
    """Run `scenario(watches, children, ends)` with `count` sleeping child processes;
    returns the ends the watches reported (dp rank, reader name)."""
    children = [sleeper() for _ in range(count)]
    ends: list[tuple[int, str]] = []

    async def run() -> None:
        async def ended(dp_rank: int, name: str, released: bool) -> None:
            ends.append((dp_rank, name))

        await scenario(ReaderWatches("ns", ended, NODE), children, ends)

    run_reaping(run, children)
    return ends


def test_a_reader_watched_again_after_its_watch_ended_is_watched_anew():
    async def scenario(watches, children, ends) -> None:
        first = token_of(children[0])
        children[0].kill()
        watches.watch(0, "reader-1", first)
        await wait_for(lambda: len(ends) == 1)
        watches.watch(0, "reader-1", token_of(children[1]))  # the same name, watched again
        await asyncio.sleep(0.2)
        assert watches.counts()["watched_by_pid"] == 1 and len(ends) == 1
        children[1].kill()
        await wait_for(lambda: len(ends) == 2)

    assert _run_with_children(2, scenario) == [(0, "reader-1"), (0, "reader-1")]


def test_ended_watches_leave_only_their_names_and_no_key_counts_as_an_actor():
    """A loop that takes an iterator per epoch watches a reader per epoch: an ended one's
    entries go (they grew without end), and `Loader.shutdown`'s lists stay right: an
    ended process key is no actor to kill, also when the membership still names it."""

    async def scenario(watches, children, ends) -> None:
        for epoch, child in enumerate(children):
            watches.watch(0, f"reader-{epoch}", token_of(child))
            child.kill()
            await wait_for(lambda n=epoch + 1: len(ends) == n)
        await wait_for(lambda: not watches._tasks)  # (a task ends after reporting)
        assert not watches._tasks and not watches._shared and not watches._ranks
        assert watches.actors({"reader-2", "reader-x"}) == ["reader-x"]
        assert watches.shared_keys() == [] and watches.counts()["watched_by_pid"] == 0
        assert watches.end("reader-1") is None  # a late end of an ended key: nothing
        assert not watches._ended

    ends = _run_with_children(3, scenario)
    assert [name for _, name in ends] == ["reader-0", "reader-1", "reader-2"]
