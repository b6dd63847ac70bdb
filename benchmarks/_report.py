"""What every benchmark writes next to its numbers, and the local Ray they run on."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def code_version() -> dict:
    """The commit measured, and which rayshard files differ from it (shared work tree)."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        except OSError:
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    return {
        "commit": git("rev-parse", "HEAD"),
        "modified": git("status", "--porcelain", "--", "rayshard").splitlines(),
    }


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def write_json(path: Path, report: dict) -> None:
    """Write `report` (with the code version and the machine) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {**report, "code": code_version(), "machine": machine()}
    path.write_text(json.dumps(document, indent=2, default=float) + "\n")
    print(f"wrote {path}")


def start_local_ray(num_cpus: int, namespace: str) -> None:
    """A fresh local Ray (never a cluster from RAY_ADDRESS) with rayshard's Ray settings;
    workers import `benchmarks.*` from the repository."""
    import ray

    from rayshard.runtime.ray_tuning import apply_ray_env_defaults, export_pythonpath

    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    apply_ray_env_defaults()
    export_pythonpath(str(ROOT))  # inherited by the workers
    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            namespace=namespace,
        )
