"""The GPU checks script (`benchmarks/gpu_checks.sh`) smoke-run on the CPU, its refusal
without CUDA, and the offline Ray wheel it installs from (`benchmarks/offline_wheels.py`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch

from benchmarks.offline_wheels import EXTRA, parse_args, strip_wheel
from tests.benchmark_runs import ROOT
from tests.timeouts import SCENARIO_TIMEOUT_S

SCRIPT = ROOT / "benchmarks" / "gpu_checks.sh"


def run_checks(out, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHON": sys.executable, **env}
    environment.pop("RAY_ADDRESS", None)  # its benchmarks start Ray of their own
    return subprocess.run(
        ["bash", str(SCRIPT), str(out)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=SCENARIO_TIMEOUT_S,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without CUDA")
def test_without_cuda_the_checks_stop_and_say_why(tmp_path):
    done = run_checks(tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no CUDA device seen by" in (tmp_path / "summary.txt").read_text()
    assert not (tmp_path / "gpu_feed.json").exists()


def _shadowing(tmp_path, module: str) -> str:
    """A folder whose `module` fails to import, to put first on PYTHONPATH."""
    package = tmp_path / "shadow" / module
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"raise ImportError('{module} shadowed by the test')\n")
    return str(package.parent)


def test_without_torch_the_checks_stop_and_say_why(tmp_path):
    out = tmp_path / "out"
    done = run_checks(out, PYTHONPATH=_shadowing(tmp_path, "torch"))
    assert done.returncode == 3, done.stdout + done.stderr
    assert "torch did not import" in (out / "summary.txt").read_text()


@pytest.mark.slow
def test_a_failed_step_fails_the_run_and_the_next_steps_still_run(tmp_path):
    out = tmp_path / "out"
    done = run_checks(
        out,
        RAYSHARD_GPU_DEVICE="cpu",
        PYTHONPATH=_shadowing(tmp_path, "ray"),
        RAYSHARD_GPU_BUDGET_S="300",
    )
    summary = (out / "summary.txt").read_text()
    assert done.returncode == 1, summary + done.stdout[-3000:] + done.stderr[-3000:]
    assert "gpu_feed: exit 0 in" in summary, summary  # needs no Ray
    assert "gpu_loader: exit 0 in" not in summary and "gpu_loader: exit" in summary, summary
    assert "step(s) failed or cut for time" in summary and ", 0 step(s)" not in summary, summary


@pytest.mark.slow
def test_a_cpu_smoke_run_runs_every_step(tmp_path):
    done = run_checks(tmp_path, RAYSHARD_GPU_DEVICE="cpu", RAYSHARD_GPU_BUDGET_S="500")
    summary = (tmp_path / "summary.txt").read_text()
    assert done.returncode == 0, summary + done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("gpu_tests", "gpu_feed", "gpu_loader", "gpu_stall"):
        assert f"{name}: exit 0 in" in summary, summary
    assert ", 0 step(s) failed or cut for time" in summary, summary
    assert json.loads((tmp_path / "gpu_feed.json").read_text())["device"] == "cpu"
    loaders = json.loads((tmp_path / "gpu_loader.json").read_text())["results"]
    assert set(loaders) == {"rayshard", "rayshard:4", "ray_data"}
    assert all(result["coverage_ok"] for result in loaders.values()), loaders
    assert all(result["rows_per_s"] > 0 for result in loaders.values()), loaders
    stall = json.loads((tmp_path / "gpu_stall.json").read_text())["results"]["rayshard"]
    assert stall["coverage_ok"] and len(stall["epochs"]["host_step"]) == 2, stall
    for loop in ("deliver", "step", "host_step"):  # the staging thread's phases, per loop
        assert set(stall[f"{loop}_feed_ms_per_batch"]) == {"source", "stage", "copy", "handover"}


def _wheel(folder, files: dict[str, bytes]):
    """A minimal valid wheel of a package `tiny` holding `files`, RECORD listing them."""
    info = "tiny-1.0.dist-info"
    files = {
        **files,
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    path = folder / "tiny-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in {**files, f"{info}/RECORD": record.encode()}.items():
            wheel.writestr(name, data)
    return path


def test_a_stripped_wheel_installs_without_the_dropped_files(tmp_path):
    whole = _wheel(tmp_path, {"tiny/__init__.py": b"VALUE = 7\n", "tiny/jars/big.jar": b"x" * 999})
    (tmp_path / "stripped").mkdir()
    stripped = strip_wheel(whole, tmp_path / "stripped", ("tiny/jars/",))
    names = zipfile.ZipFile(stripped).namelist()
    assert "tiny/jars/big.jar" not in names and "tiny/__init__.py" in names
    record = zipfile.ZipFile(stripped).read("tiny-1.0.dist-info/RECORD").decode()
    assert "jars" not in record and "tiny/__init__.py,," in record
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    subprocess.run([*pip, "--target", str(target), str(stripped)], check=True, timeout=120)
    assert not (target / "tiny" / "jars").exists()
    imported = subprocess.run(
        [sys.executable, "-c", "import tiny; print(tiny.VALUE)"],
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.strip() == "7"


def test_extra_wheels_add_to_the_default_list_unless_it_is_dropped(tmp_path):
    assert parse_args([str(tmp_path)]).wanted == list(EXTRA)
    added = parse_args([str(tmp_path), "--extra", "click==8.1.8", "msgpack"]).wanted
    assert added == [*EXTRA, "click==8.1.8", "msgpack"]
    only = parse_args([str(tmp_path), "--no-default-extras", "--extra", "msgpack"]).wanted
    assert only == ["msgpack"]
