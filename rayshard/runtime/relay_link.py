"""A sender's way to its node's acknowledgement relay (`rayshard.runtime.ack_relay`):
asked for when the coordinator's answer says so, taken once the relay runs, dropped when
it ends or hangs, so that its groups go straight to the coordinator meanwhile."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from typing import Any

import ray

log = logging.getLogger("rayshard.runtime.acks")  # one logger for the sender's messages
# A relayed group not answered this long is sent straight, and its relay replaced: a relay
# that hangs (a frozen process) must not hold its node's acknowledgements. The relay answers
# once the coordinator recorded the group, so this also bounds a slow coordinator's answer.
RELAY_PATIENCE_S = 10.0


@dataclasses.dataclass(frozen=True)
class Sent:
    """An acknowledgement call in flight: its reference, the group it carries (to send it
    again if its relay fails), the relay's token ("": straight to the coordinator) and when
    it was sent."""

    ref: Any
    group: tuple
    relay: str
    sent_at: float = dataclasses.field(default_factory=time.monotonic)

    def overdue(self, now: float) -> bool:
        """A relayed call not answered within `RELAY_PATIENCE_S` (a relay that hangs)."""
        return bool(self.relay) and now - self.sent_at > RELAY_PATIENCE_S

    def patience_s(self) -> float | None:
        """How much longer to wait for its answer (None: straight, as long as it takes)."""
        if not self.relay:
            return None
        return max(0.0, RELAY_PATIENCE_S - (time.monotonic() - self.sent_at))


class RelayHung(Exception):
    """A relayed call was not answered within `RELAY_PATIENCE_S`."""

    def __init__(self, entry: Sent) -> None:
        super().__init__(f"relay {entry.relay} did not answer within {RELAY_PATIENCE_S} s")


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
        would wait unrecorded, growing what a lost rank repeats. A failed step is logged;
        the next answer that asks for a relay asks again, replacing one that failed to
        start."""
        if self._asking is None or ray.wait([self._asking], timeout=0)[1]:
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
            return
        self.relay, self._asking = offered, None

    def send(self, group: tuple, straight: bool = False) -> Sent:
        """One call carrying `group` (the (args, kwargs) of `Coordinator.ack`): through the
        relay taken, or straight to the coordinator."""
        if self.relay is not None and not straight:
            return Sent(self.relay[1].ack.remote(self._sender_id, group), group, self.relay[0])
        args, options = group
        return Sent(self._coordinator.ack.remote(*args, **options), group, "")

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
                error,
                self._rank,
            )
            self.relay, self._failed = None, entry.relay
        elif not gone:
            log.warning("a relayed acknowledgement failed, sent again straight: %r", error)
        return self.send(entry.group, straight=True)

    def forget(self) -> None:
        """Drop every reference (under `ray_held()`: see `AckSender._forget`)."""
        self.relay, self._asking, self._offered = None, None, None


__all__ = ["RELAY_PATIENCE_S", "RelayHung", "RelayLink", "Sent"]
