"""The coordinator's pure core through one `dynamic` epoch at many ranks (see
`benchmarks/elastic_bench.py`): every rank registers, starts the epoch, leases a row
group at a time and acknowledges it in groups of 4 batches; in the churn cases one node's
ranks die a third of the way in; with stragglers on, every lease that finds nothing asks
for stragglers, as the coordinator does; in the restart case every rank registers again
there (a whole Ray Train group restarting: each registration ends the rank's old process
and joins its new one) and starts the epoch again. The CPU per command is the core's own cost,
beside Ray's ~1.3 ms per actor call on this machine: it must not grow with the ranks."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence

import pyarrow as pa

SPLIT_ROWS = 32_768  # a row group: one lease
BATCH = 1024
ACK_ROWS = 4 * BATCH  # one acknowledgement: a group of 4 batches
NODE_RANKS = 8  # ranks lost with a node
CASES = (
    ("steady", 0, None),
    ("node lost", NODE_RANKS, None),
    ("node lost, stragglers on", NODE_RANKS, 30.0),
    ("group restarted", -1, None),  # (-1: every rank registers again)
)


def _source(splits: int):
    from rayshard.plan import DataLayout
    from rayshard.sources.base import Source

    class RowGroups(Source):
        """`splits` row groups of metadata only: the core never reads."""

        def layout(self) -> DataLayout:
            return DataLayout.of_files([SPLIT_ROWS] * splits)

        def schema(self) -> pa.Schema:
            return pa.schema([("id", pa.int64())])

        def read(
            self, start: int, end: int, columns: Sequence[str] | None = None
        ) -> Iterator[pa.RecordBatch]:
            raise NotImplementedError("the core benchmark reads nothing")

    return RowGroups()


def run_core_epoch(ranks: int, lose: int, timeout: float | None, splits_per_rank: int = 4) -> dict:
    """One epoch of `ranks` ranks on the core; CPU seconds per kind of command."""
    from rayshard.config.loader_config import LoaderConfig
    from rayshard.core import commands as cmd
    from rayshard.core.coordination import CoordinatorCore
    from rayshard.plan import PlanConfig

    settings = LoaderConfig(
        plan=PlanConfig(batch_size=BATCH), policy="dynamic", straggler_timeout_s=timeout
    )
    core = CoordinatorCore("bench", _source(ranks * splits_per_rank), settings)
    cpu = {"start": 0.0, "lease": 0.0, "ack": 0.0, "lost": 0.0, "restart": 0.0}
    calls = {"lease": 0, "ack": 0, "lost": 0}
    clock = 0.0

    def apply(kind: str, command: cmd.Command):
        began = time.process_time()
        decision = core.apply(command)
        cpu[kind] += time.process_time() - began
        calls[kind] = calls.get(kind, 0) + 1
        return decision

    for rank in range(ranks):
        apply("start", cmd.Register(rank, ranks, rank, ranks, clock))
    for rank in range(ranks):
        apply("start", cmd.StartEpoch(rank, 0, clock))
    held: dict[int, list[list[int]]] = {rank: [] for rank in range(ranks)}
    delivered = {rank: 0 for rank in range(ranks)}
    finishing: set[int] = set()
    lose_after, acked = ranks * splits_per_rank * SPLIT_ROWS // 3, 0
    while held:
        for rank in list(held):
            clock += 0.001
            if rank not in held:
                continue
            if not held[rank]:  # ask for a piece; past its steps, until no one holds work
                leased = apply("lease", cmd.Lease(rank, 0, 1, rank in finishing, clock))
                if leased.pieces:
                    held[rank] += [list(piece) for piece in leased.pieces]
                elif rank not in finishing:
                    finishing.add(rank)
                elif not leased.wait:
                    del held[rank]
                continue
            piece = held[rank][0]
            end = min(piece[0] + ACK_ROWS, piece[1])
            ids, piece[0] = ((piece[0], end),), end
            if piece[0] >= piece[1]:
                held[rank].pop(0)
            delivered[rank] += -(-(end - ids[0][0]) // BATCH)
            apply("ack", cmd.Ack(rank, 0, delivered[rank], ids, clock))
            acked += end - ids[0][0]
            if lose < 0 and acked >= lose_after:  # the whole group restarts
                for again in sorted(held):
                    apply("restart", cmd.Register(again, ranks, again, ranks, clock))
                for again in sorted(held):
                    apply("restart", cmd.StartEpoch(again, 0, clock))
                    held[again], delivered[again] = [], 0
                lose = 0
            if lose > 0 and acked >= lose_after:
                for victim in random.Random(0).sample(sorted(held), lose):
                    apply("lost", cmd.Lost(victim, "reader died", clock))
                    del held[victim]
                lose = 0
    book = core.books[0].snapshot()
    return {
        "ranks": ranks,
        "lost_ranks": calls["lost"],
        "leases": calls["lease"],
        "acks": calls["ack"],
        "start_s": cpu["start"],
        "lease_us": 1e6 * cpu["lease"] / max(calls["lease"], 1),
        "ack_us": 1e6 * cpu["ack"] / max(calls["ack"], 1),
        "lost_ms": 1e3 * cpu["lost"] / max(calls["lost"], 1),
        "restart_s": cpu["restart"],  # CPU seconds of the whole group's registrations
        "requeued_rows": book["requeued_rows"],
        "complete": core.epoch_complete(0),
    }


def run_core(rank_counts: Sequence[int]) -> dict:
    """Every case at every rank count."""
    rows = [
        {"case": name, "stragglers_timeout_s": timeout, **run_core_epoch(ranks, lose, timeout)}
        for ranks in rank_counts
        for name, lose, timeout in CASES
    ]
    return {"config": {"ranks": list(rank_counts), "split_rows": SPLIT_ROWS}, "runs": rows}
