"""How long the suite waits for the events its whole-cluster scenarios assert on: one place,
overridable from the environment, named in every timeout message.

Scenarios wait for progress (a checkpoint reported, a node removed, a rank lost), never
for a fixed number of seconds, and assert only what the code guarantees; a timeout here
means an event never came, not that it came late. The values are generous because a
loaded 2-core machine may be several times slower than a quiet one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

EVENT_ENV = "RAYSHARD_TEST_EVENT_TIMEOUT_S"
SCENARIO_ENV = "RAYSHARD_TEST_SCENARIO_TIMEOUT_S"

# One awaited event (a checkpoint, a node loss noticed, a rank's first batches).
EVENT_TIMEOUT_S = float(os.environ.get(EVENT_ENV, "150"))
# A whole scenario subprocess (its own cluster, several events); below pytest's 600 s.
SCENARIO_TIMEOUT_S = float(os.environ.get(SCENARIO_ENV, "540"))


def event_timeout_message(what: str) -> str:
    return f"timed out after {EVENT_ENV}={EVENT_TIMEOUT_S:g} s waiting for {what}"


def scenario_timeout_message(name: str) -> str:
    return f"scenario {name} ran past {SCENARIO_ENV}={SCENARIO_TIMEOUT_S:g} s"


def wait_until(predicate: Callable[[], Any], what: str, poll: float = 0.1) -> Any:
    """`predicate()`'s first true value, polled every `poll` s for up to the event
    timeout; past it, an AssertionError naming `what`."""
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(event_timeout_message(what))
        time.sleep(poll)
