"""Ray settings rayshard exports before starting a local Ray."""

from __future__ import annotations

import os

from rayshard.runtime.ray_tuning import RAY_ENV_DEFAULTS, apply_ray_env_defaults, export_pythonpath

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


def test_pythonpath_export_puts_the_folder_first_once(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/b", "/a", "/b"]))
    export_pythonpath("/a")
    assert os.environ["PYTHONPATH"].split(os.pathsep) == ["/a", "/b", "/b"]
    monkeypatch.delenv("PYTHONPATH")
    export_pythonpath("/a")
    assert os.environ["PYTHONPATH"] == "/a"


def test_session_workers_import_the_tests_without_a_runtime_env(ray_session):
    # The session's Ray was started with PYTHONPATH exported instead of a job runtime_env:
    # its workers import `tests.*` all the same, and start without a setup process.
    import ray

    @ray.remote(num_cpus=0)
    def where() -> tuple[str, dict]:
        import tests.runtime.helpers as helpers

        return helpers.__file__, ray.get_runtime_context().runtime_env

    module, runtime_env = ray.get(where.remote())
    assert module.startswith(os.getcwd()) and not runtime_env.get("env_vars"), runtime_env
