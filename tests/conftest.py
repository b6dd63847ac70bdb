"""Shared fixtures: one local Ray for the whole session (function-scoped `ray.init` is slow)."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray with a few CPUs and no dashboard, shared by every Ray test."""
    import ray

    from rayshard.ray_tuning import apply_ray_env_defaults

    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    apply_ray_env_defaults()
    if not ray.is_initialized():
        ray.init(
            address="local",  # a fresh local Ray, whatever else runs on the machine
            num_cpus=4,
            include_dashboard=False,
            log_to_driver=False,
            namespace="rayshard-tests",
            runtime_env={"env_vars": {"PYTHONPATH": os.getcwd()}},
        )
    yield ray
    ray.shutdown()


# Tests that start a whole cluster (multi-node Ray, Ray Train groups, the autoscaler): under
# `pytest -n 2 --dist loadgroup` (`make test`) they run one after another in one worker
# process while the other worker takes the rest, so two of them never compete for the
# machine's cores at once.
WHOLE_CLUSTER_MODULES = (
    "tests/multinode/test_multinode.py",
    "tests/experiment/test_autoscaling_run.py",
    "tests/experiment/test_experiment_run.py",
    "tests/frameworks/test_lightning.py",
    "tests/frameworks/test_transformers.py",
    "tests/runtime/test_ray_train.py",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.split("::")[0] in WHOLE_CLUSTER_MODULES:
            item.add_marker(pytest.mark.xdist_group("whole_cluster"))


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
