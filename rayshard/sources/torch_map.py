"""Map-style datasets (`__len__` / `__getitem__` returning dicts or tuples) as a source.

torch is imported only when a sample holds a tensor; any object with `__len__` and
`__getitem__` works, `torch.utils.data.Dataset` included. ESPnet3's sharded datasets
(`ShardedDataset`, `CombinedDataset`: `rayshard.sources.sharded_datasets`) are laid out
shard after shard, each shard one "file" of the layout.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from rayshard.config.checks import check_int
from rayshard.errors import ConfigError, DataError
from rayshard.plan import DataLayout
from rayshard.plan import intervals as iv
from rayshard.sources._samples import infer_schema, to_batch
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


class TorchMapSource(Source):
    """A map-style dataset as a source: rows become Arrow record batches.

    - Samples are dicts of scalars, strings, bytes, numpy arrays or torch tensors, or
      tuples such as `(x, y)` whose values are named by `names` (default "0", "1", ...).
    - The schema comes from three probe samples (first, middle, last): arrays of one
      shape (any rank) become fixed-shape columns, delivered as `(rows, *shape)` arrays
      and tensors; rank-1 arrays whose lengths differ, or keys listed in `ragged`, become
      variable-length lists (padded by the loader, see `Loader(padding=...)`). A later
      sample of another shape is a `DataError` naming it.
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
            self._shards: list[iv.Intervals] | None = shard_ranges(dataset)
            self._order = iv.concat(itertools.chain.from_iterable(self._shards))
            self._layout = DataLayout.of_files([iv.total(s) for s in self._shards])
            self.total_shards: int | None = dataset.total_shards
            self.dist_world_size: int | None = getattr(dataset, "dist_world_size", None)
        else:
            self._shards = None
            self._order = ((0, n),)
            self._layout = DataLayout.of_samples(n)
            self.total_shards = None
            self.dist_world_size = None
        if names is not None:
            names = [names] if isinstance(names, str) else [str(k) for k in names]
        self._names = names
        label = type(dataset).__name__
        first = _sample(dataset, 0, label, names)
        self._keys = list(first.keys())
        probes = [first] + [
            _sample(dataset, i, label, names) for i in sorted({n // 2, n - 1} - {0})
        ]
        ragged = [ragged] if isinstance(ragged, str) else list(ragged)
        unknown = [k for k in ragged if k not in self._keys]
        if unknown:
            raise ConfigError(
                f"ragged={ragged!r}: {unknown} are not sample keys of {label}; "
                f"the keys are {self._keys}"
            )
        full = infer_schema(probes, self._keys, ragged)
        if columns is not None:
            columns = [columns] if isinstance(columns, str) else list(columns)
            missing = [c for c in columns if c not in self._keys]
            if missing:
                raise ConfigError(
                    f"column(s) {missing} are not sample keys of {type(dataset).__name__}: "
                    f"available keys are {self._keys}"
                )
        self._columns = columns
        self._full_schema = full

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
        """The shards of a `ShardedDataset`, else chunks of `batch_rows` samples."""
        if self._shards is not None:
            return super().splits()
        n, step = self._layout.num_samples, max(self._batch_rows, 1024)
        return [(a, min(a + step, n)) for a in range(0, n, step)]

    def indices(self, start: int, end: int) -> Iterator[int]:
        """The dataset indices behind samples `[start, end)` of the source."""
        return iv.indices(iv.take(self._order, start, end))

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
            if sorted(sample.keys()) != sorted(self._keys):
                raise DataError(
                    f"{name}[{index}] has keys {sorted(sample.keys())}, but sample 0 has "
                    f"{sorted(self._keys)}: every sample must return the same keys"
                )
            chunk.append(sample)
            where.append(index)
            if len(chunk) == self._batch_rows:
                yield to_batch(chunk, where, schema, name)
                chunk, where = [], []
        if chunk:
            yield to_batch(chunk, where, schema, name)

    def describe(self) -> str:
        kind = f", {self.total_shards} shards" if self.total_shards else ""
        return f"{type(self._dataset).__name__} ({self._layout.num_samples} samples{kind})"


def _project(schema: pa.Schema, columns: list[str]) -> pa.Schema:
    missing = [c for c in columns if schema.get_field_index(c) < 0]
    if missing:
        raise ConfigError(f"column(s) {missing} do not exist: available columns are {schema.names}")
    return pa.schema([schema.field(c) for c in columns])
