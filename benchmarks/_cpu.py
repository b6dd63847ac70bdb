"""CPU time of a process tree during a measurement: what a loader costs, whatever else
the shared machine runs meanwhile.

Rows per second on a busy machine say how much of the cores a loader got; CPU-seconds per
row say what it needs, and stay put under load. `TreeCpu` samples the user and system
time of this process and every descendant (Ray's processes and workers included) on a
thread of its own, and sums each process's growth over the run: a process started during
the run counts from zero; one that exits counts up to its last sample (`interval_s`, so
at most that much of its time is missed). The samplers' own threads (this one's, and the
other measuring threads given, such as the PSS sampler's) are taken out: they measure,
they do not load.

`series` holds the tree's CPU-seconds since the start at each sample, so the CPU of a
stretch of the run (the warm epochs, leaving process start-up out) is `cpu_between`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

from benchmarks._measure import process_name, process_tree

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
IDLE_WORKER = "ray::IDLE"  # a Ray worker process between tasks


def process_cpu_s(pid: int) -> float | None:
    """User plus system CPU-seconds of `pid` so far (None if it exited)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S


class TreeCpu:
    """with TreeCpu() as cpu: ...; cpu.seconds is the tree's CPU-seconds spent inside.

    The CPU the threads in `measuring` (running threads of this process, such as a
    `PeakPss` sampler's, alive until this one exits) spend meanwhile is taken out too."""

    def __init__(
        self, interval_s: float = 0.05, measuring: Sequence[threading.Thread] = ()
    ) -> None:
        self.interval_s = interval_s
        self.seconds = 0.0
        self._measuring = list(measuring)
        self.series: list[tuple[float, float]] = []  # (time.time(), CPU-s so far)
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._names: dict[int, str | None] = {}  # pid -> `counted_name` (15 characters)
        self._own_began = 0.0
        self._own_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def __enter__(self) -> TreeCpu:
        self._read()
        self._first = dict(self._last)  # processes already running count from here
        self._other_start = self._measuring_cpu_s()
        self.series.append((time.time(), 0.0))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.seconds = self.series[-1][1]

    def _run(self) -> None:
        self._own_began = time.thread_time()
        while not self._stop.wait(self.interval_s):
            self._own_s = time.thread_time() - self._own_began
            self._sample()
        self._own_s = time.thread_time() - self._own_began

    def _sample(self) -> None:
        self._read()
        grown = sum(cpu - self._first.get(pid, 0.0) for pid, cpu in self._last.items())
        other = self._measuring_cpu_s() - self._other_start
        self.series.append((time.time(), max(grown - self._own_s - other, 0.0)))

    def _measuring_cpu_s(self) -> float:
        return sum(
            time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            for thread in self._measuring
            if thread.ident is not None and thread.is_alive()
        )

    def _read(self) -> None:
        for pid in process_tree():
            cpu = process_cpu_s(pid)
            if cpu is not None:
                self._last[pid] = cpu
                self._names[pid] = counted_name(self._names.get(pid), process_name(pid))

    def by_process(self) -> dict[str, float]:
        """CPU-seconds of the run by process name, largest first: where a loader's CPU
        goes, its ranks against Ray's and its own actors. A Ray worker counts under the
        last task or actor it was seen running (`ray::IDLE` if none); the measuring
        threads' own time is in their process's ("python" for the driver's samplers)."""
        out: dict[str, float] = {}
        for pid, cpu in self._last.items():
            name = self._names.get(pid) or "?"
            out[name] = out.get(name, 0.0) + cpu - self._first.get(pid, 0.0)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def counted_name(seen: str | None, now: str | None) -> str | None:
    """The name a process's CPU counts under, given the one it counted under so far
    (`seen`) and its name now (`now`, None once it exited): the latest, except that a
    Ray worker back to `ray::IDLE` keeps the task or actor it ran."""
    if now is None or (now == IDLE_WORKER and seen is not None):
        return seen
    return now


def cpu_between(series: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """CPU-seconds of `series` (a `TreeCpu`'s) from its last sample at or before `start` to
    its first at or after `end` (the stretch, widened to whole sampling intervals)."""
    before = [cpu for t, cpu in series if t <= start]
    after = [cpu for t, cpu in series if t >= end]
    low = before[-1] if before else series[0][1]
    high = after[0] if after else series[-1][1]
    return high - low


__all__ = ["TreeCpu", "counted_name", "cpu_between", "process_cpu_s"]
