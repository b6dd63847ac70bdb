"""The value checks every configuration object shares, each with one message format.

Every message names the option, its value, the rule and a way out, e.g.
`prefetch_depth=0 is not in the range prefetch_depth>=1 (the default is 2)`.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rayshard.errors import ConfigError


def check_int(
    value: Any,
    name: str,
    *,
    minimum: int,
    fix: str = "",
    error: type[Exception] = ConfigError,
    type_error: type[Exception] | None = None,
    integral: bool = False,
) -> int:
    """`value` must be an int (not a bool) >= `minimum`; the error names it and the fix.

    The one integer check of the package: every module routes its integer options here,
    so each message reads `name=value must be an integer >= minimum (fix)` (not an
    integer) or `name=value is not in the range name>=minimum (fix)` (too small). `error`
    is the type raised (`ConfigError` unless a lower-level API raises a plain
    `ValueError`); `type_error`, if given, is raised instead for a value that is not an
    integer at all (e.g. `TypeError`). `integral=True` also accepts any
    `numbers.Integral` (NumPy integers). Returns `value`.
    """
    suffix = f" ({fix})" if fix else ""
    kind = numbers.Integral if integral else int
    if isinstance(value, bool) or not isinstance(value, kind):
        raise (type_error or error)(f"{name}={value!r} must be an integer >= {minimum}{suffix}")
    if value < minimum:
        raise error(f"{name}={value} is not in the range {name}>={minimum}{suffix}")
    return value


def check_number(value: Any, name: str, *, positive: bool = True, fix: str = "") -> float:
    """`value` must be a finite number, > 0 (`positive`) or >= 0; returns it as a float."""
    rule = f"{name}>0" if positive else f"{name}>=0"
    suffix = f" ({fix})" if fix else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name}={value!r} must be a number in the range {rule}{suffix}")
    if not _finite(value) or value < 0 or (positive and value == 0):
        raise ConfigError(f"{name}={value!r} is not in the range {rule}{suffix}")
    return float(value)


def check_resources(resources: Any) -> tuple[tuple[str, float], ...]:
    """`transform_resources` as sorted (name, amount) pairs, each amount a number > 0."""
    pairs = resources.items() if isinstance(resources, Mapping) else resources
    try:
        checked = tuple(sorted((str(name), float(amount)) for name, amount in pairs))
    except (TypeError, ValueError, OverflowError) as error:
        raise ConfigError(
            f"transform_resources={resources!r} must map Ray resource names to amounts, "
            f"e.g. {{'CPU': 1, 'preprocess': 1}}"
        ) from error
    bad = [
        (name, amount)
        for name, amount in checked
        if not (amount > 0 and math.isfinite(amount) and _ray_precise(amount)) or not name
    ]
    if bad or not checked:
        raise ConfigError(
            f"transform_resources={resources!r}: every resource needs a name and a finite "
            f"amount > 0 in steps of 0.0001, as Ray counts them (bad: {bad or 'none given'}); "
            "leave it unset to run the workers on the reader's node"
        )
    return checked


def check_cpus(value: Any, name: str) -> float:
    """A number of CPUs for a Ray actor: >= 0, in Ray's steps of 0.0001."""
    amount = check_number(value, name, positive=False)
    if not _ray_precise(amount):
        raise ConfigError(f"{name}={value!r}: Ray counts CPUs in steps of 0.0001; round it")
    return amount


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # (an int too large for a float: 10**400)
        return False


def _ray_precise(amount: float) -> bool:
    """Whether Ray accepts `amount` of a resource (it holds them to 0.0001)."""
    return abs(amount * 10_000 - round(amount * 10_000)) < 1e-6


def as_tuple_groups(groups: Sequence[Sequence[int]] | None) -> Any:
    """`dp_groups` as a tuple of tuples of ranks (hashable, frozen), or None. Each group is
    a non-empty list of world ranks (integers >= 0), every rank in one group, all groups of
    one size; that they cover the world is checked against its size (`plan.groups`)."""
    if groups is None:
        return None
    fix = "give the model-parallel groups as lists of world ranks, e.g. [[0, 1], [2, 3]]"
    if not _is_sequence(groups) or not groups or not all(_is_sequence(g) and g for g in groups):
        raise ConfigError(f"dp_groups={groups!r} is not a list of non-empty lists: {fix}")
    out = tuple(
        tuple(
            int(check_int(r, f"dp_groups[{i}][{j}]", minimum=0, fix=fix, integral=True))
            for j, r in enumerate(g)
        )
        for i, g in enumerate(groups)
    )
    ranks = [r for g in out for r in g]
    if len(set(ranks)) != len(ranks):
        twice = sorted({r for r in ranks if ranks.count(r) > 1})
        raise ConfigError(f"dp_groups={groups!r} names ranks {twice} more than once: {fix}")
    if len({len(g) for g in out}) > 1:
        raise ConfigError(f"dp_groups={groups!r} has groups of different sizes: {fix}")
    return out


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def strings(value: Any, name: str) -> tuple[str, ...] | None:
    """A string, path or list of them as a tuple of strings; None stays None."""
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        value = [value]
    try:
        items = tuple(os.fspath(v) for v in value)
    except TypeError as error:
        raise ConfigError(f"{name}={value!r} must be a string or a list of strings") from error
    if not items:
        raise ConfigError(f"{name}=[] is empty: leave it unset or name at least one")
    return items


def load_yaml_file(path: str, what: str) -> Any:
    """The document in YAML file `path` (None for an empty file); a missing, unreadable or
    binary file, a folder, or bad YAML is a `ConfigError` naming the file and `what` it
    should have been."""
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except FileNotFoundError as error:
        raise ConfigError(f"{path}: no such {what}") from error
    except IsADirectoryError as error:
        raise ConfigError(f"{path} is a folder, not a {what}: pass a YAML file") from error
    except OSError as error:
        raise ConfigError(f"cannot read {what} {path}: {error.strerror or error}") from error
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{path} is not a {what}: not UTF-8 text (byte {error.start}), so not YAML; "
            "pass a YAML file"
        ) from error
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from error
