"""A bounded, closable hand-off between the staging thread and the consumer.

`queue.Queue` cannot wake a producer blocked in `put` when the consumer goes away, which
leaves a choice between polling with timeouts and leaking a thread. This channel has a
`close()` that wakes both sides at once, so shutting a feed down never sleeps or polls.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from rayshard.config.checks import check_int

CLOSED = object()
"""What `get()` returns once the channel is closed."""

EMPTY = object()
"""What `get(timeout=...)` returns when no item came in time."""


class Channel:
    """At most `capacity` items in flight; `put` blocks while full, `get` while empty."""

    def __init__(self, capacity: int) -> None:
        check_int(capacity, "capacity", minimum=1, error=ValueError)
        self.capacity = capacity
        self._items: deque[Any] = deque()
        self._closed = False
        # One condition guards `_items` and `_closed`; both sides wait on it.
        self._changed = threading.Condition()

    def put(self, item: Any) -> bool:
        """Append `item`, waiting for room; False (item dropped) if the channel closed."""
        with self._changed:
            while len(self._items) >= self.capacity and not self._closed:
                self._changed.wait()
            if self._closed:
                return False
            self._items.append(item)
            self._changed.notify_all()
            return True

    def get(self, timeout: float | None = None) -> Any:
        """The oldest item, waiting for one; `CLOSED` once the channel is closed; `EMPTY`
        if `timeout` seconds passed without one."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._items or self._closed, timeout):
                return EMPTY
            if self._closed:
                return CLOSED
            item = self._items.popleft()
            self._changed.notify_all()
            return item

    def close(self) -> list[Any]:
        """Close both ends and return the items nobody took (for cleanup)."""
        with self._changed:
            self._closed = True
            left = list(self._items)
            self._items.clear()
            self._changed.notify_all()
            return left

    def __len__(self) -> int:
        with self._changed:
            return len(self._items)
