"""What the coordinator is asked to change (commands) and what it decided (decisions).

Commands are small frozen dataclasses, JSON-safe, and carry every outside value the core
needs (the clock included), so replaying a journal of them rebuilds the same state. The
coordinator actor builds a command per request, applies it to the pure core, journals it
and carries out the decision (reply, metrics, watches).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from rayshard.errors import StaleClientError
from rayshard.plan.id_runs import as_runs


@dataclasses.dataclass(frozen=True)
class Command:
    """Base of every journaled change; `kind` names it in the journal."""

    kind: ClassVar[str] = ""

    def to_entry(self) -> dict[str, Any]:
        # Fields are JSON-safe plain values (no nested dataclasses): a shallow dict, as
        # `asdict`'s deep copy costs a call per pair of an acknowledgement's ids.
        args = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {"op": self.kind, "args": args}


@dataclasses.dataclass(frozen=True)
class Register(Command):
    """A worker joins: world rank and size, its data-parallel rank and size."""

    kind: ClassVar[str] = "register"
    world_rank: int
    world_size: int
    dp_rank: int
    dp_size: int
    time: float = 0.0


@dataclasses.dataclass(frozen=True)
class Attach(Command):
    """The reader actor `name` of `dp_rank` exists (created or found by a worker); or,
    with `watch`, the rank reads in its consumer and the process's shared watch actor
    `watch` watches it under the key `name`; or, with `member`, `name` is the key of a
    model-parallel group member's process, which `watch` watches (a member key that a
    restarted coordinator watches again: `rayshard.runtime.member_watch`)."""

    kind: ClassVar[str] = "attach"
    dp_rank: int
    name: str
    watch: str = ""
    member: bool = False


@dataclasses.dataclass(frozen=True)
class Release(Command):
    """The group member watched under key `name` closed or dropped its iterator: its
    process's end is no loss, and a restarted coordinator does not watch it again."""

    kind: ClassVar[str] = "release"
    name: str


@dataclasses.dataclass(frozen=True)
class StartEpoch(Command):
    """A rank begins `epoch`: a static-policy rank asks for its plan, a `dynamic` one for
    its batch count (the epoch's lease book is made then). `time`: when (0 in journals
    older than it). `request`: under `dynamic`, an id of the rank reading's lease calls
    (`Lease.request`) taken now: a call of the reading's earlier streams (in flight across
    a `set_epoch` restart, say) comes before it and is refused, not granted to no reader."""

    kind: ClassVar[str] = "epoch"
    dp_rank: int
    epoch: int
    time: float = 0.0
    request: str = ""


@dataclasses.dataclass(frozen=True)
class Lease(Command):
    """A dynamic rank asks for up to `count` pieces of `epoch`; `finishing`: it reached its
    equal step count, so only work returned by a lost rank may follow. `time`: when it
    asked (the straggler clock; 0 in journals older than it). `request`: the reader's id of
    this call; Ray retries a call in flight when the coordinator restarts, and the retry
    (same id) gets the answer the journal already holds, not more pieces. `share`: a
    paced ask, made early with rows still in hand: granting stops once its pieces hold
    `1 / (2 x members)` of the rows no rank holds (one piece at least), and it is offered
    no straggler's work."""

    kind: ClassVar[str] = "lease"
    dp_rank: int
    epoch: int
    count: int = 1
    finishing: bool = False
    time: float = 0.0
    request: str = ""
    share: bool = False

    def check_after(self, last: str) -> None:
        """Raise `StaleClientError` if this call is older than `last`, its rank's latest
        lease call: both "<reading>:<n>" ids of one rank reading (numbered across its
        epochs), this one with the smaller n. A relay that was late (a frozen process) may
        deliver a call its rank has since sent straight and gone past, and a stream the
        reading abandoned may send one late; granting it would lease pieces no one reads."""
        stream, _, number = self.request.rpartition(":")
        last_stream, _, last_number = last.rpartition(":")
        same = bool(stream) and stream == last_stream
        if same and number.isdigit() and last_number.isdigit() and int(number) < int(last_number):
            raise StaleClientError(
                f"lease call {self.request!r} of data-parallel rank {self.dp_rank} came after "
                f"its later call {last!r} (delayed, as in a relay that was frozen, or of a "
                "stream its reading left): not granted"
            )


