"""The sharded datasets of ESPnet3: `ShardedDataset` (a dataset that says which samples
form shard `i`) and `CombinedDataset` (several datasets end to end, shards concatenated).

As a source (`TorchMapSource`), a sharded dataset's samples are laid out shard after shard,
and each shard is one "file" of the layout, so the `file` policy with `total_shards` = the
dataset's shard count gives every rank whole shards, rotating exactly like ESPnet3's
`(epoch * world_size + rank) % total_shards` under `stride`.
"""

from __future__ import annotations

import abc
import bisect
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from rayshard.config.checks import check_int
from rayshard.errors import ConfigError
from rayshard.sources._runs import check_runs, joined, runs_of_values
from rayshard.sources._samples import numpy_of
from rayshard.sources._samples import sample_of as _sample


class ShardedDataset(abc.ABC):
    """A map-style dataset that knows its shards (ESPnet3's interface).

    Set `total_shards` (and optionally `dist_world_size`, the world size it is built for)
    and implement `__len__`, `__getitem__` and `shard(i)`. `shard(i)` returns the indices
    of shard `i`: a `range`, a sequence or array of ints, an object with `.indices`
    (`torch.utils.data.Subset`), a torch tensor, or `IndexRanges` of `(start, end)`
    pairs. `__len__` is the size of the whole dataset. Shards must cover every sample
    exactly once (checked when the dataset becomes a source).
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


def shard_ranges(dataset: ShardedDataset) -> list[np.ndarray]:
    """Every shard as `(start, end)` runs in the shard's order (a `(k, 2)` int64 array
    each), after ESPnet3's start-up checks (coverage checked in numpy)."""
    shards = getattr(dataset, "total_shards", None)
    check_int(
        shards,
        f"{type(dataset).__name__}.total_shards",
        minimum=1,
        fix="a ShardedDataset must set total_shards before it is used",
        integral=True,
    )
    out = [runs_of(dataset, i) for i in range(int(shards))]
    check_runs(out, len(dataset))  # (as listed: a sample a shard repeats is refused)
    return out


def runs_of(dataset: Any, shard_idx: int) -> np.ndarray:
    """Shard `shard_idx` of a sharded dataset as runs (a combination's without tuples)."""
    if isinstance(dataset, CombinedDataset):
        return dataset.shard_runs(shard_idx)
    return _as_runs(dataset.shard(shard_idx), f"{type(dataset).__name__}.shard({shard_idx})")


class IndexRanges(tuple):
    """Sample indices as half-open `(start, end)` pairs in order (what `shard()` may return
    instead of listing every index)."""

    __slots__ = ()


def _as_runs(indices: Any, where: str) -> np.ndarray:
    """What `shard()` returned as `(start, end)` runs in order: one numpy pass, no Python
    pair per run (stride shards have one run per sample)."""
    if not isinstance(indices, IndexRanges):
        indices = numpy_of(indices)  # a torch tensor of indices (whose .indices is sparse's)
        if hasattr(indices, "indices") and not isinstance(indices, (range, np.ndarray)):
            indices = numpy_of(indices.indices)  # a torch Subset
        if isinstance(indices, range):
            if indices.step == 1:
                return joined(np.array([[indices.start, indices.stop]]))
            indices = np.arange(indices.start, indices.stop, indices.step)
    try:
        values = np.asarray(indices, dtype=np.int64)
        if isinstance(indices, IndexRanges):
            return joined(values.reshape(-1, 2))
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"{where} returned {type(indices).__name__}: return a range, a list of sample "
            "indices, a torch Subset or IndexRanges of (start, end) pairs"
        ) from error
    return runs_of_values(values.reshape(-1))


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
                f"{'; '.join(names)}. Make the others ShardedDataset subclasses (set "
                "total_shards, implement shard(i)), or use separate splits"
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
            sample_keys = sorted(_sample(d, 0, type(d).__name__, error=ConfigError).keys())
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
            self.total_shards = int(datasets[0].total_shards)
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
        return IndexRanges(tuple(pair) for pair in self.shard_runs(shard_idx).tolist())

    def shard_runs(self, shard_idx: int) -> np.ndarray:
        """`shard(shard_idx)` as a `(k, 2)` array of runs."""
        if not self.sharded:
            raise ConfigError("this CombinedDataset holds no ShardedDataset, so it has no shards")
        parts = [runs_of(d, shard_idx) + base for d, base in zip(self.datasets, self.offsets)]
        return joined(np.concatenate(parts))
