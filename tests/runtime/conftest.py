"""Fixtures of the runtime tests."""

from __future__ import annotations

import pytest

from rayshard.runtime import relay_link


@pytest.fixture
def short_relay_patience(monkeypatch):
    """A relayed call's patience 1 s and a probe's 0.5 s, in this process's senders (a
    frozen relay is bypassed within the test's time)."""
    monkeypatch.setattr(relay_link, "RELAY_PATIENCE_S", 1.0)
    monkeypatch.setattr(relay_link, "PROBE_S", 0.5)
