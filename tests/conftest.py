"""Shared fixtures: one local Ray for the whole session (function-scoped `ray.init` is slow)."""

from __future__ import annotations

import os

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
