"""Lease throughput of the coordinator with many ranks (see `benchmarks/elastic_bench.py`)."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._cpu import process_cpu_s
from benchmarks.elastic.common import pid_of

RANKS = 1000
TINY_SPLIT = 16


def _lease_book_rates(splits: int, ranks: int) -> dict:
    from rayshard.core.leases import LeaseBook

    book = LeaseBook(
        [(i * TINY_SPLIT, (i + 1) * TINY_SPLIT) for i in range(splits)],
        range(ranks),
        batch_size=1024,
    )
    began = time.perf_counter()
    pieces = []
    for i in range(splits):
        lease = book.lease(i % ranks)
        if lease is not None:
            pieces.append((lease.start, lease.end))
    lease_s = time.perf_counter() - began
    began = time.perf_counter()
    for piece in pieces:
        book.ack([piece])
    ack_s = time.perf_counter() - began
    if len(pieces) != splits or book.unleased_rows():
        raise RuntimeError(f"LeaseBook leased {len(pieces)} of {splits} splits")
    return {
        "leases": len(pieces),
        "leases_per_s": len(pieces) / lease_s,
        "acks_per_s": len(pieces) / ack_s,
    }


def _journal_rate(workdir: Path, count: int, ranks: int = RANKS) -> float:
    from rayshard.core.commands import Lease
    from rayshard.runtime.journal import Journal

    journal = Journal(str(workdir / "journal-bench.jsonl"), "bench")
    journal.start_fresh()
    began = time.perf_counter()
    for i in range(count):
        journal.append(Lease(i % ranks, 0).to_entry())
    return count / (time.perf_counter() - began)


def _compaction_and_restore_ms(
    workdir: Path, splits: int, ranks: int = RANKS, repeats: int = 3
) -> tuple[list, list]:
    """Milliseconds of each of `repeats` journal compactions (the core's snapshot made,
    then written) of a `dynamic` epoch of `splits` pieces, `ranks` ranks, 20,000 leased;
    and of each of `repeats` restores from that journal (read, then loaded into a new
    core: a restarted coordinator's work before it answers)."""
    from rayshard.config.loader_config import LoaderConfig
    from rayshard.core import commands as cmd
    from rayshard.core.coordination import CoordinatorCore
    from rayshard.plan import PlanConfig
    from rayshard.runtime.journal import Journal
    from rayshard.sources import TableSource

    ids = pa.table({"id": np.arange(splits * TINY_SPLIT, dtype=np.int64)})
    source = TableSource(pa.Table.from_batches(ids.to_batches(max_chunksize=TINY_SPLIT)))
    plan = PlanConfig(batch_size=1024, equal_steps=False)
    core = CoordinatorCore("bench", source, LoaderConfig(plan=plan, policy="dynamic"))
    for rank in range(ranks):
        core.apply(cmd.Register(rank, ranks, rank, ranks, 0.0))
    core.apply(cmd.StartEpoch(0, 0))
    for i in range(min(20_000, splits // 2)):
        core.apply(cmd.Lease(i % ranks, 0, 1, request=f"bench-{i % ranks}:{i}"))
    journal = Journal(str(workdir / "journal-compact.jsonl"), "bench")
    journal.start_fresh(replace_any=True)
    times, restores = [], []
    for _ in range(repeats):
        began = time.perf_counter()
        journal.compact(core.to_dict())
        times.append((time.perf_counter() - began) * 1e3)
    for _ in range(repeats):
        began = time.perf_counter()
        restarted = Journal(journal.path, "bench")
        restarted.restore(CoordinatorCore("bench", source, core.settings))
        restarted.close(remove=False)
        restores.append((time.perf_counter() - began) * 1e3)
    return times, restores


RELAYED_PER_CALL = 8  # calls a `relayed` call carries: a node of 8 ranks' relay


class _Caller:
    """Simulated ranks in one process: `lease.remote` for its ranks, round robin, with
    `inflight` calls outstanding."""

    def __init__(self, coordinator) -> None:
        self.coordinator = coordinator

    async def run(self, generation: int, ranks: list[int], calls: int, inflight: int) -> tuple:
        got = 0

        async def worker(first: int) -> None:
            nonlocal got
            for i in range(first, calls, inflight):
                leased = await self.coordinator.lease.remote(generation, ranks[i % len(ranks)], 0)
                got += bool(leased.pieces)

        began = time.time()
        await asyncio.gather(*(worker(k) for k in range(inflight)))
        return got, calls, began, time.time()

    async def acks(self, generation: int, work: list, inflight: int, target=None) -> tuple:
        """One `ack` call per `(rank, start, end)` of `work` (one 16-row batch each), with
        `inflight` calls outstanding, to the coordinator or to `target`."""
        target = target or self.coordinator

        async def worker(first: int) -> None:
            for rank, start, end in work[first::inflight]:
                runs = np.array([[start, end]], dtype=np.int64)
                usage = {"batches": 1, "samples": end - start, "bytes": 8 * (end - start)}
                await target.ack.remote(generation, rank, 0, 1, runs, usage)

        began = time.time()
        await asyncio.gather(*(worker(k) for k in range(inflight)))
        return len(work), began, time.time()

    async def relayed_leases(
        self, generation: int, ranks: list[int], calls: int, inflight: int, per_call: int
    ) -> tuple:
        """`calls` lease calls of one piece for `ranks`, round robin, `per_call` to a
        `relayed` call (as a node's relay forwards them), `inflight` calls outstanding."""
        got = 0
        asks = [ranks[i % len(ranks)] for i in range(calls)]
        batches = [asks[i : i + per_call] for i in range(0, calls, per_call)]

        async def worker(first: int) -> None:
            nonlocal got
            for batch in batches[first::inflight]:
                relayed = [("lease", (generation, rank, 0), {}) for rank in batch]
                answers = await self.coordinator.relayed.remote("bench", "no relay", relayed)
                got += sum(bool(a.pieces) for a in answers)

        began = time.time()
        await asyncio.gather(*(worker(k) for k in range(inflight)))
        return got, calls, began, time.time()

    async def acks_many(self, generation: int, work: list, inflight: int, per_call: int) -> tuple:
        """The same groups as `acks`, `per_call` to a `relayed` call (as a node's relay
        forwards them), with `inflight` calls outstanding."""
        calls = [work[i : i + per_call] for i in range(0, len(work), per_call)]

        async def worker(first: int) -> None:
            for call in calls[first::inflight]:
                groups = [
                    (
                        "ack",
                        (generation, rank, 0, 1, np.array([[start, end]], dtype=np.int64), {}),
                        {},
                    )
                    for rank, start, end in call
                ]
                await self.coordinator.relayed.remote("bench", "no relay", groups)

        began = time.time()
        await asyncio.gather(*(worker(k) for k in range(inflight)))
        return len(work), began, time.time()


class _Empty:
    """An actor whose async `ack` does nothing: what a call costs in Ray itself."""

    async def ack(self, generation, dp_rank, epoch, batches, ids, usage=None) -> None:
        return None


def _ack_rate(actors: list, generation: int, work: list, inflight: int, pid: int, target=None):
    """`work` acknowledged by `actors` (to the coordinator, or `target`); calls/s and the
    CPU of the process `pid` (the one called) per call."""
    import ray

    cpu_before = process_cpu_s(pid)
    shares = [work[i :: len(actors)] for i in range(len(actors))]
    acked = ray.get(
        [a.acks.remote(generation, share, inflight, target) for a, share in zip(actors, shares)]
    )
    wall = max(r[2] for r in acked) - min(r[1] for r in acked)
    return {
        "calls": len(work),
        "seconds": wall,
        "acks_per_s": len(work) / wall,
        "cpu_us_per_call": (process_cpu_s(pid) - cpu_before) / len(work) * 1e6,
    }


def _py_spy_top(raw: Path, limit: int = 15) -> list[dict]:
    """Self and inclusive sample shares per frame from py-spy's collapsed stacks."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames, n = stack.split(";"), int(count)
        total += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
    top = sorted(own.items(), key=lambda kv: -kv[1])[:limit]
    return {
        "samples": total,
        "top_self": [
            {"frame": f, "self": n / max(total, 1), "inclusive": inclusive[f] / max(total, 1)}
            for f, n in top
        ],
        "coordinator_methods_inclusive": {
            f: n / max(total, 1)
            for f, n in sorted(inclusive.items(), key=lambda kv: -kv[1])
            if "(rayshard/" in f
        },
    }


def _drive(
    actors: list, generation: int, per: int, inflight: int, pids: list[int], total: int = RANKS
) -> dict:
    """Every caller issues `per` lease calls; rates over the span of all of them, and the
    CPU the coordinator (pids[0]) and the callers used per call."""
    import ray

    ranks = len(actors)
    cpu_before = [process_cpu_s(p) for p in pids]
    results = ray.get(
        [
            a.run.remote(generation, list(range(i, total, ranks)), per, inflight)
            for i, a in enumerate(actors)
        ]
    )
    cpu = [process_cpu_s(p) - before for p, before in zip(pids, cpu_before)]
    got = sum(r[0] for r in results)
    issued = sum(r[1] for r in results)
    wall = max(r[3] for r in results) - min(r[2] for r in results)
    return {
        "calls": issued,
        "leases": got,
        "seconds": wall,
        "calls_per_s": issued / wall,
        "leases_per_s": got / wall,
        "coordinator_cpu_share": cpu[0] / wall,
        "coordinator_cpu_us_per_call": cpu[0] / issued * 1e6,
        "callers_cpu_us_per_call": sum(cpu[1:]) / issued * 1e6,
    }


def run_throughput(
    workdir: Path,
    splits: int,
    calls: int,
    callers: int,
    inflight: int,
    profile: str | None,
    ranks: int = RANKS,
    ack_calls: int | None = None,
) -> dict:
    """Lease and acknowledgement rates of a coordinator with `ranks` registered ranks:
    `calls` lease calls, `ack_calls` (default `calls`) acknowledgements per ack run."""
    import ray

    ack_calls = calls if ack_calls is None else ack_calls

    from rayshard.loader import Loader
    from rayshard.sources.parquet import ParquetSource

    book = _lease_book_rates(splits, ranks)
    journal_per_s = _journal_rate(workdir, min(splits, 100_000), ranks)
    compaction_ms, restore_ms = _compaction_and_restore_ms(workdir, splits, ranks)
    folder = workdir / "throughput"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny.parquet"
    pq.write_table(
        pa.table({"id": np.arange(splits * TINY_SPLIT, dtype=np.int64)}),
        path,
        row_group_size=1 << 20,
    )
    loader = Loader(
        ParquetSource([str(path)], split_rows=TINY_SPLIT),
        batch_size=1024,
        name=f"leases-{uuid.uuid4().hex[:8]}",
        policy="dynamic",
    )
    coordinator = loader._coordinator
    out = {
        "config": {
            "ranks": ranks,
            "splits": splits,
            "split_rows": TINY_SPLIT,
            "calls": calls,
            "callers": callers,
            "inflight_per_caller": inflight,
        },
        "lease_book": book,
        "journal_appends_per_s": journal_per_s,
        "journal_compaction_ms": compaction_ms,
        "journal_restore_ms": restore_ms,
    }
    try:
        regs = ray.get(
            [
                coordinator.register.remote(
                    r, ranks, {"dp_rank": r, "dp_size": ranks, "group": [r]}
                )
                for r in range(ranks)
            ]
        )
        generation = regs[-1]["generation"]
        # Rank 0 begins the epoch: the coordinator makes its lease book (answering nothing
        # else meanwhile), timed from the call to its answer.
        began = time.perf_counter()
        ray.get(coordinator.start_epoch.remote(generation, 0, 0))
        out["epoch_start_ms"] = (time.perf_counter() - began) * 1e3
        actors = [ray.remote(num_cpus=0)(_Caller).remote(coordinator) for _ in range(callers)]
        ray.get(
            [
                a.run.remote(generation, list(range(i, ranks, callers)), 200, inflight)
                for i, a in enumerate(actors)
            ]
        )  # warm-up
        pid = ray.get(coordinator.__ray_call__.remote(pid_of))
        pids = [pid, *ray.get([a.__ray_call__.remote(pid_of) for a in actors])]
        out["actor"] = _drive(actors, generation, calls // callers, inflight, pids, ranks)
        # The same lease calls, `RELAYED_PER_CALL` a call as a node's relay forwards them.
        cpu_before, began = process_cpu_s(pid), time.time()
        relayed = ray.get(
            [
                a.relayed_leases.remote(
                    generation,
                    list(range(i, ranks, callers)),
                    calls // callers,
                    max(1, inflight // RELAYED_PER_CALL),
                    RELAYED_PER_CALL,
                )
                for i, a in enumerate(actors)
            ]
        )
        wall = max(r[3] for r in relayed) - min(r[2] for r in relayed)
        got = sum(r[0] for r in relayed)
        out["relayed_leases"] = {
            "per_call": RELAYED_PER_CALL,
            "leases": got,
            "leases_per_s": got / wall,
            "cpu_us_per_lease": (process_cpu_s(pid) - cpu_before) / max(got, 1) * 1e6,
        }
        if profile:  # a second pass: py-spy takes CPU from this 2-core machine
            raw = workdir / "coordinator.pyspy.txt"
            spy = subprocess.Popen(
                [
                    profile,
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    "250",
                    "--format",
                    "raw",
                    "--nonblocking",
                    "-o",
                    str(raw),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)  # py-spy attaches
            out["actor_profiled"] = _drive(
                actors, generation, calls // callers, inflight, pids, ranks
            )
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
            out["profile"] = _py_spy_top(raw) if raw.exists() else "py-spy wrote nothing"
        batch, rounds = 100, max(calls // 100, 1)
        cpu_before = process_cpu_s(pid)
        began = time.time()
        # The library's batched call: `lease(count=batch)` hands a rank up to `batch`
        # pieces in one round trip (readers use it to fill a block of batches per call).
        answers = ray.get(
            [coordinator.lease.remote(generation, k % ranks, 0, batch) for k in range(rounds)]
        )
        got = sum(len(a.pieces) for a in answers)
        wall = time.time() - began
        out["batched"] = {
            "batch": batch,
            "calls": rounds,
            "leases": got,
            "seconds": wall,
            "leases_per_s": got / wall,
            "coordinator_cpu_us_per_lease": (process_cpu_s(pid) - cpu_before) / got * 1e6,
        }
        # Acknowledgements of those pieces, one call per piece, from the callers.
        work = [
            (k % ranks, start, end)
            for k, answer in enumerate(answers)
            for start, end in answer.pieces
        ][:ack_calls]
        out["acks"] = _ack_rate(actors, generation, work, inflight, pid)
        # The same groups again (recording a group twice changes nothing), gathered
        # `RELAYED_PER_CALL` a call as a node's relay forwards them: per group.
        cpu_before, share = process_cpu_s(pid), work[: len(work) // len(actors) * len(actors)]
        shares = [share[i :: len(actors)] for i in range(len(actors))]
        many = ray.get(
            [
                a.acks_many.remote(generation, part, max(1, inflight // 8), RELAYED_PER_CALL)
                for a, part in zip(actors, shares)
            ]
        )
        wall = max(r[2] for r in many) - min(r[1] for r in many)
        out["relayed_acks"] = {
            "groups": len(share),
            "per_call": RELAYED_PER_CALL,
            "groups_per_s": len(share) / wall,
            "cpu_us_per_group": (process_cpu_s(pid) - cpu_before) / max(len(share), 1) * 1e6,
        }
        # An epoch's tail: every rank takes what its capacity leaves, so no piece is left
        # to lease, and each acknowledgement asks whether it ended the epoch.
        rest = ray.get([coordinator.lease.remote(generation, r, 0, 10_000) for r in range(ranks)])
        tail = [(r, start, end) for r, answer in enumerate(rest) for start, end in answer.pieces]
        random.Random(0).shuffle(tail)  # ranks acknowledge in any order: scattered runs
        out["tail_acks"] = _ack_rate(actors, generation, tail[:ack_calls], inflight, pid)
        leases = ray.get(coordinator.describe.remote())["leases"]
        out["tail_acks"]["unleased_rows"] = leases[0]["unleased_rows"]
        # Churn: a rank holding unacknowledged pieces leaves; they go back to the queue, and
        # the acknowledgements that follow are all after churn.
        gone = tail[min(ack_calls, len(tail) - 1)][0]
        ray.get(coordinator.leave.remote(generation, gone))
        after = [w for w in tail[ack_calls:] if w[0] != gone][:ack_calls]
        out["churn_acks"] = _ack_rate(actors, generation, after, inflight, pid)
        leases = ray.get(coordinator.describe.remote())["leases"]
        out["churn_acks"]["requeued_rows"] = leases[0]["requeued_rows"]
        # The same calls to a method that does nothing: Ray's own part of each call.
        empty = ray.remote(num_cpus=0)(_Empty).remote()
        empty_pid = ray.get(empty.__ray_call__.remote(pid_of))
        out["empty_actor"] = _ack_rate(actors, generation, work, inflight, empty_pid, empty)
        ray.kill(empty)
        for actor in actors:
            ray.kill(actor)
    finally:
        loader.shutdown()
    return out