@dataclasses.dataclass(frozen=True)
class Ack(Command):
    """Consumers of `dp_rank` received batches up to their `batches`-th, holding `ids`
    (`(start, end)` pairs, or their `(n, 2)` int64 array as the coordinator gets them);
    recorded at `time` (restarts the rank's straggler clock); under packing `partial`
    holds (sample index, tokens delivered) of split documents."""

    kind: ClassVar[str] = "ack"
    dp_rank: int
    epoch: int
    batches: int
    ids: Any
    time: float = 0.0
    partial: tuple[tuple[int, int], ...] = ()

    def to_entry(self) -> dict[str, Any]:
        # `ids` go flat (start, end, start, end, ...): a shuffled epoch acknowledges about
        # one pair per sample, and JSON writes a flat list of ints several times faster
        entry = super().to_entry()
        entry["args"]["ids"] = as_runs(self.ids).ravel().tolist()
        return entry


@dataclasses.dataclass(frozen=True)
class Lost(Command):
    """`dp_rank` is gone (its reader died, it left, or it was replaced)."""

    kind: ClassVar[str] = "lost"
    dp_rank: int
    reason: str
    time: float = 0.0


@dataclasses.dataclass(frozen=True)
class Restore(Command):
    """Resume from a saved loader state (a new generation, same members)."""

    kind: ClassVar[str] = "restore"
    state: dict
    time: float = 0.0


COMMANDS: dict[str, type[Command]] = {
    c.kind: c for c in (Register, Attach, Release, StartEpoch, Lease, Ack, Lost, Restore)
}


def command_from_entry(entry: dict[str, Any]) -> Command:
    """The command a journal line holds (the inverse of `Command.to_entry`)."""
    cls = COMMANDS[entry["op"]]
    args = dict(entry["args"])
    if cls is Ack:
        flat = args["ids"]
        args["ids"] = tuple(zip(flat[0::2], flat[1::2]))
        args["partial"] = tuple(tuple(pair) for pair in args.get("partial", ()))
    return cls(**args)


# -- decisions ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Registered:
    """The generation the worker registered under, the name of its rank's reader, and the
    epoch its rank is at (where a new iterator of the rank starts); `requeued_rows`: rows
    the rank's earlier registration gave back, replaced (for the metrics, not the reply)."""

    generation: int
    reader: str
    dp_size: int
    loader: str
    dynamic: bool
    epoch: int = 0
    requeued_rows: int = 0

    def reply(self) -> dict[str, Any]:
        reply = dataclasses.asdict(self)
        del reply["requeued_rows"]
        return reply


@dataclasses.dataclass(frozen=True)
class Leased:
    """Pieces `[start, end)` for the rank; none and `wait`: ask again shortly (work may
    still come back from another rank); none and not `wait`: the rank's epoch is over."""

    pieces: tuple[tuple[int, int], ...] = ()
    wait: bool = False
    outstanding: int = 0  # leases not finished, for the metrics
    stragglers: tuple[int, ...] = ()  # ranks whose work was taken back for this request
    unleased: int = -1  # rows no rank held once this was given (-1: not known)
    ranks: int = 0  # members of the epoch then (the reader's pacing shares `unleased`)
    steps: int | None = None  # the rank's batches under equal steps then (where it pads to)
    relay: bool = False  # set by the actor, not the core: send lease calls via the relay

    @property
    def done(self) -> bool:
        return not self.pieces and not self.wait

    def relayed(self, relay: bool) -> Leased:
        """This answer, saying whether to send lease calls through the node's relay."""
        return dataclasses.replace(self, relay=True) if relay else self

    def with_steps(self, steps: int | None) -> Leased:
        """This answer with the rank's step count as of now (a retried call's: the pieces
        are those granted then, the count may have grown since)."""
        return self if steps == self.steps else dataclasses.replace(self, steps=steps)


@dataclasses.dataclass(frozen=True)
class RankLost:
    """What went back to the queue when a rank was lost (empty if it was not a member)."""

    dp_rank: int
    requeued: tuple[tuple[int, int], ...] = ()

    @property
    def requeued_rows(self) -> int:
        return sum(end - start for start, end in self.requeued)


@dataclasses.dataclass(frozen=True)
class Noted:
    """A change with nothing to answer but the fact that it was recorded."""


__all__ = [
    "COMMANDS",
    "Ack",
    "Attach",
    "Command",
    "Lease",
    "Leased",
    "Lost",
    "Noted",
    "RankLost",
    "Register",
    "Registered",
    "Release",
    "Restore",
    "StartEpoch",
    "command_from_entry",
]
