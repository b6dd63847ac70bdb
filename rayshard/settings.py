"""What a loader's actors receive: the driver's validated `LoaderConfig` itself.

`LoaderSettings` is another name for `rayshard.config.LoaderConfig` (one class lists every
field and its default); the loader fills in its `column_rules` before the actors start.
"""

from __future__ import annotations

from rayshard.config import LoaderConfig

LoaderSettings = LoaderConfig

__all__ = ["LoaderSettings"]
