"""Actor classes made remote once per process.

Ray exports a remote class to the cluster once per job, but every `ray.remote(cls)` call
makes a new class that is exported again when its first actor starts (about 0.1 s on the
caller: Ray disassembles the class to detect duplicate exports). Loaders, iterators and
readers start their actors through `remote_class`, so only the first pays it.
"""

from __future__ import annotations

import functools
from typing import Any

import ray


@functools.cache
def remote_class(cls: type) -> Any:
    """`ray.remote(cls)`, made once per process; set options with `.options(...)`."""
    return ray.remote(cls)


__all__ = ["remote_class"]
