"""The top-level names are the documented classes, resolved lazily: importing `rayshard`
alone imports neither Ray nor torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

import rayshard


@pytest.mark.parametrize("name", rayshard.__all__)
def test_every_public_name_is_the_class_of_its_module(name):
    value = getattr(rayshard, name)
    module = __import__(rayshard._PUBLIC[name], fromlist=[name])
    assert value is getattr(module, name)
    assert name in dir(rayshard)


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Lodaer'"):
        rayshard.Lodaer  # noqa: B018


def test_import_rayshard_is_cheap():
    code = "import sys, rayshard; print('ray' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
