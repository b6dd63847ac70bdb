"""Transforms: user functions that run on every batch inside the reader processes.

`Loader(..., transform=fn)` calls `fn(batch, ctx)` in the rank's reader actor, never in the
training process, on each batch of `batch_size` rows (the last one may be shorter) before
it goes to the object store. `batch` is a dict of numpy arrays (string and binary columns
as Python lists) plus `_index` and `_padded`; `ctx` is a `TransformContext`.

Randomness: `ctx.rng(row)` is a generator whose state depends only on
`(seed, epoch, sample index)` (`sample_rng`), so a sample gets the same augmentation
whatever the world size, policy, batching or resume.

Filters: return fewer rows, keeping `_index` and `_padded` for the rows kept
(`keep_rows(batch, mask)` does it). Dropped samples count as consumed; the batch count is
unchanged, so batches get smaller (possibly empty).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.random.bit_generator import ISpawnableSeedSequence

INDEX_KEY = "_index"
PADDED_KEY = "_padded"
_RNG_DOMAIN = 0x7261797368617264  # "rayshard": keeps these streams apart from other uses
_SPAWN_DOMAIN = 1  # the seed sequences a sample generator's `spawn` derives from

Batch = dict[str, Any]
TransformFn = Callable[[Batch, "TransformContext"], Mapping[str, Any]]


@functools.lru_cache(maxsize=256)
def _epoch_key(seed: int, epoch: int) -> int:
    """The first Philox key word of (seed, epoch): a SeedSequence hash, computed once."""
    state = np.random.SeedSequence([_RNG_DOMAIN, seed, epoch]).generate_state(1, np.uint64)
    return int(state[0])


class _PhiloxKey(ISpawnableSeedSequence):
    """A seed sequence whose state is a given Philox key: `Philox(_PhiloxKey(key))` is
    `Philox(key=key)` (same state, same stream) without the throwaway `SeedSequence` that
    numpy builds from OS entropy for a keyed Philox (about 60% of its cost). `spawn`
    derives children from the key, so they are reproducible too."""

    __slots__ = ("key", "_seq")

    def __init__(self, key: np.ndarray) -> None:
        self.key = key  # (2,) uint64
        self._seq: np.random.SeedSequence | None = None

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        if n_words == 2 and (dtype is np.uint64 or np.dtype(dtype) == np.uint64):
            return self.key  # what Philox asks for: its key
        return self._sequence().generate_state(n_words, dtype)

    def spawn(self, n_children: int) -> list[np.random.SeedSequence]:
        return self._sequence().spawn(n_children)

    def _sequence(self) -> np.random.SeedSequence:
        if self._seq is None:
            words = [_RNG_DOMAIN, _SPAWN_DOMAIN, *(int(k) for k in self.key)]
            self._seq = np.random.SeedSequence(words)
        return self._seq


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of sample `index` in `epoch`: Philox keyed by (hash(seed, epoch),
    index), counter 0. A pure function of its arguments."""
    if min(seed, epoch, index) < 0:
        raise ValueError(f"seed={seed}, epoch={epoch}, index={index} must all be >= 0")
    key = np.array([_epoch_key(seed, epoch), index], dtype=np.uint64)
    return _keyed_rng(key)


def _keyed_rng(key: np.ndarray) -> np.random.Generator:
    """A generator on Philox with `key` ((2,) uint64) and counter 0."""
    return np.random.Generator(np.random.Philox(_PhiloxKey(key)))


@dataclasses.dataclass(frozen=True, eq=False)  # holds arrays: compared by identity
class TransformContext:
    """What a transform knows about its batch.

    - `loader`: the loader's id; `seed`: the loader's seed; `epoch`; `rank`: the
      data-parallel rank reading the batch.
    - `indices`: the dataset sample index of every row; `padded`: True for padding rows
      (repeats of a real sample, which get that sample's random state).
    """

    loader: str
    seed: int
    epoch: int
    rank: int
    indices: np.ndarray
    padded: np.ndarray

    def __len__(self) -> int:
        return len(self.indices)

    def rng(self, row: int) -> np.random.Generator:
        """The generator of the sample at position `row` of the batch (not a sample index:
        `sample_rng(ctx.seed, ctx.epoch, ctx.indices[row])`)."""
        return _keyed_rng(self._keys[row])

    @functools.cached_property
    def _keys(self) -> np.ndarray:
        """(n, 2) uint64: the Philox key of every row's sample, made once per batch."""
        indices = np.asarray(self.indices, dtype=np.int64)
        lowest = int(indices.min()) if len(indices) else 0
        if min(self.seed, self.epoch, lowest) < 0:
            raise ValueError(
                f"seed={self.seed}, epoch={self.epoch}, index={lowest} must all be >= 0"
            )
        keys = np.empty((len(indices), 2), dtype=np.uint64)
        keys[:, 0] = _epoch_key(self.seed, self.epoch)
        keys[:, 1] = indices
        return keys

    def rngs(self) -> list[np.random.Generator]:
        """One generator per row, in row order."""
        return [self.rng(row) for row in range(len(self.indices))]


