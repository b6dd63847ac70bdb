"""The loader's own configuration parts besides the planner's `PlanConfig`.

`ReadConfig` says what is read and in which order, `RuntimeConfig` how the actors run.
Each is frozen and keyword-only and checks its own fields in `__post_init__`; checks that
need two parts live in `LoaderConfig` (`loader_config`). Every field here is plain data, so
every one of them can be set from YAML under its own name.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any

from rayshard.config.checks import (
    as_tuple_groups,
    check_cpus,
    check_int,
    check_number,
    check_resources,
    strings,
)
from rayshard.config.conversions import packing_of, padding_rule, pairs
from rayshard.config.env import parse_bool
from rayshard.core.sharding import ShardingPolicy
from rayshard.data.columns import Padding
from rayshard.data.packing import Packing
from rayshard.errors import ConfigError

RELAY_MODES = ("auto", "node", "off")  # `RuntimeConfig.ack_relay`

FORMATS = ("auto", "parquet", "arrow")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReadConfig:
    """What the readers read, and in which order.

    - `policy`: one of `ShardingPolicy` but `hint` (default `data`: exact, any source).
    - `paths`, `source_format`, `split_rows`: the files `LoaderConfig.make_source` opens
      (`auto` picks Arrow for `.arrow`/`.feather`/`.ipc` paths, Parquet otherwise).
    - `columns`: the columns read (None: all); `padding`, `fill_null`: per-column rules
      (`rayshard.data.columns`), as {column: option} mappings.
    - `shuffle`: shuffle pieces (static policies) or leases (`dynamic`) per epoch;
      `shuffle_buffer`: rows of the in-rank shuffle buffer (0: off);
      `shuffle_blocks`: rows per block of the streaming global shuffle (0: off; `data`).
    - `reader_threads`: threads reading pieces ahead, in plan order, in each process that
      reads (the reader, or each of its `reader_workers`); None: the CPUs Ray assigned to
      that process, 1..8 (`rayshard.runtime.reading_threads`).
    - `packing`: a `Packing`, or its fields as a mapping (YAML: `packing: {column: tokens,
      seq_len: 2048}`), or None.
    """

    policy: ShardingPolicy = ShardingPolicy.DATA
    paths: tuple[str, ...] | None = None
    source_format: str = "auto"
    split_rows: int | None = None
    columns: tuple[str, ...] | None = None
    padding: tuple[tuple[str, Padding], ...] | None = None
    # (a struct's fill is a dict: a copy, kept out of the hash, which it cannot enter)
    fill_null: tuple[tuple[str, Any], ...] | None = dataclasses.field(default=None, hash=False)
    shuffle: bool = False
    shuffle_buffer: int = 0
    shuffle_blocks: int = 0
    reader_threads: int | None = None
    packing: Packing | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        policy = ShardingPolicy.parse(self.policy)
        if policy is ShardingPolicy.HINT:
            raise ConfigError(
                "policy='hint' is for pipelines you build yourself: shard them with "
                "rayshard.core.sharding.bind_hints; the loader serves 'data', 'file', "
                "'file_or_data', 'off' and 'dynamic'"
            )
        set_(self, "policy", policy)
        set_(self, "paths", strings(self.paths, "paths"))
        set_(self, "columns", strings(self.columns, "columns"))
        twice = sorted({c for c in self.columns or () if self.columns.count(c) > 1})
        if twice:
            raise ConfigError(f"columns={list(self.columns)} names {twice} twice: name each once")
        fmt = str(self.source_format).strip().lower()
        if fmt not in FORMATS:
            raise ConfigError(
                f"source_format={self.source_format!r} is not a valid choice: "
                f"use one of {', '.join(FORMATS)}"
            )
        set_(self, "source_format", fmt)
        if self.split_rows is not None:
            check_int(self.split_rows, "split_rows", minimum=1, fix="or leave it unset")
        set_(self, "padding", pairs(self.padding, "padding", padding_rule))
        set_(self, "fill_null", pairs(self.fill_null, "fill_null", lambda _, v: copy.deepcopy(v)))
        set_(self, "shuffle", parse_bool(self.shuffle, "shuffle"))
        check_int(self.shuffle_buffer, "shuffle_buffer", minimum=0, fix="0 turns shuffling off")
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
        if self.reader_threads is not None:
            fix = "or None (the default): as many as the CPUs Ray gave the reading process"
            check_int(self.reader_threads, "reader_threads", minimum=1, fix=fix)
        set_(self, "packing", packing_of(self.packing))
        if self.packing is not None:
            self._check_packing()

    def _check_packing(self) -> None:
        """Packing runs on the static `data` plan, after reading, without row shuffling."""
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
        column = self.packing.column
        if column in dict(self.padding or ()):
            raise ConfigError(
                f"padding[{column!r}] with packing on the same column: packing fills rows "
                f"of seq_len={self.packing.seq_len} itself (and splits or refuses longer "
                f"documents), so a padding rule there would not apply; remove it, or cut "
                f"documents in a transform before packing"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """How the loader's actors run.

    - `name`, `namespace`: the coordinator actor's (namespace None: one per Ray job);
      `coordinator_max_restarts`: Ray restarts of the coordinator (-1: forever).
    - `prefetch_depth`: batches kept ready ahead of the training loop.
    - `batches_per_object` (None: 16 for static policies, 4 for `dynamic`) and
      `object_bytes`: how batches are grouped into object-store blocks.
    - `ack_interval_s`, `lease_poll_s`, `state_timeout_s`: acknowledgement period (the
      shortest: a busy coordinator asks for longer, `rayshard.core.ack_pacing`); how
      long a `dynamic` rank told to wait waits for the coordinator's wake-up before it asks
      again anyway (at least 1 s without `straggler_timeout_s`; see
      `rayshard.runtime.epoch_waits.quiet_wait_s`); how long a state request waits.
    - `ack_relay`: how consumers reach the coordinator with acknowledgements: `auto`
      (straight, until it asks for a longer interval than `ack_interval_s`, then through
      their node's relay, one call per node's gathered groups), `node` (always through
      the relay) or `off` (always straight); see `rayshard.runtime.ack_relay`.
    - `straggler_timeout_s`: `dynamic` only: silence before a rank's work is reoffered.
    - `model_parallel_size`, `dp_groups`: ranks sharing one data-parallel shard.
    - `reader_workers`: processes reading a rank's pieces and running its transform (1:
      the reader); `transform_workers`: processes running only its transform (1: the
      reader); at most one of the two above 1. `transform_resources`: Ray resources of each
      worker (None: on the reader's node).
    - `reader_num_cpus`: CPUs each reader actor reserves.
    - `consumer_reads`: whether a rank reads on a thread of its consumer (the training
      worker) rather than in its reader actor (None: when the rank has one consumer, no
      worker processes, no transform and no packing; see `rayshard.runtime.local_reads`).
    - `journal_path`: where the coordinator journals (None: a local temp file).
    """

    name: str = "rayshard"
    namespace: str | None = None
    coordinator_max_restarts: int = 3
    prefetch_depth: int = 2
    batches_per_object: int | None = None
    object_bytes: int = 8 << 20
    ack_interval_s: float = 0.1
    lease_poll_s: float = 0.05
    state_timeout_s: float = 60.0
    ack_relay: str = "auto"
    straggler_timeout_s: float | None = None
    model_parallel_size: int = 1
    dp_groups: tuple[tuple[int, ...], ...] | None = None
    reader_workers: int = 1
    transform_workers: int = 1
    transform_resources: tuple[tuple[str, float], ...] | None = None
    reader_num_cpus: float = 0.0
    consumer_reads: bool | None = None
    journal_path: str | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for key in ("name", "namespace"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{key}={value!r} must be a non-empty string")
        if self.name is None:
            raise ConfigError("name=None must be a non-empty string (the default is 'rayshard')")
        set_(self, "journal_path", _journal_path(self.journal_path))
        check_int(
            self.coordinator_max_restarts, "coordinator_max_restarts", minimum=-1, fix="-1: forever"
        )
        check_int(self.prefetch_depth, "prefetch_depth", minimum=1, fix="the default is 2")
        if self.batches_per_object is not None:
            check_int(self.batches_per_object, "batches_per_object", minimum=1)
        fix = "bytes per object-store block; 8 MiB is the default"
        check_int(self.object_bytes, "object_bytes", minimum=1, fix=fix)
        # 0 acknowledges on receipt / polls without pause; a state request needs time
        check_number(self.ack_interval_s, "ack_interval_s", positive=False, fix="seconds")
        check_number(self.lease_poll_s, "lease_poll_s", positive=False, fix="seconds")
        check_number(self.state_timeout_s, "state_timeout_s", fix="seconds")
        relay = "off" if self.ack_relay is False else self.ack_relay  # (YAML 1.1's `off`)
        set_(self, "ack_relay", relay.strip().lower() if isinstance(relay, str) else relay)
        if self.ack_relay not in RELAY_MODES:
            raise ConfigError(
                f"ack_relay={self.ack_relay!r} must be one of {', '.join(RELAY_MODES)}: 'auto' "
                "(the default) relays through each node once the coordinator is busy"
            )
        check_cpus(self.reader_num_cpus, "reader_num_cpus")
        check_int(self.model_parallel_size, "model_parallel_size", minimum=1)
        set_(self, "dp_groups", as_tuple_groups(self.dp_groups))
        if self.dp_groups and self.model_parallel_size not in (1, len(self.dp_groups[0])):
            raise ConfigError(
                f"model_parallel_size={self.model_parallel_size} and dp_groups="
                f"{[list(g) for g in self.dp_groups]} (groups of {len(self.dp_groups[0])}) "
                "disagree: give dp_groups alone, or model_parallel_size alone for groups of "
                "consecutive ranks"
            )
        check_int(
            self.reader_workers,
            "reader_workers",
            minimum=1,
            fix="processes reading a rank's data; 1, the default, reads in the reader",
        )
        check_int(self.transform_workers, "transform_workers", minimum=1)
        if self.reader_workers > 1 and self.transform_workers > 1:
            raise ConfigError(
                f"reader_workers={self.reader_workers} with transform_workers="
                f"{self.transform_workers}: reader workers run the transform too; set "
                f"reader_workers alone (reading and transform in those processes), or "
                f"transform_workers alone (the transform only)"
            )
        if self.transform_resources is not None:
            set_(self, "transform_resources", check_resources(self.transform_resources))
        self._check_straggler_timeout()
        self._check_consumer_reads()

    @property
    def group_size(self) -> int:
        """Ranks per model-parallel group (`dp_groups`' size, else `model_parallel_size`)."""
        return len(self.dp_groups[0]) if self.dp_groups else self.model_parallel_size

    def _check_consumer_reads(self) -> None:
        wanted = self.consumer_reads
        if wanted is not None and not isinstance(wanted, bool):
            raise ConfigError(
                f"consumer_reads={wanted!r} must be True, False or None (the default: the "
                "consumer reads when it is its rank's only one and no worker process or "
                "transform is involved)"
            )
        shared = self.model_parallel_size > 1 or any(len(g) > 1 for g in self.dp_groups or ())
        workers = self.reader_workers > 1 or self.transform_workers > 1
        if wanted and self.reader_num_cpus:
            raise ConfigError(
                f"consumer_reads=True with reader_num_cpus={self.reader_num_cpus}: a consumer "
                "that reads has no reader actor to reserve CPUs for; leave consumer_reads unset "
                "(reader_num_cpus > 0 reads in reader actors), or reader_num_cpus at 0"
            )
        if wanted and (shared or workers or self.transform_resources is not None):
            what = "model-parallel groups share" if shared else "worker processes are fed by"
            raise ConfigError(
                f"consumer_reads=True: {what} the reader actor (model_parallel_size="
                f"{self.model_parallel_size}, dp_groups={self.dp_groups}, reader_workers="
                f"{self.reader_workers}, transform_workers={self.transform_workers}, "
                f"transform_resources={self.transform_resources}); leave consumer_reads unset"
            )

    def _check_straggler_timeout(self) -> None:
        timeout = self.straggler_timeout_s
        if timeout is not None and timeout is not False:  # (False: YAML 1.1's bare `off`)
            fix = "give the seconds a rank may hold work silently, or None to turn it off"
            timeout = check_number(timeout, "straggler_timeout_s", fix=fix)
        object.__setattr__(self, "straggler_timeout_s", timeout or None)

    def check_straggler_margin(self) -> None:
        """The straggler timeout must exceed twice the slowest heartbeat (ack or poll)."""
        timeout = self.straggler_timeout_s
        slowest = max(self.ack_interval_s, self.lease_poll_s)
        if timeout is not None and timeout <= 2 * slowest:
            raise ConfigError(
                f"straggler_timeout_s={timeout!r} must exceed twice ack_interval_s="
                f"{self.ack_interval_s!r} and lease_poll_s={self.lease_poll_s!r}, or healthy "
                "ranks would look silent: raise it (well above a training step's time)"
            )


def _journal_path(value: Any) -> str | None:
    """`journal_path` made absolute on the driver (the coordinator runs in Ray's working_dir,
    where a relative path names another file), `~` expanded; a URI is refused: the journal
    is a file the coordinator appends to and locks, on a local or mounted filesystem."""
    path = os.fspath(value) if isinstance(value, os.PathLike) else value
    if path is None:
        return None
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"journal_path={value!r} must be a non-empty string")
    if "://" in path:
        raise ConfigError(
            f"journal_path={path!r} is a URI: the journal must be a local or mounted path "
            "(a file the coordinator appends to and locks); give a path on the driver's node"
        )
    return os.path.abspath(os.path.expanduser(path))
