"""Acknowledgements gathered per node: one `AckRelay` actor per node and loader.

Every acknowledgement group is a Ray call, and a call costs its actor about half a
millisecond of CPU whatever it carries: with thousands of ranks the coordinator spends its
core on calls, and asks for ever longer intervals (`rayshard.core.ack_pacing`), which is
what a lost rank repeats. A relay on each node takes its consumers' groups and forwards
those that arrived meanwhile in one `relayed` call, one call in flight: the coordinator's
calls shrink by the consumers per node, their per-call cost is paid on their own node.
A `dynamic` rank sends its lease calls through the same relay once its groups go there or
a lease answer asks for it (a reader actor, which sends no groups): a lease sent again
straight keeps its request id, so it is answered as before, not granted twice, and one a
late relay delivers after its rank's next call is refused (`Lease.check_after`).

A relay answers a group only once the coordinator recorded it (with its answer), so a
consumer's waiting flushes keep their meaning. A group whose relay failed (it died, its
node's call failed) is sent again straight to the coordinator by its consumer: recording a
group twice changes no progress (acknowledged runs are a union, batch counts a maximum),
nor the rank's consumer totals (a sender numbers its groups: `RankUsage`).
The relay measures its own CPU per call like the coordinator and answers with the longer
of the two intervals. Relays are made by the coordinator (`AckRelays`), pinned to their
node and owned by it: they end with it, and one unused for `IDLE_RELEASE_S` (or four of
the intervals its groups are asked for, if longer) is ended (Ray's
autoscaler takes a node with a live actor for busy).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import time
import uuid
from collections.abc import Callable
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayshard.core.ack_pacing import AckAnswer, AckPacing
from rayshard.errors import RayshardError
from rayshard.runtime.remote import remote_class

IDLE_RELEASE_S = 30.0  # a relay that forwarded nothing this long is ended
SENDERS_SEEN_S = 30.0  # a consumer silent this long no longer counts for the relay's pacing
MAX_CALLS = 100_000  # concurrent `ack` calls one relay takes (one per consumer)


class AckRelay:
    """Forwards its node's acknowledgement groups to the coordinator in batches (an async
    actor; see the module docstring)."""

    def __init__(self, coordinator: Any, node_id: str, token: str, pacing: AckPacing) -> None:
        self._coordinator, self._node, self._token = coordinator, node_id, token
        self._pacing = pacing  # this relay's own CPU per call
        self._pending: list[tuple[tuple, asyncio.Future]] = []
        self._forwarding: asyncio.Task | None = None
        self._senders: dict[str, float] = {}  # consumer -> when last heard (monotonic)
        self._pruned_at = 0.0  # when `_senders` was last pruned (monotonic)
        self.forwarded = [0, 0, 0]  # calls to the coordinator, groups and leases they carried
        self._waiting = 0  # `ack` calls not answered yet

    async def ack(self, sender: str, group: tuple) -> AckAnswer | None:
        """Record `group` (the arguments of `Coordinator.ack`) through the coordinator;
        returns its answer, with this relay's own interval if longer (None: the coordinator
        took the group as stale). Raises if the coordinator could not be reached or refused
        this group (its consumer then sends it straight)."""
        now = time.monotonic()
        self._senders[sender] = now
        recorded = await self._forwarded("ack", group)
        if not isinstance(recorded, AckAnswer):
            return recorded
        own = self._pacing.interval_s(self._consumers(now))
        return dataclasses.replace(recorded, interval_s=max(recorded.interval_s, own))

    async def lease(self, sender: str, group: tuple) -> Any:
        """A `dynamic` rank's lease call (the arguments of `Coordinator.lease`), forwarded
        with the node's other calls; returns its answer, or the error `ack` would raise
        (its rank then sends the call straight, with the same request id: it is not granted
        twice). Returned, not raised: a call its rank sent straight past this relay is
        never read, and Ray logs an unread error as unhandled."""
        try:
            return await self._forwarded("lease", group)
        except Exception as error:  # noqa: BLE001 - the rank's `AckSender.answer` reads it
            return error

    async def _forwarded(self, method: str, group: tuple) -> Any:
        """The coordinator's answer to `method(*group)`, forwarded with what else waits."""
        self._pacing.called(time.monotonic(), time.process_time)
        answer = asyncio.get_running_loop().create_future()
        self._pending.append(((method, *group), answer))
        if self._forwarding is None or self._forwarding.done():
            self._forwarding = asyncio.ensure_future(self._forward())
        self._waiting += 1
        try:
            return await answer
        finally:
            self._waiting -= 1

    async def _forward(self) -> None:
        """Send what is pending in one call, then what arrived meanwhile, until none is.
        Every call of a batch ends answered or failed, whatever goes wrong here: one left
        unanswered would hold its consumer's waits while this relay still answers probes."""
        while self._pending:
            batch, self._pending = self._pending, []
            lost = "relay lost this call's answer"
            try:
                await self._forward_batch(batch)
            except Exception as error:  # noqa: BLE001 - a bug fails this batch alone
                lost = f"{lost}: {error!r}"
            for _, waiting in batch:
                if not waiting.done():
                    waiting.set_exception(RuntimeError(lost))

    async def _forward_batch(self, batch: list[tuple[tuple, asyncio.Future]]) -> None:
        calls = [call for call, _ in batch]
        try:
            answers = await self._coordinator.relayed.remote(self._node, self._token, calls)
        except Exception as error:  # noqa: BLE001 - each consumer sends its call again
            for _, waiting in batch:
                if not waiting.done():
                    waiting.set_exception(RuntimeError(f"relay could not forward: {error!r}"))
            return
        self.forwarded[0] += 1
        self.forwarded[1] += sum(method == "ack" for method, *_ in calls)
        self.forwarded[2] += sum(method == "lease" for method, *_ in calls)
        for (_, waiting), recorded in zip(batch, answers, strict=True):
            if waiting.done():  # (its call was cancelled)
                continue
            if isinstance(recorded, Exception):  # this call alone was refused
                waiting.set_exception(recorded)
            else:
                waiting.set_result(recorded)

    def _consumers(self, now: float) -> int:
        """Consumers heard from within `SENDERS_SEEN_S` (forgetting the others at most once
        a second: a pass over every consumer on every call would cost as much as the call)."""
        if now - self._pruned_at >= 1.0:
            self._pruned_at = now
            self._senders = {s: t for s, t in self._senders.items() if t >= now - SENDERS_SEEN_S}
        return len(self._senders)

    async def counts(self) -> dict:
        """Calls forwarded, the groups and leases they carried, and the calls waiting for
        their answer now (for tests and benchmarks)."""
        calls, groups, leases = self.forwarded
        counts = {"calls": calls, "groups": groups, "leases": leases}
        return {**counts, "waiting": self._waiting, "node": self._node}


