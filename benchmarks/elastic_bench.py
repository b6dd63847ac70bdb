"""Benchmark of the dynamic policy (issue 5): recovery after a rank dies, coordinator
throughput with many ranks, and the dynamic policy's epoch throughput next to `data`.

    python benchmarks/elastic_bench.py [--quick] [--json PATH] [--only recovery,...]
        [--profile] [--py-spy PATH]

recovery    3 ranks consume a `dynamic` loader (default Ray and loader settings; Parquet
            ids, batch 256, splits of 1,024 rows, a simulated 20 ms training step). When
            the victim rank has received 8 batches its reader actor dies: `ray.kill`
            (mode `ray_kill`) or SIGKILL of its process (mode `sigkill`). Times, all
            `time.time()` on this one machine, measured from the kill:
              detect_s  until the coordinator records `rank_lost` (describe()["events"])
              relet_s   until the coordinator hands a surviving rank the first lease that
                        overlaps the dead rank's unacknowledged rows: the recovery time
              served_s  until a surviving consumer receives a batch holding one of them
            The coordinator is instrumented for this through `__ray_call__` (benchmark
            only): its `_apply_lease`/`_apply_lost` are wrapped to log the time, the
            rank and the piece of every lease, and the dead rank's unacknowledged rows
            (outstanding leases minus acknowledged samples) at the moment of release.
            Coverage of the epoch is checked (nothing lost; duplicates are the dead
            rank's received-but-unacknowledged batches).
throughput  the coordinator with 1,000 registered data-parallel ranks and splits of 16
            rows: `LeaseBook.lease`/`ack` in process; `Journal.append` of one lease
            entry in process; the real actor with `lease.remote` from caller actors
            (async, many calls in flight); and the library's batched call
            `lease_many(rank, count=100)` (the readers' path: up to `count` pieces in
            one round trip, each journaled). `--profile` samples the
            coordinator with py-spy during the per-call run and lists where time goes.
epoch       `policy="data"` and `policy="dynamic"` on the same Parquet data (x float32
            [128], label, id; row groups of 32,768 rows = the dynamic splits), 2 ranks as
            Ray tasks, batch 1024, numpy batches; each run reads 2 epochs with a fresh
            loader and the second (warm) one is measured; runs alternate between the
            policies and the median is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as `python benchmarks/elastic_bench.py`
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from tqdm import tqdm  # noqa: E402

from benchmarks._measure import EpochTimer, format_table, summarize_epoch  # noqa: E402

DEFAULT_JSON = ROOT / "benchmarks" / "results" / "elastic_bench.json"
SECTIONS = ("recovery", "throughput", "epoch")
KILL_MODES = ("ray_kill", "sigkill")
TARGETS = {"recovery_s": 5.0, "actor_leases_per_s": 10_000.0}
FEATURES = 128
ROW_BYTES = FEATURES * 4 + 8 + 8


def _progress(iterable, **options):
    return tqdm(iterable, disable=None, file=sys.stderr, leave=False, **options)


def _median_max(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    real = [v for v in values if v is not None]
    return (statistics.median(real), max(real)) if real else (None, None)


def _overlaps(lo: int, hi: int, ranges: Sequence[Sequence[int]]) -> bool:
    return any(lo < end and start < hi for start, end in ranges)


def _in_ranges(ids: np.ndarray, ranges: Sequence[Sequence[int]]) -> np.ndarray:
    hit = np.zeros(ids.shape, dtype=bool)
    for start, end in ranges:
        hit |= (ids >= start) & (ids < end)
    return hit


def _runs(ids: np.ndarray) -> list[list[int]]:
    """Sorted ids as [start, end) runs."""
    if ids.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(ids) != 1) + 1
    return [[int(part[0]), int(part[-1]) + 1] for part in np.split(ids, cuts)]


def _kill_readers(loader) -> None:
    """Readers outlive `Loader.shutdown()` (their owner is the worker that made them)."""
    import ray

    prefix = f"{loader.loader_id}:reader:"
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == loader.namespace and actor["name"].startswith(prefix):
            with contextlib.suppress(ValueError):  # already gone
                ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]))


# ---------------------------------------------------------------------------- recovery

RECOVERY = {"rows": 60_000, "batch_size": 256, "split_rows": 1024, "step_s": 0.02}
KILL_AFTER_BATCHES = 8


def write_ids(folder: Path, rows: int, files: int = 3) -> list[str]:
    """Parquet files of an `id` column (0..rows-1) and a small feature; one row group each
    file (the dynamic splits come from `split_rows`)."""
    folder.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, rows, files + 1).astype(np.int64)
    paths = []
    for index, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        ids = np.arange(lo, hi, dtype=np.int64)
        table = pa.table({"id": ids, "x": ids.astype(np.float32)})
        path = folder / f"ids-{index:02d}.parquet"
        pq.write_table(table, path, row_group_size=max(hi - lo, 1))
        paths.append(str(path))
    return paths


def _instrument(coordinator) -> None:
    """Runs inside the coordinator actor: log every lease and the unacknowledged rows of a
    rank at its release, with `time.time()` stamps."""
    from rayshard.plan import intervals as iv

    log = coordinator._bench_log = {"leases": [], "lost": []}
    apply_lease, apply_lost = coordinator._apply_lease, coordinator._apply_lost

    def lease(dp_rank, epoch):
        piece = apply_lease(dp_rank=dp_rank, epoch=epoch)
        log["leases"].append((time.time(), dp_rank, piece))
        return piece

    def lost(dp_rank, reason):
        unacked = []
        for book in coordinator._books.values():
            held = [(le.start, le.end) for le in book.outstanding(dp_rank)]
            unacked += iv.subtract(iv.normalize(held), book.consumed())
        apply_lost(dp_rank=dp_rank, reason=reason)
        log["lost"].append((time.time(), dp_rank, [list(r) for r in unacked]))

    coordinator._apply_lease, coordinator._apply_lost = lease, lost


def _bench_log(coordinator) -> dict:
    return coordinator._bench_log


def _pid(actor) -> int:
    return os.getpid()


class Consumer(threading.Thread):
    """One rank's training loop: takes batches, records (arrival time, real ids), sleeps
    `step_s` per batch; stops at the first error (its reader died)."""

    def __init__(self, iterator, step_s: float) -> None:
        super().__init__(daemon=True)
        self.iterator, self.step_s = iterator, step_s
        self.arrivals: list[tuple[float, np.ndarray]] = []
        self.error: BaseException | None = None
        self.received = threading.Semaphore(0)

    def run(self) -> None:
        try:
            for batch in self.iterator:
                ids = np.asarray(batch["id"])[~np.asarray(batch["_padded"])]
                self.arrivals.append((time.time(), ids.copy()))
                self.received.release()
                time.sleep(self.step_s)
        except BaseException as error:  # noqa: BLE001 - the dead rank's consumer ends here
            self.error = error
            self.received.release()

    def ids(self) -> np.ndarray:
        parts = [ids for _, ids in self.arrivals]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)


def recovery_once(paths: list[str], mode: str, rows: int, world: int = 3) -> dict:
    import ray

    from rayshard.loader import Loader
    from rayshard.sources.parquet import ParquetSource

    loader = Loader(
        ParquetSource(paths, split_rows=RECOVERY["split_rows"]),
        batch_size=RECOVERY["batch_size"],
        name=f"elastic-{uuid.uuid4().hex[:8]}",
        policy="dynamic",
    )
    coordinator = loader._coordinator
    try:
        ray.get(coordinator.__ray_call__.remote(_instrument))
        its = [
            loader.iterator(world_rank=r, world_size=world, batch_format="numpy")
            for r in range(world)
        ]
        victim = 1
        pid = ray.get(its[victim]._reader.__ray_call__.remote(_pid))
        consumers = [Consumer(it, RECOVERY["step_s"]) for it in its]
        for consumer in consumers:
            consumer.start()
        for _ in range(KILL_AFTER_BATCHES):
            if not consumers[victim].received.acquire(timeout=60):
                raise RuntimeError("the victim rank received no batch within 60 s")
        killed = time.time()
        if mode == "ray_kill":
            ray.kill(its[victim]._reader, no_restart=True)
        else:
            os.kill(pid, signal.SIGKILL)
        for consumer in consumers:
            consumer.join(120)
        if any(c.is_alive() for c in consumers):
            raise RuntimeError("a consumer did not finish its epoch within 120 s")
        survivors_failed = [
            repr(c.error) for i, c in enumerate(consumers) if i != victim and c.error
        ]
        if survivors_failed:
            raise RuntimeError(f"a surviving rank failed: {survivors_failed}")
        stats = loader.stats()
        log = ray.get(coordinator.__ray_call__.remote(_bench_log))
    finally:
        for it in its if "its" in locals() else ():
            with contextlib.suppress(Exception):  # the victim's reader is already dead
                ray.kill(it._reader)
        loader.shutdown()
    lost_events = [
        e for e in stats["events"] if e["event"] == "rank_lost" and e["dp_rank"] == victim
    ]
    lost_time, _, unacked = next(entry for entry in log["lost"] if entry[1] == victim)
    relet = next(
        (
            t
            for t, rank, piece in log["leases"]
            if rank != victim and t >= lost_time and piece and _overlaps(*piece, unacked)
        ),
        None,
    )
    served = min(
        (
            t
            for i, c in enumerate(consumers)
            if i != victim
            for t, ids in c.arrivals
            if t >= killed and _in_ranges(ids, unacked).any()
        ),
        default=None,
    )
    seen = np.concatenate([c.ids() for c in consumers])
    unique = np.unique(seen)
    missing = _runs(np.setdiff1d(np.arange(rows), unique))
    # Who was handed the missing rows, and when (s after the kill): the diagnosis of a loss.
    holders = [
        {"rank": rank, "after_kill_s": t - killed, "piece": piece}
        for t, rank, piece in log["leases"]
        if piece and _overlaps(*piece, missing)
    ]
    return {
        "mode": mode,
        "detect_s": lost_events[0]["time"] - killed if lost_events else None,
        "relet_s": None if relet is None else relet - killed,
        "served_s": None if served is None else served - killed,
        "unacked_rows": int(sum(end - start for start, end in unacked)),
        "requeued_rows": lost_events[0]["requeued_rows"] if lost_events else None,
        "victim_batches": len(consumers[victim].arrivals),
        "missing": int(rows - unique.size),
        "duplicates": int(seen.size - unique.size),
        "victim_error": type(consumers[victim].error).__name__,
        "missing_ranges": missing[:10],
        "missing_leased": holders[:10],
        "book_at_end": stats["leases"],
        "victim": victim,
        "lost_after_kill_s": lost_time - killed,
    }


def run_recovery(workdir: Path, repeats: int, rows: int) -> dict:
    paths = write_ids(workdir / "recovery", rows)
    runs = []
    for mode, _ in _progress([(m, i) for m in KILL_MODES for i in range(repeats)], desc="recovery"):
        runs.append(recovery_once(paths, mode, rows))
    summary = {}
    for mode in KILL_MODES:
        mine = [r for r in runs if r["mode"] == mode]
        row = {"mode": mode, "runs": len(mine)}
        for key in ("detect_s", "relet_s", "served_s"):
            row[f"{key}_median"], row[f"{key}_max"] = _median_max([r[key] for r in mine])
        row["missing"] = sum(r["missing"] for r in mine)
        row["duplicates_max"] = max(r["duplicates"] for r in mine)
        row["unacked_rows_median"] = statistics.median(r["unacked_rows"] for r in mine)
        summary[mode] = row
    return {
        "config": {
            **RECOVERY,
            "rows": rows,
            "world_size": 3,
            "kill_after_batches": KILL_AFTER_BATCHES,
            "repeats": repeats,
        },
        "runs": runs,
        "summary": summary,
    }


def ray_health_check_settings() -> dict:
    """The installed Ray's health-check settings (compiled defaults unless RAY_* is set)."""
    from ray._raylet import Config

    names = (
        "health_check_initial_delay_ms",
        "health_check_period_ms",
        "health_check_timeout_ms",
        "health_check_failure_threshold",
    )
    out = {name: int(getattr(Config, name)()) for name in names}
    out["node_death_detection_s_approx"] = (
        out["health_check_period_ms"] * out["health_check_failure_threshold"] / 1000
    )
    return out


