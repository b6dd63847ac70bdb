"""The loader's own settings beyond the planner's: policy, reading, prefetching."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from rayshard.columns import ColumnRules
from rayshard.errors import ConfigError
from rayshard.packing import Packing
from rayshard.plan import LastBatch, PlanConfig
from rayshard.plan.options import check_int
from rayshard.sharding import ShardingPolicy


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoaderSettings:
    """Everything a loader's actors need to know, validated on the driver."""

    plan: PlanConfig
    policy: ShardingPolicy = ShardingPolicy.DATA
    columns: tuple[str, ...] | None = None
    shuffle: bool = False
    shuffle_buffer: int = 0
    prefetch_depth: int = 2
    model_parallel_size: int = 1
    dp_groups: tuple[tuple[int, ...], ...] | None = None
    state_timeout_s: float = 60.0
    reader_num_cpus: float = 0.0
    lease_poll_s: float = 0.05
    batches_per_object: int | None = None  # None: 16 (static policies) or 4 (`dynamic`)
    object_bytes: int = 8 << 20
    reader_threads: int = 1
    ack_interval_s: float = 0.1
    journal_path: str | None = None
    column_rules: ColumnRules = ColumnRules()  # padding and fill values (`rayshard.columns`)
    transform_workers: int = 1  # processes running a rank's transform (1: the reader)
    packing: Packing | None = None  # pack a token column into rows (`rayshard.packing`)

    def __post_init__(self) -> None:
        policy = ShardingPolicy.parse(self.policy)
        if policy is ShardingPolicy.HINT:
            raise ConfigError(
                "policy='hint' is for pipelines you build yourself: shard them with "
                "rayshard.sharding.bind_hints; the loader serves 'data', 'file', "
                "'file_or_data', 'off' and 'dynamic'"
            )
        object.__setattr__(self, "policy", policy)
        check_int(self.shuffle_buffer, "shuffle_buffer", minimum=0)
        check_int(self.prefetch_depth, "prefetch_depth", minimum=1)
        if self.batches_per_object is not None:
            check_int(self.batches_per_object, "batches_per_object", minimum=1)
        check_int(
            self.object_bytes,
            "object_bytes",
            minimum=1,
            fix="bytes per object-store block; 8 MiB is the default",
        )
        check_int(self.reader_threads, "reader_threads", minimum=1)
        check_int(self.transform_workers, "transform_workers", minimum=1)
        if self.columns is not None:
            object.__setattr__(self, "columns", tuple(self.columns))
        if self.packing is not None:
            self._check_packing()

    def _check_packing(self) -> None:
        """Packing runs on the static `data` plan, after reading, without row shuffling."""
        if not isinstance(self.packing, Packing):
            raise TypeError(
                f"packing={self.packing!r} must be a rayshard.packing.Packing, e.g. "
                f"Packing(column='tokens', seq_len=2048)"
            )
        if self.policy is not ShardingPolicy.DATA:
            raise ConfigError(
                f"packing with policy={self.policy.value!r} is not supported: packing needs "
                f"the static 'data' policy (its packed row counts are planned before the "
                f"epoch); use policy='data'"
            )
        if self.shuffle_buffer:
            raise ConfigError(
                f"packing with shuffle_buffer={self.shuffle_buffer} is not supported: packed "
                f"rows follow the reading order; use shuffle=True (shuffled pieces) and "
                f"shuffle_buffer=0"
            )
        if self.plan.last_batch is LastBatch.DROP:
            raise ConfigError(
                "packing with last_batch='drop' would drop documents: set last_batch="
                "'partial' and choose Packing(last_row='pad' or 'drop') for the last row"
            )

    @property
    def block_batches(self) -> int:
        """Batches per object-store block: `batches_per_object`, or by default 16 for the
        static policies (fewer, larger objects: less per-object overhead) and 4 for
        `dynamic` (a reader holds fewer leased rows ahead, so the work stays spread and a
        rank that joins late still finds some)."""
        if self.batches_per_object is not None:
            return self.batches_per_object
        return 4 if self.policy is ShardingPolicy.DYNAMIC else 16

    def fingerprint(self, source_name: str, num_samples: int) -> str:
        """A short id of (settings, source) that a saved state must match."""
        facts = {
            "plan": self.plan.to_dict(),
            "policy": self.policy.value,
            "columns": self.columns,
            "shuffle": self.shuffle,
            "shuffle_buffer": self.shuffle_buffer,
            "source": source_name,
            "num_samples": num_samples,
        }
        if self.packing is not None:  # only then: ids of loaders without packing unchanged
            facts["packing"] = self.packing.to_dict()
        payload = json.dumps(facts, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def as_tuple_groups(groups: Sequence[Sequence[int]] | None) -> Any:
    return None if groups is None else tuple(tuple(int(r) for r in g) for g in groups)
