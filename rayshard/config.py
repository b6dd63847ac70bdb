"""`LoaderConfig`: every loader setting in one frozen object, from Python or from YAML.

Validated the same way on both paths: the planner settings go through
`PlanConfig.resolve(explicit=..., file=..., environ=...)` (explicit arguments win over the
file, the file over `RAYSHARD_*` environment overrides, see `rayshard.env`), the loader's
own settings through `__post_init__`. Unknown keys are rejected with the list of known ones.

A YAML file is a flat mapping of these keys, optionally under a top-level `rayshard:` key
so it can live inside a larger training configuration. ESPnet3's `dist_world_size` is
accepted as another name for `expected_world_size`::

    total_shards: 16
    dist_world_size: 8
    policy: data
    rotation: stride
    batch_size: 32
    last_batch: drop
    seed: 7
    shuffle_buffer: 10000
    paths: [data/train/*.parquet]
    columns: [tokens, label]
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from rayshard.errors import ConfigError
from rayshard.packing import Packing
from rayshard.plan import LastBatch, PlanConfig, Rotation, Uneven
from rayshard.sharding import ShardingPolicy

_PLAN_KEYS = tuple(f.name for f in dataclasses.fields(PlanConfig))
_ALIASES = {"dist_world_size": "expected_world_size"}
_FORMATS = ("auto", "parquet", "arrow")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """Planner settings (those of `PlanConfig`) plus the loader's own.

    - `policy`: one of `ShardingPolicy` (default `data`: exact, deterministic, any source).
    - `shuffle_buffer`: rows of the in-rank shuffle buffer (0: read order, no shuffle).
    - `shuffle_blocks`: rows per block of the streaming global shuffle (0: off; `data`).
    - `prefetch_depth`: batches kept ready ahead of the training loop.
    - `paths`, `columns`, `split_rows`, `source_format`: where the data is
      (`auto` picks Arrow for `.arrow`/`.feather` paths, Parquet otherwise).
    - `packing`: a `Packing`, or its fields as a mapping (YAML: `packing: {column: tokens,
      seq_len: 2048}`), or None.
    """

    batch_size: int = 1
    total_shards: int | None = None
    expected_world_size: int | None = None
    rotation: Rotation = Rotation.SHIFT
    uneven: Uneven = Uneven.UNBALANCED
    last_batch: LastBatch = LastBatch.PARTIAL
    pad_last_batch: bool = False
    equal_steps: bool = True
    seed: int = 0
    policy: ShardingPolicy = ShardingPolicy.DATA
    shuffle_buffer: int = 0
    shuffle_blocks: int = 0
    prefetch_depth: int = 2
    paths: tuple[str, ...] | None = None
    columns: tuple[str, ...] | None = None
    split_rows: int | None = None
    source_format: str = "auto"
    packing: Packing | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "packing", _packing(self.packing))
        plan = PlanConfig(**{k: getattr(self, k) for k in _PLAN_KEYS})
        for key in _PLAN_KEYS:  # normalized values (enums, bools)
            set_(self, key, getattr(plan, key))
        set_(self, "policy", ShardingPolicy.parse(self.policy))
        _check_int(self.shuffle_buffer, "shuffle_buffer", 0, "0 turns shuffling off")
        _check_int(self.shuffle_blocks, "shuffle_blocks", 0, "0 turns the global shuffle off")
        _check_int(self.prefetch_depth, "prefetch_depth", 1, "the default is 2")
        if self.split_rows is not None:
            _check_int(self.split_rows, "split_rows", 1, "or leave it unset")
        set_(self, "paths", _strings(self.paths, "paths"))
        set_(self, "columns", _strings(self.columns, "columns"))
        fmt = str(self.source_format).strip().lower()
        if fmt not in _FORMATS:
            raise ConfigError(
                f"source_format={self.source_format!r} is not a valid choice: "
                f"use one of {', '.join(_FORMATS)}"
            )
        set_(self, "source_format", fmt)

    # -- building -------------------------------------------------------------------------
    @classmethod
    def known_keys(cls) -> list[str]:
        return sorted([f.name for f in dataclasses.fields(cls)] + list(_ALIASES))

    @classmethod
    def resolve(
        cls,
        explicit: Mapping[str, Any] | None = None,
        file: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        *,
        file_name: str = "configuration file",
    ) -> LoaderConfig:
        """Explicit arguments over the file over the environment; `None` means not given."""
        explicit_ = _canonical(explicit or {}, "arguments")
        file_ = _canonical(file or {}, file_name)
        plan = PlanConfig.resolve(
            explicit={k: v for k, v in explicit_.items() if k in _PLAN_KEYS},
            file={k: v for k, v in file_.items() if k in _PLAN_KEYS},
            environ=environ,
        )
        merged = {k: getattr(plan, k) for k in _PLAN_KEYS}
        for source in (file_, explicit_):
            merged.update(
                {k: v for k, v in source.items() if k not in _PLAN_KEYS and v is not None}
            )
        return cls(**merged)

    @classmethod
    def from_yaml(
        cls,
        path: str | os.PathLike,
        *,
        environ: Mapping[str, str] | None = None,
        **explicit: Any,
    ) -> LoaderConfig:
        """Read a YAML file; keyword arguments (not `None`) override its values."""
        import yaml

        name = os.fspath(path)
        try:
            with open(name, encoding="utf-8") as handle:
                document = yaml.safe_load(handle)
        except FileNotFoundError as error:
            raise ConfigError(f"{name}: no such configuration file") from error
        except yaml.YAMLError as error:
            raise ConfigError(f"{name} is not valid YAML: {error}") from error
        if document is None:
            document = {}
        if isinstance(document, Mapping) and set(document) == {"rayshard"}:
            document = document["rayshard"] or {}
        if not isinstance(document, Mapping):
            raise ConfigError(
                f"{name} must hold a mapping of loader settings (key: value lines), "
                f"not a {type(document).__name__}"
            )
        return cls.resolve(explicit=explicit, file=document, environ=environ, file_name=name)

    # -- using ----------------------------------------------------------------------------
    @property
    def plan(self) -> PlanConfig:
        """The planner's part of this configuration."""
        return PlanConfig(**{k: getattr(self, k) for k in _PLAN_KEYS})

    def make_source(self, filesystem: Any = None) -> Any:
        """The file source `paths` and `columns` describe (Parquet or Arrow IPC)."""
        if not self.paths:
            raise ConfigError("no paths configured: set paths (a folder, glob or list of files)")
        fmt = self.source_format
        if fmt == "auto":
            arrow = all(p.lower().endswith((".arrow", ".feather", ".ipc")) for p in self.paths)
            fmt = "arrow" if arrow else "parquet"
        if fmt == "arrow":
            from rayshard.sources.arrow_files import ArrowFileSource as cls_
        else:
            from rayshard.sources.parquet import ParquetSource as cls_
        return cls_(
            list(self.paths),
            columns=self.columns,
            filesystem=filesystem,
            split_rows=self.split_rows,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON/YAML-safe view (enums as strings, tuples as lists)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Packing):
                value = value.to_dict()
            elif hasattr(value, "value"):
                value = value.value
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out


def _canonical(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where} must be a mapping of settings, not {type(values).__name__}")
    known = {f.name for f in dataclasses.fields(LoaderConfig)}
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = _ALIASES.get(key, key)
        if name not in known:
            raise ConfigError(
                f"unknown loader option {key!r} in {where}: known options are "
                f"{', '.join(LoaderConfig.known_keys())}"
            )
        if name in out and key in _ALIASES and value is not None and out[name] != value:
            raise ConfigError(
                f"{where} sets both {key}={value!r} and {name}={out[name]!r}: keep one"
            )
        if value is not None or name not in out:
            out[name] = value
    return out


def _packing(value: Any) -> Packing | None:
    if value is None or isinstance(value, Packing):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"packing={value!r} must be a mapping of packing options, e.g. "
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


def _strings(value: Any, name: str) -> tuple[str, ...] | None:
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


def _check_int(value: Any, name: str, minimum: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name}={value!r} is not in the range {name}>={minimum} ({hint})")