def keep_rows(batch: Mapping[str, Any], mask: Any) -> Batch:
    """The rows of `batch` where `mask` is True, every column (arrays and lists, `_index`
    and `_padded` included): how a batch transform drops rows. `mask` is one bool per row
    (a list of row positions, which numpy would take as truthy values, is refused)."""
    keep = np.asarray(mask)
    count = len(batch[INDEX_KEY]) if INDEX_KEY in batch else len(next(iter(batch.values()), []))
    if keep.shape != (count,) or (keep.dtype != bool and keep.size):
        raise ValueError(
            f"keep_rows: mask must hold one bool per row of the batch ({count} rows), got "
            f"{keep.dtype} of shape {keep.shape}: to keep rows by position, pass "
            "np.isin(np.arange(len(ctx)), positions)"
        )
    keep = keep.astype(bool)
    rows = np.flatnonzero(keep)
    out: Batch = {}
    for key, column in batch.items():
        if isinstance(column, np.ndarray):
            out[key] = column[keep]
        else:
            out[key] = [column[i] for i in rows]
    return out


class per_sample:  # noqa: N801 - used like a function: transform=per_sample(fn)
    """A batch transform from a per-sample function `fn(sample, rng) -> dict | None`.

    `sample` maps each column to this row's value (without `_index`/`_padded`); `rng` is
    the sample's generator (`sample_rng`). Returning None drops the sample. Outputs are
    stacked per key: numbers and arrays into one numpy array, anything else (str, bytes)
    into a list. A batch whose samples were all dropped keeps the columns, zero rows long,
    once this reader saw one sample kept (before that, only `_index` and `_padded`)."""

    def __init__(self, fn: Callable[[dict, np.random.Generator], Mapping[str, Any] | None]):
        if not callable(fn):
            raise TypeError(f"per_sample needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self._empty: Batch | None = None  # zero-row columns, from the first sample kept

    def __call__(self, batch: Mapping[str, Any], ctx: TransformContext) -> Batch:
        names = [k for k in batch if k not in (INDEX_KEY, PADDED_KEY)]
        kept: list[int] = []
        outputs: list[Mapping[str, Any]] = []
        for row in range(len(ctx.indices)):
            result = self.fn({k: batch[k][row] for k in names}, ctx.rng(row))
            if result is not None:
                kept.append(row)
                outputs.append(result)
        out = _stack(outputs) if outputs else dict(self._empty or {})
        if outputs and self._empty is None:
            self._empty = {k: v[:0] for k, v in out.items()}
        out[INDEX_KEY] = np.asarray(ctx.indices)[kept]
        out[PADDED_KEY] = np.asarray(ctx.padded)[kept]
        return out


def _stack(outputs: Sequence[Mapping[str, Any]]) -> Batch:
    keys = list(outputs[0])
    extra = next((k for o in outputs for k in o if k not in outputs[0]), None)
    if extra is not None:  # (a key only later samples return: not dropped without a word)
        raise ValueError(
            f"per_sample: every sample must return the same keys; one returns {extra!r}, "
            f"which the first did not (it returned {keys})"
        )
    out: Batch = {}
    for key in keys:
        try:
            values = [o[key] for o in outputs]
        except KeyError:
            raise ValueError(
                f"per_sample: every sample must return the same keys; one lacks {key!r} "
                f"(the first returned {keys})"
            ) from None
        numeric = all(  # per type, not per value: a batch holds one or two types
            issubclass(t, (np.ndarray, np.generic, int, float, bool))
            and not issubclass(t, (np.str_, np.bytes_))
            for t in {type(v) for v in values}
        )
        if not numeric:
            out[key] = values
            continue
        arrays = [np.asarray(v) for v in values]
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            shown = ", ".join(str(shape) for shape in sorted(shapes)[:4])
            raise ValueError(
                f"per_sample: key {key!r} holds arrays of different shapes ({shown}) in one "
                "batch, which cannot be stacked: return them as Python lists (.tolist()), "
                "or resize or pad them to one shape"
            )
        out[key] = np.stack(arrays)
    return out


def check_transform(transform: Any, name: str = "transform") -> None:
    """Refuse, on the driver, a transform that is not callable or does not pickle
    (it is shipped to every reader actor with cloudpickle)."""
    if transform is None:
        return
    if not callable(transform):
        raise TypeError(
            f"{name}={transform!r} is not callable: pass a function fn(batch, ctx) -> batch, "
            f"or rayshard.data.transforms.per_sample(fn) for a function of one sample"
        )
    from ray import cloudpickle

    try:
        cloudpickle.dumps(transform)
    except Exception as error:  # noqa: BLE001 - whatever pickling raised, it cannot ship
        raise TypeError(
            f"{name}={transform!r} cannot be pickled ({type(error).__name__}: {error}); it "
            f"runs in the reader actors, so it must pickle with cloudpickle: create locks, "
            f"files, clients and models inside it (lazily, on first call) instead of "
            f"capturing them"
        ) from error


__all__ = [
    "TransformContext",
    "check_transform",
    "keep_rows",
    "per_sample",
    "sample_rng",
]
