"""Every environment variable the device feed reads, and the checks its numbers must pass.

Explicit arguments always win over these variables. The names and meanings follow DALI's
(`DALI_HOST_BUFFER_GROWTH_FACTOR` and friends) so that DALI users find what they expect.

| variable | meaning | values |
|---|---|---|
| `RAYSHARD_HOST_BUFFER_GROWTH_FACTOR` | over-allocation when a staging buffer must grow | float >= 1 (default 1) |
| `RAYSHARD_BUFFER_GROWTH_FACTOR` | the same, used when the host-specific one is unset | float >= 1 |
| `RAYSHARD_HOST_BUFFER_SHRINK_THRESHOLD` | ordinary host buffers shrink below this fraction | float in [0, 1] (default 0.9) |
| `RAYSHARD_AFFINITY_MASK` | CPU ids for reader threads, thread i on the i-th id | e.g. `3,5,6,10` |
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from rayshard.errors import ConfigError

HOST_GROWTH_FACTOR = "RAYSHARD_HOST_BUFFER_GROWTH_FACTOR"
GROWTH_FACTOR = "RAYSHARD_BUFFER_GROWTH_FACTOR"
HOST_SHRINK_THRESHOLD = "RAYSHARD_HOST_BUFFER_SHRINK_THRESHOLD"
AFFINITY_MASK = "RAYSHARD_AFFINITY_MASK"

DEFAULT_GROWTH_FACTOR = 1.0
DEFAULT_SHRINK_THRESHOLD = 0.9

DEVICE_VARIABLES = (HOST_GROWTH_FACTOR, GROWTH_FACTOR, HOST_SHRINK_THRESHOLD, AFFINITY_MASK)


def check_growth_factor(value: float, name: str = "growth_factor") -> float:
    """Return `value` as a float if it is a finite number >= 1, else name it and the fix."""
    number = _as_float(value, name)
    if not math.isfinite(number) or number < 1.0:
        raise ConfigError(
            f"{name}={value!r} is not a valid growth factor: buffers only grow, so it must be "
            f"a finite number >= 1 (use 1 for exact sizes, e.g. 1.5 to over-allocate by 50%)"
        )
    return number


def check_shrink_threshold(value: float, name: str = "shrink_threshold") -> float:
    """Return `value` as a float if it lies in [0, 1], else name it and the fix."""
    number = _as_float(value, name)
    if not 0.0 <= number <= 1.0:
        raise ConfigError(
            f"{name}={value!r} is outside [0, 1]: use 0 to never shrink, 1 to always shrink, "
            f"or a fraction such as the default {DEFAULT_SHRINK_THRESHOLD}"
        )
    return number


def host_growth_factor(environ: Mapping[str, str] | None = None) -> float:
    """The host staging growth factor from the environment (host-specific name first)."""
    environ = os.environ if environ is None else environ
    for variable in (HOST_GROWTH_FACTOR, GROWTH_FACTOR):
        text = environ.get(variable, "").strip()
        if text:
            return check_growth_factor(text, variable)
    return DEFAULT_GROWTH_FACTOR


def host_shrink_threshold(environ: Mapping[str, str] | None = None) -> float:
    """The shrink threshold for ordinary (non-pinned) host buffers from the environment."""
    environ = os.environ if environ is None else environ
    text = environ.get(HOST_SHRINK_THRESHOLD, "").strip()
    if not text:
        return DEFAULT_SHRINK_THRESHOLD
    return check_shrink_threshold(text, HOST_SHRINK_THRESHOLD)


def affinity_mask_text(environ: Mapping[str, str] | None = None) -> str:
    """The raw `RAYSHARD_AFFINITY_MASK` (empty when unset); `affinity.py` parses it."""
    environ = os.environ if environ is None else environ
    return environ.get(AFFINITY_MASK, "").strip()


def _as_float(value: object, name: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is a bool: give a number")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r} is not a number: give a decimal such as 1.5") from None
