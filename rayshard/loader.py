"""The loader: built once on the driver from a source and a configuration; hands every
training worker its iterator.

The driver validates everything it can (configuration, source metadata) before any actor
starts, then starts the loader's coordinator actor under an explicit name and namespace.
The loader pickles into `train_loop_config` (it carries the coordinator's handle).
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayshard.config.checked import checked_config
from rayshard.config.loader_config import LoaderConfig, loader_config
from rayshard.core.sharding import assign
from rayshard.data.formats import arrow_types
from rayshard.data.transforms import TransformFn
from rayshard.errors import ConfigError
from rayshard.plan import data_parallel_rank
from rayshard.runtime import generations, journal
from rayshard.runtime.coordinator import Coordinator
from rayshard.runtime.delivery import Delivery
from rayshard.runtime.iterator import ShardIterator
from rayshard.runtime.iterator_args import check_iterator_args, check_torch_columns
from rayshard.runtime.journal import Journal
from rayshard.runtime.local_reads import LocalReads, reads_in_consumer
from rayshard.runtime.member_watch import watch_member
from rayshard.runtime.placement_check import warn_about_actor_resources
from rayshard.runtime.process_watch import watch_rank
from rayshard.runtime.ray_tuning import apply_ray_env_defaults
from rayshard.runtime.reader import ShardReader
from rayshard.runtime.remote import remote_class
from rayshard.runtime.row_streams import RankReading
from rayshard.runtime.worlds import worker_world
from rayshard.sources import Source

log = logging.getLogger(__name__)


class Loader:
    """An elastic, exactly-once data loader over `source`, configured by a `LoaderConfig`
    and keyword options (every `LoaderConfig` key; see `rayshard.config` and the README).

    `transform=fn` runs `fn(batch, ctx)` on every batch in the reader processes (see
    `rayshard.data.transforms`); it must be callable and pickle with cloudpickle.
    `transform_workers=k` runs it in k processes per rank, in batch order;
    `reader_workers=k` runs the reading too (and the transform, if any) in k processes per
    rank, in the order one reader has; `transform_resources={"CPU": 1, "preprocess": 1}`
    places those processes wherever Ray finds the resources (CPU-only nodes) instead of on
    the reader's node.
    `packing=Packing(column=..., seq_len=...)` packs a token column into rows of `seq_len`
    tokens in the readers (see `rayshard.data.packing`); `batch_size` then counts packed rows."""

    def __init__(
        self,
        source: Source,
        config: LoaderConfig | Mapping[str, Any] | str | os.PathLike | None = None,
        *,
        transform: TransformFn | None = None,
        config_file: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        """`options` are `LoaderConfig` keys (`batch_size=32`, `policy="dynamic"`, ...; an
        unknown one is a `ConfigError` listing the known ones). They win over `config` (a
        `LoaderConfig`, a mapping of settings, or a YAML file's path; `config_file` is the
        older name of the mapping), which wins over `RAYSHARD_*` variables, which win over
        the defaults. A `None` option counts as not given."""
        if not isinstance(source, Source):
            raise TypeError(
                f"source must be a rayshard Source (e.g. ParquetSource, TableSource), "
                f"got {type(source).__name__}"
            )
        if config is not None and config_file is not None:
            raise ConfigError("give config= or config_file= (its older name), not both")
        self.settings = settings = checked_config(
            source, config if config is not None else config_file, options, transform
        )
        self.transform = transform
        self.source = source
        self.layout = source.layout()
        if settings.expected_world_size is not None:  # (data-parallel ranks: times a group)
            self.check_world(settings.expected_world_size * settings.runtime.group_size)
        if not ray.is_initialized():
            apply_ray_env_defaults()
            ray.init()
        name = self.name = settings.name
        self.namespace = settings.namespace or f"rayshard-{ray.get_runtime_context().get_job_id()}"
        self.loader_id = (
            f"{name}:{self.settings.fingerprint(source.describe(), self.layout.num_samples)}"
        )
        journal_path = settings.journal_path
        self.journal_path = journal_path or journal.default_path(self.namespace, name)
        if journal_path is not None:
            Journal(self.journal_path, self.loader_id).check_reusable()
        warn_about_actor_resources(settings)
        here = self._coordinator_node = ray.get_runtime_context().get_node_id()
        try:
            self._coordinator = (
                remote_class(Coordinator)
                .options(
                    name=name,
                    namespace=self.namespace,
                    num_cpus=0,
                    # Restarts replay the journal; calls in flight are retried by Ray.
                    max_restarts=settings.coordinator_max_restarts,
                    max_task_retries=-1,
                    # The default journal is a local file: keep the coordinator on its node.
                    scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
                )
                .remote(
                    self.loader_id,
                    source,
                    self.settings,
                    self.namespace,
                    self.journal_path,
                    journal_path is None,
                    uuid.uuid4().hex[:8],  # this loader object's: its readers' names
                )
            )
            ray.get(self._coordinator.ping.remote())
        except ValueError as error:
            raise ConfigError(
                f"a loader named {name!r} already exists in namespace {self.namespace!r}: "
                "give this loader another name, or another namespace"
            ) from error
        log.info("rayshard loader %s started in namespace %s", name, self.namespace)

    @classmethod
    def from_config(
        cls, config: LoaderConfig, *, source: Source | None = None, **options: Any
    ) -> Loader:
        """A loader from a `LoaderConfig`, mapping or YAML path; `options` win over it."""
        source = source if source is not None else loader_config(config, {}).make_source()
        return cls(source, config, **options)

    @classmethod
    def from_yaml(
        cls,
        path: str,
        *,
        source: Source | None = None,
        loader_options: dict | None = None,
        **explicit: Any,
    ) -> Loader:
        """A loader from a YAML file; `explicit` settings win over the file, the file over
        `RAYSHARD_*` variables. `loader_options` go to the constructor too (`name`,
        `transform`, ...)."""
        return cls.from_config(
            LoaderConfig.from_yaml(path, **explicit), source=source, **(loader_options or {})
        )

    def check_world(self, world_size: int) -> None:
        """Validate the configuration against a world size before any worker starts."""
        dp = data_parallel_rank(
            0, world_size, self.settings.model_parallel_size, self.settings.dp_groups
        )
        assign(self.settings.policy, self.settings.plan, self.source, dp.dp_size, epoch=0)

    def iterator(
        self,
        *,
        world_rank: int | None = None,
        world_size: int | None = None,
        batch_format: str = "torch",
        device: Any = None,
        collate_fn: Any = None,
    ) -> ShardIterator:
        """This worker's iterator. Inside Ray Train the rank and size come from the Train
        context; outside it, pass them (default: a launcher's `RANK` and `WORLD_SIZE`, else
        a single worker: `rayshard.runtime.worlds`).

        `batch_format="torch"` (default) yields dicts of tensors on `device` through the
        pinned-memory device feed (`collate_fn` runs on each host batch before the copy);
        `"numpy"` yields zero-copy arrays (views of the decoded Arrow columns, or of the object
        store when the reader actor reads); `"arrow"` record batches
        (`collate_fn` runs on each of those too).
        """
        world_rank, world_size = worker_world(world_rank, world_size, self.settings.policy)
        world_rank, world_size = check_iterator_args(
            world_rank, world_size, batch_format, device, collate_fn
        )
        self.check_world(world_size)
        dp = data_parallel_rank(
            world_rank, world_size, self.settings.model_parallel_size, self.settings.dp_groups
        )
        registration = ray.get(
            self._coordinator.register.remote(
                world_rank,
                world_size,
                {"dp_rank": dp.dp_rank, "dp_size": dp.dp_size, "group": list(dp.group)},
            )
        )
        reading = self._rank_reading(dp.dp_rank)
        local = None
        if reads_in_consumer(self.settings, len(dp.group), self.transform):
            local = LocalReads(reading)
        schema = self._read_schema()  # found before the reader: nothing may fail after it
        nested = () if self.settings.packing else self.settings.column_rules.nested_columns(schema)
        types: dict = {}
        if self.settings.packing is None and self.transform is None:  # (else its own columns)
            types = arrow_types(schema) if batch_format == "arrow" else {}
            check_torch_columns(schema, batch_format, collate_fn)
        depth = self.settings.prefetch_depth
        delivery = Delivery(batch_format, nested, collate_fn, device, depth, types)
        registration["reader_name"] = registration["reader"]  # leaving names it
        registration["reader"] = self._reader(registration, dp, reading, local is not None)
        iterator = ShardIterator(
            self._coordinator,
            registration,
            dp,
            delivery,
            blocks_ahead=self.settings.blocks_ahead,
            ack_interval_s=self.settings.ack_interval_s,
            local_reads=local,
        )
        generations.made(generations.key_of(self._coordinator), iterator)
        return iterator

    def _read_schema(self) -> Any:
        """The schema of the columns the readers read."""
        schema = self.source.schema()
        columns = self.settings.columns
        return schema if columns is None else pa.schema([schema.field(c) for c in columns])

    def _rank_reading(self, dp_rank: int) -> RankReading:
        """What data-parallel rank `dp_rank` reads with, in its reader or its consumer."""
        parts = (self.source, self.settings, dp_rank, self.loader_id, self.transform)
        return RankReading(self._coordinator, *parts)

    def _reader(self, registration: dict, dp: Any, reading: RankReading, watch_only: bool) -> Any:
        """Get or create this rank's reader on this worker's node (one per model-parallel
        group: the first member creates it, the others find it by name); `watch_only`: the
        worker reads for itself, and what watches it under the reader's name
        (`registration["watch_key"]`, see `watch_rank`) stands in for the reader."""
        name, generation = registration["reader"], registration["generation"]
        node = ray.get_runtime_context().get_node_id()
        if watch_only:  # on another node than the coordinator's, the attach is not waited for
            registration["watch_key"] = name
            parts = (self._coordinator, self.namespace, generation, dp.dp_rank, name)
            return watch_rank(*parts, answer_now=node == self._coordinator_node)
        reader = remote_class(ShardReader).options(
            name=name,
            namespace=self.namespace,
            get_if_exists=True,
            # Hard affinity: the reader must share the worker's object store (and fate).
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            num_cpus=self.settings.reader_num_cpus,
            # every member's block calls in flight may wait for blocks (a pool they filled
            # would starve a slower member's call, and the group with it), and its `watch`
            # (`member_watch.keep_reader`), with room left
            max_concurrency=4 + len(dp.group) * (self.settings.blocks_ahead + 3),
        )
        reader = reader.remote(reading, len(dp.group))
        ray.get(self._coordinator.attach_reader.remote(generation, dp.dp_rank, name))
        if len(dp.group) > 1:  # this process is watched as the group's member too
            here = node == self._coordinator_node
            parts = (self._coordinator, self.namespace, generation, dp, name, here, reader)
            registration["member_watch"] = watch_member(*parts)
        return reader

    def stats(self) -> dict:
        """Membership, progress, dynamic leases, what every rank's consumers received
        (batches, samples, bytes, stall seconds), how every `dynamic` rank leased (calls,
        paced calls, rows, seconds its reading waited for answers), the waits held at an
        epoch's end (`waits_held`), the ranks watched by their process's pid
        (`watched_by_pid`), the `NodeWatch` actors doing it on other nodes than the
        coordinator's (`node_watches`), the model-parallel group members whose processes
        it watches (`members_watched`), the acknowledgement interval it asks for now
        (`ack_interval_asked_s`) and events (ranks lost or joined, coordinator restarts), as
        the coordinator sees them."""
        return ray.get(self._coordinator.describe.remote())

    def shutdown(self) -> None:
        """Stop the readers and the coordinator, and release this loader's ranks from
        their processes' shared watches (iterators of this loader stop working). Its
        iterators in this process are closed first: what their loops received is recorded,
        and their threads end. The coordinator journals nothing more, and removes the
        default journal (no `journal_path` given); a `journal_path` of the user's is kept."""
        for iterator in generations.made_here(generations.key_of(self._coordinator)):
            with contextlib.suppress(Exception):  # a dead coordinator: nothing to record
                iterator.close()
        try:
            names = ray.get(self._coordinator.reader_names.remote(), timeout=30)
            watches = ray.get(self._coordinator.shared_watches.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - a dead coordinator: its readers die with their workers
            names, watches = [], []
        for name in names:
            with contextlib.suppress(ValueError):  # ValueError: already gone
                ray.kill(ray.get_actor(name, namespace=self.namespace), no_restart=True)
        for watch, key in watches:
            with contextlib.suppress(ValueError):  # its process ended, and the watch with it
                ray.get_actor(watch, namespace=self.namespace).end_watch.remote(key)
        with contextlib.suppress(Exception):  # a dead coordinator: it writes no more
            ray.get(self._coordinator.close.remote(self.settings.journal_path is None), timeout=30)
        ray.kill(self._coordinator, no_restart=True)
