"""The coordinator actor: the Ray shell around the pure `CoordinatorCore`. One actor per
loader. A request is checked (clients of an older `generation`, of an epoch their rank
left, or (leases) of a replaced registration are refused as stale), turned into a command,
applied to the core, journaled and answered. A restarted coordinator (Ray
`max_restarts`) loads the journal's latest snapshot and replays the commands after it; the
journal is compacted at each restart, epoch's end and restore, and every `COMPACT_EVERY`.
An async actor: one event loop, no locks. It watches each rank's reader and each group
member's process (`CoordinatorWatch`; a rank lost: under `dynamic` its unacknowledged leases
go back) and owns the nodes' relays."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rayshard.config.loader_config import LoaderConfig
from rayshard.core import commands as cmd
from rayshard.core.ack_pacing import AckAnswer, AckPacing
from rayshard.core.coordination import CoordinatorCore
from rayshard.core.state import LoaderState
from rayshard.errors import RayshardError, state_timed_out
from rayshard.plan.id_runs import as_runs
from rayshard.runtime import decision_records, journal
from rayshard.runtime.ack_relay import AckRelays, record_each
from rayshard.runtime.coordinator_watch import CoordinatorWatch
from rayshard.runtime.epoch_ends import EpochEnds
from rayshard.runtime.epoch_waits import EpochWaits, changes_answers
from rayshard.runtime.rank_usage import RankUsage
from rayshard.runtime.reader_watches import ReaderWatches
from rayshard.sources import Source

COMPACT_EVERY = 20_000  # commands between two snapshots, at the latest


class Coordinator(CoordinatorWatch):
    """Epoch, membership, plan and progress of one loader (see module docstring)."""

    def __init__(
        self,
        loader_id: str,
        source: Source,
        settings: LoaderConfig,
        namespace: str,
        journal_path: str,
        journal_is_default: bool = False,
        instance: str = "",
    ) -> None:
        self._loader_id = loader_id
        self._settings = settings
        self._core = CoordinatorCore(loader_id, source, settings, instance)
        self._usage = RankUsage()  # per rank: what its consumers got, how it leased
        self._ack_pacing = AckPacing.for_settings(settings)  # how often consumers acknowledge
        self._acked = asyncio.Condition()
        self._waits = EpochWaits()  # ranks waiting at an epoch's end (`await_change`)
        self._namespace = namespace
        self._watches = ReaderWatches(namespace, self._reader_ended)
        self._since_snapshot = 0
        self._ends = EpochEnds()  # epochs every rank received (their end compacted)
        self._relays = AckRelays(self._ack_pacing)  # the nodes' acknowledgement relays
        self._trace: list | None = None  # (time, kind, dp rank, pieces), when tracing
        self._journal = journal.Journal(journal_path, loader_id)
        self._rewatch_pending = self._journal.open_for(self._core, replace_any=journal_is_default)
        if self._rewatch_pending:  # restarted: what it replayed is not replayed again
            self._compact()

    # -- membership ------------------------------------------------------------------------
    async def register(self, world_rank: int, world_size: int, dp: dict) -> dict:
        """Join the loader; returns the generation and the name of this rank's reader.
        Static policies: a different data-parallel size starts a new generation, with the
        progress so far as the resume point. Dynamic: ranks join the running epoch."""
        decision = self._do(
            cmd.Register(world_rank, world_size, dp["dp_rank"], dp["dp_size"], time.time())
        )
        return decision.reply()

    async def leave(self, generation: int, dp_rank: int, reader: str = "") -> None:
        """A rank leaves gracefully: its unfinished leases go back to the queue. A worker
        a later registration of its rank replaced (`reader`: its name) leaves nothing."""
        if self._core.serves(generation, dp_rank, reader):
            self._do(cmd.Lost(dp_rank, "left", time.time()))

    # -- plans and leases ------------------------------------------------------------------
    async def start_epoch(self, generation: int, dp_rank: int, epoch: int, floor: str = "") -> dict:
        """A reader begins `epoch` for `dp_rank`: its static plan (or its rest) or, under
        `dynamic`, its batch count (lease book made; `floor`: `cmd.StartEpoch.request`)."""
        self._core.check_epoch(generation, dp_rank, epoch)
        decision = self._do(cmd.StartEpoch(dp_rank, epoch, time.time(), floor))
        if isinstance(decision, int):  # dynamic: leases name the registration they serve
            return {"batches": decision, "plan": None, "reader": self._core.reader(dp_rank)}
        partial = dict(self._core.resumed_partial(epoch))  # packing: tokens to skip
        return {"batches": decision.batches, "plan": decision, "partial": partial}

    async def length(self, generation: int, dp_rank: int, epoch: int) -> int:
        """Batches `dp_rank` yields in `epoch` (dynamic: as the lease book stands now)."""
        self._core.check(generation)
        return self._core.length(dp_rank, epoch)

    async def lease(
        self,
        generation: int,
        dp_rank: int,
        epoch: int,
        count: int = 1,
        finishing: bool = False,
        request: str = "",
        reader: str = "",
        share: bool = False,
        waited_s: float = 0.0,
    ) -> cmd.Leased:
        """Up to `count` pieces for `dp_rank` in one round trip. `request` identifies the
        call (Ray's retry after a restart, or a rank's past a failed relay, gets the same
        answer); `reader` (the rank's reader at the epoch's start) is refused once it
        re-registered; `share`: see `cmd.Lease`; `waited_s`: the reading's wait since its
        last call. The answer's `relay`: lease through the node's relay (as `AckAnswer`)."""
        self._core.check_epoch(generation, dp_rank, epoch, reader)
        repeat = request != "" and self._core.last_lease.get(dp_rank, ("",))[0] == request
        asked = cmd.Lease(dp_rank, epoch, count, finishing, time.time(), request, share)
        answer = self._do(asked, traced=not repeat)
        if not repeat:  # (a retried call, answered again, is counted and traced once)
            self._usage.leased(dp_rank, answer, share, waited_s)
        relay = self._ack_pacing.answer(self._core.consumers(), self._settings.ack_relay).relay
        return answer.relayed(relay)

    async def await_change(
        self, generation: int, epoch: int, seen: str, timeout_s: float
    ) -> tuple[str, str]:
        """Where a `dynamic` rank told to wait for the others' leases waits: until `epoch`
        ended or something changed since token `seen` (see `EpochWaits.wait`)."""
        return await self._waits.wait(seen, timeout_s, self._ends.ended(generation, epoch))

    async def held(self, generation: int, dp_rank: int, epoch: int) -> list:
        """Rows of `epoch` still leased to `dp_rank` (a straggler's reader drops the rest)."""
        self._core.check(generation)
        return [list(pair) for pair in self._core.held(dp_rank, epoch)]

    # -- progress and state ----------------------------------------------------------------
    async def ack(
        self,
        generation: int,
        dp_rank: int,
        epoch: int,
        batches: int,
        ids: list,
        usage: dict | None = None,
        partial: list | None = None,
    ) -> AckAnswer | None:
        """A consumer of `dp_rank` received batches up to its `batches`-th, holding samples
        `ids` (`usage`: their real samples, bytes and its stall seconds; `partial`: packed
        documents split across rows, as (sample index, tokens delivered)). Returns the
        interval to acknowledge at and whether through a relay (`AckPacing.answer`)."""
        answer = self._record_ack(generation, dp_rank, epoch, batches, ids, usage, partial)
        async with self._acked:
            self._acked.notify_all()
        return answer

    async def relayed(self, node: str, token: str, calls: list) -> list:
        """Relay `token` of `node` forwards its node's `calls`, each (method, args, kwargs)
        of `ack` or `lease`, in one call; returns their answers (or errors) in order."""
        methods = {"ack": self._record_ack, "lease": self.lease}  # (`lease` runs at once)
        with self._journal.batched():  # one write for the lot, before the answers
            answers = record_each(methods, calls)  # one refused fails alone
        self._relays.forwarded(node, token, calls, answers)
        async with self._acked:
            self._acked.notify_all()
        return answers

    async def relay(self, node: str, failed: str = "") -> tuple[str, Any]:
        """(token, handle) of the acknowledgement relay of `node` (`AckRelays.relay`)."""
        return self._relays.relay(node, failed)

    async def state(self, generation: int, epoch: int, received: int) -> dict:
        """The loader-wide state once every rank acknowledged `received` batches of `epoch`
        (or all it has, if fewer)."""
        self._core.check(generation)
        timeout_s = self._settings.state_timeout_s
        if self._core.begun(epoch):
            try:
                async with self._acked:
                    settled = self._acked.wait_for(lambda: self._core.settled(epoch, received))
                    await asyncio.wait_for(settled, timeout=timeout_s)
            except asyncio.TimeoutError:
                raise state_timed_out(self._core, epoch, received, timeout_s) from None
        return self._core.state_at(epoch, received)

    async def restore(
        self, state: dict, restored_at: int | None = None, dp_rank: int = -1
    ) -> tuple[int, int]:
        """Resume from a saved state (a new generation: readers drop what they read ahead);
        (epoch, generation). Peers' loads of the current state join it; a rank that restored
        at this generation (`restored_at`) and was acknowledged since restores it again."""
        loaded = LoaderState.from_dict(
            state,
            expect_loader=self._loader_id,
            expect_made_by=self._core.made_by,
            expect_num_samples=self._core.num_samples,
        )
        if self._core.members is None:
            raise RayshardError("restore() before any rank registered: take an iterator first")
        acked = any(dp_rank in counts for counts in self._core.received.values())
        again = restored_at == self._core.members.generation and acked
        if self._core.resume != loaded or again:
            self._do(cmd.Restore(loaded.to_dict(), time.time()))
            self._compact()
        return loaded.epoch, self._core.members.generation

    async def describe(self) -> dict:
        """Membership, progress and events, for `stats()`, experiments and debugging."""
        since = {"journal_commands_since_snapshot": self._since_snapshot}
        since.update(waits_held=self._waits.held, **self._watches.counts(), **self._relays.counts())
        since["ack_interval_asked_s"] = self._ack_pacing.interval_s(self._core.consumers())
        return {**self._core.summary(), **self._usage.summary(), **since}

    async def reader_names(self) -> list[str]:
        """Reader actors this loader named and saw attached, for `Loader.shutdown`."""
        members = self._core.members
        return self._watches.actors(set(members.readers.values() if members else ()))

    async def shared_watches(self) -> list[tuple[str, str]]:
        """(watch actor, key) of each rank a `RankWatch` watched, for `Loader.shutdown`."""
        return self._watches.shared_keys()

    async def ping(self) -> bool:
        self._rewatch()
        return True

    async def close(self, remove_journal: bool) -> None:
        """`Loader.shutdown`, before the kill: journal nothing more (`Journal.close`)."""
        self._journal.close(remove=remove_journal)

    async def trace(self, enable: bool = True) -> list:
        """Record leases and rank losses from now on (`enable`), or stop; returns those so far."""
        recorded, self._trace = list(self._trace or []), ([] if enable else None)
        return recorded

    # -- load, step, journal ---------------------------------------------------------------
    def _do(self, command: cmd.Command, traced: bool = True) -> Any:
        self._ack_pacing.called(time.monotonic(), time.process_time)  # its CPU per call
        self._rewatch()
        decision = self._core.apply(command)
        self._journal.append(command.to_entry())
        self._since_snapshot += 1
        decision_records.record(self._loader_id, command, decision, self._trace if traced else None)
        if self._since_snapshot >= COMPACT_EVERY:
            self._compact()
        if changes_answers(command, decision):
            self._waits.signal()
        return decision

    def _record_ack(self, generation, dp_rank, epoch, batches, ids, usage=None, partial=None):
        """`ack`, short of waking `state()`: None for a previous generation's late group."""
        if not self._core.serves(generation, dp_rank):
            return None
        pairs = tuple(tuple(int(x) for x in pair) for pair in partial or ())
        ids = as_runs(ids)  # (n, 2) int64: no Python object per pair
        self._do(cmd.Ack(dp_rank, epoch, batches, ids, time.time(), pairs))
        self._usage.acked(dp_rank, usage)
        if self._ends.acked(self._core, generation, epoch, dp_rank, batches):
            self._compact()
            self._waits.signal()
        return self._ack_pacing.answer(self._core.consumers(), self._settings.ack_relay)

    def _compact(self) -> None:
        """Replace the journal by one snapshot of the core's state (without the progress of
        epochs every rank is past: snapshots stay the size of the epochs in play)."""
        self._core.forget_past_epochs()
        self._journal.compact(self._core.to_dict())
        self._since_snapshot = 0
