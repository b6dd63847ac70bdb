"""A worker on another node than the coordinator's is watched by its pid through that
node's `NodeWatch` (`rayshard.runtime.node_watch`), with real Ray and real processes. The
coordinator's side (`NodeWatches`) runs here in the test's own event loop, watching child
processes of this test through a `NodeWatch` on this node: the same calls a coordinator
on another node makes (the multi-node scenarios run it across nodes)."""

from __future__ import annotations

import asyncio

import pytest
import ray

from rayshard.runtime import pid_watch
from rayshard.runtime.node_watch import RETRY_S, NodeWatches
from tests.test_pid_tokens import run_reaping, sleeper, token_of, token_with
from tests.timeouts import EVENT_TIMEOUT_S

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(not pid_watch.pidfds_work(), reason="no pidfds on this system"),
]


async def eventually(condition, what: str) -> None:
    """Wait, polling, until the coroutine function `condition()` returns true."""

    async def poll() -> None:
        while not await condition():
            await asyncio.sleep(0.05)

    try:
        await asyncio.wait_for(poll(), EVENT_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def test_a_node_watch_follows_its_processes_and_is_replaced_when_it_dies(ray_session):
    """Ends a watch at its process's death or at its release, and only then; a `NodeWatch`
    killed while its node lives is replaced, with every watch it held taken over; one left
    with no watch is ended (an autoscaler takes a node with a live actor for busy)."""
    here = ray.get_runtime_context().get_node_id()
    processes = [sleeper(), sleeper()]
    tokens = [token_of(process, here) for process in processes]

    async def run() -> None:
        watches = NodeWatches()
        assert await watches.sees(tokens[0]) and len(watches) == 1
        watched = pid_watch.parse(tokens[0])
        # Its pid given to another process: the process ended; it is seen, and its watch
        # ends at once (its rank is then lost: its worker cannot fall back to a RankWatch).
        reused = token_with(watched, start=watched.start + 1)
        assert await watches.sees(reused)
        await asyncio.wait_for(watches.watch("key-r", reused, asyncio.Event()), EVENT_TIMEOUT_S)
        ended = [asyncio.Event(), asyncio.Event()]
        waits = [
            asyncio.ensure_future(watches.watch(f"key-{i}", tokens[i], ended[i])) for i in (0, 1)
        ]
        first = watches._handles[here]

        def holding(*keys: str):
            async def held(handle) -> bool:
                return await handle.keys.remote() == list(keys)

            return held

        await eventually(lambda: holding("key-0", "key-1")(first), "both keys watched")
        ray.kill(first)  # its node lives on: the watches go on in a new one
        await eventually(
            lambda: _replaced(watches, here, first, holding("key-0", "key-1")),
            "a new NodeWatch with both keys",
        )
        assert not any(wait.done() for wait in waits), "a watch ended with its NodeWatch"
        second = watches._handles[here]
        # A process killed with its NodeWatch: the old one or the next (at its first look)
        # ends its watch.
        ray.kill(second)
        processes[0].kill()  # a real death: ends that watch, and only it
        await asyncio.wait_for(waits[0], EVENT_TIMEOUT_S)
        await eventually(
            lambda: _replaced(watches, here, second, holding("key-1")), "a third NodeWatch"
        )
        await asyncio.sleep(RETRY_S)
        assert not waits[1].done()
        third = watches._handles[here]
        ended[1].set()  # released: ends here, and on the node
        await asyncio.wait_for(waits[1], EVENT_TIMEOUT_S)

        async def released() -> bool:
            return len(watches) == 0

        await eventually(released, "the unused NodeWatch's release")

        async def dead() -> bool:
            try:
                await third.keys.remote()
            except ray.exceptions.RayActorError:
                return True
            return False

        await eventually(dead, "the unused NodeWatch's end")  # `ray.kill` is asynchronous

    run_reaping(run, processes)


async def _replaced(watches: NodeWatches, node: str, old, held) -> bool:
    handle = watches._handles.get(node)
    return handle is not None and handle._actor_id != old._actor_id and await held(handle)


def test_a_node_ray_does_not_know_gets_no_watch(ray_session):
    """A token of a node that is not alive (or never was) is not seen, its watch ends at
    once (its processes are gone with it), and no `NodeWatch` is made for it."""
    process = sleeper()
    token = token_of(process, "b" * 56)

    async def run() -> None:
        watches = NodeWatches()
        assert not await watches.sees(token)
        await asyncio.wait_for(watches.watch("key", token, asyncio.Event()), EVENT_TIMEOUT_S)
        assert len(watches) == 0

    run_reaping(run, [process])


def test_a_process_its_node_watch_cannot_see_is_refused_with_no_watch_started(ray_session):
    """A process in another pid namespace than the node's watch (a container of its own)
    is refused; once the watch has refused one, the next such process is refused with no
    `NodeWatch` started for it, while a process the watch sees is still watched."""
    here = ray.get_runtime_context().get_node_id()
    process = sleeper()
    token = token_of(process, here)
    watched = pid_watch.parse(token)
    elsewhere = token_with(watched, namespace=watched.namespace + 1)

    async def run() -> None:
        watches = NodeWatches()

        async def released() -> bool:
            return len(watches) == 0

        assert not await watches.sees(elsewhere) and len(watches) == 1  # asked, refused
        await eventually(released, "the unused NodeWatch's end")
        assert not await watches.sees(elsewhere)
        assert len(watches) == 0  # refused at once: none started
        assert await watches.sees(token) and len(watches) == 1

    run_reaping(run, [process])
