"""Map-style datasets (`__len__` / `__getitem__` returning dicts) as a source, and the
sharded datasets of ESPnet3: `ShardedDataset` and `CombinedDataset`.

torch is imported only when a sample holds a tensor; any object with `__len__` and
`__getitem__` works, `torch.utils.data.Dataset` included.

A `ShardedDataset` says which samples form shard `i`. As a source, its samples are laid
out shard after shard, and each shard is one "file" of the layout, so the `file` policy
with `total_shards` = the dataset's shard count gives every rank whole shards, rotating
exactly like ESPnet3's `(epoch * world_size + rank) % total_shards` under `stride`.
"""

from __future__ import annotations

import abc
import bisect
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from rayshard.errors import ConfigError, DataError
from rayshard.plan import DataLayout, check_coverage
from rayshard.plan import intervals as iv
from rayshard.sources._samples import as_dict, infer_schema, to_batch
from rayshard.sources.base import Source


class ShardedDataset(abc.ABC):
    """A map-style dataset that knows its shards (ESPnet3's interface).

    Set `total_shards` (and optionally `dist_world_size`, the world size it is built for)
    and implement `__len__`, `__getitem__` and `shard(i)`. `shard(i)` returns the indices
    of shard `i`: a `range`, a sequence or array of ints, an object with `.indices`
    (`torch.utils.data.Subset`), or `IndexRanges` of `(start, end)` pairs. `__len__` is
    the size of the whole dataset. Shards must cover every sample exactly once (checked
    when the dataset becomes a source).
    """

    total_shards: int
    dist_world_size: int | None = None

    @property
    def num_shards(self) -> int:
        return self.total_shards

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @abc.abstractmethod
    def shard(self, shard_idx: int) -> Any:
        """The sample indices of shard `shard_idx` (see the class docstring)."""


def is_sharded(dataset: Any) -> bool:
    """A `ShardedDataset`, or a `CombinedDataset` of them."""
    if isinstance(dataset, CombinedDataset):
        return dataset.sharded
    return isinstance(dataset, ShardedDataset)


def shard_ranges(dataset: ShardedDataset) -> list[iv.Intervals]:
    """Every shard as index ranges in the shard's order, after ESPnet3's start-up checks."""
    shards = getattr(dataset, "total_shards", None)
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ConfigError(
            f"{type(dataset).__name__}.total_shards={shards!r}: a ShardedDataset must set "
            "total_shards to an integer >= 1 before it is used"
        )
    out = [
        _as_ranges(dataset.shard(i), f"{type(dataset).__name__}.shard({i})") for i in range(shards)
    ]
    check_coverage([iv.normalize(r) for r in out], len(dataset))
    return out


class IndexRanges(tuple):
    """Sample indices as half-open `(start, end)` pairs in order (what `shard()` may return
    instead of listing every index)."""

    __slots__ = ()


def _as_ranges(indices: Any, where: str) -> iv.Intervals:
    if isinstance(indices, IndexRanges):
        return iv.concat((int(a), int(b)) for a, b in indices)
    if hasattr(indices, "indices") and not isinstance(indices, (range, np.ndarray)):
        indices = indices.indices
    if isinstance(indices, range):
        if indices.step != 1:
            indices = list(indices)
        else:
            return iv.concat([(indices.start, indices.stop)])
    try:
        values = np.asarray(indices, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"{where} returned {type(indices).__name__}: return a range, a list of sample "
            "indices, or a torch Subset"
        ) from error
    if len(values) == 0:
        return ()
    # (k,) positions where a run of consecutive indices breaks
    breaks = np.flatnonzero(np.diff(values) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(values)]])
    return iv.concat((int(values[a]), int(values[b - 1]) + 1) for a, b in zip(starts, ends))


class CombinedDataset:
    """Several map-style datasets one after the other, with ESPnet3's rules.

    All datasets are sharded or none is; sharded ones agree on `total_shards` and
    `dist_world_size`; all return the same sample keys (checked on each first sample).
    When sharded, shard `i` is shard `i` of every part, and the combination is itself a
    `ShardedDataset`.
    """

    def __init__(self, datasets: Sequence[Any]) -> None:
        datasets = list(datasets)
        if not datasets:
            raise ConfigError("CombinedDataset needs at least one dataset")
        sharded = [is_sharded(d) for d in datasets]
        if any(sharded) and not all(sharded):
            names = [
                f"{i}: {type(d).__name__} ({'sharded' if s else 'not sharded'})"
                for i, (d, s) in enumerate(zip(datasets, sharded))
            ]
            raise ConfigError(
                "if any dataset of a combination is a ShardedDataset, all must be: "
                f"{'; '.join(names)}. Give the others a shard() method, or use separate splits"
            )
        if all(sharded):
            values = {(d.total_shards, d.dist_world_size) for d in datasets}
            if len(values) > 1:
                listing = ", ".join(
                    f"{type(d).__name__}(total_shards={d.total_shards}, "
                    f"dist_world_size={d.dist_world_size})"
                    for d in datasets
                )
                raise ConfigError(
                    "all sharded datasets of a combination must share total_shards and "
                    f"dist_world_size: {listing}. Pass both from one configuration value"
                )
        keys = None
        for i, d in enumerate(datasets):
            if len(d) == 0:
                continue
            sample_keys = sorted(_sample(d, 0, type(d).__name__).keys())
            if keys is None:
                keys, first = sample_keys, i
            elif sample_keys != keys:
                raise ConfigError(
                    f"datasets return different sample keys: dataset {first} gives {keys}, "
                    f"dataset {i} ({type(d).__name__}) gives {sample_keys}; "
                    "every dataset of a combination must return the same keys"
                )
        self.datasets = datasets
        self.offsets = [0, *itertools.accumulate(len(d) for d in datasets)]
        self.sharded = all(sharded)
        if self.sharded:
            self.total_shards = datasets[0].total_shards
            self.dist_world_size = datasets[0].dist_world_size

    def __len__(self) -> int:
        return self.offsets[-1]

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} is outside the combined dataset of {len(self)}")
        part = bisect.bisect_right(self.offsets, index) - 1
        return self.datasets[part][index - self.offsets[part]]

    @property
    def num_shards(self) -> int:
        return self.total_shards if self.sharded else 1

    def shard(self, shard_idx: int) -> IndexRanges:
        """Shard `shard_idx` of every part, as ranges of combined indices."""
        if not self.sharded:
            raise ConfigError("this CombinedDataset holds no ShardedDataset, so it has no shards")
        out: list[tuple[int, int]] = []
        for d, base in zip(self.datasets, self.offsets):
            ranges = _as_ranges(d.shard(shard_idx), f"{type(d).__name__}.shard({shard_idx})")
            out.extend((a + base, b + base) for a, b in ranges)
        return IndexRanges(out)


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
        if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
            raise ConfigError(f"batch_rows={batch_rows!r} must be an integer >= 1")
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


def _sample(dataset: Any, index: int, name: str, names: Sequence[str] | None = None) -> dict:
    return as_dict(dataset[index], index, name, names)
