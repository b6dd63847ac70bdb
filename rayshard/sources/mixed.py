"""`MixedSource`: several sources mixed by weight, with exact per-source counts per epoch.

The loader sees one dataset of `T = sum(counts)` samples per epoch and plans, leases and
resumes over its positions as over any source; which sample of which source a position
reads is `rayshard.core.mixing.Mix` for the epoch and the loader's seed
(`Source.for_epoch`). Every row carries `_source` (the source's position in `sources`) and
`_source_index` (its sample index in that source).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from rayshard.config.checks import check_int
from rayshard.core.mix_pieces import MIN_PIECE, aligned_pieces
from rayshard.core.mixing import Mix, apportion, check_weights
from rayshard.data.arrow_numpy import arrow_of
from rayshard.errors import ConfigError
from rayshard.plan import DataLayout
from rayshard.sources._decoded import DecodedChunks
from rayshard.sources.base import Source
from rayshard.sources.schema import promote_type

log = logging.getLogger(__name__)

SOURCE_KEY = "_source"
SOURCE_INDEX_KEY = "_source_index"
#: Whole splits (row groups) kept per source and reading process (see `_SplitCache`).
CACHED_SPLITS = 4


class MixedSource(Source):
    """`sources` mixed per epoch by `weights` (proportions of `samples_per_epoch`, default
    the sources' total rows) or by exact `counts` per source; `columns` are the columns
    read from every source (default: those all sources have), which must agree in type up
    to a safe promotion. Splits (the pieces `dynamic` leases) are `split_rows` positions
    each, or by default cut where the source with the widest splits (row groups) starts a
    new one, so a piece decodes one row group of it (`rayshard.core.mix_pieces`)."""

    def __init__(
        self,
        sources: Sequence[Source],
        weights: Sequence[float] | None = None,
        *,
        counts: Sequence[int] | None = None,
        samples_per_epoch: int | None = None,
        columns: Sequence[str] | None = None,
        split_rows: int | None = None,
    ) -> None:
        sources = list(sources) if isinstance(sources, (list, tuple)) else sources
        if not isinstance(sources, list) or not sources:
            raise ConfigError(f"sources={sources!r} must be a non-empty list of sources")
        for i, s in enumerate(sources):
            if not isinstance(s, Source):
                raise TypeError(f"sources[{i}] is a {type(s).__name__}, not a rayshard Source")
        if split_rows is not None:
            check_int(split_rows, "split_rows", minimum=1, fix="or None (aligned pieces)")
        sizes = tuple(s.layout().num_samples for s in sources)
        counts = _counts(sizes, weights, counts, samples_per_epoch)
        for s, (size, count) in enumerate(zip(sizes, counts)):
            if count and not size:
                raise ConfigError(
                    f"sources[{s}] ({sources[s].describe()}) has no rows but weight/count "
                    f"asks for {count} samples per epoch: give it weight 0, or fix the source"
                )
            if not count:
                log.warning("mix: sources[%d] (%s) gets no samples", s, sources[s].describe())
        self._sources = sources
        self._mix = Mix(sizes, counts)
        self._data_schema = _common_schema(sources, columns)
        extra = [pa.field(SOURCE_KEY, pa.int64()), pa.field(SOURCE_INDEX_KEY, pa.int64())]
        self._schema = pa.schema([*self._data_schema, *extra])
        self._layout = DataLayout.of_files(_pieces(self._mix, sources, split_rows))
        log.info("mix: %s samples per epoch per source (of %s rows)", counts, sizes)

    @property
    def counts(self) -> tuple[int, ...]:
        """Samples drawn from each source per epoch (exact)."""
        return self._mix.counts

    @property
    def sizes(self) -> tuple[int, ...]:
        """Rows of each source."""
        return self._mix.sizes

    @property
    def sources(self) -> tuple[Source, ...]:
        """The mixed sources, in order."""
        return tuple(self._sources)

    def mix(self, seed: int) -> Mix:
        """The mixing arithmetic for a loader seeded by `seed`."""
        return Mix(self._mix.sizes, self._mix.counts, seed)

    def layout(self) -> DataLayout:
        return self._layout

    def schema(self) -> pa.Schema:
        return self._schema

    def describe(self) -> str:
        parts = ", ".join(f"{s.describe()} x{c}" for s, c in zip(self._sources, self.counts))
        return f"mix of {len(self._sources)} sources [{parts}]"

    def for_epoch(self, epoch: int, seed: int) -> Source:
        return _EpochMix(self, self.mix(seed), epoch)

    def let_go(self) -> None:
        for source in self._sources:  # an epoch's own splits go with its `for_epoch` copy
            source.let_go()

    def read(
        self, start: int, end: int, columns: Sequence[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Epoch 0 with seed 0; the loader reads through `for_epoch`."""
        return self.for_epoch(0, 0).read(start, end, columns)

    def read_mixed(
        self,
        mix: Mix,
        epoch: int,
        start: int,
        end: int,
        columns: Sequence[str] | None,
        cache: _SplitCache | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Positions `[start, end)` of `epoch`: each source's picks gathered from its whole
        splits (through `cache`), then put in position order."""
        names = list(columns) if columns is not None else self._schema.names
        data = [n for n in names if n not in (SOURCE_KEY, SOURCE_INDEX_KEY)]
        target = pa.schema([self._data_schema.field(n) for n in data])
        source, index = mix.locate(epoch, start, end)  # (n,) each
        cache = cache or _SplitCache(self._sources)
        parts, order = [], []
        for s in np.unique(source):
            where = np.flatnonzero(source == s)
            parts.append(cache.take(int(s), index[where], data).cast(target))
            order.append(where)
        if parts:
            table = pa.concat_tables(parts)
            table = table.take(arrow_of(np.argsort(np.concatenate(order), kind="stable")))
        else:
            table = target.empty_table()
        extra = {SOURCE_KEY: source, SOURCE_INDEX_KEY: index}
        arrays = [table.column(n) if n in data else pa.array(extra[n]) for n in names]
        yield from pa.table(arrays, names=names).combine_chunks().to_batches()


class _EpochMix(Source):
    """A `MixedSource` as read in one epoch (what the readers hold for it)."""

    def __init__(self, parent: MixedSource, mix: Mix, epoch: int) -> None:
        self._parent, self._mix, self._epoch = parent, mix, epoch
        self._cache = _SplitCache(parent._sources)

    def layout(self) -> DataLayout:
        return self._parent.layout()

    def schema(self) -> pa.Schema:
        return self._parent.schema()

    def splits(self) -> list[tuple[int, int]]:
        return self._parent.splits()

    def describe(self) -> str:
        return f"{self._parent.describe()}, epoch {self._epoch}"

    def read(
        self, start: int, end: int, columns: Sequence[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        return self._parent.read_mixed(self._mix, self._epoch, start, end, columns, self._cache)


def _pieces(mix: Mix, sources: list[Source], split_rows: int | None) -> list[int]:
    """Piece lengths: `split_rows` positions each, or (None) cut at the split boundaries
    of the source with the widest splits (`rayshard.core.mix_pieces`), else MIN_PIECE each."""
    if split_rows is None:
        starts = [[a for a, _ in s.splits()] for s in sources]
        aligned = aligned_pieces(mix, starts)
        if aligned is not None:
            return aligned
        split_rows = MIN_PIECE
    total = mix.total
    return [min(split_rows, total - a) for a in range(0, total, split_rows)]


def _counts(
    sizes: tuple[int, ...],
    weights: Sequence[float] | None,
    counts: Sequence[int] | None,
    samples_per_epoch: int | None,
) -> tuple[int, ...]:
    """Per-source counts from exactly one of `weights` (with `samples_per_epoch`) or `counts`."""
    if (weights is None) == (counts is None):
        raise ConfigError(
            "give MixedSource either weights=[...] (proportions of samples_per_epoch) or "
            "counts=[...] (exact samples per source per epoch), not both and not neither"
        )
    if counts is not None:
        if samples_per_epoch is not None:
            raise ConfigError(
                f"samples_per_epoch={samples_per_epoch} goes with weights=, not counts= "
                "(counts already fix the epoch's size): drop one of them"
            )
        if not isinstance(counts, Sequence) or len(counts) != len(sizes):
            raise ConfigError(
                f"counts={counts!r} must have one integer per source ({len(sizes)} sources)"
            )
        for i, c in enumerate(counts):
            check_int(c, f"counts[{i}]", minimum=0, integral=True)
        if not any(counts):
            raise ConfigError(f"counts={list(counts)} are all zero: give a source a count >= 1")
        return tuple(int(c) for c in counts)
    weights = check_weights(weights, len(sizes))
    total = sum(sizes) if samples_per_epoch is None else samples_per_epoch
    default = "the default is the sources' total rows" if samples_per_epoch is None else ""
    check_int(total, "samples_per_epoch", minimum=1, fix=default)
    return apportion(total, weights)


def _common_schema(sources: list[Source], columns: Sequence[str] | None) -> pa.Schema:
    """The consumed columns, typed to what every source converts to without loss."""
    schemas = [s.schema() for s in sources]
    if columns is None:
        columns = [n for n in schemas[0].names if all(n in sch.names for sch in schemas[1:])]
        if not columns:
            raise ConfigError(
                "the sources share no column: pass columns=[...] naming columns every source has"
            )
    fields = []
    for name in columns:
        if name in (SOURCE_KEY, SOURCE_INDEX_KEY):
            raise ConfigError(f"column {name!r} is added by MixedSource: rename it in the sources")
        field = None
        for i, (src, sch) in enumerate(zip(sources, schemas)):
            if name not in sch.names:
                raise ConfigError(
                    f"column {name!r} is not in sources[{i}] ({src.describe()}), which has "
                    f"{sch.names}: read only columns every source has (columns=[...])"
                )
            other = sch.field(name)
            wide = other.type if field is None else promote_type(field.type, other.type)
            if wide is None:
                raise ConfigError(
                    f"column {name!r} is {field.type} in sources[0] ({sources[0].describe()}) "
                    f"but {other.type} in sources[{i}] ({src.describe()}), with no safe "
                    "promotion: cast one source's column, or leave the column out"
                )
            field = pa.field(name, wide)
        fields.append(field)
    return pa.schema(fields)


class _SplitCache:
    """The last `CACHED_SPLITS` whole splits (row groups) read of each source, in the
    reading process: a rank's consecutive pieces pick rows from the same row groups of
    every source, which are then decoded once, not once per piece. Thread-safe: a split
    that several reading threads ask for at once is decoded by the first, the others wait
    for it (each thread decoded it again before: `reader_threads` times the work)."""

    def __init__(self, sources: list[Source]) -> None:
        self._sources = sources
        self._starts = [np.array([a for a, _ in s.splits()], dtype=np.int64) for s in sources]
        self._ends = [[b for _, b in s.splits()] for s in sources]
        self._decoded = [DecodedChunks(CACHED_SPLITS) for _ in sources]

    def take(self, source: int, index: np.ndarray, columns: list[str]) -> pa.Table:
        """Rows `index` of `source` (any order, repeats allowed), projected to `columns`."""
        starts = self._starts[source]
        unique, inverse = np.unique(index, return_inverse=True)
        split = np.searchsorted(starts, unique, side="right") - 1  # (u,) split of each row
        tables, offsets, rows = [], np.zeros(len(starts), dtype=np.int64), 0
        for k in np.unique(split).tolist():
            table = self._split(source, k, columns)
            offsets[k] = rows - starts[k]  # row `i` of split k is row `i + offset` of the concat
            tables.append(table)
            rows += table.num_rows
        at = unique + offsets[split]  # (u,) rows in the concatenated splits
        return pa.concat_tables(tables).take(arrow_of(at[inverse.reshape(-1)]))

    def _split(self, source: int, k: int, columns: list[str]) -> pa.Table:
        def decode() -> pa.Table:
            start, end = int(self._starts[source][k]), self._ends[source][k]
            batches = list(self._sources[source].read(start, end, columns))
            return pa.Table.from_batches(batches).select(columns)

        return self._decoded[source].get((k, tuple(columns)), decode)