# ---------------------------------------------------------------------------- throughput

RANKS = 1000
TINY_SPLIT = 16


def _lease_book_rates(splits: int, ranks: int) -> dict:
    from rayshard.leases import LeaseBook

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


def _journal_rate(workdir: Path, count: int) -> float:
    from rayshard.runtime.journal import Journal

    journal = Journal(str(workdir / "journal-bench.jsonl"), "bench")
    journal.start_fresh()
    began = time.perf_counter()
    for i in range(count):
        journal.append({"op": "lease", "args": {"dp_rank": i % RANKS, "epoch": 0}})
    return count / (time.perf_counter() - began)


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
                piece = await self.coordinator.lease.remote(generation, ranks[i % len(ranks)], 0)
                got += piece is not None

        began = time.time()
        await asyncio.gather(*(worker(k) for k in range(inflight)))
        return got, calls, began, time.time()


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process used so far."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def _drive(actors: list, generation: int, per: int, inflight: int, pids: list[int]) -> dict:
    """Every caller issues `per` lease calls; rates over the span of all of them, and the
    CPU the coordinator (pids[0]) and the callers used per call."""
    import ray

    ranks = len(actors)
    cpu_before = [_cpu_s(p) for p in pids]
    results = ray.get(
        [
            a.run.remote(generation, list(range(i, RANKS, ranks)), per, inflight)
            for i, a in enumerate(actors)
        ]
    )
    cpu = [_cpu_s(p) - before for p, before in zip(pids, cpu_before)]
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
    workdir: Path, splits: int, calls: int, callers: int, inflight: int, profile: str | None
) -> dict:
    import ray

    from rayshard.loader import Loader
    from rayshard.sources.parquet import ParquetSource

    book = _lease_book_rates(splits, RANKS)
    journal_per_s = _journal_rate(workdir, min(splits, 100_000))
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
            "ranks": RANKS,
            "splits": splits,
            "split_rows": TINY_SPLIT,
            "calls": calls,
            "callers": callers,
            "inflight_per_caller": inflight,
        },
        "lease_book": book,
        "journal_appends_per_s": journal_per_s,
    }
    try:
        regs = ray.get(
            [
                coordinator.register.remote(
                    r, RANKS, {"dp_rank": r, "dp_size": RANKS, "group": [r]}
                )
                for r in range(RANKS)
            ]
        )
        generation = regs[-1]["generation"]
        ray.get(coordinator.length.remote(generation, 0, 0))  # builds the epoch's lease book
        actors = [ray.remote(num_cpus=0)(_Caller).remote(coordinator) for _ in range(callers)]
        ray.get(
            [
                a.run.remote(generation, list(range(i, RANKS, callers)), 200, inflight)
                for i, a in enumerate(actors)
            ]
        )  # warm-up
        pid = ray.get(coordinator.__ray_call__.remote(_pid))
        pids = [pid, *ray.get([a.__ray_call__.remote(_pid) for a in actors])]
        out["actor"] = _drive(actors, generation, calls // callers, inflight, pids)
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
            out["actor_profiled"] = _drive(actors, generation, calls // callers, inflight, pids)
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
            out["profile"] = _py_spy_top(raw) if raw.exists() else "py-spy wrote nothing"
        batch, rounds = 100, max(calls // 100, 1)
        cpu_before = _cpu_s(pid)
        began = time.time()
        # The library's batched call: `lease_many` hands a rank up to `batch` pieces in
        # one round trip (readers use it to fill a block of batches per call).
        answers = ray.get(
            [
                coordinator.lease_many.remote(generation, k % RANKS, 0, batch)
                for k in range(rounds)
            ]
        )
        got = sum(len(a) for a in answers if isinstance(a, list))
        wall = time.time() - began
        out["batched"] = {
            "batch": batch,
            "calls": rounds,
            "leases": got,
            "seconds": wall,
            "leases_per_s": got / wall,
            "coordinator_cpu_us_per_lease": (_cpu_s(pid) - cpu_before) / got * 1e6,
        }
        for actor in actors:
            ray.kill(actor)
    finally:
        loader.shutdown()
    return out


# ---------------------------------------------------------------------------- epoch

EPOCH_BATCH = 1024
EPOCH_WORLD = 2


def write_features(folder: Path, rows: int, files: int = 8, row_group: int = 32768) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    bounds = np.linspace(0, rows, files + 1).astype(np.int64)
    paths = []
    for index, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        x = rng.standard_normal((hi - lo) * FEATURES, dtype=np.float32)
        table = pa.table(
            {
                "x": pa.FixedSizeListArray.from_arrays(pa.array(x), FEATURES),
                "label": rng.integers(0, 10, hi - lo, dtype=np.int64),
                "id": np.arange(lo, hi, dtype=np.int64),
            }
        )
        path = folder / f"part-{index:03d}.parquet"
        pq.write_table(table, path, row_group_size=row_group)
        paths.append(str(path))
    return paths


def _epoch_rank(loader, rank: int, epochs: int):
    batches = loader.iterator(world_rank=rank, world_size=EPOCH_WORLD, batch_format="numpy")
    return [
        EpochTimer(rank, e).consume(batches, lambda b: b["id"][~b["_padded"]])
        for e in range(epochs)
    ]


def epoch_once(paths: list[str], policy: str, rows: int) -> dict:
    import ray

    from rayshard.loader import Loader
    from rayshard.sources.parquet import ParquetSource

    loader = Loader(
        ParquetSource(paths),
        batch_size=EPOCH_BATCH,
        name=f"epoch-{policy}-{uuid.uuid4().hex[:8]}",
        policy=policy,
    )
    try:
        task = ray.remote(num_cpus=0)(_epoch_rank)
        records = ray.get([task.remote(loader, r, 2) for r in range(EPOCH_WORLD)])
    finally:
        _kill_readers(loader)
        loader.shutdown()
    warm = [rank[-1] for rank in records]
    return summarize_epoch(warm, rows, ROW_BYTES)


def run_epoch(workdir: Path, rows: int, repeats: int) -> dict:
    paths = write_features(workdir / "epoch", rows)
    runs: dict[str, list[dict]] = {"data": [], "dynamic": []}
    for _, policy in _progress([(i, p) for i in range(repeats) for p in runs], desc="epoch"):
        runs[policy].append(epoch_once(paths, policy, rows))
    summary = {}
    for policy, mine in runs.items():
        rates = [r["rows_per_s"] for r in mine]
        summary[policy] = {
            "policy": policy,
            "rows_per_s": statistics.median(rates),
            "rows_per_s_min": min(rates),
            "rows_per_s_max": max(rates),
            "coverage_ok": all(r["coverage"]["ok"] for r in mine),
        }
    summary["dynamic"]["ratio_vs_data"] = (
        summary["dynamic"]["rows_per_s"] / summary["data"]["rows_per_s"]
    )
    return {
        "config": {
            "rows": rows,
            "batch_size": EPOCH_BATCH,
            "world_size": EPOCH_WORLD,
            "repeats": repeats,
            "files": len(paths),
            "row_group": 32768,
        },
        "runs": runs,
        "summary": summary,
    }


# ---------------------------------------------------------------------------- driver


def _source_state() -> dict:
    """The commit measured and the rayshard files changed in the (shared) work tree."""

    def git(*command: str) -> str:
        done = subprocess.run(["git", *command], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    changed = git("status", "--porcelain", "--", "rayshard")
    return {"commit": git("rev-parse", "HEAD"), "rayshard_changes": changed.splitlines()}


def start_ray(num_cpus: int) -> None:
    import ray

    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    from rayshard.ray_tuning import apply_ray_env_defaults

    apply_ray_env_defaults()
    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            namespace="rayshard-elastic-bench",
            runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/elastic_bench.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--repeats", type=int, help="recovery runs per kill mode (default 5)")
    parser.add_argument("--callers", type=int, default=2, help="caller processes (throughput)")
    parser.add_argument("--inflight", type=int, default=64, help="calls in flight per caller")
    parser.add_argument("--profile", action="store_true", help="py-spy the coordinator")
    parser.add_argument("--py-spy", default=shutil.which("py-spy"), help="py-spy executable")
    parser.add_argument("--ray-cpus", type=int, default=4, help="logical CPUs for ray.init")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write JSON")
    args = parser.parse_args(argv)
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown or not args.sections:
        parser.error(
            f"argument --only: invalid choice {','.join(unknown) or args.only!r} "
            f"(choose from {', '.join(SECTIONS)})"
        )
    for option, value in (
        ("--repeats", args.repeats),
        ("--callers", args.callers),
        ("--inflight", args.inflight),
    ):
        if value is not None and value < 1:
            parser.error(f"Invalid value for '{option}': {value} is not in the range x>=1.")
    if args.profile and not args.py_spy:
        parser.error("--profile needs py-spy: pip install py-spy, or pass --py-spy PATH")
    if args.repeats is None:
        args.repeats = 1 if args.quick else 5
    return args


RECOVERY_TABLE = (
    ("kill", "mode", "s"),
    ("runs", "runs", "d"),
    ("detect med s", "detect_s_median", ".3f"),
    ("detect max s", "detect_s_max", ".3f"),
    ("relet med s", "relet_s_median", ".3f"),
    ("relet max s", "relet_s_max", ".3f"),
    ("served med s", "served_s_median", ".3f"),
    ("served max s", "served_s_max", ".3f"),
    ("unacked rows", "unacked_rows_median", ".0f"),
    ("lost", "missing", "d"),
    ("dup max", "duplicates_max", "d"),
)
THROUGHPUT_TABLE = (("path", "path", "s"), ("ops/s", "rate", ",.0f"), ("what", "what", "s"))
EPOCH_TABLE = (
    ("policy", "policy", "s"),
    ("rows/s", "rows_per_s", ",.0f"),
    ("min", "rows_per_s_min", ",.0f"),
    ("max", "rows_per_s_max", ",.0f"),
    ("vs data", "ratio_vs_data", ".3f"),
    ("coverage", "coverage", "s"),
)


def report_tables(results: dict) -> list[str]:
    out = []
    if "recovery" in results:
        out.append(format_table(list(results["recovery"]["summary"].values()), RECOVERY_TABLE))
    if "throughput" in results:
        t = results["throughput"]
        rows = [
            {
                "path": "LeaseBook.lease",
                "rate": t["lease_book"]["leases_per_s"],
                "what": "in process",
            },
            {"path": "LeaseBook.ack", "rate": t["lease_book"]["acks_per_s"], "what": "in process"},
            {"path": "Journal.append", "rate": t["journal_appends_per_s"], "what": "in process"},
            {
                "path": "actor lease.remote",
                "rate": t["actor"]["leases_per_s"],
                "what": "{callers} callers x {inflight_per_caller} in flight".format(**t["config"]),
            },
            {
                "path": "actor lease_many(100)",
                "rate": t["batched"]["leases_per_s"],
                "what": "one call, up to 100 pieces for one rank",
            },
        ]
        out.append(format_table(rows, THROUGHPUT_TABLE))
        if isinstance(t.get("profile"), dict):
            profile = t["profile"]
            out.append(f"coordinator profile (py-spy, {profile['samples']} samples, all threads):")
            out += [
                f"  self {p['self']:6.1%}  incl {p['inclusive']:6.1%}  {p['frame']}"
                for p in profile["top_self"]
            ]
            out.append("  rayshard frames, inclusive:")
            out += [
                f"  {share:6.1%}  {frame}"
                for frame, share in list(profile["coordinator_methods_inclusive"].items())[:8]
            ]
    if "epoch" in results:
        rows = [
            {**r, "coverage": "ok" if r["coverage_ok"] else "FAILED"}
            for r in results["epoch"]["summary"].values()
        ]
        out.append(format_table(rows, EPOCH_TABLE))
    return out


def check_targets(results: dict) -> dict:
    checks = {}
    if "recovery" in results:
        worst = [row["relet_s_max"] for row in results["recovery"]["summary"].values()]
        value = None if None in worst else max(worst)
        checks["recovery_s"] = {
            "value": value,
            "target": TARGETS["recovery_s"],
            "met": value is not None and value <= TARGETS["recovery_s"],
        }
    if "throughput" in results:
        value = results["throughput"]["actor"]["leases_per_s"]
        checks["actor_leases_per_s"] = {
            "value": value,
            "target": TARGETS["actor_leases_per_s"],
            "met": value >= TARGETS["actor_leases_per_s"],
        }
        batched = results["throughput"].get("batched", {}).get("leases_per_s")
        if batched is not None:
            checks["actor_lease_many_per_s"] = {
                "value": batched,
                "target": TARGETS["actor_leases_per_s"],
                "met": batched >= TARGETS["actor_leases_per_s"],
            }
    return checks


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = {
        "recovery_rows": 15_000 if args.quick else RECOVERY["rows"],
        "splits": 10_000 if args.quick else 200_000,
        "calls": 2_000 if args.quick else 20_000,
        "epoch_rows": 30_000 if args.quick else 1_000_000,
        "epoch_repeats": 1 if args.quick else 3,
    }
    start_ray(args.ray_cpus)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="rayshard-elastic-bench-") as tmp:
        workdir = Path(tmp)
        runners = {
            "recovery": lambda: {
                **run_recovery(workdir, args.repeats, sizes["recovery_rows"]),
                "ray_health_checks": ray_health_check_settings(),
            },
            "throughput": lambda: run_throughput(
                workdir,
                sizes["splits"],
                sizes["calls"],
                args.callers,
                args.inflight,
                args.py_spy if args.profile else None,
            ),
            "epoch": lambda: run_epoch(workdir, sizes["epoch_rows"], sizes["epoch_repeats"]),
        }
        for section in SECTIONS:
            if section in args.sections:
                began = time.time()
                results[section] = runners[section]()
                results[section]["section_seconds"] = time.time() - began
    print("\n\n".join(report_tables(results)))
    checks = check_targets(results)
    for key, check in checks.items():
        sign = "<=" if key == "recovery_s" else ">="
        value = "-" if check["value"] is None else f"{check['value']:,.3f}"
        print(
            f"{key}: {value} (target {sign} {check['target']:,}) "
            f"{'met' if check['met'] else 'MISSED'}"
        )
    report = {
        "config": {"quick": args.quick, "ray_cpus": args.ray_cpus, **sizes, **_source_state()},
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "results": results,
        "targets": checks,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2, default=float))
    print(f"wrote {args.json}")
    import ray

    ray.shutdown()
    lost = sum(r["missing"] for r in results.get("recovery", {}).get("runs", []))
    epoch_ok = all(s["coverage_ok"] for s in results.get("epoch", {}).get("summary", {}).values())
    return 0 if lost == 0 and epoch_ok else 1


if __name__ == "__main__":
    sys.exit(main())
