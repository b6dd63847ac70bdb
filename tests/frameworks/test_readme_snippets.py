"""The README's "Training frameworks" snippets are excerpts of code the tests run: every
line of a snippet (comments aside) appears, in order, in the file it is taken from."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = {
    "rayshard.frameworks.lightning": ROOT / "examples" / "train_lightning.py",
    "rayshard.frameworks.transformers": ROOT / "tests" / "frameworks" / "hf_loops.py",
}


def _code_lines(text: str) -> list[str]:
    lines = (re.sub(r"\s+#.*$", "", line).strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _snippets() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Training frameworks", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_snippet_is_an_excerpt_of_tested_code(module):
    snippets = [s for s in _snippets() if module in s]
    assert len(snippets) == 1, f"one README snippet should import {module}"
    source = _code_lines(SOURCES[module].read_text())
    position = 0
    for line in _code_lines(snippets[0]):
        if line.startswith("def "):  # shown with a shorter signature
            name = line.split("(", 1)[0]
            assert any(s.startswith(name + "(") for s in source), line
            continue
        try:
            position = source.index(line, position) + 1
        except ValueError:
            pytest.fail(f"README line not found (in order) in {SOURCES[module].name}: {line}")
