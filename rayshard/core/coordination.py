"""The coordinator's state and its transitions, without Ray: membership, plans, lease books,
progress and events.

`CoordinatorCore.apply(command)` is the only way the state changes; it reads no clock
(times come in the commands), draws no random number and touches no metrics, so replaying
the journal, or loading a snapshot (`to_dict`) and replaying what followed it, rebuilds the
same state. Queries: `rayshard.core.queries`; stragglers: `rayshard.core.stragglers`. The
Ray actor (`rayshard.runtime.coordinator`) checks a request, builds the command, applies
it, journals it and carries out the decision."""

from __future__ import annotations

from typing import Any

from rayshard.config.loader_config import LoaderConfig
from rayshard.core import commands as cmd
from rayshard.core import snapshots
from rayshard.core.leases import LeaseBook
from rayshard.core.membership import Membership
from rayshard.core.queries import CoreQueries
from rayshard.core.sharding import ShardingPolicy, dynamic_pieces
from rayshard.core.shuffle import lease_order
from rayshard.core.state import LoaderState
from rayshard.core.stragglers import reoffer
from rayshard.plan import EpochPlan, RankPlan
from rayshard.plan import intervals as iv
from rayshard.plan.id_runs import RunSet, as_runs, run_rows
from rayshard.sources.base import Source


