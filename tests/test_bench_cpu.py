"""The loader benchmark's CPU accounting (`benchmarks._cpu`): a child process's CPU counts,
the measuring threads' own does not, and a stretch of the run is read off the series."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks._cpu import IDLE_WORKER, TreeCpu, counted_name, cpu_between, process_cpu_s

ROOT = Path(__file__).resolve().parent.parent
BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_a_child_process_cpu_counts():
    with TreeCpu(interval_s=0.02) as cpu:
        subprocess.run([sys.executable, "-c", BURN.format(s=0.4)], check=True)
    # 0.4 CPU-s of burning, plus the interpreter's start; at most one interval of the
    # child's time after its last sample is missed
    assert cpu.seconds >= 0.3
    assert cpu.series[0][1] == 0.0 and cpu.series[-1][1] == cpu.seconds


SPINNER = """
import threading, time
from benchmarks._cpu import TreeCpu

spent, release = threading.Event(), threading.Event()


def spin():  # a measuring thread: burns 0.5 CPU-s, lives until released
    began = time.thread_time()
    while time.thread_time() - began < 0.5:
        pass
    spent.set()
    release.wait()


spinner = threading.Thread(target=spin, daemon=True)
spinner.start()
with TreeCpu(interval_s=0.02, measuring=[spinner]) as cpu:
    spent.wait()  # this thread only waits: nothing else of the tree works
release.set()
spinner.join()
print(cpu.seconds)
"""


def test_the_measuring_threads_do_not_count():
    # In a fresh process: this one's tree holds the session's Ray, whose processes work
    # whenever they like (and would count: they are in the tree).
    done = subprocess.run(
        [sys.executable, "-c", SPINNER], cwd=ROOT, check=True, capture_output=True, text=True
    )
    assert float(done.stdout.split()[-1]) < 0.25  # the spinner's 0.5 CPU-s are out


def test_cpu_between_reads_whole_sampling_intervals():
    series = [(0.0, 0.0), (1.0, 1.0), (2.0, 3.0), (3.0, 6.0)]
    assert cpu_between(series, 1.0, 2.0) == 2.0
    assert cpu_between(series, 1.5, 2.5) == 5.0  # widened to the samples around it
    assert cpu_between(series, -1.0, 9.0) == 6.0


def test_process_cpu_of_a_gone_process_is_none():
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert process_cpu_s(int(done.stdout)) is None
    assert process_cpu_s(os.getpid()) > 0


def test_cpu_by_process_names_the_process_that_spent_it(tmp_path):
    # /proc names a process after the file it was started from: a link to the interpreter
    # under another name tells the child's CPU apart from this process's.
    burner = tmp_path / "cpu-burner"
    burner.symlink_to(sys.executable)
    with TreeCpu(interval_s=0.02) as cpu:
        subprocess.run([str(burner), "-c", BURN.format(s=0.4)], check=True)
    by_process = cpu.by_process()
    assert by_process["cpu-burner"] >= 0.3
    assert list(by_process.values()) == sorted(by_process.values(), reverse=True)


def test_a_ray_worker_back_to_idle_counts_under_the_task_it_ran():
    task = "ray::_rayshard_rank"  # as /proc names a worker running the benchmark's rank
    assert counted_name(None, IDLE_WORKER) == IDLE_WORKER  # never seen running anything
    assert counted_name(IDLE_WORKER, task) == task
    assert counted_name(task, IDLE_WORKER) == task  # between tasks: still that task's
    assert counted_name(task, "ray::Coordinator") == "ray::Coordinator"  # the latest
    assert counted_name("python", "cpu-burner") == "cpu-burner"  # exec'd: its new name
    assert counted_name(task, None) == task  # exited: as counted
    assert counted_name(None, None) is None
