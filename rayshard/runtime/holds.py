"""What an iterator holds for its rank, and lets go when it is closed or dropped: the
rank's place in the loader (`leave`), its reader actor (or, for a rank that reads in its
consumer, the watch that stands for it: `process_watch`), and a model-parallel member's
own watch and share of the group's reader (`member_watch`)."""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import ray

from rayshard.plan import DataParallelRank
from rayshard.runtime import member_watch, process_watch
from rayshard.runtime.local_reads import abandon_rank
from rayshard.runtime.ray_held import ray_held

RELEASE_WAIT_S = 30.0  # a closing member waits this long for its watch to take its end


class Holds:
    """The rank's reader and watches as one iterator (`owner`) holds them."""

    def __init__(
        self,
        owner: Any,
        coordinator: Any,
        registration: dict,
        placement: DataParallelRank,
        local_reads: Any,
    ) -> None:
        self.coordinator = coordinator
        self.reader = registration["reader"]  # a `ShardReader`, or a `PendingWatch`
        self.reader_name = registration.get("reader_name", "")
        self.watch_key = key = registration.get("watch_key")  # the reader is a shared watch
        self.placement = placement
        self.local = local_reads  # a `LocalReads`: the worker reads for itself
        self._member = registration.get("member_watch")  # (key, `PendingWatch`) of a member
        # Finalizers, for an `owner` dropped unclosed: the rank's key, the member's share.
        self._dropped: Any = None
        if key is not None:
            self._dropped = weakref.finalize(owner, abandon_rank, self.local, self.reader, key)
        self._member_dropped: Any = None
        if self._member is not None:
            member = (self.reader, placement.world_rank, *self._member)
            self._member_dropped = weakref.finalize(owner, member_watch.drop_member, *member)

    def settle(self) -> None:
        """Before the first reads of an epoch: the attaches answered (`watch_rank`; an
        error of one is raised here)."""
        if self.local is not None and self.reader is not None:  # (None: closed)
            self.reader.settled()
        if self._member is not None and self._member_dropped.alive:
            self._member[1].settled()

    def close(self, generation: int) -> None:
        """Leave the coordinator and stop the reader, or, a group's member, leave the
        reader to the others (`close_member`) unless it is the last; then release the
        watches' keys. A no-op after `Loader.shutdown()` or `ray.shutdown()`."""
        try:
            with ray_held() as up:
                if up:
                    self._leave(generation)
        except ray.exceptions.RayActorError:
            pass  # the loader was shut down: coordinator and readers are gone
        finally:  # the keys are stopped, and a watch released once the process has none
            if self._dropped is not None and self._dropped.detach():
                with ray_held() as up:  # after `ray.shutdown()`: no Ray call
                    watch = self.reader if up else None
                    self.reader = process_watch.release(self.watch_key, watch)
            if self._member_dropped is not None and self._member_dropped.detach():
                key, watch = self._member
                with ray_held() as up:
                    if up:
                        watch.closing()  # (its attach answered first: see `watch_rank`)
                    process_watch.release(key, watch if up else None)
                    if up and watch.ended_call is not None:  # taken before this process
                        with contextlib.suppress(Exception):  # may end: no death then
                            ray.get(watch.ended_call, timeout=RELEASE_WAIT_S)

    def _leave(self, generation: int) -> None:
        placement = (generation, self.placement.dp_rank, self.reader_name)
        if self.watch_key is not None and self.reader is not None:  # not closed before:
            self.reader.closing()  # its attach answered first (`watch_rank`)
        elif self.watch_key is None and not self._last_of_group():
            return
        try:
            ray.get(self.coordinator.leave.remote(*placement))
        finally:  # (also with the coordinator gone: a group's reader is kept till it stops)
            if self.watch_key is None:
                self.reader.stop.remote()

    def _last_of_group(self) -> bool:
        rank, alone = self.placement.world_rank, len(self.placement.group) == 1
        return alone or ray.get(self.reader.close_member.remote(rank))


__all__ = ["Holds"]
