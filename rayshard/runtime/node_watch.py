"""Watching the processes of other nodes by their pids: one `NodeWatch` actor per node.

The coordinator watches the workers of its own node through their pids (`pid_watch`).
For a worker on another node it asks that node's `NodeWatch`, which does the same there:
one actor per node and coordinator, made on the first attach of a worker of that node,
pinned to it, and owned by the coordinator (it ends with the coordinator; a restarted
coordinator makes them again as it watches the journal's ranks). That is one process
per node, where each worker process used to start a `RankWatch` actor of its own.

A watch ends when the process ends, when Ray reports its node dead (its processes gone
with it), or when the coordinator releases it (the iterator closed or was dropped).
Nothing else ends it: a `NodeWatch` that dies, cannot be placed or does not answer while
its node lives ends no watch, since a live worker taken for dead would have its work
served twice. A new `NodeWatch` takes the watches over (after `RETRY_S`, doubling while
they keep failing); its first look at a process returns at once if it ended meanwhile.
A `NodeWatch` left with no watch for `IDLE_RELEASE_S` is ended: Ray's autoscaler takes a
node with a live actor for busy, and would never remove it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayshard.runtime import pid_watch
from rayshard.runtime.remote import remote_class

log = logging.getLogger(__name__)

RETRY_S = 1.0  # wait before a new `NodeWatch` takes over from one that died (doubling)
MAX_RETRY_S = 30.0
IDLE_RELEASE_S = 2.0  # a `NodeWatch` with no watch this long is ended
SEES_TIMEOUT_S = 60.0  # a `NodeWatch` that does not answer `sees` by then: not seen
NODE_POLL_S = 0.1  # how often Ray is asked whether a dead watch's node is gone
MAX_WATCHES = 100_000  # concurrent watch calls of one `NodeWatch` (one per rank watched)


class NodeWatch:
    """Watches processes of its node by pid for a coordinator elsewhere (an async actor)."""

    def __init__(self, node_id: str) -> None:
        self._node = node_id
        self._ended: dict[str, asyncio.Event] = {}  # key -> set by `end_watch`

    async def sees(self, token: str) -> bool:
        """Whether the process of `token` is one this node's watch can keep (`watchable`)."""
        return pid_watch.watchable(token, self._node)

    async def pid_namespace(self) -> int | None:
        """The pid namespace this watch sees processes in; None where it can watch none
        (no pidfds here)."""
        return pid_watch.pid_namespace() if pid_watch.pidfds_work() else None

    async def watch(self, key: str, token: str) -> None:
        """Return once the process of `token` has ended or `end_watch(key)` was called (at
        once if that came first)."""
        try:
            await pid_watch.exited_or_ended(token, self._ended.setdefault(key, asyncio.Event()))
        finally:
            self._ended.pop(key, None)

    async def end_watch(self, key: str) -> None:
        """Release the watch of `key` (the rank left, or its iterator was dropped)."""
        self._ended.setdefault(key, asyncio.Event()).set()

    async def keys(self) -> list[str]:
        """Keys watched now (for tests and diagnostics)."""
        return sorted(key for key, ended in self._ended.items() if not ended.is_set())


