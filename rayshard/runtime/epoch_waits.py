"""How a `dynamic` rank waits at an epoch's end, on both sides of the coordinator's calls.

A rank past its share is told to wait while other ranks hold unfinished leases or rows
are left to lease (those rows could come back to it if a rank died). Rather than poll,
it waits on the coordinator (`Coordinator.await_change`), which holds the call until
something that can change the answer happens: the epoch's last acknowledgement, a rank
lost, left or joined, a straggler's work offered again, a state restored
(`EpochWaits.signal`, rare: not every acknowledgement). Tokens (the coordinator
instance's id and a count of changes) make it free of races: a change since the token a
rank last saw ends its wait at once, and a restarted coordinator's tokens are new.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import ray

from rayshard.config.loader_config import LoaderConfig
from rayshard.core import commands as cmd
from rayshard.runtime.ray_held import ray_held

# Waits held at once. Ray runs at most 1,000 calls of an async actor at a time (its default
# `max_concurrency`): acknowledgements and leases must still find room when thousands of
# ranks wait at an epoch's end. A rank over the limit pauses on its side.
MAX_WAITING = 256
QUIET_WAIT_S = 1.0  # see `quiet_wait_s`
# A waiting rank sees its reader's stop within this: the next epoch's start joins the
# reading thread (a loop that stops at `len()` starts it while the rank waits). Measured
# here: 0.7% of a core while a rank waits, against 0.5% at 0.05 s slices.
_CANCEL_CHECK_S = 0.005


class EpochWaits:
    """The coordinator's side: the ranks' waits it holds, woken together by `signal()`."""

    def __init__(self) -> None:
        self._changed = asyncio.Event()  # set, then replaced, by `signal()`
        self._changes = 0
        self._instance = uuid.uuid4().hex[:12]
        self.held = 0  # waits held now

    def token(self) -> str:
        return f"{self._instance}:{self._changes}"

    def signal(self) -> None:
        """Wake every wait held now (later waits wait for the next change)."""
        self._changes += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self, seen: str, timeout_s: float, ended: bool) -> tuple[str, str]:
        """("changed", token) at once when the epoch `ended`, or something changed since
        `seen` ("" gets a token at once), else once something does; ("quiet", token) after
        `timeout_s`; ("busy", token) at once when `MAX_WAITING` waits are held already."""
        changed, token = self._changed, self.token()
        if ended or seen != token:
            return "changed", token
        if self.held >= MAX_WAITING:
            return "busy", token
        self.held += 1
        try:
            await asyncio.wait_for(changed.wait(), timeout_s)
            outcome = "changed"
        except asyncio.TimeoutError:
            outcome = "quiet"
        finally:
            self.held -= 1
        return outcome, self.token()


def changes_answers(command: cmd.Command, decision: Any) -> bool:
    """Whether applying `command` (with its `decision`) may change what a waiting rank is
    told, so the coordinator signals: membership (a rank lost, left, joined or replaced),
    a restored state, a straggler's work offered again. Rare: not every acknowledgement."""
    if isinstance(command, (cmd.Lost, cmd.Register, cmd.Restore)):
        return True
    return isinstance(decision, cmd.Leased) and bool(decision.stragglers)


def wait_for_change(
    coordinator: Any,
    key: tuple[int, int],
    seen: str,
    settings: LoaderConfig,
    cancel: threading.Event,
) -> str:
    """Wait, after a lease answer that said wait, until the rank should ask again: once the
    coordinator signals a change to epoch `key = (generation, epoch)` since token `seen`
    ("" gets a token at once) — the epoch's last acknowledgement ends every waiting rank's
    epoch at once — or after `quiet_wait_s(settings)`, or on `cancel`. When the coordinator
    holds no more waits, the coordinator is gone or restarting (the next lease call raises
    or retries that), or Ray is shut down, the rank pauses `lease_poll_s` here, as every
    waiting rank did before. Returns the token to pass next time."""
    with ray_held() as up:
        call = coordinator.await_change.remote(*key, seen, quiet_wait_s(settings)) if up else None
    try:
        outcome, token = ("busy", "") if call is None else _answer_unless(call, cancel)
    except ray.exceptions.RayActorError:
        outcome, token = "busy", ""
    finally:
        with ray_held():  # the reference goes while no shutdown is under way
            call = None
    if outcome == "busy":
        cancel.wait(settings.lease_poll_s)
    elif outcome == "changed" and token == seen:  # the epoch ended before the call: it
        cancel.wait(settings.lease_poll_s)  # was signalled, so this is a guard, never a loop
    return token


def quiet_wait_s(settings: LoaderConfig) -> float:
    """How long a waiting rank waits for a change before it asks again anyway: `lease_poll_s`
    with `straggler_timeout_s` set (an idle rank's ask is what takes a straggler's work
    back), else at least `QUIET_WAIT_S` (a change the coordinator does not signal)."""
    if settings.straggler_timeout_s is not None:
        return settings.lease_poll_s
    return max(settings.lease_poll_s, QUIET_WAIT_S)


def _answer_unless(call: Any, cancel: threading.Event) -> tuple[str, str]:
    """The answer to `call`, unless `cancel` is set first: then the call is cancelled (so
    the wait the coordinator holds frees its place; Ray's cancel is best effort, and a
    wait it misses lasts until a change or its timeout) and the answer is ("cancelled",
    ""). Every Ray call is made under `ray_held`, for a `ray.shutdown()` in another
    thread; once Ray is down the answer is ("busy", "")."""
    while True:
        with ray_held(blocking=False) as up:
            if up is False:
                return "busy", ""
            if up and cancel.is_set():
                ray.cancel(call)
                return "cancelled", ""
            if up and ray.wait([call], timeout=_CANCEL_CHECK_S)[0]:
                return ray.get(call)
        if up is None:  # Ray starting or shutting down in another thread
            if cancel.is_set():
                return "cancelled", ""
            cancel.wait(_CANCEL_CHECK_S)


__all__ = [
    "MAX_WAITING",
    "QUIET_WAIT_S",
    "EpochWaits",
    "changes_answers",
    "quiet_wait_s",
    "wait_for_change",
]
