"""The coordinator: one Ray actor per loader holding epoch, membership and plan.

It is an async actor: one event loop, so its fields need no lock, and a `state()` call
can wait for other ranks' acknowledgements without blocking them. Clients carry the
membership `generation` they registered under; a client of an older generation, or one
asking for an epoch its rank has already left, is rejected as stale.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayshard.errors import RayshardError, StaleClientError
from rayshard.plan import EpochPlan, RankPlan
from rayshard.plan import intervals as iv
from rayshard.runtime.planning import epoch_plan
from rayshard.settings import LoaderSettings
from rayshard.sources import Source
from rayshard.state import LoaderState


@dataclasses.dataclass
class _Membership:
    generation: int
    dp_size: int
    world_size: int
    nodes: dict[int, str] = dataclasses.field(default_factory=dict)  # world rank -> node
    readers: dict[int, Any] = dataclasses.field(default_factory=dict)  # dp rank -> actor


class Coordinator:
    """Epoch, membership, plan and progress of one loader (see module docstring)."""

    def __init__(self, loader_id: str, source: Source, settings: LoaderSettings) -> None:
        self._loader_id = loader_id
        self._source = source
        self._settings = settings
        self._layout = source.layout()
        self._members: _Membership | None = None
        self._plans: dict[int, EpochPlan] = {}
        self._rank_epoch: dict[int, int] = {}
        self._resume: LoaderState | None = None
        # epoch -> dp rank -> (batches received, samples consumed as a list of intervals)
        self._progress: dict[int, dict[int, tuple[int, list[iv.Interval]]]] = {}
        self._acked = asyncio.Condition()

    async def register(self, world_rank: int, world_size: int, dp: dict, node_id: str) -> dict:
        """Join the loader; returns the generation and the reader actor of this rank's group.

        A different data-parallel size than the current membership starts a new generation:
        progress so far becomes the resume point, and the old readers are stopped.
        """
        members = self._members
        if members is None or members.dp_size != dp["dp_size"]:
            members = await self._new_generation(dp["dp_size"], world_size)
        members.nodes[world_rank] = node_id
        dp_rank = dp["dp_rank"]
        if dp_rank not in members.readers:
            members.readers[dp_rank] = self._start_reader(dp_rank, len(dp["group"]), node_id)
        return {"generation": members.generation, "reader": members.readers[dp_rank]}

    async def rank_plan(self, generation: int, dp_rank: int, epoch: int) -> RankPlan:
        """The plan of one rank for `epoch` (the rest of it, when resuming there)."""
        members = self._check(generation)
        last = self._rank_epoch.get(dp_rank)
        if last is not None and epoch < last:
            raise StaleClientError(
                f"data-parallel rank {dp_rank} asked for epoch {epoch}, but it already started "
                f"epoch {last}: this iterator is stale; take a new one from the loader"
            )
        self._rank_epoch[dp_rank] = epoch
        if epoch not in self._plans:
            self._plans[epoch] = epoch_plan(
                self._settings, self._source, members.dp_size, epoch, self._resume
            )
        return self._plans[epoch].ranks[dp_rank]

    async def ack(self, generation: int, dp_rank: int, epoch: int, batches: int, ids: list) -> None:
        """A consumer of `dp_rank` received its `batches`-th batch holding samples `ids`."""
        if self._members is None or generation != self._members.generation:
            return  # a late acknowledgement from a previous generation: already accounted
        ranks = self._progress.setdefault(epoch, {})
        count, consumed = ranks.get(dp_rank, (0, []))
        ranks[dp_rank] = (max(count, batches), [*consumed, *map(tuple, ids)])
        async with self._acked:
            self._acked.notify_all()

    async def state(self, generation: int, epoch: int, received: int) -> dict:
        """The loader-wide state once every rank acknowledged `received` batches of `epoch`
        (or all of its batches, if it has fewer)."""
        members = self._check(generation)
        plan = self._plans.get(epoch)
        if plan is None:
            return self._state_dict(epoch, ())

        def settled() -> bool:
            ranks = self._progress.get(epoch, {})
            return all(
                ranks.get(r.rank, (0, []))[0] >= min(received, r.batches) for r in plan.ranks
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
        consumed = self._consumed(epoch)
        if self._resume is not None and self._resume.epoch == epoch:
            consumed = iv.normalize([*consumed, *self._resume.consumed])
        if iv.subtract(plan.delivered(), consumed) == () and received > 0:
            return self._state_dict(epoch + 1, ())
        del members
        return self._state_dict(epoch, consumed)

    async def restore(self, state: dict) -> tuple[int, int]:
        """Resume from a saved state; idempotent, so every rank may call it.

        A new state starts a new generation (same members and readers), so readers drop
        what they read ahead under the old plan. Returns (epoch, generation).
        """
        loaded = LoaderState.from_dict(state, expect_loader=self._loader_id)
        members = self._members
        if members is None:
            raise RayshardError("restore() before any rank registered: take an iterator first")
        if self._resume != loaded:
            self._resume = loaded
            self._plans.clear()
            self._progress.clear()
            self._rank_epoch.clear()
            members.generation += 1
        return loaded.epoch, members.generation

    async def describe(self) -> dict:
        """Membership and progress, for `stats()` and debugging."""
        members = self._members
        return {
            "loader": self._loader_id,
            "generation": members.generation if members else 0,
            "dp_size": members.dp_size if members else 0,
            "epochs_planned": sorted(self._plans),
            "rank_epoch": dict(self._rank_epoch),
            "readers": len(members.readers) if members else 0,
        }

    def _consumed(self, epoch: int) -> iv.Intervals:
        ranks = self._progress.get(epoch, {})
        return iv.normalize(pair for _, consumed in ranks.values() for pair in consumed)

    def _state_dict(self, epoch: int, consumed: iv.Intervals) -> dict:
        members = self._members
        return LoaderState(
            loader=self._loader_id,
            epoch=epoch,
            seed=self._settings.plan.seed,
            consumed=consumed,
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

    async def _new_generation(self, dp_size: int, world_size: int) -> _Membership:
        old = self._members
        if old is not None:
            epochs = sorted(self._progress)
            if epochs:
                epoch = epochs[-1]
                consumed = self._consumed(epoch)
                if self._resume is not None and self._resume.epoch == epoch:
                    consumed = iv.normalize([*consumed, *self._resume.consumed])
                self._resume = LoaderState(
                    self._loader_id,
                    epoch,
                    self._settings.plan.seed,
                    consumed,
                    old.dp_size,
                    self._layout.num_samples,
                )
            for reader in old.readers.values():
                ray.kill(reader, no_restart=True)
            self._plans.clear()
            self._progress.clear()
            self._rank_epoch.clear()
        generation = old.generation + 1 if old else 1
        self._members = _Membership(generation, dp_size, world_size)
        return self._members

    def _start_reader(self, dp_rank: int, consumers: int, node_id: str) -> Any:
        from rayshard.runtime.reader import ShardReader

        handle = ray.get_runtime_context().current_actor
        strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=True)
        return (
            ray.remote(ShardReader)
            .options(
                num_cpus=self._settings.reader_num_cpus,
                max_concurrency=4 + consumers,
                scheduling_strategy=strategy,
            )
            .remote(handle, self._source, self._settings, dp_rank, consumers)
        )
