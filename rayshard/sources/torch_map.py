"""Map-style datasets (`__len__` / `__getitem__` returning dicts or tuples) as a source.

torch is imported only when a sample holds a tensor; any object with `__len__` and
`__getitem__` works, `torch.utils.data.Dataset` included. ESPnet3's sharded datasets
(`ShardedDataset`, `CombinedDataset`: `rayshard.sources.sharded_datasets`) are laid out
shard after shard, each shard one "file" of the layout.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from rayshard.config.checks import check_int
from rayshard.errors import ConfigError
from rayshard.plan import DataLayout
from rayshard.sources._runs import IndexRuns, short_hash, size_of, subset_mark
from rayshard.sources._samples import check_keys, infer_schema, to_batch
from rayshard.sources._samples import sample_of as _sample
from rayshard.sources.base import Source
from rayshard.sources.sharded_datasets import (
    CombinedDataset,
    IndexRanges,
    ShardedDataset,
    is_sharded,
    shard_ranges,
)

__all__ = ["CombinedDataset", "IndexRanges", "ShardedDataset", "TorchMapSource"]

PROBES = 32  # the most samples probed for a key None or empty in the first three


class TorchMapSource(Source):
    """A map-style dataset as a source: rows become Arrow record batches.

    - Samples are dicts of scalars, strings, bytes, numpy arrays or torch tensors, or
      tuples such as `(x, y)` whose values are named by `names` (default "0", "1", ...).
    - The schema comes from three probe samples (first, middle, last; a key None or empty
      in all three from up to `PROBES` spread over the dataset): arrays of one shape (any
      rank) become fixed-shape columns, delivered as `(rows, *shape)` arrays and tensors;
      rank-1 arrays whose lengths differ, or keys listed in `ragged`, become
      variable-length lists (padded by the loader, see `Loader(padding=...)`).
    - What `__getitem__` raises (kept as `__cause__`), or a value that makes no column of
      the probed type, is a `ConfigError` at start-up and a `DataError` while reading,
      naming the sample, the key and the type seen and expected.
    - `read` calls `__getitem__` for exactly the rows asked for, `batch_rows` at a time.
    - A `ShardedDataset` (or a sharded `CombinedDataset`) is laid out shard after shard,
      each shard one file of the layout; `splits()` are then the shards. Coverage is
      checked here: overlapping or missing samples are a `ConfigError`.
    The dataset is pickled with the source.
    """

    def __init__(
        self,
        dataset: Any,
        columns: Sequence[str] | None = None,
        *,
        batch_rows: int = 256,
        names: Sequence[str] | None = None,
        ragged: Sequence[str] = (),
    ) -> None:
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise ConfigError(
                f"{type(dataset).__name__} is not a map-style dataset: it needs __len__ and "
                "__getitem__ (for iterable datasets, write them to Parquet first)"
            )
        check_int(batch_rows, "batch_rows", minimum=1)
        self._dataset = dataset
        self._batch_rows = batch_rows
        n = len(dataset)
        if n == 0:
            raise ConfigError(
                f"{type(dataset).__name__} has no samples: check how it was built, "
                "or pass a non-empty dataset"
            )
        if is_sharded(dataset):
            shards = shard_ranges(dataset)
            self._order = IndexRuns(np.concatenate(shards))
            self._layout = DataLayout.of_files([size_of(s) for s in shards])
            self.total_shards: int | None = int(dataset.total_shards)
            self.dist_world_size: int | None = getattr(dataset, "dist_world_size", None)
        else:
            self._order = IndexRuns(np.array([[0, n]]))
            self._layout = DataLayout.of_samples(n)
            self.total_shards = None
            self.dist_world_size = None
        if names is not None:
            names = [names] if isinstance(names, str) else [str(k) for k in names]
        self._names = names
        if columns is not None:
            columns = [columns] if isinstance(columns, str) else list(columns)
        ragged = [ragged] if isinstance(ragged, str) else list(ragged)
        self._keys, self._full_schema = _probe(dataset, n, names, ragged, columns)
        if columns is not None:
            missing = [c for c in columns if c not in self._keys]
            if missing:
                raise ConfigError(
                    f"column(s) {missing} are not sample keys of {type(dataset).__name__}: "
                    f"available keys are {self._keys}"
                )
        self._columns = columns

    @property
    def dataset(self) -> Any:
        return self._dataset

    def layout(self) -> DataLayout:
        return self._layout

    def schema(self) -> pa.Schema:
        if self._columns is None:
            return self._full_schema
        return pa.schema([self._full_schema.field(c) for c in self._columns])

    def splits(self) -> list[tuple[int, int]]:
        """The shards of a `ShardedDataset`, else chunks of `batch_rows` samples, at least
        1,024 (a plan of fewer, larger splits; reads still come `batch_rows` at a time)."""
        if self.total_shards is not None:
            return super().splits()
        n, step = self._layout.num_samples, max(self._batch_rows, 1024)
        return [(a, min(a + step, n)) for a in range(0, n, step)]

    def indices(self, start: int, end: int) -> Iterator[int]:
        """The dataset indices behind samples `[start, end)` of the source."""
        return self._order.indices(start, end)

    def read(
        self, start: int, end: int, columns: Sequence[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        num = self._layout.num_samples
        if not (0 <= start <= end <= num):
            raise ValueError(f"rows [{start}, {end}) are outside the dataset's [0, {num})")
        cols = self._columns if columns is None else list(columns)
        schema = self.schema() if columns is None else _project(self._full_schema, cols)
        chunk: list[dict[str, Any]] = []
        where: list[int] = []
        name = type(self._dataset).__name__
        for index in self.indices(start, end):
            sample = _sample(self._dataset, index, name, self._names)
            check_keys(sample, self._keys, index, name)
            chunk.append(sample)
            where.append(index)
            if len(chunk) == self._batch_rows:
                yield to_batch(chunk, where, schema, name)
                chunk, where = [], []
        if chunk:
            yield to_batch(chunk, where, schema, name)

    def describe(self) -> str:
        """Name, sample count and shard count; a short hash of the order when it is not
        0, 1, 2, ... (stride shards) and of a `Subset`'s indices unless they are 0..n-1,
        so two such datasets get two loader ids (the plain case's description, and ids of
        states saved for it, unchanged)."""
        kind = f", {self.total_shards} shards" if self.total_shards else ""
        if not self._order.is_identity():
            sizes = np.asarray(self._layout.file_rows or (), np.int64)
            kind += f", order {short_hash(self._order.starts, self._order.offsets, sizes)}"
        kind += subset_mark(self._dataset)
        return f"{type(self._dataset).__name__} ({self._layout.num_samples} samples{kind})"


def _probe(
    dataset: Any, n: int, names: list[str] | None, ragged: list[str], wanted: list[str] | None
) -> tuple[list[str], pa.Schema]:
    """The keys (of sample 0) and schema from the probe samples (first, middle, last); a
    key None or empty in all of them is probed in up to `PROBES` samples spread over the
    dataset, and a `ConfigError` if still without a value (and among `wanted`)."""
    label = type(dataset).__name__
    where = sorted({0, n // 2, n - 1})
    probes = [_sample(dataset, i, label, names, ConfigError) for i in where]
    keys = list(probes[0].keys())
    unknown = [k for k in ragged if k not in keys]
    if unknown:
        raise ConfigError(
            f"ragged={ragged!r}: {unknown} are not sample keys of {label}; the keys are {keys}"
        )
    for i, probe in zip(where[1:], probes[1:]):
        lacking = [k for k in keys if k not in probe]
        if lacking:
            raise ConfigError(
                f"{label}[{i}] lacks the keys {lacking} of {label}[0] ({keys}): every sample "
                "must return the same keys"
            )
    schema = infer_schema(probes, keys, ragged, label, where)
    empty = [f.name for f in schema if _valueless(f.type)]
    extra = iter(sorted(set(np.linspace(0, n - 1, PROBES).astype(int).tolist()) - set(where)))
    while empty and len(where) < PROBES and (i := next(extra, None)) is not None:
        where.append(i)
        sample = _sample(dataset, i, label, names, ConfigError)
        probes.append({k: sample.get(k) for k in keys})
        for field in infer_schema(probes, empty, ragged, label, where):  # (only these keys)
            schema = schema.set(schema.get_field_index(field.name), field)
        empty = [k for k in empty if _valueless(schema.field(k).type)]
    for key in empty:
        if wanted is None or key in wanted:
            raise ConfigError(
                f"key {key!r} of {label} is None or empty in all {len(where)} samples probed "
                f"({sorted(where)}): its type cannot be known. Give it a value in __getitem__ "
                "(e.g. an empty array of its dtype), or leave it out of columns="
            )
    return keys, schema


def _valueless(type_: pa.DataType) -> bool:
    """The type of only None values (`null`) or empty lists (`list<null>`)."""
    while pa.types.is_list(type_) or pa.types.is_fixed_size_list(type_):
        type_ = type_.value_type
    return pa.types.is_null(type_)


def _project(schema: pa.Schema, columns: list[str]) -> pa.Schema:
    missing = [c for c in columns if schema.get_field_index(c) < 0]
    if missing:
        raise ConfigError(f"column(s) {missing} do not exist: available columns are {schema.names}")
    return pa.schema([schema.field(c) for c in columns])
