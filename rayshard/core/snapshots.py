"""The coordinator core's whole state as JSON-safe data, and back: the snapshot a journal
compaction writes (`rayshard.runtime.journal`), from which a restarted coordinator replays
the commands that followed it."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rayshard.core import commands as cmd
from rayshard.core.leases import LeaseBook
from rayshard.core.membership import Membership
from rayshard.core.state import LoaderState
from rayshard.plan.id_runs import RunSet

if TYPE_CHECKING:
    from rayshard.core.coordination import CoordinatorCore

EVENTS_KEPT = 1000
"""The latest membership events the core keeps (stats, snapshots): at 10,000 ranks one
registration round alone is 10,000 `rank_joined` events, carried by every snapshot."""


def event_log(events: Iterable[dict] = ()) -> deque[dict]:
    """The core's events: the latest `EVENTS_KEPT` of them."""
    return deque(events, maxlen=EVENTS_KEPT)


def core_to_dict(core: CoordinatorCore) -> dict[str, Any]:
    """The whole state of `core`, JSON-safe; `load_core` on a fresh core rebuilds it."""
    return {
        "members": None if core.members is None else core.members.to_dict(),
        "started": sorted(core.started),
        "books": [[e, b.to_dict()] for e, b in sorted(core.books.items())],
        "rank_epoch": [[r, e] for r, e in sorted(core.rank_epoch.items())],
        "resume": None if core.resume is None else core.resume.to_dict(),
        "received": [
            [e, sorted([r, n] for r, n in c.items())] for e, c in sorted(core.received.items())
        ],
        "consumed": [
            [e, [list(p) for p in core.merged_consumed(e)]] for e in sorted(core.consumed)
        ],
        "partial": [[e, sorted([i, t] for i, t in p.items())] for e, p in core.partial.items()],
        "events": list(core.events),
        "readers_named": core.readers_named,
        "last_lease": [
            [r, request, dict(vars(leased))]  # (not `asdict`: its deep copy cost 29 µs each)
            for r, (request, leased) in sorted(core.last_lease.items())
        ],
    }


def load_core(core: CoordinatorCore, data: dict[str, Any]) -> None:
    """Put the state `core_to_dict` saved into `core`."""
    m = data["members"]
    core.members = None if m is None else Membership.from_dict(m)
    core.started = set(data["started"])
    core.books = {e: LeaseBook.from_dict(b) for e, b in data["books"]}
    core.rank_epoch = {r: e for r, e in data["rank_epoch"]}
    core.resume = None if data["resume"] is None else LoaderState.from_dict(data["resume"])
    core.received = {e: {r: n for r, n in c} for e, c in data["received"]}
    core.consumed = {e: RunSet(c) for e, c in data["consumed"]}
    core.acked_rows = {}  # counted again from `consumed` when asked for
    core.partial = {e: {i: t for i, t in p} for e, p in data.get("partial", [])}
    core.events = event_log(data["events"])
    core.readers_named = data["readers_named"]
    core.last_lease = {
        r: (
            request,
            cmd.Leased(
                tuple(tuple(p) for p in leased["pieces"]),
                leased["wait"],
                leased["outstanding"],
                tuple(leased["stragglers"]),
                leased.get("unleased", -1),
                leased.get("ranks", 0),
                leased.get("steps"),
            ),
        )
        for r, request, leased in data.get("last_lease", [])
    }


__all__ = ["core_to_dict", "load_core"]
