"""The coordinator's death watch over the ranks' readers (`rayshard.runtime.coordinator`).

A rank is watched through its reader actor (`ShardReader.watch()` blocks while it lives)
or, when it reads in its consumer, through that process: by its pid, from the
coordinator when the process is on its node (`rayshard.runtime.pid_watch`), else from
that node's `NodeWatch` (`rayshard.runtime.node_watch`); where neither can see the
process, through its key in that process's shared `RankWatch` (`rayshard.runtime.watch`).
One asyncio task per reader waits for the end, of the actor, the process or the key, and
reports it once. A restarted coordinator watches the journal's readers again, some perhaps
not made yet (their worker registered just before the restart): an actor Ray does not
know is looked for `FIND_S` before it counts as ended, and an attach meanwhile arms its
watch anew, as it does a watch that ended.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import ray

from rayshard.runtime import member_watch, pid_watch
from rayshard.runtime.node_watch import NodeWatches

FIND_S = 10.0  # how long a restarted coordinator looks for a reader Ray does not know
FIND_POLL_S = 0.2
GONE_KEPT = 65_536  # ended watches remembered (a loop may take an iterator per epoch)


class ReaderWatches:
    """Watch tasks of one coordinator; `on_end(dp_rank, name, released)` when a watched
    reader ends (`released`: its watch answered, as `stop()` or `end_watch` of its key
    make it; not a death, a node's loss or a failed watch)."""

    def __init__(
        self,
        namespace: str,
        on_end: Callable[[int, str, bool], Awaitable[None]],
        node_id: str | None = None,
    ) -> None:
        self._namespace = namespace
        self._node = node_id or ray.get_runtime_context().get_node_id()  # the coordinator's
        self._on_end = on_end
        self._tasks: dict[str, Any] = {}  # reader name -> the task that watches it
        self._shared: dict[str, str] = {}  # reader name -> the process's watch that has it
        self._ended: dict[str, asyncio.Event] = {}  # pid-watched keys: set by `end`
        self._ranks: dict[str, int] = {}  # reader name -> its rank
        self._finding: set[str] = set()  # reader names whose watch looks for its actor
        # Ended watches, forgotten above (each rank's iterator per epoch would add one for
        # good): name -> whether it was a reader actor (`Loader.shutdown` kills those
        # still alive, their iterators not dropped); a late `end` of one is a no-op.
        self._gone: OrderedDict[str, bool] = OrderedDict()
        self._nodes = NodeWatches()  # watches of other nodes' processes

    async def can_watch(self, watch: str) -> bool:
        """Whether a rank's `watch` is one this coordinator can keep: a reader actor, a
        `RankWatch`, or the token of a process it sees by pid: on its node, or through
        the `NodeWatch` of the process's node."""
        if not pid_watch.is_token(watch):
            return True
        if pid_watch.parse(watch).node == self._node:
            return pid_watch.watchable(watch, self._node)
        return await self._nodes.sees(watch)

    def watch(self, dp_rank: int, name: str, shared: str | None, find_s: float = 0.0) -> None:
        """Watch reader `name` of `dp_rank`, or its key in the shared watch `shared` (an
        actor, or a process token); once per reader while its watch runs (one that ended,
        or still looks for its actor, is armed anew); call inside the event loop. An actor
        Ray does not know is looked for `find_s` (a restart's), else counts as ended."""
        task = self._tasks.get(name)
        if task is not None and not task.done() and name not in self._finding:
            return
        if task is not None:
            task.cancel()  # (ended, or looking for an actor: this watch replaces it)
        self._gone.pop(name, None)
        self._ranks[name] = dp_rank
        self._shared.pop(name, None)
        if shared is not None:
            self._shared[name] = shared
        finds = find_s > 0 and not pid_watch.is_token(shared)  # (an actor looked for)
        (self._finding.add if finds else self._finding.discard)(name)

        async def watch() -> None:
            released = False  # (an answer, not a failure: released, not a process's end)
            try:
                if shared is None:
                    await (await self._actor(name, name, find_s)).watch.remote()
                elif pid_watch.is_token(shared):
                    released = await self._process_or_key_end(name, shared)
                else:
                    await (await self._actor(name, shared, find_s)).watch.remote(name)
                released = released or not pid_watch.is_token(shared)
            except Exception:  # noqa: BLE001 - any failure of the watch means it is gone
                pass
            await self._on_end(dp_rank, name, released)
            if self._tasks.get(name) is asyncio.current_task():  # (not armed anew since)
                self._forget(name)

        self._tasks[name] = asyncio.get_event_loop().create_task(watch())

    async def _actor(self, name: str, actor: str, find_s: float) -> Any:
        """The handle of `actor`, the watch of reader `name`, looked for up to `find_s`
        while Ray does not know it (made soon, or gone: its `ValueError` after that)."""
        deadline = time.monotonic() + find_s
        while True:
            try:
                handle = ray.get_actor(actor, namespace=self._namespace)
            except ValueError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(FIND_POLL_S)
                continue
            if self._tasks.get(name) is asyncio.current_task():
                self._finding.discard(name)  # found: a later attach leaves this watch be
            return handle

    def _forget(self, name: str) -> None:
        """Drop an ended watch's entries, remembering its name (the last `GONE_KEPT`)."""
        del self._tasks[name]
        self._ranks.pop(name, None)
        self._finding.discard(name)
        self._gone[name] = self._shared.pop(name, None) is None
        while len(self._gone) > GONE_KEPT:
            self._gone.popitem(last=False)

    def end(self, key: str) -> int | None:
        """The rank watched by its process under `key` left it (closed or dropped): end
        that watch as a `RankWatch` ends a key (at once if it comes first). Returns the
        rank of a key watched so, whose end the caller records at once (else None)."""
        task = self._tasks.get(key)
        if key in self._gone or (task is not None and task.done()):
            return None
        self._ended.setdefault(key, asyncio.Event()).set()
        return self._ranks.get(key) if pid_watch.is_token(self._shared.get(key)) else None

    async def _process_or_key_end(self, key: str, token: str) -> bool:
        """Return once the process of `token` ended (or its node) or `end(key)` was
        called (then True); watched here, or by the `NodeWatch` of its node."""
        ended = self._ended.setdefault(key, asyncio.Event())
        try:
            if pid_watch.parse(token).node == self._node:
                await pid_watch.exited_or_ended(token, ended)
            else:
                await self._nodes.watch(key, token, ended)
            return ended.is_set()
        finally:
            self._ended.pop(key, None)

    def actors(self, attached: set[str]) -> list[str]:
        """The reader actors among those watched and `attached` (not shared keys)."""
        gone = {name for name, actor in self._gone.items() if actor}
        keys = {name for name, actor in self._gone.items() if not actor} | set(self._shared)
        return sorted((set(self._tasks) | gone | attached) - keys)

    def shared_keys(self) -> list[tuple[str, str]]:
        """(shared watch actor, key) of every rank watched that way (not by pid)."""
        return sorted(
            (watch, key) for key, watch in self._shared.items() if not pid_watch.is_token(watch)
        )

    def counts(self) -> dict[str, int]:
        """For `stats()`: ranks watched by their process's pid now (`watched_by_pid`),
        the `NodeWatch` actors doing it on other nodes (`node_watches`), and the group
        members' processes watched now, however (`members_watched`)."""
        live = [key for key, task in self._tasks.items() if not task.done()]
        members = [key for key in live if member_watch.parse(key)[1] is not None]
        by_pid = sum(
            1
            for key in set(live) - set(members)  # (a group member's process: no rank)
            if pid_watch.is_token(self._shared.get(key))
        )
        counted = {"watched_by_pid": by_pid, "node_watches": len(self._nodes)}
        return {**counted, "members_watched": len(members)}


__all__ = ["FIND_S", "ReaderWatches"]
