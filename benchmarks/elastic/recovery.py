"""Recovery after a rank's reader dies (see `benchmarks/elastic_bench.py`)."""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.elastic.common import (
    KILL_MODES,
    id_runs,
    in_ranges,
    median_max,
    overlaps,
    pid_of,
    progress,
)

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


def _trace_log(trace: list) -> dict:
    """The coordinator's trace as {"leases": [(time, rank, piece)], "lost": [(time, rank,
    unacknowledged pieces)]}."""
    log: dict = {"leases": [], "lost": []}
    for when, kind, rank, pieces in trace:
        if kind == "lease":
            log["leases"] += [(when, rank, list(piece)) for piece in pieces] or [(when, rank, None)]
        else:
            log["lost"].append((when, rank, [list(piece) for piece in pieces]))
    return log


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
        # Each rank its own reader actor, the process that dies: ranks that read in this
        # driver would share one watch actor, and killing it would end all of them.
        consumer_reads=False,
    )
    coordinator = loader._coordinator
    try:
        ray.get(coordinator.trace.remote(True))
        its = [
            loader.iterator(world_rank=r, world_size=world, batch_format="numpy")
            for r in range(world)
        ]
        victim = 1
        pid = ray.get(its[victim]._holds.reader.__ray_call__.remote(pid_of))
        consumers = [Consumer(it, RECOVERY["step_s"]) for it in its]
        for consumer in consumers:
            consumer.start()
        for _ in range(KILL_AFTER_BATCHES):
            if not consumers[victim].received.acquire(timeout=60):
                raise RuntimeError("the victim rank received no batch within 60 s")
        killed = time.time()
        if mode == "ray_kill":
            ray.kill(its[victim]._holds.reader, no_restart=True)
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
        log = _trace_log(ray.get(coordinator.trace.remote(False)))
    finally:
        for it in its if "its" in locals() else ():
            with contextlib.suppress(Exception):  # the victim's reader is already dead
                ray.kill(it._holds.reader)
        loader.shutdown()
    lost_events = [
        e for e in stats["events"] if e["event"] == "rank_lost" and e["dp_rank"] == victim
    ]
    lost_time, _, unacked = next(entry for entry in log["lost"] if entry[1] == victim)
    relet = next(
        (
            t
            for t, rank, piece in log["leases"]
            if rank != victim and t >= lost_time and piece and overlaps(*piece, unacked)
        ),
        None,
    )
    served = min(
        (
            t
            for i, c in enumerate(consumers)
            if i != victim
            for t, ids in c.arrivals
            if t >= killed and in_ranges(ids, unacked).any()
        ),
        default=None,
    )
    seen = np.concatenate([c.ids() for c in consumers])
    unique = np.unique(seen)
    missing = id_runs(np.setdiff1d(np.arange(rows), unique))
    # Who was handed the missing rows, and when (s after the kill): the diagnosis of a loss.
    holders = [
        {"rank": rank, "after_kill_s": t - killed, "piece": piece}
        for t, rank, piece in log["leases"]
        if piece and overlaps(*piece, missing)
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


def run_recovery(workdir: Path, repeats: int, rows: int, world: int = 3) -> dict:
    paths = write_ids(workdir / "recovery", rows)
    runs = []
    for mode, _ in progress([(m, i) for m in KILL_MODES for i in range(repeats)], desc="recovery"):
        runs.append(recovery_once(paths, mode, rows, world))
    summary = {}
    for mode in KILL_MODES:
        mine = [r for r in runs if r["mode"] == mode]
        row = {"mode": mode, "runs": len(mine)}
        for key in ("detect_s", "relet_s", "served_s"):
            row[f"{key}_median"], row[f"{key}_max"] = median_max([r[key] for r in mine])
        row["missing"] = sum(r["missing"] for r in mine)
        row["duplicates_max"] = max(r["duplicates"] for r in mine)
        row["unacked_rows_median"] = statistics.median(r["unacked_rows"] for r in mine)
        summary[mode] = row
    return {
        "config": {
            **RECOVERY,
            "rows": rows,
            "world_size": world,
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
