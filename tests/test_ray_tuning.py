"""Ray settings rayshard exports before starting a local Ray."""

from __future__ import annotations

from rayshard.ray_tuning import RAY_ENV_DEFAULTS, apply_ray_env_defaults


def test_defaults_are_exported_and_a_users_value_is_kept(monkeypatch):
    for name in RAY_ENV_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_free_objects_period_milliseconds", "500")
    apply_ray_env_defaults()
    import os

    assert os.environ["RAY_free_objects_period_milliseconds"] == "500"
    monkeypatch.delenv("RAY_free_objects_period_milliseconds")
    apply_ray_env_defaults()
    assert (
        os.environ["RAY_free_objects_period_milliseconds"]
        == RAY_ENV_DEFAULTS["RAY_free_objects_period_milliseconds"]
    )