class NodeWatches:
    """The coordinator's `NodeWatch` actors, by node id (made on first use)."""

    def __init__(self) -> None:
        self._handles: dict[str, Any] = {}
        self._keys: dict[str, set[str]] = {}  # node -> the keys watched there now
        self._used: dict[str, float] = {}  # node -> when its watch was last asked (loop time)
        self._seeing: dict[str, int] = {}  # node -> `sees` calls waiting on its watch
        self._releases: set[asyncio.Task] = set()  # pending `_release_later` (kept: not GC'd)
        self._alive_nodes: tuple[float, set[str]] | None = None  # (when, ids) Ray said alive
        self._asking: asyncio.Future | None = None  # the `ray.nodes()` call in flight
        # node -> the pid namespace its watch sees (None: none), learnt when it refused a
        # process: a process of another namespace there is refused with no watch started
        self._namespaces: dict[str, int | None] = {}

    def __len__(self) -> int:
        return len(self._handles)

    async def sees(self, token: str) -> bool:
        """Whether the `NodeWatch` of the token's node can watch its process; False for a
        node that is not alive, or whose watch could not start or answer (the worker then
        starts a `RankWatch`)."""
        watched = pid_watch.parse(token)
        node = watched.node
        if self._namespaces.get(node, watched.namespace) != watched.namespace:
            return False  # a process its watch cannot see (a container of its own, say)
        self._used[node] = asyncio.get_running_loop().time()
        self._seeing[node] = self._seeing.get(node, 0) + 1
        handle = None
        try:
            handle = await self._handle(node)
            if handle is None:
                return False
            if await asyncio.wait_for(handle.sees.remote(token), SEES_TIMEOUT_S):
                return True
            self._namespaces[node] = await handle.pid_namespace.remote()
            return False
        except Exception as error:  # noqa: BLE001 - any failure: not seen, nothing attached
            log.info("the watch of node %s did not answer: %r", node, error)
            self._forget(handle)
            return False
        finally:
            self._seeing[node] -= 1
            self._release_if_idle(node)  # no watch may follow (the attach failed)

    async def watch(self, key: str, token: str, ended: asyncio.Event) -> None:
        """Return once the process of `token` has ended, its node is gone, or `ended` is
        set (the watch is then released on that node too)."""
        node = pid_watch.parse(token).node
        self._keys.setdefault(node, set()).add(key)
        try:
            await self._watch(key, token, ended, node)
        finally:
            self._keys[node].discard(key)
            self._used[node] = asyncio.get_running_loop().time()
            self._release_if_idle(node)

    async def _watch(self, key: str, token: str, ended: asyncio.Event, node: str) -> None:
        """`watch`: only a return of the node's watch (the process ended) or a node Ray
        reports dead ends it; any failure of the watch (it died, could not be placed or
        started) makes a new one take over, after `RETRY_S` doubling up to `MAX_RETRY_S`
        (back to `RETRY_S` once a watch held that long)."""
        loop, retry_s = asyncio.get_running_loop(), RETRY_S
        while not ended.is_set():
            began, handle = loop.time(), None
            try:
                handle = await self._handle(node)
                if handle is None:
                    return  # its node is gone, and the process with it
                await self._watch_once(handle, key, token, ended)
                return  # the process ended, or the watch was released
            except Exception as error:  # noqa: BLE001 - the watch failed: another takes over
                log.info("the watch of node %s failed: %r (another takes over)", node, error)
                self._forget(handle)  # its node may live on (see the module docstring)
            if loop.time() - began >= MAX_RETRY_S:
                retry_s = RETRY_S
            if await self._ends_within(node, retry_s, ended):
                return
            retry_s = min(MAX_RETRY_S, retry_s * 2)

    @staticmethod
    async def _watch_once(handle: Any, key: str, token: str, ended: asyncio.Event) -> None:
        """One `NodeWatch.watch` call: returns once the process ended or `ended` is set
        (the call is then ended on the node too); raises if the call failed."""
        call = asyncio.ensure_future(handle.watch.remote(key, token))
        release = asyncio.ensure_future(ended.wait())
        answered = False
        try:
            await asyncio.wait([call, release], return_when=asyncio.FIRST_COMPLETED)
            answered = call.done()
        finally:
            release.cancel()
            if not answered:  # released (or this task cancelled): end it there too
                call.cancel()  # (a request: the future is not done until the loop runs)
                with contextlib.suppress(Exception):
                    handle.end_watch.remote(key)
        if answered:
            call.result()  # raises if the call failed

    async def _handle(self, node: str) -> Any:
        """The `NodeWatch` of `node`, made if needed; None if the node is not alive."""
        if node not in self._handles and not await self._alive(node):
            return None
        handle = self._handles.get(node)  # made by another call meanwhile?
        if handle is None:
            options = {"num_cpus": 0, "max_concurrency": MAX_WATCHES}
            pinned = NodeAffinitySchedulingStrategy(node, soft=False)
            handle = remote_class(NodeWatch).options(**options, scheduling_strategy=pinned)
            handle = self._handles[node] = handle.remote(node)
        return handle

    async def _alive(self, node: str) -> bool:
        """Whether Ray knows node `node` as alive. One `ray.nodes()` (off the event loop)
        serves every call within `NODE_POLL_S`; True where Ray cannot be asked (a watch
        never ends on doubt)."""
        known = self._alive_nodes
        if known is not None and asyncio.get_running_loop().time() - known[0] < NODE_POLL_S:
            return node in known[1]
        if self._asking is None:
            self._asking = asyncio.ensure_future(asyncio.to_thread(ray.nodes))
            self._asking.add_done_callback(self._asked)
        try:
            nodes = await asyncio.shield(self._asking)
        except Exception as error:  # noqa: BLE001 - unknown: taken for alive
            log.warning("could not ask Ray which nodes are alive: %r", error)
            return True
        return any(entry["NodeID"] == node and entry.get("Alive") for entry in nodes)

    def _asked(self, asking: asyncio.Future) -> None:
        """Keep the answer of a `ray.nodes()` call for `NODE_POLL_S`."""
        self._asking = None
        if not asking.cancelled() and asking.exception() is None:
            alive = {entry["NodeID"] for entry in asking.result() if entry.get("Alive")}
            self._alive_nodes = (asyncio.get_running_loop().time(), alive)

    async def _ends_within(self, node: str, seconds: float, ended: asyncio.Event) -> bool:
        """Whether Ray reports node `node` dead within `seconds`, asking every `NODE_POLL_S`
        (a watch dies with its node a moment before Ray marks the node dead); stops early,
        with False, once `ended` is set."""
        deadline = asyncio.get_running_loop().time() + seconds
        while not ended.is_set():
            if not await self._alive(node):
                return True
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return False
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ended.wait(), min(NODE_POLL_S, left))
        return False

    def _release_if_idle(self, node: str) -> None:
        """End the watch of `node` once it has been unused for `IDLE_RELEASE_S`."""
        if not self._keys.get(node):
            task = asyncio.get_running_loop().create_task(self._release_later(node))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)

    async def _release_later(self, node: str) -> None:
        await asyncio.sleep(IDLE_RELEASE_S)
        loop = asyncio.get_running_loop()
        recently = loop.time() - self._used.get(node, 0.0) < IDLE_RELEASE_S
        if self._keys.get(node) or self._seeing.get(node) or recently:
            return  # in use again: its own end schedules the next release
        self._keys.pop(node, None)
        self._used.pop(node, None)
        handle = self._handles.pop(node, None)
        if handle is not None:
            with contextlib.suppress(Exception):  # already gone
                await asyncio.to_thread(ray.kill, handle)

    def _forget(self, handle: Any) -> None:
        """Drop a failed watch's handle (if no newer one replaced it)."""
        for node, known in list(self._handles.items()):
            if known is handle:
                del self._handles[node]


__all__ = [
    "IDLE_RELEASE_S",
    "MAX_RETRY_S",
    "NODE_POLL_S",
    "RETRY_S",
    "SEES_TIMEOUT_S",
    "NodeWatch",
    "NodeWatches",
]
