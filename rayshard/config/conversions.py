"""Conversions of YAML-friendly option values (mappings) into the objects the
configuration parts hold: per-column rule pairs, `Padding`, `Packing`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rayshard.data.columns import Padding
from rayshard.data.packing import Packing
from rayshard.errors import ConfigError


def pairs(value: Any, name: str, convert: Any) -> tuple[tuple[str, Any], ...] | None:
    """A {column: option} mapping as sorted (column, option) pairs; other values stay for
    `rayshard.data.columns` to refuse with its own message."""
    if value is None or not isinstance(value, Mapping):
        return value
    return tuple(sorted((str(k), convert(k, v)) for k, v in value.items()))


def padding_rule(column: str, value: Any) -> Any:
    if not isinstance(value, Mapping):
        return value  # a Padding, or something `rayshard.data.columns` refuses by name
    known = [f.name for f in dataclasses.fields(Padding)]
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ConfigError(
            f"padding[{column!r}]: unknown option(s) {unknown}: known options are {known}"
        )
    return Padding(**value)


def packing_of(value: Any) -> Packing | None:
    if value is None or isinstance(value, Packing):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(
            f"packing={value!r} must be a rayshard.data.packing.Packing, e.g. "
            f"Packing(column='tokens', seq_len=2048), or a mapping of packing options, e.g. "
            f"{{column: tokens, seq_len: 2048}}"
        )
    known = [f.name for f in dataclasses.fields(Packing)]
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ConfigError(f"unknown packing option(s) {unknown}: known options are {known}")
    try:
        return Packing(**value)
    except TypeError as error:  # a required option missing
        raise ConfigError(f"packing={dict(value)!r}: {error} (column and seq_len)") from None


__all__ = ["packing_of", "padding_rule", "pairs"]
