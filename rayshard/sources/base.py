"""The interface every data source implements: a layout for the planner, and reads of any
row range without touching rows outside it.

Sample `i` is the `i`-th row of the dataset in its natural order (files in the order
given, rows in file order). Sources are pickled and sent to shard actors, so they hold
paths and metadata, never open handles or data they did not need.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from rayshard.plan import DataLayout, pieces


class Source(abc.ABC):
    """A dataset the planner can split."""

    @abc.abstractmethod
    def layout(self) -> DataLayout:
        """Sample count, plus per-file row counts for file-based sources (metadata only)."""

    @abc.abstractmethod
    def schema(self) -> pa.Schema:
        """The schema of what `read` yields (after column projection if one was set)."""

    @abc.abstractmethod
    def read(
        self, start: int, end: int, columns: Sequence[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Rows `[start, end)` of the dataset in order, reading nothing outside them."""

    def splits(self) -> list[tuple[int, int]]:
        """Natural read units (files, row groups) as sample ranges covering the dataset.

        Readers never read across a split boundary in one call, unless the split goes on in
        the same read unit (`read_units`); the dynamic policy leases these. The default is
        one split per file, or the whole dataset.
        """
        layout = self.layout()
        if layout.file_rows is None:
            return [(0, layout.num_samples)] if layout.num_samples else []
        offsets = layout.offsets
        return [(a, b) for a, b in zip(offsets, offsets[1:]) if b > a]

    def split_array(self) -> np.ndarray:
        """`splits()` as an `(n, 2)` int64 array: what a `dynamic` epoch queues. Sources of
        millions of splits compute it directly (no Python tuple per split)."""
        return pieces.as_pieces(self.splits())

    def read_units(self) -> np.ndarray | None:
        """Where a read starts over, as ranges sorted by start (an `(n, 2)` int64 array
        like `split_array`), or None (the default): each split. Reading consecutive splits
        of one unit in one call costs no more than reading one of them (a file source's
        row group, decoded once): readers join the pieces they read in a row inside one,
        and `dynamic` and `off` order splits by unit (`split_order`)."""
        return None

    def describe(self) -> str:
        """A short human name for messages (a path, a table)."""
        return type(self).__name__

    def for_epoch(self, epoch: int, seed: int) -> Source:
        """The source as read in `epoch` of a loader seeded by `seed`: the same layout,
        schema and splits; only what a sample index reads may change (a `MixedSource`
        draws other samples every epoch). Default: the source itself."""
        return self

    def let_go(self) -> None:
        """Drop what this process keeps decoded for reads to come (a rank's reading of an
        epoch ended: a file source's row groups read in parts). Default: nothing kept."""
        return


class TableSource(Source):
    """An in-memory `pyarrow.Table`, split by row ranges without copying (slices)."""

    def __init__(self, table: pa.Table, columns: Sequence[str] | None = None) -> None:
        from rayshard.errors import ConfigError

        if not isinstance(table, pa.Table):
            raise ConfigError(
                f"TableSource(table=...) got a {type(table).__module__}."
                f"{type(table).__qualname__}; it takes a pyarrow.Table: convert a dict of "
                "columns with pyarrow.table(data), a DataFrame with pyarrow.Table.from_pandas"
            )
        if columns is not None:
            table = _selected(table, columns)
        self._table = table

    def layout(self) -> DataLayout:
        return DataLayout.of_samples(self._table.num_rows)

    def schema(self) -> pa.Schema:
        return self._table.schema

    def read(
        self, start: int, end: int, columns: Sequence[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        num = self._table.num_rows
        if not (0 <= start <= end <= num):  # (as file sources: not a shorter slice)
            raise ValueError(f"rows [{start}, {end}) are outside the table's [0, {num})")
        part = self._table.slice(start, end - start)
        yield from (part if columns is None else _selected(part, columns)).to_batches()

    def splits(self) -> list[tuple[int, int]]:
        return pieces.as_tuples(self._chunk_pieces())

    def split_array(self) -> np.ndarray:
        if type(self).splits is not TableSource.splits:  # a subclass's own splits() rules
            return super().split_array()
        return self._chunk_pieces()

    def _chunk_pieces(self) -> np.ndarray:
        """The table's chunks (of its first column), or the whole table if it has none."""
        if self._table.num_columns:
            column = self._table.column(0)
            lengths = np.fromiter(map(len, column.iterchunks()), np.int64, column.num_chunks)
            chunks = pieces.cut_chunks(lengths, None)
            if len(chunks):
                return chunks
        return pieces.as_pieces(super().splits())

    def describe(self) -> str:
        """Row count and schema: two tables of one row count get two loader ids."""
        return f"in-memory table ({self._table.num_rows} rows; {schema_text(self.schema())})"


def schema_text(schema: pa.Schema) -> str:
    """`name: type` of every column; past 120 characters, the column count and 8 hex
    digits of that text (a short description that still tells schemas apart)."""
    text = ", ".join(f"{field.name}: {field.type}" for field in schema)
    if len(text) <= 120:
        return text
    digest = hashlib.blake2b(text.encode(), digest_size=4).hexdigest()
    return f"{len(schema)} columns, schema {digest}"


def _selected(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """`table`'s `columns`; a `ConfigError` naming those it lacks."""
    from rayshard.errors import ConfigError

    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ConfigError(f"columns {missing} are not in the table; it has {table.column_names}")
    return table.select(list(columns))
