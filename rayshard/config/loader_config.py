"""`LoaderConfig`: every loader setting in one frozen object, from Python or from YAML.

It is made of three parts, each listing its fields and defaults once and checking them in
its own `__post_init__`: `PlanConfig` (the planner, `rayshard.plan`), `ReadConfig` and
`RuntimeConfig` (`rayshard.config.parts`). `LoaderConfig` adds the checks that need two
parts. The actors receive the `LoaderConfig` itself, with the column rules the loader
derived from the source's schema.

Every field of every part is also a flat keyword and attribute: `LoaderConfig(seed=7,
policy="dynamic")`, `config.seed`. A YAML file is a flat mapping of these keys, optionally
under a top-level `rayshard:` key so it can live inside a larger training configuration;
ESPnet3's `dist_world_size` is another name for `expected_world_size`. Resolution order:
explicit value, then the file (or a given `LoaderConfig`), then the `RAYSHARD_*` environment
variables (`rayshard.config.env`), then the default. Unknown keys are refused with the known ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from enum import Enum
from typing import Any

from rayshard.config.checks import load_yaml_file
from rayshard.config.env import plan_overrides
from rayshard.config.parts import ReadConfig, RuntimeConfig
from rayshard.core.sharding import ShardingPolicy
from rayshard.data.columns import ColumnRules
from rayshard.data.packing import Packing
from rayshard.errors import ConfigError
from rayshard.plan import LastBatch, PlanConfig

PARTS: dict[str, type] = {"plan": PlanConfig, "read": ReadConfig, "runtime": RuntimeConfig}
# flat option name -> the part that holds it (each name is in exactly one part)
OWNER = {f.name: part for part, cls in PARTS.items() for f in dataclasses.fields(cls)}
ALIASES = {"dist_world_size": "expected_world_size"}


@dataclasses.dataclass(frozen=True, kw_only=True, init=False)
class LoaderConfig:
    """Planner, reading and runtime settings (see the module docstring and the parts).

    `LoaderConfig(plan=..., read=..., runtime=..., **flat)`: any part given whole, any field
    given flat (flat wins over the part it belongs to). `column_rules` is filled in by the
    loader from `padding`, `fill_null` and the source's schema.
    """

    plan: PlanConfig
    read: ReadConfig
    runtime: RuntimeConfig
    column_rules: ColumnRules

    def __init__(
        self,
        *,
        plan: PlanConfig | None = None,
        read: ReadConfig | None = None,
        runtime: RuntimeConfig | None = None,
        column_rules: ColumnRules | None = None,
        **flat: Any,
    ) -> None:
        flat = canonical(flat, "arguments")
        given = {"plan": plan, "read": read, "runtime": runtime}
        for part, cls in PARTS.items():
            values = {k: v for k, v in flat.items() if OWNER[k] == part}
            base = given[part]
            if base is not None and not isinstance(base, cls):
                raise TypeError(f"{part}= takes a {cls.__name__}, got {type(base).__name__}")
            value = cls(**values) if base is None else dataclasses.replace(base, **values)
            object.__setattr__(self, part, value)
        rules = ColumnRules() if column_rules is None else column_rules
        object.__setattr__(self, "column_rules", rules)
        self.__post_init__()

    def __post_init__(self) -> None:
        """The checks that need two parts."""
        if self.straggler_timeout_s is not None and self.policy is not ShardingPolicy.DYNAMIC:
            raise ConfigError(
                f"straggler_timeout_s={self.straggler_timeout_s!r} needs policy='dynamic' "
                f"(policy={self.policy.value!r} plans every rank's share up front): use "
                "policy='dynamic', or leave straggler_timeout_s unset"
            )
        self.runtime.check_straggler_margin()
        asked = self._last_batch_asked()
        if asked is not None and self.policy is ShardingPolicy.DYNAMIC:
            raise ConfigError(
                f"{asked} with policy='dynamic': dynamic ranks lease rows as they go, so "
                "their last batches are not known ahead to drop, fill or pad (equal steps "
                "pad with marked rows as needed); use policy='data', or "
                + ("pad_last_batch=False" if asked == "pad_last_batch" else "last_batch='partial'")
                + " (also check RAYSHARD_LAST_BATCH / RAYSHARD_PAD_LAST_BATCH and the file)"
            )
        if asked is not None and self.packing is not None:
            why = (
                " would drop documents"
                if self.last_batch is LastBatch.DROP
                else ": packed batches are planned in packed rows, and a short last batch or "
                "rank gets marked padding rows under equal steps"
            )
            raise ConfigError(
                f"packing with {asked}{why}; leave last_batch='partial' and pad_last_batch="
                "False, and choose Packing(last_row='pad' or 'drop') for the last row"
            )

    def _last_batch_asked(self) -> str | None:
        """`last_batch`/`pad_last_batch` asking more than a partial last batch, else None."""
        if self.last_batch is not LastBatch.PARTIAL:
            return f"last_batch={self.last_batch.value!r}"
        return "pad_last_batch" if self.pad_last_batch else None

    # -- building -------------------------------------------------------------------------
    @classmethod
    def known_keys(cls) -> list[str]:
        """Every flat key a file or the keyword arguments may set (aliases included)."""
        return sorted([*OWNER, *ALIASES])

    def replace(self, **explicit: Any) -> LoaderConfig:
        """A copy with `explicit` flat values (`None`: not given) over this one's."""
        given = {k: v for k, v in canonical(explicit, "arguments").items() if v is not None}
        return LoaderConfig(
            plan=self.plan,
            read=self.read,
            runtime=self.runtime,
            column_rules=self.column_rules,
            **given,
        )

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
        merged: dict[str, Any] = dict(plan_overrides(environ))
        for values, where in ((file, file_name), (explicit, "arguments")):
            given = canonical(values or {}, where)
            merged.update({k: v for k, v in given.items() if v is not None})
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
        name = os.fspath(path)
        return cls.resolve(explicit, read_yaml(name), environ, file_name=name)

    # -- using ----------------------------------------------------------------------------
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
        options = {"filesystem": filesystem, "split_rows": self.split_rows}
        return cls_(list(self.paths), columns=self.columns, **options)

    def to_dict(self) -> dict[str, Any]:
        """Every flat key, JSON/YAML-safe (enums as strings, tuples as lists)."""
        return {name: _plain(name, getattr(self, name)) for name in OWNER}

    @property
    def block_batches(self) -> int:
        """Batches per object-store block: `batches_per_object`, or by default 16 for the
        static policies (fewer, larger objects: less per-object overhead) and 4 for
        `dynamic` (a reader holds fewer leased rows ahead, so the work stays spread and a
        rank that joins late still finds some)."""
        if self.batches_per_object is not None:
            return self.batches_per_object
        return 4 if self.policy is ShardingPolicy.DYNAMIC else 16

    @property
    def reads_shuffled(self) -> bool:
        """Whether samples reach a rank in a shuffled order (`shuffle`, a shuffle buffer or
        shuffle blocks): the planner then moves what `last_batch="drop"` leaves out with
        the epoch instead of cutting every shard's tail."""
        return self.shuffle or self.shuffle_buffer > 0 or self.shuffle_blocks > 0

    @property
    def blocks_ahead(self) -> int:
        """The one read-ahead budget, `prefetch_depth` batches, in whole object-store blocks:
        a reader actor keeps this many blocks ready beyond those its consumers took, and a
        consumer keeps this many block requests in flight beyond the block it is using. (The
        device feed and a consumer's own reads hold `prefetch_depth` batches.)"""
        return max(1, -(-self.prefetch_depth // self.block_batches))

    @property
    def worker_count(self) -> int:
        """Worker processes per reader: `reader_workers` or `transform_workers`, whichever
        is above 1 (1: the reader does everything itself)."""
        return max(self.reader_workers, self.transform_workers)

    def fingerprint(self, source_name: str, num_samples: int) -> str:
        """A short id of (settings, source) that a saved state must match."""
        payload = json.dumps(self._identity(source_name, num_samples), sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def identity_facts(self, source_name: str, num_samples: int) -> dict[str, Any]:
        """What `fingerprint` hashes, flat (the plan's keys at the top): saved states carry
        it, so a state refused as another loader's can say what differs."""
        facts = self._identity(source_name, num_samples)
        return {**facts.pop("plan"), **facts}

    def _identity(self, source_name: str, num_samples: int) -> dict[str, Any]:
        # (`expected_world_size` checks the job, not the data: a state may change world size)
        facts = {
            "plan": {**self.plan.to_dict(), "expected_world_size": None},
            "policy": self.policy.value,
            "columns": self.columns,
            "shuffle": self.shuffle,
            "shuffle_buffer": self.shuffle_buffer,
            "source": source_name,
            "num_samples": num_samples,
        }
        # Only when on: ids of loaders without them stay unchanged (saved states, journals).
        if self.shuffle_blocks:
            facts["shuffle_blocks"] = self.shuffle_blocks
        if self.packing is not None:
            facts["packing"] = self.packing.to_dict()
        return facts


def _flat(name: str, part: str) -> property:
    def get(self: LoaderConfig) -> Any:
        return getattr(getattr(self, part), name)

    return property(get, doc=f"`{part}.{name}`")


for _name, _part in OWNER.items():
    setattr(LoaderConfig, _name, _flat(_name, _part))


def canonical(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Flat settings under their canonical names; unknown keys are refused."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where} must be a mapping of settings, not {type(values).__name__}")
    out: dict[str, Any] = {}
    given_as: dict[str, str] = {}  # canonical name -> the key that set it (an alias or not)
    for key, value in values.items():
        name = ALIASES.get(key, key)
        if name not in OWNER:
            raise ConfigError(
                f"unknown loader option {key!r} in {where}: known options are "
                f"{', '.join(LoaderConfig.known_keys())}"
            )
        if name in given_as and value is not None and out[name] != value:
            raise ConfigError(
                f"{where} sets both {given_as[name]}={out[name]!r} and {key}={value!r} "
                "(the same option): keep one"
            )
        if value is not None or name not in out:
            out[name] = value
            if value is not None:
                given_as[name] = key
    return out


def read_yaml(name: str) -> Mapping[str, Any]:
    """The mapping of settings in a YAML file (under `rayshard:` or at the top)."""
    document = load_yaml_file(name, "configuration file")
    if document is None:
        document = {}
    if isinstance(document, Mapping) and "rayshard" in document:  # in a larger configuration
        document = document["rayshard"] or {}
    if not isinstance(document, Mapping):
        raise ConfigError(
            f"{name} must hold a mapping of loader settings (key: value lines), "
            f"not a {type(document).__name__}"
        )
    return document


def loader_config(
    config: LoaderConfig | Mapping[str, Any] | str | os.PathLike | None,
    explicit: Mapping[str, Any],
    *,
    environ: Mapping[str, str] | None = None,
) -> LoaderConfig:
    """What `Loader(source, config, **explicit)` runs with: `explicit` (None: not given)
    over `config` over the environment over the defaults. A `LoaderConfig` is complete (it
    read the environment when it was resolved); a mapping or a YAML path is a file."""
    if isinstance(config, LoaderConfig):
        return config.replace(**explicit)
    if isinstance(config, (str, os.PathLike)):
        return LoaderConfig.from_yaml(config, environ=environ, **explicit)
    return LoaderConfig.resolve(explicit, config, environ)


def _plain(name: str, value: Any) -> Any:
    if isinstance(value, Packing):
        return value.to_dict()
    if isinstance(value, Enum):
        return value.value
    if name == "padding" and value is not None:
        return {column: dataclasses.asdict(p) for column, p in value}
    if name in ("fill_null", "transform_resources") and value is not None:
        return dict(value)
    if name == "dp_groups" and value is not None:
        return [list(group) for group in value]
    if isinstance(value, tuple):
        return list(value)
    return value
