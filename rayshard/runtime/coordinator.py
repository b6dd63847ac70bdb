"""The coordinator: one Ray actor per loader holding epoch, membership, plan and progress.

It is an async actor: one event loop, so its fields need no lock, and `state()` can wait
for other ranks' acknowledgements without blocking them. Every change is applied by a
plain method (`_apply_*`) and written to the journal before the caller gets an answer; a
restarted coordinator (Ray `max_restarts`) replays the journal through the same methods.

Clients carry the membership `generation` they registered under; a client of an older
generation, or one asking for an epoch its rank has already left, is rejected as stale.
Readers (one per data-parallel rank) are created by the workers they feed, so they share
the worker's fate, not the coordinator's; the coordinator watches each one and, under the
`dynamic` policy, puts a dead reader's unacknowledged leases back into the queue.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import ray

from rayshard import metrics
from rayshard.errors import RayshardError, StaleClientError
from rayshard.leases import LeaseBook
from rayshard.plan import EpochPlan, RankPlan
from rayshard.plan import intervals as iv
from rayshard.runtime.journal import Journal
from rayshard.runtime.planning import epoch_plan
from rayshard.settings import LoaderSettings
from rayshard.sharding import ShardingPolicy, assign
from rayshard.sources import Source
from rayshard.state import LoaderState


@dataclasses.dataclass
class _Membership:
    generation: int
    dp_size: int
    world_size: int
    ranks: set[int] = dataclasses.field(default_factory=set)  # registered dp ranks
    world: dict[int, int] = dataclasses.field(default_factory=dict)  # world rank -> dp rank
    readers: dict[int, str] = dataclasses.field(default_factory=dict)  # dp rank -> actor name


class Coordinator:
    """Epoch, membership, plan and progress of one loader (see module docstring)."""

    def __init__(
        self,
        loader_id: str,
        source: Source,
        settings: LoaderSettings,
        namespace: str,
        journal_path: str,
        journal_is_default: bool = False,
    ) -> None:
        self._loader_id = loader_id
        self._source = source
        self._settings = settings
        self._namespace = namespace
        self._layout = source.layout()
        self._dynamic = settings.policy is ShardingPolicy.DYNAMIC
        self._members: _Membership | None = None
        self._plans: dict[int, EpochPlan] = {}
        self._books: dict[int, LeaseBook] = {}
        self._rank_epoch: dict[int, int] = {}
        self._resume: LoaderState | None = None
        # epoch -> dp rank -> batches received; epoch -> consumed intervals (all ranks)
        self._received: dict[int, dict[int, int]] = {}
        self._consumed: dict[int, list[iv.Interval]] = {}
        self._events: list[dict] = []
        self._readers_named = 0
        self._usage: dict[int, dict] = {}  # dp rank -> totals of what its consumers got
        self._acked = asyncio.Condition()
        self._watched: dict[str, Any] = {}
        self._rewatch_pending = False
        self._journal = Journal(journal_path, loader_id)
        if ray.get_runtime_context().was_current_actor_reconstructed:
            for entry in self._journal.replay():
                getattr(self, f"_apply_{entry['op']}")(**entry["args"])
            self._event("coordinator_restarted")
            self._rewatch_pending = True
        else:
            self._journal.start_fresh(replace_any=journal_is_default)

    # -- membership ------------------------------------------------------------------------
    async def register(self, world_rank: int, world_size: int, dp: dict) -> dict:
        """Join the loader; returns the generation and the name of this rank's reader.

        Static policies: a different data-parallel size starts a new generation, with the
        progress so far as the resume point. Dynamic: ranks join the running epoch.
        """
        return self._record("register", world_rank=world_rank, world_size=world_size, dp=dp)

    async def attach_reader(self, generation: int, dp_rank: int, name: str) -> None:
        """A worker created (or found) the reader actor `name` of `dp_rank`; watch it.

        The reader named at registration is attached even if the generation moved on
        since (another worker of a restarted group restored the checkpoint in between;
        this worker's own restore then moves it to the new generation)."""
        members = self._members
        if members is None or members.readers.get(dp_rank) != name:
            self._check(generation)
        self._record("attach", dp_rank=dp_rank, name=name)
        self._watch(dp_rank, name)

    async def leave(self, generation: int, dp_rank: int) -> None:
        """A rank leaves gracefully: its unfinished leases go back to the queue."""
        if self._members is not None and generation == self._members.generation:
            self._record("lost", dp_rank=dp_rank, reason="left")

    # -- plans and leases ------------------------------------------------------------------
    async def rank_plan(self, generation: int, dp_rank: int, epoch: int) -> RankPlan:
        """The static plan of one rank for `epoch` (the rest of it, when resuming there)."""
        self._check_epoch(generation, dp_rank, epoch)
        self._record("epoch", dp_rank=dp_rank, epoch=epoch)
        return self._plan(epoch).ranks[dp_rank]

    async def length(self, generation: int, dp_rank: int, epoch: int) -> int:
        """Batches `dp_rank` yields in `epoch` (dynamic: as the lease book stands now)."""
        self._check(generation)
        if not self._dynamic:
            return self._plan(epoch).ranks[dp_rank].batches
        steps = self._book(epoch).steps(dp_rank)
        if steps is None:  # no equal steps: an even share of what is left, as an estimate
            book = self._book(epoch)
            rows = book.unleased_rows() + sum(le.end - le.start for le in book.outstanding())
            steps = -(-rows // (max(len(book.ranks), 1) * self._settings.plan.batch_size))
        return steps

    async def lease(
        self, generation: int, dp_rank: int, epoch: int, finishing: bool = False
    ) -> list[int] | str | None:
        """The next split piece `[start, end)` for `dp_rank`; None when it has no more;
        "wait" when work may still come back (ask again shortly)."""
        self._check_epoch(generation, dp_rank, epoch)
        piece = self._record("lease", dp_rank=dp_rank, epoch=epoch)
        book = self._book(epoch)
        if piece is None and finishing and book.unleased_rows():
            # Capacity held for declared ranks that never came: give it to the living.
            absent = [r for r in book.ranks if r not in self._members.ranks]
            for rank in absent:
                self._record("release", epoch=epoch, dp_rank=rank)
            if absent:
                piece = self._record("lease", dp_rank=dp_rank, epoch=epoch)
        if piece is None and (finishing or not self._settings.plan.equal_steps):
            # A rank that may end (no equal steps, or past its last step) stays until no
            # other rank holds unfinished work that could come back if that rank died.
            book.close_finished()
            if any(le.rank != dp_rank for le in book.outstanding()):
                return "wait"
        return piece

    async def lease_many(
        self, generation: int, dp_rank: int, epoch: int, count: int, finishing: bool = False
    ) -> list[list[int]] | str | None:
        """Up to `count` pieces in one call (one round trip instead of `count`); the rules
        are `lease`'s: None when there is no more, "wait" to ask again shortly."""
        first = await self.lease(generation, dp_rank, epoch, finishing)
        if not isinstance(first, list):
            return first
        pieces = [first]
        while len(pieces) < count:
            piece = self._record("lease", dp_rank=dp_rank, epoch=epoch)
            if piece is None:
                break
            pieces.append(piece)
        return pieces

    async def steps(self, generation: int, dp_rank: int, epoch: int) -> int | None:
        """Final batch count of `dp_rank` under equal steps (asked once its leases ran out)."""
        self._check(generation)
        return self._book(epoch).steps(dp_rank)

    # -- progress and state ----------------------------------------------------------------
    async def ack(
        self,
        generation: int,
        dp_rank: int,
        epoch: int,
        batches: int,
        ids: list,
        usage: dict | None = None,
    ) -> None:
        """A consumer of `dp_rank` received batches up to its `batches`-th, holding samples
        `ids` (`usage`: their real samples, bytes and the consumer's stall seconds)."""
        if self._members is None or generation != self._members.generation:
            return  # late acknowledgement of a previous generation: already accounted
        self._record("ack", dp_rank=dp_rank, epoch=epoch, batches=batches, ids=ids)
        totals = self._usage.setdefault(
            dp_rank, {"batches": 0, "samples": 0, "bytes": 0, "stall_s": 0.0}
        )
        for key, value in (usage or {}).items():
            totals[key] = totals.get(key, 0) + value
        async with self._acked:
            self._acked.notify_all()

    async def state(self, generation: int, epoch: int, received: int) -> dict:
        """The loader-wide state once every rank acknowledged `received` batches of `epoch`
        (or all it has, if fewer)."""
        self._check(generation)
        if epoch not in self._plans and epoch not in self._books:
            return self._state_dict(epoch, self._resumed_consumed(epoch))

        def settled() -> bool:
            counts = self._received.get(epoch, {})
            return all(
                counts.get(r, 0) >= min(received, self._total(epoch, r))
                for r in self._active_ranks()
            )

        try:
            async with self._acked:
                await asyncio.wait_for(
                    self._acked.wait_for(settled), timeout=self._settings.state_timeout_s
                )
        except asyncio.TimeoutError:
            raise RayshardError(
                f"not every rank acknowledged {received} batches of epoch {epoch} within "
                f"state_timeout_s={self._settings.state_timeout_s}: call state_dict() at the "
                "same step on every rank, or raise state_timeout_s"
            ) from None
        consumed = self._all_consumed(epoch)
        if received > 0 and not iv.subtract(self._epoch_samples(epoch), consumed):
            return self._state_dict(epoch + 1, ())
        return self._state_dict(epoch, consumed)

    async def restore(self, state: dict) -> tuple[int, int]:
        """Resume from a saved state; idempotent, so every rank may call it. A new state
        starts a new generation (same members), so readers drop what they read ahead.
        Returns (epoch, generation)."""
        loaded = LoaderState.from_dict(state, expect_loader=self._loader_id)
        if self._members is None:
            raise RayshardError("restore() before any rank registered: take an iterator first")
        if self._resume != loaded:
            self._record("restore", state=loaded.to_dict())
        return loaded.epoch, self._members.generation

    async def describe(self) -> dict:
        """Membership, progress and events, for `stats()`, experiments and debugging."""
        members = self._members
        return {
            "loader": self._loader_id,
            "policy": self._settings.policy.value,
            "generation": members.generation if members else 0,
            "dp_size": members.dp_size if members else 0,
            "ranks": sorted(members.ranks) if members else [],
            "readers": len(members.readers) if members else 0,
            "epochs_planned": sorted({*self._plans, *self._books}),
            "rank_epoch": dict(self._rank_epoch),
            "leases": {e: b.snapshot() for e, b in self._books.items()},
            "consumers": {r: dict(u) for r, u in sorted(self._usage.items())},
            "reserved_samples": sum(b.requeued_rows for b in self._books.values()),
            "events": list(self._events),
        }

    async def reader_names(self) -> list[str]:
        """Every reader this loader named and saw attached (for `Loader.shutdown`)."""
        names = set(self._watched)
        if self._members is not None:
            names.update(self._members.readers.values())
        return sorted(names)

    async def ping(self) -> bool:
        self._rewatch()
        return True

    # -- journaled changes -----------------------------------------------------------------
    def _record(self, op: str, **args: Any) -> Any:
        self._rewatch()
        result = getattr(self, f"_apply_{op}")(**args)
        self._journal.append({"op": op, "args": args})
        return result

    def _apply_register(self, world_rank: int, world_size: int, dp: dict) -> dict:
        members = self._members
        if members is None or (not self._dynamic and members.dp_size != dp["dp_size"]):
            members = self._new_generation(dp["dp_size"], world_size)
        dp_rank = dp["dp_rank"]
        if members.world.get(world_rank) == dp_rank and dp_rank in members.ranks:
            # The same worker registers again (a restarted worker, a new iterator): the old
            # one is gone, even if its reader's death has not been noticed yet.
            self._apply_lost(dp_rank, reason="replaced")
        members.world[world_rank] = dp_rank
        if self._dynamic and dp_rank not in members.ranks:
            members.dp_size = max(members.dp_size, dp_rank + 1)
            for book in self._books.values():
                book.join(dp_rank)
            if members.ranks:
                self._event("rank_joined", dp_rank=dp_rank)
        members.ranks.add(dp_rank)
        if dp_rank not in members.readers:
            # A fresh name per reader: a rank that comes back after its reader died gets a
            # new reader, watched anew. Members of one group share the name given first.
            self._readers_named += 1
            members.readers[dp_rank] = (
                f"{self._loader_id}:reader:g{members.generation}:r{dp_rank}:{self._readers_named}"
            )
        name = members.readers[dp_rank]
        return {
            "generation": members.generation,
            "reader": name,
            "dp_size": members.dp_size,
            "loader": self._loader_id,
            "dynamic": self._dynamic,
        }

    def _apply_attach(self, dp_rank: int, name: str) -> None:
        if self._members is not None:
            self._members.readers.setdefault(dp_rank, name)

    def _apply_epoch(self, dp_rank: int, epoch: int) -> None:
        self._rank_epoch[dp_rank] = epoch

    def _apply_lease(self, dp_rank: int, epoch: int) -> list[int] | None:
        self._rank_epoch[dp_rank] = epoch
        book = self._book(epoch)
        lease = book.lease(dp_rank)
        metrics.set_leases_outstanding(self._loader_id, book.outstanding_count())
        return None if lease is None else [lease.start, lease.end]

    def _apply_ack(self, dp_rank: int, epoch: int, batches: int, ids: list) -> None:
        counts = self._received.setdefault(epoch, {})
        counts[dp_rank] = max(counts.get(dp_rank, 0), batches)
        pairs = [tuple(pair) for pair in ids]
        self._consumed.setdefault(epoch, []).extend(pairs)
        if epoch in self._books:
            self._books[epoch].ack(pairs)

    def _apply_lost(self, dp_rank: int, reason: str) -> None:
        members = self._members
        if members is None or dp_rank not in members.ranks:
            return
        members.ranks.discard(dp_rank)
        members.readers.pop(dp_rank, None)
        requeued = sum(book.release(dp_rank) for book in self._books.values())
        self._event("rank_lost", dp_rank=dp_rank, reason=reason, requeued_rows=requeued)
        metrics.record_reserved(self._loader_id, requeued)

    def _apply_release(self, epoch: int, dp_rank: int) -> None:
        self._book(epoch).release(dp_rank)

    def _apply_restore(self, state: dict) -> None:
        self._resume = LoaderState.from_dict(state, expect_loader=self._loader_id)
        self._plans.clear()
        self._books.clear()
        self._received.clear()
        self._consumed.clear()
        self._rank_epoch.clear()
        self._members.generation += 1

    # -- helpers ---------------------------------------------------------------------------
    def _new_generation(self, dp_size: int, world_size: int) -> _Membership:
        old = self._members
        if old is not None:
            epochs = sorted({*self._received, *self._plans})
            if epochs:
                epoch = epochs[-1]
                self._resume = LoaderState(
                    self._loader_id,
                    epoch,
                    self._settings.plan.seed,
                    self._all_consumed(epoch),
                    old.dp_size,
                    self._layout.num_samples,
                )
            self._plans.clear()
            self._books.clear()
            self._received.clear()
            self._consumed.clear()
            self._rank_epoch.clear()
            self._event("new_generation", dp_size=dp_size)
        generation = old.generation + 1 if old else 1
        self._members = _Membership(generation, dp_size, world_size)
        return self._members

    def _plan(self, epoch: int) -> EpochPlan:
        if epoch not in self._plans:
            self._plans[epoch] = epoch_plan(
                self._settings, self._source, self._members.dp_size, epoch, self._resume
            )
        return self._plans[epoch]

    def _book(self, epoch: int) -> LeaseBook:
        if epoch not in self._books:
            members = self._members
            assignment = assign(
                ShardingPolicy.DYNAMIC,
                self._settings.plan,
                self._source,
                max(members.dp_size, 1),
                epoch,
            )
            # Every declared rank gets a share from the start, registered yet or not, so
            # equal steps hold when ranks register at slightly different times.
            self._books[epoch] = LeaseBook(
                assignment.splits,
                sorted(members.ranks | set(range(members.dp_size))),
                self._settings.plan.batch_size,
                equal_steps=self._settings.plan.equal_steps,
                consumed=self._resumed_consumed(epoch),
            )
        return self._books[epoch]

    def _resumed_consumed(self, epoch: int) -> iv.Intervals:
        resume = self._resume
        return resume.consumed if resume is not None and resume.epoch == epoch else ()

    def _all_consumed(self, epoch: int) -> iv.Intervals:
        return iv.normalize([*self._consumed.get(epoch, []), *self._resumed_consumed(epoch)])

    def _epoch_samples(self, epoch: int) -> iv.Intervals:
        if epoch in self._plans:
            return iv.normalize([*self._plans[epoch].delivered(), *self._resumed_consumed(epoch)])
        return ((0, self._layout.num_samples),)

    def _active_ranks(self) -> list[int]:
        return sorted(self._members.ranks) if self._members else []

    def _total(self, epoch: int, dp_rank: int) -> int:
        if epoch in self._plans:
            return self._plans[epoch].ranks[dp_rank].batches
        steps = self._books[epoch].steps(dp_rank) if epoch in self._books else None
        return steps if steps is not None else 1 << 62

    def _state_dict(self, epoch: int, consumed: iv.Intervals) -> dict:
        members = self._members
        return LoaderState(
            loader=self._loader_id,
            epoch=epoch,
            seed=self._settings.plan.seed,
            consumed=tuple(consumed),
            world_size=members.dp_size if members else 0,
            num_samples=self._layout.num_samples,
        ).to_dict()

    def _check(self, generation: int) -> _Membership:
        members = self._members
        if members is None or generation != members.generation:
            current = members.generation if members else None
            raise StaleClientError(
                f"client of generation {generation} talks to a loader at generation {current}: "
                "the worker group changed since this iterator was made; take a new one"
            )
        return members

    def _check_epoch(self, generation: int, dp_rank: int, epoch: int) -> None:
        self._check(generation)
        last = self._rank_epoch.get(dp_rank)
        if last is not None and epoch < last:
            raise StaleClientError(
                f"data-parallel rank {dp_rank} asked for epoch {epoch}, but it already started "
                f"epoch {last}: this iterator is stale; take a new one from the loader"
            )

    def _event(self, kind: str, **details: Any) -> None:
        self._events.append({"time": time.time(), "event": kind, **details})

    def _watch(self, dp_rank: int, name: str) -> None:
        """Watch reader `name`: its death releases `dp_rank` (once per reader)."""
        if name in self._watched:
            return

        async def watch() -> None:
            try:
                reader = ray.get_actor(name, namespace=self._namespace)
                await reader.watch.remote()
            except Exception:  # noqa: BLE001 - any failure of the reader means it is gone
                pass
            members = self._members
            if members is not None and members.readers.get(dp_rank) == name:
                self._record("lost", dp_rank=dp_rank, reason="reader died")
                async with self._acked:
                    self._acked.notify_all()

        self._watched[name] = asyncio.get_event_loop().create_task(watch())

    def _rewatch(self) -> None:
        """After a restart: watch the readers the journal knows about again (the first
        call after a restart runs this, inside the event loop)."""
        if self._rewatch_pending and self._members is not None:
            self._rewatch_pending = False
            for dp_rank, name in list(self._members.readers.items()):
                self._watch(dp_rank, name)
