"""One `RankWatch` per process, shared by every rank the process reads for, where the
coordinator cannot watch the process by its pid, itself or through the `NodeWatch` of the
process's node (`watch_rank`, `pid_watch`, `node_watch`).

Starting an actor is a new process (about 1 s of CPU, Ray does not reuse task workers
for actors); a process that makes several iterators (a train and a validation loader, a
second loader on a warm Ray, a test suite) pays it once while the watch is in use, or
unused for less than `IDLE_RELEASE_S`. This module holds the handle that made the watch:
Ray ends an actor once its owner holds no handle to it.

A watch nobody uses is released: `process_watch` holds a rank's key for the iterator that
reads it, `release` lets it go (the iterator closed or was dropped), and a thread of this
module drops the handle of a watch that has held no key for `IDLE_RELEASE_S` (Ray then
ends it). A process that owns an actor is never reclaimed by Ray, so a task worker that
once read for a rank would otherwise stay, with its watch, for the rest of the job. Each
watch has a name of its own (the process's Ray worker id and a serial), so a new iterator
never finds a watch that is being released; `get_if_exists` finds the live one, or makes
it again if it died.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayshard.runtime import pid_watch
from rayshard.runtime.ray_held import ray_held
from rayshard.runtime.remote import remote_class
from rayshard.runtime.watch import RankWatch

IDLE_RELEASE_S = 60.0  # an unused watch is kept this long for the process's next iterator


@dataclasses.dataclass
class WatchUse:
    """Which keys a process's watch holds, and since when it holds none (pure)."""

    name: str
    connection: str  # this process's Ray connection when the watch was made
    handle: Any = None
    keys: set[str] = dataclasses.field(default_factory=set)
    idle_since: float | None = None

    def hold(self, key: str) -> None:
        self.keys.add(key)
        self.idle_since = None

    def release(self, key: str, now: float) -> bool:
        """Let `key` go; whether the watch became idle with it."""
        if key not in self.keys:
            return False
        self.keys.discard(key)
        if self.keys:
            return False
        self.idle_since = now
        return True

    def expired(self, now: float, idle_s: float) -> bool:
        """Whether the watch has held no key for `idle_s` seconds."""
        return not self.keys and self.idle_since is not None and now - self.idle_since >= idle_s


_watches: dict[str, WatchUse] = {}  # namespace -> this process's watch there
_earlier: list[WatchUse] = []  # watches of a Ray this process shut down: handles kept
_serial = itertools.count()
_lock = threading.RLock()  # re-entrant: `release` runs in garbage-collector finalizers
_expiry: threading.Thread | None = None  # ends unused watches (started by `process_watch`)


def process_watch(namespace: str, key: str) -> tuple[str, Any]:
    """The name and handle of this process's watch in `namespace` (made on first use, on
    this node: it must share the process's fate), holding `key` until `release(key)`."""
    context = ray.get_runtime_context()
    ray_here = _connection()
    with _lock:
        use = _watches.get(namespace)
        if use is None or use.connection != ray_here:  # first use, or Ray started again here
            if use is not None:  # its handle is of the earlier Ray: never dropped
                _earlier.append(use)
            use = WatchUse(f"rayshard-watch-{context.get_worker_id()}-{next(_serial)}", ray_here)
        here = NodeAffinitySchedulingStrategy(context.get_node_id(), soft=False)
        options = {"name": use.name, "namespace": namespace, "get_if_exists": True}
        options.update(num_cpus=0, scheduling_strategy=here)
        handle = remote_class(RankWatch).options(**options).remote()
        # Keep the handle that made the actor: a handle `get_if_exists` found is not
        # counted as the owner's, and dropping the first one would end the watch.
        if use.handle is None or use.handle._actor_id != handle._actor_id:
            use.handle = handle
        use.hold(key)
        _watches[namespace] = use
        _start_expiry()
        return use.name, use.handle


