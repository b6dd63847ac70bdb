"""Configuration: `LoaderConfig` and its parts (`parts`), the `RAYSHARD_*` environment
(`env`) and the shared value checks (`checks`). The configuration classes resolve on first
use (PEP 562), so the pure core can import `checks` without loading the sources the
configuration names; `from rayshard.config import LoaderConfig` still works."""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "LoaderConfig": "rayshard.config.loader_config",
    "ReadConfig": "rayshard.config.parts",
    "RuntimeConfig": "rayshard.config.parts",
    "PlanConfig": "rayshard.plan.options",
}


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'rayshard.config' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
