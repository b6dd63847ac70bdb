"""Ray settings rayshard exports before starting a local Ray."""

from __future__ import annotations

import os

from rayshard.ray_tuning import RAY_ENV_DEFAULTS, apply_ray_env_defaults

FREE_PERIOD = "RAY_free_objects_period_milliseconds"  # Ray's own spelling


def test_defaults_are_exported_and_a_users_value_is_kept(monkeypatch):
    for name in RAY_ENV_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(FREE_PERIOD, "500")
    apply_ray_env_defaults()
    assert os.environ.get(FREE_PERIOD) == "500"
    monkeypatch.delenv(FREE_PERIOD)
    apply_ray_env_defaults()
    assert os.environ.get(FREE_PERIOD) == RAY_ENV_DEFAULTS[FREE_PERIOD] == "100"
