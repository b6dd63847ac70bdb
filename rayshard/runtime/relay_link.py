"""A sender's way to its node's acknowledgement relay (`rayshard.runtime.ack_relay`):
asked for when the coordinator's answer says so, taken once the relay runs, dropped when
it ends or hangs, so that its groups go straight to the coordinator meanwhile. A rank's
`dynamic` lease calls go the same way (its consumer's sender, or its reader actor's)."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from typing import Any

import ray

from rayshard.errors import RayshardError

log = logging.getLogger("rayshard.runtime.acks")  # one logger for the sender's messages
# A relayed group not answered this long has its relay probed: a relay that hangs (a frozen
# process) must not hold its node's acknowledgements. A relay answers a group once the
# coordinator recorded it, so a slow coordinator also makes groups late: a relay that
# answers the probe is kept and waited on; one that does not within `PROBE_S` is dropped,
# its groups sent straight and a new relay asked for.
RELAY_PATIENCE_S = 10.0
PROBE_S = 2.0
# A relay offered but not running this long is asked for again (a new one replaces it):
# longer than a call's patience, since a loaded node may take many seconds to start a
# process (groups go straight meanwhile), and shorter than the coordinator's idle release
# (`ack_relay.IDLE_RELEASE_S`), which would end it first.
RELAY_START_S = 20.0


@dataclasses.dataclass(frozen=True)
class Sent:
    """A call in flight: its reference, the group it carries (to send it again if its relay
    fails), the relay's token ("": straight to the coordinator), when it was sent and the
    coordinator's method it calls (`ack`, or `lease`)."""

    ref: Any
    group: tuple
    relay: str
    sent_at: float = dataclasses.field(default_factory=time.monotonic)
    method: str = "ack"

    def overdue(self, now: float) -> bool:
        """A relayed call not answered within `RELAY_PATIENCE_S` (a relay that hangs)."""
        return bool(self.relay) and now - self.sent_at > RELAY_PATIENCE_S

    def patience_s(self) -> float | None:
        """How much longer to wait for its answer before its relay is probed (None:
        straight, as long as it takes)."""
        if not self.relay:
            return None
        return max(0.0, RELAY_PATIENCE_S - (time.monotonic() - self.sent_at))


class RelayHung(Exception):
    """A relayed call was not answered within `RELAY_PATIENCE_S`, nor a probe of its relay
    within `PROBE_S` (or the relay was dropped meanwhile)."""

    def __init__(self, entry: Sent) -> None:
        super().__init__(
            f"relay {entry.relay} did not answer within {RELAY_PATIENCE_S} s, nor a probe "
            f"within {PROBE_S} s"
        )


