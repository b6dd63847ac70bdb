"""An iterator still open when the script calls `ray.shutdown()` (a loop that broke early,
an exception): nothing of it may start a new local Ray (Ray's auto-init) or touch the core
worker while it shuts down: not its acknowledgement thread, not `close()`, not its
finalizer when it is dropped. Each used to call into Ray after the shutdown; a check of
`ray.is_initialized()` alone raced with it (a thread that ended, or dropped an
`ObjectRef`, while the core worker shut down ended the process).

The script runs in a process of its own, since it shuts its Ray down."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rayshard import Loader, ParquetSource
from rayshard.runtime.ray_held import ray_held
from tests.runtime.helpers import unique_name, write_parquet
from tests.timeouts import wait_until

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import gc, sys, threading
import ray
from rayshard import Loader, ParquetSource

ray.init(address="local", num_cpus=1, include_dashboard=False)
loader = Loader(ParquetSource(sys.argv[1], columns=["id"]), batch_size=4, ack_interval_s=0.1)
its = [loader.iterator(world_rank=r, world_size=4, batch_format="numpy") for r in range(4)]
for it in its:
    next(iter(it))
    it._acks.flush(wait=True)
    next(iter(it))  # its acknowledgement goes out from the thread, never awaited
kept, dropped, gone = its[0], its[1], its[2:]
del its, it
# Dropped while Ray is up: their keys are released; their acknowledgement threads hold the
# last references to what they sent, and live on until Ray shuts down under them.
del gone
gc.collect()

# Ray's shutdown ends the core worker, then deletes `global_worker.core_worker`: an
# `ObjectRef` dropped in between ends the process. The window is a GIL handover wide; here
# the acknowledgement threads that look at Ray during the shutdown are held until it, and
# it is held open (up to a second per thread) for them to end in it.
Worker = type(ray._private.worker.global_worker)
window, shutting_down = threading.Event(), False
def connected(self, get=Worker.connected.fget):
    if shutting_down and threading.current_thread().name == "rayshard-acks":
        window.wait()
    return get(self)
def held_open(self, name, delete=Worker.__delattr__):
    if name == "core_worker":
        window.set()
        for thread in threading.enumerate():
            if thread.name == "rayshard-acks":
                thread.join(timeout=1)
    delete(self, name)
Worker.connected, Worker.__delattr__ = property(connected), held_open

next(iter(kept))  # a received batch: its acknowledgement is pending
shutting_down = True
ray.shutdown()
for thread in threading.enumerate():  # every acknowledgement thread's next flush, or end
    if thread.name == "rayshard-acks":
        thread.join(timeout=30)
        print("acknowledgement thread alive:", thread.is_alive(), flush=True)
kept.close()  # after ray.shutdown(): nothing left to leave
del dropped  # its finalizer: nothing left to release
gc.collect()
print("initialized after:", ray.is_initialized(), flush=True)
"""


def test_ray_held_is_rays_own_init_and_shutdown_lock():
    """Without Ray's lock `ray_held` falls back to a check that races (see the module)."""
    from ray._private import worker

    from rayshard.runtime import ray_held

    assert ray_held._LOCK is worker._connect_or_shutdown_lock


@pytest.mark.ray
def test_an_iterator_open_at_ray_shutdown_starts_no_new_ray(tmp_path):
    data = write_parquet(tmp_path / "data", [40], row_group_size=10)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_DEDUP_LOGS": "0"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, data],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,  # a Ray start and shutdown: about 10 s
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "initialized after: False" in done.stdout, out[-3000:]
    assert "alive: True" not in done.stdout, out[-3000:]
    assert out.count("Started a local Ray instance") == 1, out[-3000:]
    assert "Exception in thread" not in out, out[-3000:]


@pytest.mark.ray
def test_an_iterator_dropped_while_rays_lock_is_busy_is_released_once_it_is_free(
    ray_session, tmp_path
):
    """A finalizer must not wait for Ray's lock (it may run on a thread that a shutdown
    joins): while another thread holds it, a thread of its own releases the key later."""
    path = write_parquet(tmp_path / "data", [20], row_group_size=10)
    loader = Loader(ParquetSource(path), name=unique_name("busy"), batch_size=4)
    held, free = threading.Event(), threading.Event()

    def hold() -> None:
        with ray_held():
            held.set()
            free.wait()

    try:
        dropped = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        assert dropped._holds.watch_key is not None
        holder = threading.Thread(target=hold)
        holder.start()
        held.wait()
        del dropped
        gc.collect()  # the finalizer finds the lock busy: nothing released yet
        releasing = [t for t in threading.enumerate() if t.name == "rayshard-release"]
        free.set()
        holder.join()
        assert releasing
        wait_until(
            lambda: [e for e in loader.stats()["events"] if e["event"] == "rank_lost"],
            "the dropped rank's release",
        )
    finally:
        free.set()
        loader.shutdown()
