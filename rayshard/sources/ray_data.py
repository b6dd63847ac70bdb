"""A `ray.data.Dataset` as a source: materialized once into Arrow blocks in the object store.

Cost, stated plainly: the first call to `layout()` (or pickling the source) executes the
dataset once with `preserve_order=True` and pins every block in the Ray object store for
as long as the source lives (Ray spills to disk past the store's size). Row counts come
from one tiny task per block, so no data travels to the driver. After that, `read(start,
end)` fetches only the blocks overlapping `[start, end)` (zero-copy on their node, one
transfer otherwise) and slices them. The natural splits are the blocks.

Materialize on the driver, before the source is sent to actors: the driver then owns the
blocks, and every actor reads the same blocks in the same order. Sources are sent through
Ray (actor arguments, `ray.put`), which keeps the block references alive.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from rayshard.errors import ConfigError, DataError
from rayshard.plan import DataLayout
from rayshard.sources._files import check_columns
from rayshard.sources.base import Source, schema_text

_block_info_task = None


def _block_info(refs: list[Any]) -> list[tuple[int, pa.Schema]]:
    """(rows, schema) of every block, computed next to the blocks."""
    global _block_info_task
    import ray

    if _block_info_task is None:

        def info(table: pa.Table) -> tuple[int, pa.Schema]:
            return table.num_rows, table.schema

        _block_info_task = ray.remote(num_cpus=0)(info)
    return ray.get([_block_info_task.remote(ref) for ref in refs])


class RayDataSource(Source):
    """A `ray.data.Dataset` (any: read_parquet, from_items, map_batches...) as a source.

    `columns` projects the blocks when read. See the module docstring for the cost.
    """

    def __init__(self, dataset: Any, columns: Sequence[str] | None = None) -> None:
        import ray.data

        if not isinstance(dataset, ray.data.Dataset):
            raise ConfigError(
                f"RayDataSource needs a ray.data.Dataset, got {type(dataset).__name__}"
            )
        self._dataset = dataset
        self._requested_columns = None if columns is None else list(columns)
        self._refs: list[Any] | None = None
        self._block_rows: tuple[int, ...] = ()
        self._schema: pa.Schema | None = None

    # -- materialization (once, lazily) -----------------------------------------------------
    def materialize(self) -> RayDataSource:
        """Execute the dataset into Arrow blocks now (otherwise done on first use)."""
        if self._refs is not None:
            return self
        options = self._dataset.context.execution_options
        previous = options.preserve_order
        options.preserve_order = True
        try:
            refs = self._dataset.materialize().to_arrow_refs()
        finally:
            options.preserve_order = previous
        infos = _block_info(refs)
        kept = [(ref, rows, schema) for ref, (rows, schema) in zip(refs, infos) if rows > 0]
        if not kept:
            raise ConfigError(
                "the ray.data.Dataset has no rows: check its source and filters, "
                "or pass a non-empty dataset"
            )
        schema = kept[0][2]
        for _, _, other in kept[1:]:
            if not other.equals(schema, check_metadata=False):
                raise ConfigError(
                    f"the dataset's blocks disagree on their schema ({schema} vs {other}): "
                    "cast the columns to one type before passing the dataset"
                )
        self._columns = check_columns(self._requested_columns, schema, "the ray.data.Dataset")
        self._refs = [ref for ref, _, _ in kept]
        self._block_rows = tuple(rows for _, rows, _ in kept)
        self._schema = schema
        self._offsets = (0, *itertools.accumulate(self._block_rows))
        self._dataset = None  # the blocks are all we need; drop the lazy plan
        return self

    def __getstate__(self) -> dict[str, Any]:
        self.materialize()
        return self.__dict__.copy()

    # -- Source -----------------------------------------------------------------------------
    def layout(self) -> DataLayout:
        self.materialize()
        return DataLayout.of_samples(self._offsets[-1])

    def schema(self) -> pa.Schema:
        self.materialize()
        if self._columns is None:
            return self._schema
        return pa.schema([self._schema.field(c) for c in self._columns])

    def splits(self) -> list[tuple[int, int]]:
        """The blocks, as sample ranges."""
        self.materialize()
        return list(zip(self._offsets, self._offsets[1:]))

    def read(
        self, start: int, end: int, columns: Sequence[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        import ray

        self.materialize()
        num = self._offsets[-1]
        if not (0 <= start <= end <= num):
            raise ValueError(f"rows [{start}, {end}) are outside the dataset's [0, {num})")
        cols = self._columns if columns is None else check_columns(columns, self.schema(), "it")
        block = bisect.bisect_right(self._offsets, start) - 1
        while start < end:
            lo = self._offsets[block]
            try:
                table = ray.get(self._refs[block])
            except ray.exceptions.RayError as error:
                raise DataError(
                    f"block {block} of the ray.data.Dataset is lost ({error})"
                ) from error
            part = table.slice(start - lo, min(end, self._offsets[block + 1]) - start)
            if cols is not None:
                part = part.select(cols)
            yield from part.to_batches()
            start = self._offsets[block + 1]
            block += 1

    def describe(self) -> str:
        if self._refs is None:
            return "ray.data.Dataset (not materialized yet)"
        # (not the block count: Ray picks it from the CPUs free when the dataset runs, so
        # a state saved on one cluster would be refused on a bigger one)
        return f"ray.data.Dataset ({self._offsets[-1]} rows; {schema_text(self.schema())})"
