"""Fixtures of the runtime tests."""

from __future__ import annotations

import contextlib

import pytest

from rayshard.runtime import relay_link


@pytest.fixture
def short_relay_patience(monkeypatch):
    """A context in which this process's senders give a relayed call 1 s and a probe
    0.5 s, so a frozen relay is bypassed within the test's time. Only around the frozen
    part: a loaded machine may take a live relay longer than that to answer."""

    @contextlib.contextmanager
    def shortened():
        with monkeypatch.context() as patch:
            patch.setattr(relay_link, "RELAY_PATIENCE_S", 1.0)
            patch.setattr(relay_link, "PROBE_S", 0.5)
            yield

    return shortened
