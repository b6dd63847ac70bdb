"""The loader's own settings beyond the planner's: policy, reading, prefetching."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
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
    shuffle_blocks: int = 0  # rows per block of the global shuffle (0: off; `data` only)
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
    # Ray resources each transform worker needs ("CPU" included); None: on the reader's node.
    transform_resources: tuple[tuple[str, float], ...] | None = None
    straggler_timeout_s: float | None = None  # `dynamic`: silence before work is reoffered
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
        check_int(self.shuffle_blocks, "shuffle_blocks", minimum=0, fix="rows per block; 0 is off")
        if self.shuffle_blocks and policy is not ShardingPolicy.DATA:
            raise ConfigError(
                f"shuffle_blocks={self.shuffle_blocks} needs policy='data' (policy="
                f"{policy.value!r} assigns whole files or leases splits): use policy='data', "
                "or shuffle=True with shuffle_buffer"
            )
        if self.shuffle_buffer and policy is ShardingPolicy.DYNAMIC:
            raise ConfigError(
                f"shuffle_buffer={self.shuffle_buffer} with policy='dynamic' is not supported: "
                "rows are leased on demand and a buffer would hold leased rows back; use "
                "shuffle=True (leases in a seeded random order per epoch), or a static policy"
            )
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
        if self.transform_resources is not None:
            object.__setattr__(
                self, "transform_resources", check_resources(self.transform_resources)
            )
        if self.columns is not None:
            object.__setattr__(self, "columns", tuple(self.columns))
        self._check_straggler_timeout(policy)
        if self.packing is not None:
            self._check_packing()

    def _check_straggler_timeout(self, policy: ShardingPolicy) -> None:
        timeout = self.straggler_timeout_s
        if timeout is None:
            return
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(
                f"straggler_timeout_s={timeout!r} must be a number of seconds, or None (off)"
            )
        if not math.isfinite(timeout) or timeout <= 0:
            raise ConfigError(
                f"straggler_timeout_s={timeout!r} is not in the range straggler_timeout_s>0: "
                "give the seconds a rank may hold work silently, or None to turn it off"
            )
        if policy is not ShardingPolicy.DYNAMIC:
            raise ConfigError(
                f"straggler_timeout_s={timeout!r} needs policy='dynamic' (policy="
                f"{policy.value!r} plans every rank's share up front): use policy='dynamic', "
                "or leave straggler_timeout_s unset"
            )
        slowest = max(self.ack_interval_s, self.lease_poll_s)
        if timeout <= 2 * slowest:
            raise ConfigError(
                f"straggler_timeout_s={timeout!r} must exceed twice ack_interval_s="
                f"{self.ack_interval_s!r} and lease_poll_s={self.lease_poll_s!r}, or healthy "
                "ranks would look silent: raise it (well above a training step's time)"
            )
        object.__setattr__(self, "straggler_timeout_s", float(timeout))

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
        if self.shuffle_blocks:
            raise ConfigError(
                f"packing with shuffle_blocks={self.shuffle_blocks} is not supported: packed "
                f"rows are planned in reading order; use shuffle=True (shuffled pieces) and "
                f"leave shuffle_blocks unset"
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
        # Only when on: ids of loaders without them stay unchanged (saved states, journals).
        if self.shuffle_blocks:
            facts["shuffle_blocks"] = self.shuffle_blocks
        if self.packing is not None:
            facts["packing"] = self.packing.to_dict()
        payload = json.dumps(facts, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def check_resources(resources: Any) -> tuple[tuple[str, float], ...]:
    """`transform_resources` as sorted (name, amount) pairs, each amount a number > 0."""
    pairs = resources.items() if isinstance(resources, dict) else resources
    try:
        checked = tuple(sorted((str(name), float(amount)) for name, amount in pairs))
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"transform_resources={resources!r} must map Ray resource names to amounts, "
            f"e.g. {{'CPU': 1, 'preprocess': 1}}"
        ) from error
    bad = [(name, amount) for name, amount in checked if not amount > 0 or not name]
    if bad or not checked:
        raise ConfigError(
            f"transform_resources={resources!r}: every resource needs a name and an amount "
            f"> 0 (bad: {bad or 'none given'}); leave it unset to run the workers on the "
            f"reader's node"
        )
    return checked


def as_tuple_groups(groups: Sequence[Sequence[int]] | None) -> Any:
    return None if groups is None else tuple(tuple(int(r) for r in g) for g in groups)
