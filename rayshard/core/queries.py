"""What the coordinator's core answers without changing anything: membership checks,
plans, batch counts, progress and the loader-wide state (`CoordinatorCore` inherits
these; only `apply` changes the state)."""

from __future__ import annotations

import bisect
import json
from typing import Any

import numpy as np

from rayshard.config.loader_config import LoaderConfig
from rayshard.core import epoch_rests
from rayshard.core.leases import LeaseBook
from rayshard.core.membership import Membership
from rayshard.core.planning import epoch_plan, packed_plan
from rayshard.core.state import LoaderState
from rayshard.errors import StaleClientError
from rayshard.plan import EpochPlan
from rayshard.plan import intervals as iv
from rayshard.plan.id_runs import RunSet
from rayshard.sources.base import Source


class CoreQueries:
    """Read-only questions about a `CoordinatorCore`'s state."""

    loader_id: str
    source: Source
    settings: LoaderConfig
    num_samples: int
    made_by: dict[str, Any]
    dynamic: bool
    members: Membership | None
    started: set[int]
    books: dict[int, LeaseBook]
    rank_epoch: dict[int, int]
    resume: LoaderState | None
    received: dict[int, dict[int, int]]
    consumed: dict[int, RunSet]
    partial: dict[int, dict[int, int]]
    acked_rows: dict[int, int]
    _plans: dict[tuple, EpochPlan]
    _sample_rows: dict[tuple, int]
    _lengths: Any

    def _new_book(self, epoch: int) -> LeaseBook:  # defined by the core
        raise NotImplementedError

    def check(self, generation: int) -> Membership:
        """The membership, if `generation` is current; else a `StaleClientError`."""
        members = self.members
        if members is None or generation != members.generation:
            current = members.generation if members else None
            raise StaleClientError(
                f"client of generation {generation} talks to a loader at generation {current}: "
                "the worker group changed since this iterator was made; take a new one"
            )
        return members

    def check_epoch(self, generation: int, dp_rank: int, epoch: int, reader: str = "") -> None:
        """`check`, that the rank was not lost (its group stopped, its rows went on) and is
        not behind an epoch it started; with `reader`, that no later registration of the
        rank replaced the one given that reader."""
        if dp_rank not in self.check(generation).ranks:
            raise StaleClientError(
                f"data-parallel rank {dp_rank} was lost (its reader or a model-parallel group "
                "member died, or it left): this iterator reads no more; take a new iterator"
            )
        if not self.serves(generation, dp_rank, reader):
            raise StaleClientError(
                f"data-parallel rank {dp_rank} registered again (a newer iterator or worker "
                f"for it replaced this one, reader {reader!r}): this one stops reading; "
                "use the newest iterator"
            )
        last = self.rank_epoch.get(dp_rank)
        if last is not None and epoch < last:
            raise StaleClientError(
                f"data-parallel rank {dp_rank} asked for epoch {epoch}, but it already started "
                f"epoch {last}: a rank's epochs only go forward (set_epoch takes {last} or "
                f"later); to read epoch {epoch} again, load_state_dict a state saved in it"
            )

    def serves(self, generation: int, dp_rank: int, reader: str = "") -> bool:
        """Whether a client of `generation` is current and, if it names its `reader`, is
        the rank's latest registration (not one a newer iterator or worker replaced)."""
        members = self.members
        if members is None or generation != members.generation:
            return False
        return not reader or members.readers.get(dp_rank) == reader

    def consumers(self) -> int:
        """Consumers (world ranks) registered in the current membership: each acknowledges."""
        return len(self.members.world) if self.members is not None else 0

    def summary(self) -> dict[str, Any]:
        """Membership, plans, lease books and events: the core's part of `stats()`."""
        members, books = self.members, self.books
        return {
            "loader": self.loader_id,
            "policy": self.settings.policy.value,
            "generation": members.generation if members else 0,
            "dp_size": members.dp_size if members else 0,
            "ranks": sorted(members.ranks) if members else [],
            "readers": len(members.readers) if members else 0,
            "epochs_planned": sorted({*self.started, *books}),
            "rank_epoch": dict(self.rank_epoch),
            "leases": {e: b.snapshot() for e, b in books.items()},
            "reserved_samples": sum(b.requeued_rows for b in books.values()),
            "events": list(self.events),
        }

    def reader(self, dp_rank: int) -> str:
        """The name of `dp_rank`'s current reader ("" if it has none)."""
        return self.members.readers.get(dp_rank, "") if self.members else ""

    def plan(self, epoch: int) -> EpochPlan:
        """The static plan of `epoch` for the current membership (and resume point)."""
        m = self.members
        key = (m.generation, m.dp_size, epoch) if m else (-1, 0, epoch)
        if key not in self._plans:
            plan = epoch_plan(self.settings, self.source, self.members.dp_size, epoch, self.resume)
            if self.settings.packing is not None:
                lengths, partial = self.token_lengths(epoch), dict(self.resumed_partial(epoch))
                plan = packed_plan(
                    plan, self.settings, self.source.splits(), lengths, partial, epoch
                )
            self._plans[key] = plan
        return self._plans[key]

    def token_lengths(self, epoch: int) -> Any:
        """Tokens per sample of the packing column in `epoch`, from the Arrow offsets: read
        once; for a `MixedSource` each of its sources read once, and each epoch's mix of
        them gathered from those (the last two epochs' kept)."""
        from rayshard.data import packing

        if self._lengths is None:
            self._lengths = {}
        mix = getattr(self.source, "mix", None)
        if mix is None:
            if None not in self._lengths:
                self._lengths[None] = packing.token_lengths(self.source, self.settings.packing)
            return self._lengths[None]
        if epoch not in self._lengths:
            if "sources" not in self._lengths:  # (a source with count 0 is never read)
                self._lengths["sources"] = [
                    packing.token_lengths(part, self.settings.packing)
                    if count
                    else np.empty(0, np.int64)
                    for part, count in zip(self.source.sources, self.source.counts)
                ]
            mixed = mix(self.settings.plan.seed)
            self._lengths[epoch] = packing.mix_token_lengths(mixed, epoch, self._lengths["sources"])
            for old in sorted(k for k in self._lengths if isinstance(k, int))[:-2]:
                del self._lengths[old]
        return self._lengths[epoch]

    def length(self, dp_rank: int, epoch: int) -> int:
        """Batches `dp_rank` yields in `epoch` (dynamic: as the lease book stands now)."""
        if not self.dynamic:
            return self.plan(epoch).ranks[dp_rank].batches
        book = self.books.get(epoch) or self._new_book(epoch)  # not kept: a query
        steps = book.steps(dp_rank)  # None for a rank not in the book
        if steps is None:  # no equal steps: an even share of what is left, as an estimate
            rows = book.unleased_rows() + book.outstanding_rows()
            steps = -(-rows // (max(book.member_count(), 1) * self.settings.plan.batch_size))
        return steps

    def steps(self, dp_rank: int, epoch: int) -> int | None:
        """Batches `dp_rank` yields under equal steps as its epoch's book stands (a lease
        answer carries it; None without equal steps or a book)."""
        book = self.books.get(epoch)
        return book.steps(dp_rank) if book is not None else None

    def begun(self, epoch: int) -> bool:
        return epoch in self.started or epoch in self.books

    def settled(self, epoch: int, received: int) -> bool:
        """Every active rank acknowledged `received` batches of `epoch` (or all it has)."""
        counts = self.received.get(epoch, {})
        return all(
            counts.get(r, 0) >= min(received, self.total(epoch, r)) for r in self.active_ranks()
        )

    def state_at(self, epoch: int, received: int) -> dict:
        """The loader-wide state once `settled(epoch, received)`: an earlier epoch's rest if
        a rank no longer here left rows of it unread (`epoch_rests.left_behind`), the next
        epoch's start if `epoch` is complete, else what of it was consumed."""
        behind = epoch_rests.left_behind(self, epoch)
        epoch = epoch if behind is None else behind
        if not self.begun(epoch):
            return self.state_dict(epoch, self.resumed_consumed(epoch), self.resumed_partial(epoch))
        consumed = self.all_consumed(epoch)
        if received > 0 and not iv.subtract(self.epoch_samples(epoch), consumed):
            return self.state_dict(epoch + 1, ())
        return self.state_dict(epoch, consumed, self.all_partial(epoch))

    def regroup_epoch(self) -> int | None:
        """See `epoch_rests.regroup_epoch`."""
        return epoch_rests.regroup_epoch(self)

    def active_ranks(self) -> list[int]:
        return sorted(self.members.ranks) if self.members else []

    def resumed_consumed(self, epoch: int) -> iv.Intervals:
        resume = self.resume
        return resume.consumed if resume is not None and resume.epoch == epoch else ()

    def resumed_partial(self, epoch: int) -> tuple[tuple[int, int], ...]:
        resume = self.resume
        return resume.partial if resume is not None and resume.epoch == epoch else ()

    def all_partial(self, epoch: int) -> tuple[tuple[int, int], ...]:
        """Split documents of `epoch` partly delivered (resumed ones included), not yet
        finished: (sample index, tokens delivered), sorted."""
        merged = dict(self.resumed_partial(epoch))
        for index, tokens in self.partial.get(epoch, {}).items():
            merged[index] = max(merged.get(index, 0), tokens)
        consumed = self.all_consumed(epoch)
        return tuple(sorted((i, t) for i, t in merged.items() if not _inside(consumed, i)))

    def all_consumed(self, epoch: int) -> iv.Intervals:
        held = self.consumed.get(epoch)
        acked = held.merged() if held is not None else ()
        return iv.normalize([*acked, *self.resumed_consumed(epoch)])

    def epoch_samples(self, epoch: int) -> iv.Intervals:
        if epoch in self.started:
            return iv.normalize([*self.plan(epoch).delivered(), *self.resumed_consumed(epoch)])
        return ((0, self.num_samples),)

    def state_dict(
        self, epoch: int, consumed: iv.Intervals, partial: tuple[tuple[int, int], ...] = ()
    ) -> dict:
        members = self.members
        return LoaderState(
            loader=self.loader_id,
            epoch=epoch,
            seed=self.settings.plan.seed,
            consumed=tuple(consumed),
            world_size=members.dp_size if members else 0,
            num_samples=self.num_samples,
            partial=tuple(partial),
            made_by=json.dumps(self.made_by, sort_keys=True),
        ).to_dict()

    def epoch_may_be_complete(self, epoch: int) -> bool:
        """Whether `epoch_complete` may hold: as many rows acknowledged (repeats counted
        again) as the epoch has samples. O(1) once the epoch's size is known, where the
        full check merges every consumed run: asked on every acknowledgement of a `dynamic`
        epoch's tail, and at every registration, it alone made those quadratic."""
        m = self.members
        key = (m.generation, m.dp_size, epoch) if m else (-1, 0, epoch)
        if key not in self._sample_rows:
            self._sample_rows[key] = iv.total(self.epoch_samples(epoch))
        if epoch not in self.acked_rows:  # first asked (or since a restart): count them
            self.acked_rows[epoch] = iv.total(self.all_consumed(epoch))
        return self.acked_rows[epoch] >= self._sample_rows[key]

    def epoch_complete(self, epoch: int) -> bool:
        """Every sample of a begun `epoch` was acknowledged (the quick count first)."""
        if not (self.begun(epoch) and self.epoch_may_be_complete(epoch)):
            return False
        return not iv.subtract(self.epoch_samples(epoch), self.all_consumed(epoch))

    def start_of(self, dp_rank: int) -> int:
        """The epoch a new iterator of `dp_rank` starts with: the one its rank is in, or
        the next once the rank received all of it (a rank new to this membership: the
        resume point's epoch, or the next once that was consumed whole). A rank that comes
        back (a Train group restarted without a checkpoint, an iterator made per epoch,
        another world size) goes on from there; an earlier epoch would be refused as stale
        or come out empty. Under `dynamic` a rank new to a running loader joins the running
        epoch (the earliest the other members are in; with none, the latest any rank began),
        not the epochs they finished; so does a rank back after its epoch was forgotten."""
        epoch = self.rank_epoch.get(dp_rank)
        if self.dynamic and (epoch is None or epoch not in self.books):
            running = self._running_epoch(dp_rank)  # (10k ranks: one pass, only for these)
            if running is not None:
                return running + 1 if self.epoch_complete(running) else running
        if epoch is None:  # new in this membership: from its resume point, if it has one
            resume = self.resume
            if resume is None:
                return 0
            whole = resume.consumed and not iv.subtract(((0, self.num_samples),), resume.consumed)
            return resume.epoch + 1 if whole else resume.epoch
        received = self.received.get(epoch, {}).get(dp_rank, 0)
        done = received >= self.total(epoch, dp_rank)
        # dynamic: an epoch whose every sample was received has nothing left for any rank
        return epoch + 1 if done or (self.dynamic and self.epoch_complete(epoch)) else epoch

    def _running_epoch(self, dp_rank: int) -> int | None:
        members = self.members.ranks if self.members else set()
        others = [(r in members, e) for r, e in self.rank_epoch.items() if r != dp_rank]
        running = min((e for member, e in others if member), default=None)
        return running if running is not None else max((e for _, e in others), default=None)

    def total(self, epoch: int, dp_rank: int) -> int:
        """Batches `dp_rank` receives in a begun `epoch` (a huge number when unknown)."""
        if epoch in self.started:
            return self.plan(epoch).ranks[dp_rank].batches
        steps = self.books[epoch].steps(dp_rank) if epoch in self.books else None
        return steps if steps is not None else 1 << 62

    def held(self, dp_rank: int, epoch: int) -> iv.Intervals:
        """Rows of `epoch` leased to `dp_rank` and not taken back from it as a straggler."""
        book = self.books.get(epoch)
        return book.held(dp_rank) if book is not None else ()


def _inside(normalized: iv.Intervals, index: int) -> bool:
    """Whether `index` lies in the sorted, merged `normalized` intervals."""
    at = bisect.bisect_right(normalized, (index, float("inf"))) - 1
    return at >= 0 and normalized[at][0] <= index < normalized[at][1]


__all__ = ["CoreQueries"]