class PendingWatch:
    """What watches a rank read for in this process, once the coordinator answered its
    attach (`watch_rank`): the coordinator, which watches the process by its pid, or, where
    it cannot see the process, this process's `RankWatch` (made then, and attached)."""

    def __init__(self, coordinator: Any, key: str, answer: Any, by_rank_watch: Any) -> None:
        self._coordinator = coordinator
        self._key = key  # the rank's key in its watch (its reader's name)
        self._answer = answer  # the attach's `ObjectRef`; None once answered
        self._by_rank_watch = by_rank_watch  # makes and attaches this process's `RankWatch`
        self._ray = _connection()  # the Ray the attach was sent to
        self._watch: Any = None
        self._released = False  # its iterator closed or was dropped
        self._closing = False  # it closed: its leave releases the rank if nothing watches it
        self._ended: Any = None  # the watch whose `end_watch(key)` was sent
        self.ended_call: Any = None  # that call's `ObjectRef` (a closing member waits)
        self._lock = threading.RLock()  # a finalizer may release on the settling thread

    def settled(self) -> Any:
        """The watch, whose `end_watch(key)` releases the rank, once the coordinator
        answered the attach (waits for it): a refused one makes the `RankWatch` now. A
        released one is ended instead (`release`), raising no error of the attach."""
        with self._lock:
            self._take_answer(raise_error=not self._released)
            if self._released:  # before the answer, or meanwhile (a finalizer, this thread)
                if not self._closing:  # (a closing iterator ends it after its leave)
                    self._end()
            elif self._watch is None:
                self._watch = self._by_rank_watch()
            return self._watch

    def closing(self) -> None:
        """The iterator closes: wait for the attach's answer, so that its leave comes
        after the attach; a refused one makes no `RankWatch` (the leave releases the rank)."""
        with self._lock:
            self._released = self._closing = True
            self._take_answer(raise_error=False)

    def release(self, blocking: bool = True) -> bool:
        """The rank no longer reads in this process (its iterator closed or was dropped):
        end its watch's key; where nothing watches a dropped one's rank (its attach was
        refused before the `RankWatch` was made), make it and end its key, as its death
        would. Never waits for the attach's answer: the thread that waits for it ends the
        rank (`settle_when_answered`). False (nothing done) if not `blocking` and that
        would wait for this watch or a Ray call. Call under `ray_held`."""
        if not self._lock.acquire(blocking=blocking):
            return False
        try:
            self._released = True
            if self._answer is not None and not ray.wait([self._answer], timeout=0)[0]:
                return True
            self._take_answer(raise_error=False)  # answered: no wait
            if not blocking and self._watch is None and not self._closing:
                return False  # a `RankWatch` to make: not in a finalizer
            self._end()
            return True
        finally:
            self._lock.release()

    def settle_when_answered(self) -> None:
        """Settle on a thread of its own once the attach is answered: a refused one falls
        back to the `RankWatch` then, not at the first reads, so that a process that ends
        before those (while it builds its model, say) still releases its rank; a released
        one is ended then. An error is left for the first reads to raise."""

        def settle() -> None:
            with ray_held() as up, contextlib.suppress(Exception):
                if up and _connection() == self._ray:  # not a Ray started since
                    self.settled()

        def answered(_: Any) -> None:  # on Ray's thread: no Ray call there
            threading.Thread(target=settle, daemon=True, name="rayshard-attach").start()

        self._answer.future().add_done_callback(answered)

    def _take_answer(self, raise_error: bool) -> None:
        if self._answer is None:
            return
        try:
            attached = ray.get(self._answer)
        except Exception:  # noqa: BLE001 - an attach that failed attached nothing
            if raise_error:
                raise
            attached = False
        self._answer = None
        self._watch = self._coordinator if attached else None

    def _end(self) -> None:
        """End the rank's key in its watch (once a watch); a dropped rank nothing watches
        gets its `RankWatch` first (the process's bookkeeping lets the key go at once)."""
        if self._watch is None and not self._closing:
            self._watch = self._by_rank_watch()
            release(self._key)
        if self._watch is not None and self._ended is not self._watch:
            self._ended = self._watch
            with contextlib.suppress(Exception):  # the watch is gone: nothing to stop
                self.ended_call = self._watch.end_watch.remote(self._key)


