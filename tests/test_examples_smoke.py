"""Smoke tests of the transform examples: each runs as its own process (with its own local
Ray) on a small dataset and must end with its OK line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_example(script: str, args: list[str], cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    env.pop("RAY_ADDRESS", None)
    command = [sys.executable, str(ROOT / "examples" / script), *args]
    command += [f"--storage={cwd / 'results'}", "--address=local"]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_images_example_small(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    pytest.importorskip("PIL")
    out = run_example("train_images.py", ["--samples=300", "--epochs=1"], tmp_path)
    assert "augmentation check: 300 samples" in out and "identical" in out
    assert "rayshard images: OK" in out


@pytest.mark.slow
def test_text_example_small(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    out = run_example("train_text.py", ["--max-bytes=60000", "--epochs=1"], tmp_path)
    assert "rayshard text: OK" in out


@pytest.mark.slow
def test_pretrain_mix_example_small(tmp_path: Path) -> None:
    out = run_example("pretrain_mix.py", ["--modules=3", "--epochs=1", "--workers=1"], tmp_path)
    assert "packed into rows of 256 tokens" in out
    assert "rayshard mix: OK" in out
