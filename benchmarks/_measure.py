"""Measurement helpers of the loader benchmark: memory (PSS of a process tree), per-rank
epoch records, the summary of one loader, and the printed table.

Memory is the proportional set size (PSS, `/proc/<pid>/smaps_rollup`) summed over the
benchmark process and every process descended from it. PSS splits each shared page
among the processes that map it, so shared memory (Ray's object store, mmapped files,
shared libraries) counts once in the sum instead of once per process.

Steady rows/s (`summarize_epoch`) leave out each epoch's start: per rank, the rows after
its first batch over the time from its first batch to its last, summed over the ranks
(ranks read at once, so their rates add). No rank's rows before its own window count.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Sequence

import numpy as np

from rayshard.plan import intervals as iv
from rayshard.plan.id_runs import sample_runs

MB = 1e6


def _children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc/<pid>/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue  # the process exited meanwhile
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def process_tree(root: int | None = None) -> list[int]:
    """`root` (default: this process) and all its descendants."""
    children = _children_map()
    out, todo = [], [root or os.getpid()]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def process_name(pid: int) -> str | None:
    """The name /proc gives `pid` (a Ray worker's is `ray::<class or task>`, cut to 15
    characters); None if it exited."""
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return None


_KINDS = (b"Pss_Anon:", b"Pss_File:", b"Pss_Shmem:")


def pss_bytes(pid: int) -> dict[str, int]:
    """PSS of one process in bytes: total `Pss` and its `Pss_Anon`, `Pss_File`,
    `Pss_Shmem` parts (Ray's object store is shmem); empty if it exited."""
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            for line in handle:
                if line.startswith(b"Pss:") or line.startswith(_KINDS):
                    key, value = line.split()[:2]
                    out[key.decode().rstrip(":")] = int(value) * 1024
    except OSError:
        pass
    return out


def wait_for_exit(names: tuple[str, ...], timeout_s: float) -> None:
    """Wait until no process of this tree has one of these names (killed actors take a
    few seconds to exit, and would count in the next measurement's memory)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if not any(process_name(pid) in names for pid in process_tree()):
            return
        time.sleep(0.2)


# The harness's own Ray actor (`benchmarks.loaders.on_ray.EpochBarrier`), not a loader's:
# its process name as /proc shows it (15 characters) starts so.
HARNESS_PROCESS = "ray::EpochBarri"


def tree_pss() -> tuple[int, dict[str, int], dict[str, int]]:
    """Total PSS of this process tree, PSS by process name, and PSS by kind (the
    harness's epoch barrier left out)."""
    total, by_name, by_kind = 0, {}, {}
    for pid in process_tree():
        name = process_name(pid)
        if name is None or name.startswith(HARNESS_PROCESS):
            continue  # it exited, or it is the harness's
        parts = pss_bytes(pid)
        pss = parts.pop("Pss", 0)
        total += pss
        for kind, value in parts.items():
            by_kind[kind] = by_kind.get(kind, 0) + value
        by_name[name] = by_name.get(name, 0) + pss
    return total, by_name, by_kind


MEMORY_DUTY = 0.03
"""The share of one core the PSS sampler may use. A sample of a Ray loader's tree (a
dozen processes and more) costs 20-100 ms, of the raw scan's (3 processes) about 10: at 20%
of a core, the sampler took about 5% of the Ray loaders' rows/s on 2 cores and little of
the raw scan's, an unfair handicap in a comparison of the two."""


class PeakPss:
    """Samples the tree's PSS on a background thread; `peak` is the largest sum seen.

    with PeakPss() as memory: ...; memory.baseline, memory.peak, memory.top, memory.kinds,
    memory.cpu_s (the sampler's own CPU-seconds). `sample_now()` takes a sample at once
    (at an epoch's edge, while the ranks wait): the paced samples may be seconds apart,
    longer than an epoch, and its times are in `edges`.
    """

    def __init__(self, interval_s: float = 0.1, max_duty: float = MEMORY_DUTY) -> None:
        self.interval_s = interval_s
        self.max_duty = max_duty  # at most this share of one core goes to sampling
        self.cpu_s = 0.0
        self.baseline = 0
        self.peak = 0
        self.top: dict[str, int] = {}  # PSS by process name at the peak
        self.kinds: dict[str, int] = {}  # PSS by kind (anon, file, shmem) at the peak
        self.samples = 0
        self.series: list[tuple[float, int]] = []  # (time.time(), total PSS) per sample
        self.edges: list[float] = []  # times of the samples `sample_now` asked for
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._asked: list[threading.Event] = []
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="pss-sampler", daemon=True)

    def __enter__(self) -> PeakPss:
        self.baseline = tree_pss()[0]
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._wake.set()
        self.thread.join()
        self._sample()
        self._answer(self._take_asked(), self.series[-1][0])

    def sample_now(self, timeout_s: float = 60.0) -> bool:
        """Sample now on the sampler's thread (its CPU stays the sampler's) and wait for
        it; False if it did not come within `timeout_s`."""
        done = threading.Event()
        with self._lock:
            self._asked.append(done)
        self._wake.set()
        return done.wait(timeout_s)

    def _take_asked(self) -> list[threading.Event]:
        with self._lock:
            asked, self._asked = self._asked, []
        return asked

    def _answer(self, asked: list[threading.Event], stamp: float) -> None:
        if asked:
            self.edges.append(stamp)
        for done in asked:
            done.set()

    def _run(self) -> None:
        # Reading smaps_rollup walks page tables: 2-10 ms per process, so with dozens of
        # Ray processes a sample costs 0.1 s or more. Space samples so the sampler uses
        # at most `max_duty` of one core (it shares the machine with what it measures).
        began_cpu = time.thread_time()
        while not self._stop.is_set():
            began = time.perf_counter()
            asked = self._take_asked()
            self._sample()
            self._answer(asked, self.series[-1][0])
            cost = time.perf_counter() - began
            self.cpu_s = time.thread_time() - began_cpu
            self._wake.wait(pause_after(cost, self.interval_s, self.max_duty))
            self._wake.clear()  # (a request arriving meanwhile is taken on the next turn)

    def _sample(self) -> None:
        total, by_name, by_kind = tree_pss()
        self.samples += 1
        self.series.append((time.time(), total))
        if total > self.peak:
            self.peak, self.top, self.kinds = total, by_name, by_kind


@dataclasses.dataclass
class EpochRecord:
    """What one rank saw in one epoch (wall-clock `time.time()` stamps, same machine)."""

    rank: int
    epoch: int
    start: float  # the rank began asking for the epoch's data
    first: float  # its first batch arrived
    end: float  # its last batch arrived
    rows: int
    batches: int
    # (k, 2) half-open runs of the ids of the real rows received, in arrival order: an
    # unshuffled epoch is a few runs, so the harness's own memory (counted in every
    # loader's PSS, in the ranks and in the driver that gathers the records) stays small
    runs: np.ndarray
    first_rows: int = 0  # real rows of its first batch


class EpochTimer:
    """Consume an iterable of batches on one rank, timing it and keeping the ids as runs.

    `ids_of(batch)` returns the ids of the batch's real rows; `check(batch)` is called on
    the first batch (shape and dtype checks).
    """

    def __init__(self, rank: int, epoch: int, start: float | None = None) -> None:
        self.rank, self.epoch = rank, epoch
        self.start = time.time() if start is None else start

    def consume(self, batches, ids_of, check=None) -> EpochRecord:
        first, count, rows, first_rows, parts = None, 0, 0, 0, []
        for batch in batches:
            if first is None:
                first = time.time()
                if check is not None:
                    check(batch)
            ids = np.asarray(ids_of(batch), dtype=np.int64)
            if count == 0:
                first_rows = int(ids.size)
            # runs in arrival order (the acknowledgements' helper: it cuts where ids jump)
            parts.append(np.array(sample_runs(ids), dtype=np.int64).reshape(-1, 2))
            rows += int(ids.size)
            count += 1
        end = time.time()
        runs = merge_adjacent(np.concatenate(parts)) if parts else np.empty((0, 2), np.int64)
        return EpochRecord(
            self.rank, self.epoch, self.start, first or end, end, rows, count, runs, first_rows
        )


def merge_adjacent(runs: np.ndarray) -> np.ndarray:
    """`runs` with each run that starts where the one before it ends joined to it."""
    if len(runs) < 2:
        return runs
    starts_new = np.concatenate(([True], runs[1:, 0] != runs[:-1, 1]))
    first = np.flatnonzero(starts_new)
    last = np.concatenate((first[1:], [len(runs)])) - 1
    return np.stack((runs[first, 0], runs[last, 1]), axis=1)


def coverage(records: Sequence[EpochRecord], num_rows: int) -> dict:
    """Exactly-once check of one epoch: the union of ids over ranks is 0..num_rows-1,
    each received once."""
    runs = np.concatenate([r.runs for r in records]) if records else np.empty((0, 2), np.int64)
    received = int((runs[:, 1] - runs[:, 0]).sum())
    union = iv.normalize(runs.tolist())
    union_all = iv.total(union)
    union_inside = iv.total(iv.intersect(union, ((0, num_rows),)))
    missing = num_rows - union_inside
    extra = union_all - union_inside
    duplicates = received - union_all
    return {
        "ok": missing == 0 and duplicates == 0 and extra == 0,
        "rows_received": received,
        "missing": missing,
        "duplicates": duplicates,
        "unknown_ids": extra,
    }


def summarize_epoch(records: Sequence[EpochRecord], num_rows: int, row_bytes: int) -> dict:
    """Throughput of one epoch over all ranks: from the first rank's start to the last
    rank's end; time to first batch is the slowest rank's."""
    start = min(r.start for r in records)
    end = max(r.end for r in records)
    elapsed = max(end - start, 1e-9)
    rows = sum(r.rows for r in records)
    return {
        "epoch": records[0].epoch,
        "start": start,
        "end": end,
        "seconds": elapsed,
        "rows": rows,
        "rows_per_s": rows / elapsed,
        "steady_rows_per_s": steady_rows_per_s(records),
        # Each rank timed from its own start: ranks that run unsynchronized drift apart
        # over epochs, and the span above then holds the drift; a synchronized loop (DDP)
        # goes at the slowest rank's pace, which this is.
        "rank_seconds": [r.end - r.start for r in sorted(records, key=lambda r: r.rank)],
        "slowest_rank_rows_per_s": rows / max(max(r.end - r.start for r in records), 1e-9),
        "mb_per_s": rows * row_bytes / elapsed / MB,
        "time_to_first_batch_s": max(r.first - r.start for r in records),
        "batches": sum(r.batches for r in records),
        "rank_rows": [r.rows for r in sorted(records, key=lambda r: r.rank)],
        "coverage": coverage(records, num_rows),
    }


def steady_rows_per_s(records: Sequence[EpochRecord]) -> float:
    """Rows/s with each epoch's start left out: per rank, the rows after its first batch
    over its first batch to its last, summed over ranks (a fast rank's rows before a slow
    rank's first batch stay its own, not the slow rank's window's)."""
    return sum((r.rows - r.first_rows) / max(r.end - r.first, 1e-9) for r in records)


def upper_median(values: Sequence[float]) -> float:
    """The median, the upper one of the middle two (what the benchmark calls a median)."""
    return sorted(values)[len(values) // 2]


def pause_after(cost_s: float, interval_s: float, max_duty: float) -> float:
    """The wait after a sample that took `cost_s`: at least `interval_s`, and long enough
    that sampling takes at most `max_duty` of the time."""
    return max(interval_s, cost_s / max_duty - cost_s)


def peak_between(series: Sequence[tuple[float, int]], start: float, end: float) -> int | None:
    """The largest sample of `series` taken between `start` and `end` (None if none: a
    sparse sampler may miss a short epoch)."""
    return max((total for t, total in series if start <= t <= end), default=None)


def epoch_windows(
    spans: Sequence[tuple[float, float]], edges: Sequence[float]
) -> list[tuple[float, float]]:
    """Each epoch's (start, end) widened to the edge samples taken around it: the last
    edge between the epoch before's end and its start, the first one between its end and
    the next epoch's start (an edge sample, taken while all ranks wait, is both one
    epoch's end and the next one's start)."""
    out = []
    for index, (start, end) in enumerate(spans):
        before = spans[index - 1][1] if index else float("-inf")
        after = spans[index + 1][0] if index + 1 < len(spans) else float("inf")
        lows = [t for t in edges if before <= t <= start]
        highs = [t for t in edges if end <= t <= after]
        out.append((lows[-1] if lows else start, highs[0] if highs else end))
    return out


def samples_between(series: Sequence[tuple[float, int]], start: float, end: float) -> int:
    """How many samples of `series` were taken between `start` and `end`."""
    return sum(1 for t, _ in series if start <= t <= end)


def growth(peaks: Sequence[float | None]) -> float | None:
    """The last sampled peak minus the first one (None with fewer than two sampled)."""
    sampled = [peak for peak in peaks if peak is not None]
    return sampled[-1] - sampled[0] if len(sampled) > 1 else None


def format_table(rows: Sequence[dict], columns: Sequence[tuple[str, str, str]]) -> str:
    """A plain text table; `columns` is (header, key, format) per column."""
    cells = [[header for header, _, _ in columns]]
    for row in rows:
        line = []
        for _, key, fmt in columns:
            value = row.get(key)
            line.append("-" if value is None else format(value, fmt))
        cells.append(line)
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    out = []
    for index, line in enumerate(cells):
        out.append(
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths)))
        )
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