def watch_rank(
    coordinator: Any,
    namespace: str,
    generation: int,
    dp_rank: int,
    key: str,
    answer_now: bool = True,
    member: bool = False,
) -> PendingWatch:
    """Have `dp_rank`, read for in this process, watched under `key` (and attached): by
    the coordinator through this process's pid where it can see this process (on its
    node, or through this node's `NodeWatch`: see `pid_watch`, `node_watch`), else by this
    process's `RankWatch` in `namespace`. Without `answer_now` (a process on another node
    than the coordinator's) the attach by pid is not waited for: its answer may wait for
    this node's `NodeWatch` to start, which the iterator's first reads wait for instead
    (`PendingWatch.settled`), after what the loop does between making the iterator and
    iterating it; a refusal makes the `RankWatch` as soon as it comes. `member`: the
    process of a model-parallel group's member, watched without attaching (`member_watch`)."""

    def by_rank_watch() -> Any:
        name, watch = process_watch(namespace, key)
        try:
            ray.get(coordinator.attach_reader.remote(generation, dp_rank, key, name, member))
        except BaseException:
            release(key)  # no iterator will hold the key: the watch may be released
            raise
        return watch

    token = pid_watch.token_here(ray.get_runtime_context().get_node_id())
    answer = None
    if token is not None:
        answer = coordinator.attach_reader.remote(generation, dp_rank, key, token, member)
    pending = PendingWatch(coordinator, key, answer, by_rank_watch)
    if token is None or answer_now:
        pending.settled()  # attached before the iterator is made; an error raised here
    else:
        pending.settle_when_answered()
    return pending


def release(key: str, watch: Any = None, blocking: bool = True) -> Any:
    """The rank watched under `key` no longer reads in this process (its iterator was
    closed or dropped); a watch left without keys ends after `IDLE_RELEASE_S`. With
    `watch` (a handle or a `PendingWatch`: call under `ray_held`), the key is ended there
    too (`watch` is the coordinator for a rank watched by its process's pid). Returns None,
    for the caller's handle (a closed iterator holding it would keep the watch), or False
    when not `blocking` and the bookkeeping's lock was busy (nothing was released)."""
    if isinstance(watch, PendingWatch):  # it ends its watch (see `PendingWatch.release`)
        if not watch.release(blocking=blocking):
            return False
        watch = None
    if not _lock.acquire(blocking=blocking):
        return False
    try:
        if watch is not None:
            with contextlib.suppress(Exception):  # the watch is gone: nothing to stop
                watch.end_watch.remote(key)
        now = time.monotonic()
        for use in _watches.values():
            use.release(key, now)
    finally:
        _lock.release()
    return None


def _connection() -> str:
    """This process's Ray connection (a new local Ray has a new node id, while a driver's
    worker id, made from its job id, may repeat)."""
    context = ray.get_runtime_context()
    return f"{context.get_node_id()}:{context.get_worker_id()}"


def _start_expiry() -> None:
    """Start the thread that ends unused watches, if it is not running (under `_lock`)."""
    global _expiry
    if _expiry is None or not _expiry.is_alive():
        _expiry = threading.Thread(target=_end_unused, daemon=True, name="rayshard-watches")
        _expiry.start()


def _end_unused() -> None:
    """Every quarter of `IDLE_RELEASE_S` (at most 5 s), drop the owner's handle of each
    watch idle that long (Ray then ends the actor). Under Ray's lock and `_lock`, taken
    without waiting (a dropped handle calls into Ray; `process_watch` may start Ray under
    `_lock`): a busy round is skipped. Ends once no watch is left."""
    global _expiry
    while True:
        time.sleep(min(5.0, max(0.05, IDLE_RELEASE_S / 4)))
        with ray_held(blocking=False) as up:
            if up is None or not _lock.acquire(blocking=False):
                continue
            try:
                ray_here = _connection() if up else None
                for namespace, use in list(_watches.items()):
                    if use.connection != ray_here:  # Ray went down or started again: keep
                        _earlier.append(_watches.pop(namespace))
                    elif use.expired(time.monotonic(), IDLE_RELEASE_S):
                        del _watches[namespace]
                        use.handle = None
                if not _watches:
                    _expiry = None
                    return
            finally:
                _lock.release()


__all__ = ["IDLE_RELEASE_S", "PendingWatch", "WatchUse", "process_watch", "release", "watch_rank"]