class RelayLink:
    """One sender's relay: none, asked for, offered (not yet running), or taken. Not
    thread-safe: its `AckSender` calls it under its lock."""

    def __init__(self, coordinator: Any, dp_rank: int) -> None:
        self._coordinator, self._rank = coordinator, dp_rank
        self.relay: tuple[str, Any] | None = None  # (token, handle) of the relay taken
        # the `Coordinator.relay` call in flight, then the offered relay's readiness call
        self._asking: Any = None
        self._offered: tuple[str, Any] | None = None  # (token, handle) not yet running
        self._failed = ""  # token of the relay that failed last (to be replaced)
        self.stopping = False  # its sender is stopping: no relay asked for any more
        self._sender_id = f"{dp_rank}-{uuid.uuid4().hex[:8]}"  # for the relay's pacing
        self._asked_at = 0.0  # when the readiness call in `_asking` was made
        self._probe: tuple[str, Any, float] | None = None  # (token, ref, sent at) in flight

    @property
    def token(self) -> str:
        """The token of the relay taken ("": none, groups go straight)."""
        return self.relay[0] if self.relay is not None else ""

    def want(self) -> None:
        """An answer asked for the relay: ask the coordinator for this node's, unless one
        is held or asked for already."""
        if self.relay is None and self._asking is None and not self.stopping:
            node = ray.get_runtime_context().get_node_id()
            self._asking = self._coordinator.relay.remote(node, self._failed)

    def take(self) -> None:
        """Take the relay the coordinator answered with once it runs: the coordinator's
        answer comes before the actor started, and groups sent to a relay still starting
        would wait unrecorded, growing what a lost rank repeats. A relay not running within
        `RELAY_START_S` is asked for again at once, replaced by a new one; after a failed
        step (logged), the next answer that asks for a relay asks again."""
        if self._asking is None:
            return
        if ray.wait([self._asking], timeout=0)[1]:  # not answered yet
            late = self._offered and time.monotonic() - self._asked_at > RELAY_START_S
            if late:  # a relay that does not start: ask again, for a new one
                log.warning(
                    "this node's acknowledgement relay did not start within %g s; asking again",
                    RELAY_START_S,
                )
                self._failed, self._asking, self._offered = self._offered[0], None, None
                self.want()
            return
        offered, self._offered = self._offered, None
        try:
            answer = ray.get(self._asking)
        except Exception as error:  # noqa: BLE001 - straight to the coordinator meanwhile
            log.warning("could not get this node's acknowledgement relay: %r", error)
            self._failed = offered[0] if offered else self._failed
            self._asking = None
            return
        if offered is None:  # the coordinator answered: now wait until the relay runs
            self._offered = tuple(answer)
            self._asking = self._offered[1].__ray_ready__.remote()
            self._asked_at = time.monotonic()
            return
        self.relay, self._asking = offered, None

    def send(self, group: tuple, straight: bool = False, method: str = "ack") -> Sent:
        """One call of the coordinator's `method` carrying `group` (its (args, kwargs)):
        through the relay taken, or straight to the coordinator."""
        if self.relay is not None and not straight:
            ref = getattr(self.relay[1], method).remote(self._sender_id, group)
            return Sent(ref, group, self.relay[0], method=method)
        args, options = group
        ref = getattr(self._coordinator, method).remote(*args, **options)
        return Sent(ref, group, "", method=method)

    def failed(self, entry: Sent, error: Exception) -> Sent:
        """A call through the relay failed: the group goes again, straight (returned).
        If the relay itself ended (released while idle, or died, alone or with its node) or
        did not answer within `RELAY_PATIENCE_S` (it hangs), send straight until a new one
        runs; the next relay asked for replaces it."""
        gone = isinstance(error, (ray.exceptions.RayActorError, RelayHung))
        if gone and self.token == entry.relay:
            log.info(
                "the acknowledgement relay of this node ended or hangs (%s): rank %d sends "
                "its groups straight to the coordinator until a new one runs",
                error if isinstance(error, RelayHung) else type(error).__name__,
                self._rank,
            )
            self.relay, self._failed = None, entry.relay
        elif not gone:  # a refusal: the straight call gets the coordinator's own answer
            level = logging.INFO if isinstance(error, RayshardError) else logging.WARNING
            log.log(level, "a relayed %s call failed, sent again straight: %r", entry.method, error)
        return self.send(entry.group, straight=True, method=entry.method)

    def handle_of(self, token: str) -> Any:
        """The handle of relay `token` if it is the one taken (None: dropped already)."""
        return self.relay[1] if self.relay is not None and self.relay[0] == token else None

    @staticmethod
    def answers(handle: Any) -> bool:
        """Whether the relay `handle` answers a probe within `PROBE_S` (blocks that long
        at most: call it outside the sender's lock)."""
        probe = handle.__ray_ready__.remote()
        return not ray.wait([probe], timeout=PROBE_S)[1] and _probe_ok(probe)

    def waiting_on(self, entry: Sent) -> Sent:
        """`entry`, given a new patience: its relay answered a probe (it waits on a slow
        coordinator, and forwards the group once that answers)."""
        log.debug("relay %s answers, the coordinator is slow: waiting on its groups", entry.relay)
        return dataclasses.replace(entry, sent_at=time.monotonic())

    def verdict(self, entry: Sent, now: float) -> Sent:
        """An overdue relayed call (`entry.overdue(now)`), without blocking: probe its
        relay; `entry` to go on waiting on (given a new patience once the relay answered),
        or the group sent straight once the relay failed or did not answer within
        `PROBE_S` (it hangs), or was dropped already."""
        handle = self.handle_of(entry.relay)
        if handle is None:
            return self.failed(entry, RelayHung(entry))
        if self._probe is None or self._probe[0] != entry.relay:
            self._probe = (entry.relay, handle.__ray_ready__.remote(), now)
            return entry
        _, probe, began = self._probe
        if ray.wait([probe], timeout=0)[1]:  # no answer yet
            if now - began <= PROBE_S:
                return entry
            self._probe = None
            return self.failed(entry, RelayHung(entry))
        self._probe = None
        return self.waiting_on(entry) if _probe_ok(probe) else self.failed(entry, RelayHung(entry))

    def forget(self) -> None:
        """Drop every reference (under `ray_held()`: see `AckSender._forget`)."""
        self.relay, self._asking, self._offered, self._probe = None, None, None, None


def _probe_ok(probe: Any) -> bool:
    """Whether a relay's answered readiness probe succeeded (a failed one: not alive)."""
    try:
        ray.get(probe)
    except Exception:  # noqa: BLE001 - any failure: the relay is not alive
        return False
    return True


__all__ = ["PROBE_S", "RELAY_PATIENCE_S", "RELAY_START_S", "RelayHung", "RelayLink", "Sent"]
