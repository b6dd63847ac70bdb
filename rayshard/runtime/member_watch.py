"""The death watch over the members of a model-parallel group.

The members of a group read through one reader actor, which keeps each block until every
member took it or closed its iterator. A member whose process dies does neither, so the
others would wait for it for ever, and nothing would tell the coordinator that the rank is
gone (under `dynamic` its unfinished leases would never go back to the other ranks). So
each member's process is watched as a rank's is (`process_watch.watch_rank`: by its pid,
or through its process's `RankWatch`), under a key of its own, `<reader>|member<world
rank>`, with no change to the rank's membership. A member's end that was not a release
(its process or node ended) makes the coordinator record the rank as lost and stop the
reader with an error that names the member: every other member's next read past its
read-ahead raises it. A member that closes or drops its iterator releases its key first
(and leaves the reader to the others), which is no loss. A member's attach and its
release are journaled (`cmd.Attach(member=True)`, `cmd.Release`): a restarted coordinator
watches the members still reading again (`rayshard.runtime.coordinator_watch`).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import ray

from rayshard.runtime import process_watch
from rayshard.runtime.ray_held import ray_held

SEPARATOR = "|member"


def member_key(reader: str, world_rank: int) -> str:
    """The watch key of group member `world_rank` of the rank read by `reader`."""
    return f"{reader}{SEPARATOR}{world_rank}"


def parse(key: str) -> tuple[str, int | None]:
    """(reader name, member's world rank) of a member key; (key, None) for a rank's key."""
    reader, separator, member = key.rpartition(SEPARATOR)
    if not separator or not member.isdigit():
        return key, None
    return reader, int(member)


def watch_member(
    coordinator: Any,
    namespace: str,
    generation: int,
    dp: Any,
    reader: str,
    answer_now: bool,
    handle: Any,
) -> tuple[str, Any]:
    """Have this process watched as member `dp.world_rank` of the group reading through
    `reader` (see the module docstring), and keep the reader's `handle` (`keep_reader`);
    (key, `PendingWatch`)."""
    keep_reader(handle)
    key = member_key(reader, dp.world_rank)
    watch = process_watch.watch_rank(
        coordinator, namespace, generation, dp.dp_rank, key, answer_now, member=True
    )
    return key, watch


_kept: dict[bytes, Any] = {}  # actor id -> a group reader's handle, kept until it stops
_after_shutdown: list[Any] = []  # handles let go with Ray down: never dropped
_kept_lock = threading.Lock()


def keep_reader(reader: Any) -> None:
    """Keep a group's reader alive in this process until it stops or dies. Ray ends an
    actor once the handle that made it is dropped, and the member whose process made it
    may close or drop its iterator while the others read on; the rank's last member
    stops it (`ShardReader.stop`: its `watch()` returns), and only then is it let go."""
    actor = reader._actor_id.binary()
    with _kept_lock:
        if actor in _kept:
            return
        _kept[actor] = reader

    def forget() -> None:
        with ray_held() as up, _kept_lock:
            handle = _kept.pop(actor, None)
            if not up:  # a handle dropped after `ray.shutdown()` may crash the process
                _after_shutdown.append(handle)

    def stopped(_: Any) -> None:  # on Ray's thread: the handle is dropped on another
        threading.Thread(target=forget, daemon=True, name="rayshard-reader-kept").start()

    reader.watch.remote().future().add_done_callback(stopped)


def reads_for(members: Any, dp_rank: int, key: str) -> bool:
    """Whether the reader of `key` (a rank's, or a member's) is `dp_rank`'s now (not lost
    or replaced since)."""
    return members is not None and members.readers.get(dp_rank) == parse(key)[0]


def loss(members: Any, dp_rank: int, key: str, closed: bool) -> str | None:
    """Why the end of the watch of `key` loses `dp_rank` (the reason the coordinator
    records), or None: its reader is not the rank's now (lost or replaced since), or a
    member released its key (`closed`: its iterator closed or dropped). A rank's own key
    (its reader, or the process reading for it) ends it however it ended."""
    if not reads_for(members, dp_rank, key):
        return None
    member = parse(key)[1]
    if member is None:
        return "reader died"
    return None if closed else f"model-parallel member {member} died"


def stop_group(namespace: str, dp_rank: int, key: str) -> None:
    """After the loss of a member (`key`): stop the group's reader, so that the others,
    past what they read ahead, raise an error naming it rather than wait for ever."""
    reader, member = parse(key)
    if member is not None:
        with contextlib.suppress(Exception):  # (gone already: its own watch ended too)
            handle = ray.get_actor(reader, namespace=namespace)
            handle.stop.remote(died_message(reader, dp_rank, member))


def died_message(reader: str, dp_rank: int, member: int) -> str:
    """What the other members of a group whose member `member` died are told."""
    return (
        f"member {member} (world rank) of data-parallel rank {dp_rank}'s model-parallel group "
        f"died (its process or node ended without closing its iterator): the group's "
        f"reader {reader!r} stopped and the rank counts as lost (under `dynamic` its "
        "unfinished leases went back to the other ranks); restart the whole group (Ray "
        "Train does) and take new iterators"
    )


def drop_member(reader: Any, world_rank: int, key: str, watch: Any) -> None:
    """A member's iterator dropped without `close()` (a finalizer: nothing waits here):
    a thread of its own tells the reader to keep no block for it (the last member stops
    it: the rank is lost, as when a single rank's reader ends with its iterator) and
    releases the member's key."""

    def release() -> None:
        with ray_held() as up:
            if not up:  # (Ray down: nothing to do)
                return
            with contextlib.suppress(Exception):  # (the reader gone: its key all the same)
                if ray.get(reader.close_member.remote(world_rank)):
                    reader.stop.remote()
            with contextlib.suppress(Exception):
                process_watch.release(key, watch)

    with contextlib.suppress(RuntimeError):  # the interpreter exits: Ray goes with it
        threading.Thread(target=release, daemon=True, name="rayshard-member").start()


__all__ = [
    "died_message",
    "drop_member",
    "keep_reader",
    "loss",
    "member_key",
    "parse",
    "reads_for",
    "stop_group",
    "watch_member",
]