class AckRelays:
    """The coordinator's relays, by node (made on first ask, ended when unused)."""

    def __init__(self, pacing: AckPacing, coordinator: Any = None) -> None:
        self._pacing = pacing
        self._coordinator = coordinator  # None: the actor this runs in, once a relay is made
        self._relays: dict[str, tuple[str, Any]] = {}  # node -> (token, handle)
        self._used: dict[str, float] = {}  # node -> when its relay last forwarded (loop time)
        self._releases: set[asyncio.Task] = set()  # `_release_when_idle` tasks (kept: not GC'd)
        self.calls, self.groups, self.leases = 0, 0, 0  # relayed calls, groups and leases
        self._asked_s = 0.0  # the interval the last relayed groups were asked for

    def relay(self, node: str, failed: str = "") -> tuple[str, Any]:
        """(token, handle) of the relay of `node`, made if needed; `failed`: the token of a
        relay its consumer saw fail, replaced by a new one (if not already)."""
        known = self._relays.get(node)
        if known is not None and known[0] == failed:
            self._end(node)
            known = None
        if known is None:
            if self._coordinator is None:
                self._coordinator = ray.get_runtime_context().current_actor
            token = uuid.uuid4().hex[:12]
            options = {"num_cpus": 0, "max_concurrency": MAX_CALLS}
            pinned = NodeAffinitySchedulingStrategy(node, soft=False)
            made = remote_class(AckRelay).options(**options, scheduling_strategy=pinned)
            fresh = dataclasses.replace(self._pacing, cost_s=0.0)  # its own measurement
            handle = made.remote(self._coordinator, node, token, fresh)
            known = self._relays[node] = (token, handle)
            loop = asyncio.get_running_loop()
            self._used[node] = loop.time()
            task = loop.create_task(self._release_when_idle(node, token))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)
        return known

    def forwarded(self, node: str, token: str, calls: list, answers: list) -> None:
        """Relay `token` of `node` forwarded `calls`, answered with `answers` (keeps it from
        being ended; the interval they ask for lengthens the idle time that ends it)."""
        self.calls += 1
        leases = sum(method == "lease" for method, *_ in calls)
        self.groups, self.leases = self.groups + len(calls) - leases, self.leases + leases
        asked = [a.interval_s for a in answers if isinstance(a, AckAnswer)]
        self._asked_s = max(asked) if asked else self._asked_s
        if self._token(node) == token:
            self._used[node] = asyncio.get_running_loop().time()

    def __len__(self) -> int:
        return len(self._relays)

    def counts(self) -> dict[str, int]:
        """For `stats()`: relays held now, groups and leases through relays, their calls."""
        counts = {"ack_relays": len(self), "acks_relayed": self.groups}
        return {**counts, "leases_relayed": self.leases, "ack_relay_calls": self.calls}

    def _token(self, node: str) -> str:
        return self._relays[node][0] if node in self._relays else ""

    async def _release_when_idle(self, node: str, token: str) -> None:
        """End relay `token` of `node` once it forwarded nothing for `idle_limit_s()`."""
        loop = asyncio.get_running_loop()
        while self._token(node) == token:
            limit = self.idle_limit_s()
            idle = loop.time() - self._used[node]
            if idle >= limit:
                self._end(node)
                return
            await asyncio.sleep(limit - idle)

    def idle_limit_s(self) -> float:
        """How long a relay may forward nothing before it is ended: `IDLE_RELEASE_S`, or
        four of the intervals its groups are asked for, if longer (a relay is not ended
        between two groups of a consumer)."""
        return max(IDLE_RELEASE_S, 4 * self._asked_s)

    def _end(self, node: str) -> None:
        self._used.pop(node, None)
        known = self._relays.pop(node, None)
        if known is not None:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(known[1])


