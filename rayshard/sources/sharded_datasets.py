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
from rayshard.plan import check_coverage
from rayshard.plan import intervals as iv
from rayshard.sources._samples import sample_of as _sample


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
    check_int(
        shards,
        f"{type(dataset).__name__}.total_shards",
        minimum=1,
        fix="a ShardedDataset must set total_shards before it is used",
    )
    out = [
        _as_ranges(dataset.shard(i), f"{type(dataset).__name__}.shard({i})") for i in range(shards)
    ]
    check_coverage(out, len(dataset))  # (as listed: a sample a shard repeats is refused)
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
