"""The coordinator's death watch calls (`rayshard.runtime.coordinator`): readers and the
processes that read for a rank attach and are watched (`ReaderWatches`), and a watch's end
may lose the rank. A group member's process is watched under a key of its own
(`rayshard.runtime.member_watch`); its attach and its release are journaled, so a
restarted coordinator watches the members still reading again, as it does the readers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from rayshard.core import commands as cmd
from rayshard.core.coordination import CoordinatorCore
from rayshard.errors import StaleClientError
from rayshard.runtime import member_watch
from rayshard.runtime.reader_watches import FIND_S, ReaderWatches


class CoordinatorWatch:
    """The death watch part of the `Coordinator` actor (a base class of it, over the
    actor's fields below and its `_do`: apply, journal and record a command)."""

    _core: CoordinatorCore
    _watches: ReaderWatches
    _acked: asyncio.Condition  # (notified when a loss may settle a `state()`)
    _namespace: str
    _rewatch_pending: bool
    _do: Callable[[cmd.Command], Any]

    async def attach_reader(
        self, generation: int, dp_rank: int, name: str, watch: str = "", member: bool = False
    ) -> bool:
        """A worker created (or found) the reader actor `name` of `dp_rank`, or reads for
        the rank itself, watched as key `name` by `watch`: its process's watch actor, or its
        pid (a `pid_watch` token; False, nothing attached: a process neither this coordinator
        nor its node's `NodeWatch` can see). Attached even if the generation moved on (a group
        member restored a checkpoint; this one's restore follows), not to a rank lost since.
        `member`: `name` is a group member's key, watched only (`member_watch`)."""
        if not await self._watches.can_watch(watch):
            return False
        members = self._core.members
        if member:  # (not for a rank lost or replaced since: nothing to watch it for)
            if member_watch.reads_for(members, dp_rank, name):
                self._do(cmd.Attach(dp_rank, name, watch, member=True))
                self._watches.watch(dp_rank, name, watch)
            return True
        if members is None or members.readers.get(dp_rank) != name:
            self._core.check(generation)
            if dp_rank not in members.ranks:  # lost since: it would serve again, unwatched
                raise StaleClientError(
                    f"data-parallel rank {dp_rank} was lost (its reader died or it left) "
                    f"before reader {name!r} attached: take a new iterator"
                )
        self._do(cmd.Attach(dp_rank, name, watch))  # its end releases `dp_rank` (watched once)
        self._watches.watch(dp_rank, name, self._core.members.shared_watch(dp_rank, name))
        return True

    async def end_watch(self, key: str) -> None:
        """`RankWatch.end_watch` of a pid-watched rank: its loss journaled before returning."""
        self._rewatch()  # (after a restart: its rank watched again first, so it is found)
        if (dp_rank := self._watches.end(key)) is not None:
            await self._reader_ended(dp_rank, key, closed=True)

    async def _reader_ended(self, dp_rank: int, name: str, closed: bool = False) -> None:
        """The watch of `name` ended (`closed`: released): the rank may be lost (see
        `member_watch.loss`); a lost group's reader is stopped for its other members. A
        member's release is journaled (not watched again after a restart)."""
        members = self._core.members
        reason = member_watch.loss(members, dp_rank, name, closed)
        if reason is not None:
            self._do(cmd.Lost(dp_rank, reason, time.time()))
            member_watch.stop_group(self._namespace, dp_rank, name)
            async with self._acked:
                self._acked.notify_all()
        elif closed and members is not None and name in members.member_watches:
            self._do(cmd.Release(name))

    def _rewatch(self) -> None:
        """After a restart, the first call watches the journal's readers and group members
        again (one not made yet, by a worker that registered, is looked for a while:
        `FIND_S`)."""
        if self._rewatch_pending and self._core.members is not None:
            self._rewatch_pending = False
            members = self._core.members
            for dp_rank, name in list(members.readers.items()):
                self._watches.watch(dp_rank, name, members.shared_watch(dp_rank, name), FIND_S)
            for key, (dp_rank, watch) in list(members.member_watches.items()):
                self._watches.watch(dp_rank, key, watch, FIND_S)


__all__ = ["CoordinatorWatch"]