def record_each(methods: dict[str, Callable[..., Any]], calls: list) -> list:
    """`methods[method](*args, **kwargs)` of each (method, args, kwargs) call (a coroutine
    run to its end at once: `finished_now`): its answer, or the error it raised (one
    refused call fails alone, not the relay's whole call)."""
    answers = []
    for method, args, options in calls:
        try:
            answer = methods[method](*args, **options)
            answers.append(finished_now(answer) if inspect.iscoroutine(answer) else answer)
        except Exception as error:  # noqa: BLE001 - returned to that call's rank
            names = ("generation", "dp_rank", "epoch", "batches" if method == "ack" else "count")
            head = dict(zip(names, args))
            answers.append(RayshardError(f"relayed {method} {head} refused: {error!r}"))
    return answers


def finished_now(coroutine: Any) -> Any:
    """The result of `coroutine`, which must end without suspending: the coordinator
    records a relayed call's commands in one journal batch, written before any answer goes
    out, and a call that suspended would let other calls answer with their entries still
    unwritten. One that suspends is closed and refused (a bug, not a condition to meet)."""
    try:
        coroutine.send(None)
    except StopIteration as ended:
        return ended.value
    coroutine.close()
    raise RuntimeError(f"{coroutine.__qualname__} suspended inside a relayed call's journal batch")


__all__ = ["IDLE_RELEASE_S", "AckRelay", "AckRelays", "finished_now", "record_each"]
