"""rayshard: a Ray-based elastic distributed data loader for training.

The public surface is importable from the top level (`from rayshard import Loader,
ParquetSource`); names resolve on first use, so `import rayshard` stays cheap and the
pure core (`rayshard.core`) does not pull in Ray.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "Loader": "rayshard.loader",
    "LoaderConfig": "rayshard.config.loader_config",
    "Packing": "rayshard.data.packing",
    "Source": "rayshard.sources.base",
    "TableSource": "rayshard.sources.base",
    "ParquetSource": "rayshard.sources.parquet",
    "ArrowFileSource": "rayshard.sources.arrow_files",
    "MixedSource": "rayshard.sources.mixed",
    "TorchMapSource": "rayshard.sources.torch_map",
    "RayDataSource": "rayshard.sources.ray_data",
    "ConfigError": "rayshard.errors",
    "RayshardError": "rayshard.errors",
    "DataError": "rayshard.errors",
    "ReadDeniedError": "rayshard.errors",
    "StaleClientError": "rayshard.errors",
    "TransformError": "rayshard.errors",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'rayshard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