class CoordinatorCore(CoreQueries):
    """Epoch, membership, plan and progress of one loader (see module docstring)."""

    def __init__(
        self, loader_id: str, source: Source, settings: LoaderConfig, instance: str = ""
    ) -> None:
        self.loader_id = loader_id
        # reader names: unique to this loader object, not shared with an earlier loader of
        # the same id (whose iterators, dropped later, would release the watches of ours)
        self.readers_prefix = f"{loader_id}:{instance}" if instance else loader_id
        self.source = source
        self.settings = settings
        self.num_samples = source.layout().num_samples
        # what the loader's id stands for: saved states carry it, a refusal names changes
        self.made_by = settings.identity_facts(source.describe(), self.num_samples)
        self.dynamic = settings.policy is ShardingPolicy.DYNAMIC
        self.members: Membership | None = None
        self.started: set[int] = set()  # epochs some rank began (static plans)
        self.books: dict[int, LeaseBook] = {}
        self.rank_epoch: dict[int, int] = {}
        self.resume: LoaderState | None = None
        self.received: dict[int, dict[int, int]] = {}  # epoch -> dp rank -> batches received
        self.consumed: dict[int, RunSet] = {}  # epoch -> consumed intervals (all ranks)
        self.acked_rows: dict[int, int] = {}  # epoch -> rows acknowledged, repeats again
        # (a cache: counted from `consumed` when first asked for, as after a restart)
        self._sample_rows: dict[tuple, int] = {}  # (generation, dp size, epoch) -> samples
        self.partial: dict[int, dict[int, int]] = {}  # epoch -> sample -> tokens delivered
        self.events = snapshots.event_log()  # (the latest `snapshots.EVENTS_KEPT`)
        self.readers_named = 0
        self._plans: dict[tuple, EpochPlan] = {}  # a cache: plans are pure functions
        self._lengths: Any = None  # packing: tokens per sample (by epoch if the source changes)
        # dp rank -> (request id, answer) of its last lease call: a retried call is answered
        # again, not granted more (the first answer may have died with the coordinator)
        self.last_lease: dict[int, tuple[str, cmd.Leased]] = {}

    # -- the one way to change the state ---------------------------------------------------
    def apply(self, command: cmd.Command) -> Any:
        """Carry out `command`; returns its decision."""
        handler = {
            cmd.Register: self._register,
            cmd.Attach: self._attach,
            cmd.Release: self._release,
            cmd.StartEpoch: self._start_epoch,
            cmd.Lease: self._lease,
            cmd.Ack: self._ack,
            cmd.Lost: self._lost,
            cmd.Restore: self._restore,
        }[type(command)]
        return handler(command)

    def _register(self, c: cmd.Register) -> cmd.Registered:
        members = self.members
        if members is None or (
            members.shrunk_to(c.dp_size) if self.dynamic else members.dp_size != c.dp_size
        ):
            members = self._new_generation(c.dp_size, c.world_size, c.time)
        replaced = members.registers_again(c.world_rank, c.dp_rank)
        back = self._lost(cmd.Lost(c.dp_rank, "replaced", c.time)).requeued_rows if replaced else 0
        members.world[c.world_rank] = c.dp_rank
        if self.dynamic and c.dp_rank not in members.ranks:
            members.dp_size = max(members.dp_size, c.dp_rank + 1)
            for book in self.books.values():
                book.join(c.dp_rank, c.time)
            if members.ranks:
                self._event("rank_joined", c.time, dp_rank=c.dp_rank)
        members.ranks.add(c.dp_rank)
        members.sizes[c.dp_rank] = c.dp_size
        if c.dp_rank not in members.readers:
            # A fresh name per reader: a rank that comes back after its reader died gets a
            # new reader, watched anew. Members of one group share the name given first.
            self.readers_named += 1
            members.readers[c.dp_rank] = (
                f"{self.readers_prefix}:reader:g{members.generation}:r{c.dp_rank}:{self.readers_named}"
            )
        members.given[c.world_rank] = members.readers[c.dp_rank]
        given = (members.generation, members.readers[c.dp_rank], members.dp_size)
        return cmd.Registered(*given, self.loader_id, self.dynamic, self.start_of(c.dp_rank), back)

    def _attach(self, c: cmd.Attach) -> cmd.Noted:
        if self.members is not None:
            self.members.attach(c.dp_rank, c.name, c.watch, c.member)
        return cmd.Noted()

    def _release(self, c: cmd.Release) -> cmd.Noted:
        if self.members is not None:
            self.members.member_watches.pop(c.name, None)
        return cmd.Noted()

    def _start_epoch(self, c: cmd.StartEpoch) -> RankPlan | int:
        """Static: the rank's plan of the epoch; dynamic: its batch count (the lease book
        made now, with the ranks known now; started again: unacknowledged rows again)."""
        again = self.rank_epoch.get(c.dp_rank) == c.epoch
        self.rank_epoch[c.dp_rank] = c.epoch
        if again:  # its loop counts its batches from the first again
            self.received.get(c.epoch, {}).pop(c.dp_rank, None)
        if self.dynamic:
            book = self._book(c.epoch, c.time)
            if again:
                book.restart(c.dp_rank)
            if c.request:  # the floor of its lease calls (see `cmd.StartEpoch`)
                self.last_lease[c.dp_rank] = (c.request, cmd.Leased())
            return self.length(c.dp_rank, c.epoch)
        self.started.add(c.epoch)
        return self.plan(c.epoch).ranks[c.dp_rank]

    def _lease(self, c: cmd.Lease) -> cmd.Leased:
        last = self.last_lease.get(c.dp_rank)
        if c.request and last is not None and last[0] == c.request:
            return last[1].with_steps(self.steps(c.dp_rank, c.epoch))
        c.check_after(last[0] if last is not None else "")  # not overtaken by a later call
        leased = self._grant(c)
        if c.request:
            self.last_lease[c.dp_rank] = (c.request, leased)
        return leased

    def _grant(self, c: cmd.Lease) -> cmd.Leased:
        self.rank_epoch[c.dp_rank] = c.epoch
        book = self._book(c.epoch, c.time)
        pieces = self._take(book, c.dp_rank, c.count, c.time, _share(book, c.share))
        if not pieces and c.finishing and book.unleased_rows():
            # Capacity held for declared ranks that never came: give it to the living.
            for rank in [r for r in book.ranks if r not in self.members.ranks]:
                book.release(rank)
            pieces = self._take(book, c.dp_rank, c.count, c.time, _share(book, c.share))
        stragglers: list[int] = []
        timeout = self.settings.straggler_timeout_s
        if not pieces and timeout is not None and not c.share:
            # An idle rank asks: work held by ranks silent for the timeout is offered to it.
            for rank, back in reoffer(book, c.dp_rank, c.time, timeout):
                stragglers.append(rank)
                self._event("straggler", c.time, dp_rank=rank, reoffered_rows=iv.total(back))
            if stragglers:
                pieces = self._take(book, c.dp_rank, c.count, c.time)
        wait = False
        if not pieces and (c.finishing or not self.settings.plan.equal_steps):
            # A rank that may end (no equal steps, or past its last step) stays while rows
            # are queued (in another rank's share) or another rank holds unfinished work:
            # rows that could come back to it if that rank died.
            wait = bool(book.unleased_rows()) or book.others_unfinished(c.dp_rank)
        held = (book.outstanding_count(), tuple(stragglers))
        counts = (book.unleased_rows(), book.member_count(), book.steps(c.dp_rank))
        return cmd.Leased(tuple(pieces), wait, *held, *counts)

    @staticmethod
    def _take(book: LeaseBook, rank: int, count: int, now: float, rows: int | None = None) -> list:
        """Up to `count` pieces for `rank`, and (`rows`) no more once they hold that many."""
        pieces, taken = [], 0
        while len(pieces) < count and (rows is None or not pieces or taken < rows):
            lease = book.lease(rank, now)
            if lease is None:
                break
            taken += lease.end - lease.start
            pieces.append((lease.start, lease.end))
        return pieces

    def _ack(self, c: cmd.Ack) -> cmd.Noted:
        counts = self.received.setdefault(c.epoch, {})
        if not self.dynamic or c.dp_rank in self.members.ranks:  # (a lost loop's are late)
            counts[c.dp_rank] = max(counts.get(c.dp_rank, 0), c.batches)
        self.consumed.setdefault(c.epoch, RunSet()).add(c.ids)
        if c.epoch in self.acked_rows:  # else counted when first asked for
            self.acked_rows[c.epoch] += run_rows(as_runs(c.ids))
        if c.partial:
            partial = self.partial.setdefault(c.epoch, {})
            for index, tokens in c.partial:
                partial[index] = max(partial.get(index, 0), tokens)
        if c.epoch in self.books:
            self.books[c.epoch].ack(c.ids, c.dp_rank, c.time)
        return cmd.Noted()

    def _lost(self, c: cmd.Lost) -> cmd.RankLost:
        members = self.members
        if members is None or c.dp_rank not in members.ranks:
            return cmd.RankLost(c.dp_rank)
        epoch = self.rank_epoch.get(c.dp_rank)  # its loop unfinished: a new one counts anew
        counts = self.received.get(epoch, {})
        if self.dynamic and counts.get(c.dp_rank, 0) < self.total(epoch, c.dp_rank):
            counts.pop(c.dp_rank, None)  # (`start_of`: its rest, not the next epoch)
        members.drop(c.dp_rank)
        requeued = [p for book in self.books.values() for p in book.release(c.dp_rank)]
        lost = {"dp_rank": c.dp_rank, "reason": c.reason, "requeued_rows": iv.total(requeued)}
        self._event("rank_lost", c.time, **lost)
        return cmd.RankLost(c.dp_rank, tuple(requeued))

    def _restore(self, c: cmd.Restore) -> cmd.Noted:
        self.resume = LoaderState.from_dict(
            c.state, expect_loader=self.loader_id, expect_made_by=self.made_by
        )
        self._forget_progress()
        self.members.generation += 1
        return cmd.Noted()

    def forget_past_epochs(self) -> list[int]:
        """Drop the progress (plans begun, books, counts, consumed samples) of epochs two or
        more behind every rank: no rank can ask for them again (an older epoch than its own
        is refused as stale, a new rank starts at the running epoch or its resume point),
        so the state, its snapshots and `stats()` stay the size of the epochs in play over
        any number of epochs. Under static policies every rank of the plan counts, so a
        rank that has not begun holds every epoch back. Returns the epochs dropped."""
        members = self.members
        if members is None:
            return []
        ranks = members.ranks if self.dynamic else members.ranks | set(range(members.dp_size))
        if not ranks or not ranks <= self.rank_epoch.keys():
            return []
        floor = min(self.rank_epoch[r] for r in ranks) - 1
        stores = (self.books, self.received, self.consumed, self.partial, self.acked_rows)
        past = sorted(e for e in {*self.started, *(e for s in stores for e in s)} if e < floor)
        for epoch in past:
            self.started.discard(epoch)
            for store in stores:
                store.pop(epoch, None)
        self._plans = {key: plan for key, plan in self._plans.items() if key[2] >= floor}
        self._sample_rows = {k: n for k, n in self._sample_rows.items() if k[2] >= floor}
        return past

    # -- snapshots (journal compaction) ----------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The whole state, JSON-safe; `load_dict` on a fresh core rebuilds it."""
        return snapshots.core_to_dict(self)

    def merged_consumed(self, epoch: int) -> iv.Intervals:
        """`epoch`'s consumed intervals, merged and kept so: snapshots merge each once."""
        return self.consumed[epoch].merged()

    def load_dict(self, data: dict[str, Any]) -> None:
        snapshots.load_core(self, data)
        self._plans.clear()

    # -- internals -------------------------------------------------------------------------
    def _new_generation(self, dp_size: int, world_size: int, time: float) -> Membership:
        old = self.members
        if old is not None:
            epoch = self.regroup_epoch()
            if epoch is not None:
                self.resume = LoaderState(
                    self.loader_id,
                    epoch,
                    self.settings.plan.seed,
                    self.all_consumed(epoch),
                    old.dp_size,
                    self.num_samples,
                    self.all_partial(epoch),
                )
            self._forget_progress()
            self._event("new_generation", time, dp_size=dp_size)
        generation = old.generation + 1 if old else 1
        self.members = Membership(generation, dp_size, world_size)
        return self.members

    def _forget_progress(self) -> None:
        kept = (self.started, self.books, self.received, self.consumed, self.acked_rows)
        for store in (*kept, self.partial, self.rank_epoch):
            store.clear()

    def _book(self, epoch: int, time: float) -> LeaseBook:
        members = self.members
        if epoch not in self.books and members.live_size() < members.dp_size:
            # A larger world's last ranks died after a smaller one registered: plan for it
            members.dp_size = members.live_size()
            self._event("world_shrunk", time, dp_size=members.dp_size, epoch=epoch)
        if epoch not in self.books:
            self.books[epoch] = self._new_book(epoch)
        return self.books[epoch]

    def _new_book(self, epoch: int) -> LeaseBook:
        members, plan = self.members, self.settings.plan
        size = members.live_size()
        splits = dynamic_pieces(plan, self.source, max(size, 1), epoch)
        if self.settings.shuffle:  # leases in a random order, the same for (seed, epoch)
            splits = lease_order(splits, plan.seed, epoch)
        # Every declared rank has a share from the start, registered or not: equal steps
        return LeaseBook(
            splits,
            sorted(members.ranks | set(range(size))),
            plan.batch_size,
            equal_steps=plan.equal_steps,
            consumed=self.resumed_consumed(epoch),
        )

    def _event(self, kind: str, time: float, **details: Any) -> None:
        self.events.append({"time": time, "event": kind, **details})


def _share(book: LeaseBook, share: bool) -> int | None:
    """Rows a paced (`share`) ask may be granted: 1 / (2 x members) of what no rank holds."""
    return -(-book.unleased_rows() // (2 * max(1, book.member_count()))) if share else None


__all__ = ["CoordinatorCore", "Membership"]
