"""Shared fixtures: one local Ray for the whole session (function-scoped `ray.init` is slow)."""

from __future__ import annotations

import os
import sys

import pytest

# Ray's own background work that the tests do not use, turned down for every Ray the suite
# starts (this process's and, inherited, those of the scenarios, examples and benchmarks
# it runs in subprocesses). The suite is CPU-bound on 2 cores; a sampled run attributed
# 94 CPU-s (5%) to log monitors re-globbing their session's hundreds of worker logs every
# 0.1 s (tests run with log_to_driver=False, so nothing reads what they publish), and
# ~1.5 CPU-s per Ray start to workers prestarted for the first driver. Ray Train (2.60)
# starts a `PreemptionWatcher` actor, one more worker process polling the GCS for node
# drains, with every worker group (restarts included); no test drains a node.
# This machine's environment sets PYTHONDONTWRITEBYTECODE=1, so every process would compile
# rayshard's modules (and pytest its rewritten test modules) from source each time: measured
# here 0.09-0.1 CPU-s more per process that imports the loader's modules, and a run starts
# hundreds (every Ray actor, the scenarios' subprocesses). Bytecode on (`__pycache__`,
# ignored by git) for this process and, inherited, for every Ray and subprocess it starts.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

for _name, _value in {
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",  # re-glob every LOG_NAME_UPDATE_INTERVAL_S
    "LOG_NAME_UPDATE_INTERVAL_S": "5",
    "RAY_prestart_worker_first_driver": "0",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}.items():
    os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray with a few CPUs and no dashboard, shared by every Ray test."""
    import ray

    from rayshard.runtime.ray_tuning import apply_ray_env_defaults, export_pythonpath

    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    # Ray Train's controller polls its workers, and takes their reports (one queued per
    # worker: `ray.train.report` blocks while it is full), every 2 s by default; the
    # Train tests report a checkpoint every few batches. The multinode scenarios use the
    # same value (tests/multinode/scenarios.py).
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    apply_ray_env_defaults()
    # Workers import `tests.*` from the repository: they inherit PYTHONPATH from the raylet
    # this process starts. A job-level `runtime_env` would do the same through a setup
    # process per worker: measured here, 1.0-1.2 s per actor start against 0.55-0.6 s.
    export_pythonpath(os.getcwd())
    if not ray.is_initialized():
        ray.init(
            address="local",  # a fresh local Ray, whatever else runs on the machine
            num_cpus=4,
            include_dashboard=False,
            log_to_driver=False,
            namespace="rayshard-tests",
        )
    yield ray
    ray.shutdown()


def pytest_collection_modifyitems(config, items):
    """The `slow` tests (whole clusters, Ray Train runs, benchmark subprocesses: tens of
    seconds each) first, in their collected order, then the rest, so no long scenario is
    left to run alone at the end. `make test` distributes with `--dist worksteal`: each
    worker starts with one contiguous share of this list (the first, with every slow test),
    and a worker that runs out takes half of what the busiest one has left. Under xdist's
    default `load` the first worker's first share held every slow test, so it ran them in
    a row (in a `-n 3` run it finished 80 s after the others); two fresh-clone CI runs
    took 910 s (`load`) and 918 s (`worksteal`): the suite is CPU-bound either way."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_sessionfinish(session, exitstatus):
    session.config._rayshard_exitstatus = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Leave without finalizing the interpreter, keeping pytest's exit status.

    Daemon threads that hold torch tensors (device-feed staging threads, test consumers)
    can still be alive at interpreter shutdown; a fresh-clone CI run had every test pass
    (573 passed) and then aborted in `THPVariable_dealloc` -> `take_gil` -> `pthread_exit`
    during finalization (a forced unwind through torch's C++ frames), turning the run red.
    Everything pytest reports is written by now; only that teardown is skipped."""
    status = getattr(config, "_rayshard_exitstatus", None)
    if status is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
