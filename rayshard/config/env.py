"""Every environment variable the planner reads, in one place.

Explicit arguments always win over a configuration file, and the file over these.

| variable | meaning | values |
|---|---|---|
| `RAYSHARD_UNEVEN_FILES` | uneven-file policy in file modes (Whale's spirit) | `replicate`, `unbalanced`, `drop` |
| `RAYSHARD_ROTATION` | shard rotation across epochs | `none`, `shift`, `stride`, `stride_shift` |
| `RAYSHARD_LAST_BATCH` | what to do with the last short batch | `partial`, `drop`, `fill` |
| `RAYSHARD_PAD_LAST_BATCH` | pad every shard to full, equal batches | `1`/`0`, `true`/`false` |
| `RAYSHARD_EQUAL_STEPS` | every rank yields the same number of batches | `1`/`0`, `true`/`false` |
| `RAYSHARD_SEED` | the seed of shuffles and rotations | an integer >= 0 |
"""

from __future__ import annotations

import os
from collections.abc import Mapping

PLAN_VARIABLES = {
    "uneven": "RAYSHARD_UNEVEN_FILES",
    "rotation": "RAYSHARD_ROTATION",
    "last_batch": "RAYSHARD_LAST_BATCH",
    "pad_last_batch": "RAYSHARD_PAD_LAST_BATCH",
    "equal_steps": "RAYSHARD_EQUAL_STEPS",
    "seed": "RAYSHARD_SEED",
}


def plan_overrides(environ: Mapping[str, str] | None = None) -> dict[str, str | int]:
    """The planner settings present in the environment, keyed by option name (raw strings;
    the seed as an integer). A value the option refuses is a `ConfigError` naming the
    variable it came from, whether or not an argument or file overrides it."""
    environ = os.environ if environ is None else environ
    found: dict[str, str | int] = {
        option: environ[variable]
        for option, variable in PLAN_VARIABLES.items()
        if environ.get(variable, "").strip()
    }
    if "seed" in found:
        found["seed"] = _parse_seed(str(found["seed"]))
    for option, value in found.items():
        _check_variable(option, value, environ[PLAN_VARIABLES[option]])
    return found


def _check_variable(option: str, value: str | int, raw: str) -> None:
    """The planner's own check of one option, its error prefixed with the variable."""
    from rayshard.errors import ConfigError
    from rayshard.plan.options import PlanConfig  # the planner imports this module

    try:
        PlanConfig(**{option: value})
    except ConfigError as error:
        variable = PLAN_VARIABLES[option]
        raise ConfigError(
            f"{variable}={raw!r} in the environment: {error}; fix it, or unset {variable}"
        ) from None


def _parse_seed(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        from rayshard.errors import ConfigError

        raise ConfigError(
            f"RAYSHARD_SEED={text!r} is not an integer: set a non-negative integer, or unset it"
        ) from None


def parse_bool(value: str | bool, name: str) -> bool:
    """Parse a yes/no setting, naming the setting when the value is neither."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off"}:
        return False
    from rayshard.errors import ConfigError

    raise ConfigError(f"{name}={value!r} is not a yes/no value: use one of 1, 0, true, false")
