"""`ray up` / `ray submit` / `ray down` for real over SSH, from pytest.

Runs tests/e2e/run_submit.sh (the script behind `make test-submit`) in a subprocess. Needs
root (it creates a throwaway user and starts a throwaway sshd); it installs openssh-server,
rsync, netcat-openbsd and acl with apt-get if they are missing. Excluded from `make test`;
run with:  .venv/bin/python -m pytest -m submit tests/e2e -v
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN_SUBMIT = REPO / "tests" / "e2e" / "run_submit.sh"

pytestmark = [
    pytest.mark.submit,
    pytest.mark.skipif(
        not hasattr(os, "geteuid") or os.geteuid() != 0,
        reason="needs root: creates a throwaway user and runs sshd (use `sudo make test-submit`)",
    ),
]


def _run(*args: str, timeout: int = 540) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.setdefault("RAYSHARD_E2E_PYTHON", sys.executable)
    proc = subprocess.run(
        ["bash", str(RUN_SUBMIT), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    print(proc.stdout[-6000:])  # shown by pytest on failure (or with -s)
    return proc


def test_submit_stand_in_script():
    proc = _run("tests/e2e/hello_ray.py", "--expect", "rayshard e2e hello: OK")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "PASSED: ray up + ray submit hello_ray.py + ray down" in proc.stdout
    assert "wrong-token check: ok" in proc.stdout


@pytest.mark.skipif(
    not (REPO / "examples" / "train.py").exists(), reason="examples/train.py not written yet"
)
def test_submit_examples_train():
    proc = _run("examples/train.py", "--expect", "rayshard demo: OK")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "PASSED: ray up + ray submit train.py + ray down" in proc.stdout
