"""Parts of chunks read out of order: where a row range lies in a file source's chunks
(`chunk_parts`, pure, against a row-by-row walk), and a chunk kept decoded for a part
that was started before the part reaching its end was read (`DecodedChunks.expect`,
`Source.will_read`, `iter_rows_parallel`), on real files from pyarrow and polars."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from parquet_fixtures import ids_of, write_dataset
from real_data import write_polars

from rayshard.data.batching import iter_rows_parallel
from rayshard.sources import TableSource
from rayshard.sources._chunk_parts import ChunkPart, chunk_parts
from rayshard.sources._decoded import DecodedChunks
from rayshard.sources.parquet import ParquetSource


def _walk(files: list[list[int]], start: int, end: int) -> list[ChunkPart]:
    """The parts of `[start, end)` found row by row."""
    rows = [
        (f, c, first)
        for f, chunks in enumerate(files)
        for c, (first, n) in enumerate(zip(itertools.accumulate([0, *chunks]), chunks))
        for _ in range(n)
    ]
    offsets = list(itertools.accumulate([0, *map(sum, files)]))
    parts: list[ChunkPart] = []
    for row in range(start, end):
        f, c, first = rows[row]
        chunk_start = offsets[f] + first
        if parts and parts[-1][:2] == (f, c):
            parts[-1] = parts[-1]._replace(hi=row + 1)
        else:
            parts.append(ChunkPart(f, c, chunk_start, row, row + 1, False))
    return [p._replace(last=p.hi == p.chunk_start + files[p.file][p.chunk]) for p in parts]


@given(
    files=st.lists(st.lists(st.integers(0, 6), max_size=4), min_size=1, max_size=4),
    data=st.data(),
)
def test_chunk_parts_are_the_row_by_row_walk(files, data):
    total = sum(map(sum, files))
    start = data.draw(st.integers(0, total))
    end = data.draw(st.integers(start, total))
    offsets = list(itertools.accumulate([0, *map(sum, files)]))
    starts = [list(itertools.accumulate([0, *chunks])) for chunks in files]
    assert list(chunk_parts(offsets, starts.__getitem__, start, end)) == _walk(files, start, end)


def _counting(decoded: list):
    return lambda: decoded.append(1) or "table"


def test_a_last_part_read_first_keeps_the_chunk_for_the_part_expected_before_it():
    cache, decoded = DecodedChunks(2), []
    cache.expect("k")
    cache.expect("k")
    cache.part("k", _counting(decoded), last=True)  # another thread was quicker
    cache.part("k", _counting(decoded), last=False)
    assert decoded == [1]
    assert len(cache) == 0  # let go with the last part expected

    unexpected: list = []  # without `expect` the same order decodes twice
    cache.part("k", _counting(unexpected), last=True)
    cache.part("k", _counting(unexpected), last=False)
    assert unexpected == [1, 1]


def test_expected_parts_never_read_are_forgotten_by_let_go():
    cache, decoded = DecodedChunks(2), []
    cache.expect("k")
    cache.let_go()  # the reading ended (a cancelled epoch): nothing is expected any more
    cache.part("k", _counting(decoded), last=True)
    assert len(cache) == 0
    cache.part("k", _counting(decoded), last=False)
    assert decoded == [1, 1]


@pytest.fixture(params=["pyarrow", "polars"])
def groups_of_16(request, tmp_path):
    """48 rows in one file, three row groups of 16 rows."""
    if request.param == "pyarrow":
        write_dataset(tmp_path, [48], row_group_size=16)
    else:
        write_polars(tmp_path / "part-000.parquet", range(48), row_group_size=16)
    return tmp_path


def test_parts_started_in_order_and_read_in_reverse_decode_each_row_group_once(groups_of_16):
    source = ParquetSource(groups_of_16, columns=["id"], split_rows=8)
    for group in range(3):
        first, second = (group * 16, group * 16 + 8), (group * 16 + 8, group * 16 + 16)
        source.will_read(*first)
        source.will_read(*second)
        assert ids_of(source.read(*second)) == list(range(*second))  # reaches the end
        assert ids_of(source.read(*first)) == list(range(*first))
    assert source.stats()["chunks_read"] == 3
    assert ids_of(source.read(0, 8)) == list(range(8))
    assert source.stats()["chunks_read"] == 4  # each was let go after its last part


class _Heard(TableSource):
    def __init__(self, table: pa.Table) -> None:
        super().__init__(table)
        self.events: list[tuple] = []

    def will_read(self, start, end, columns=None):
        self.events.append(("will_read", start, end))

    def read(self, start, end, columns=None):
        self.events.append(("read", start, end))
        return super().read(start, end, columns)


def test_parallel_reading_announces_each_piece_before_a_thread_reads_it():
    source = _Heard(pa.table({"id": list(range(40))}))
    pieces = [(a, a + 5) for a in range(0, 40, 5)]
    with ThreadPoolExecutor(3) as pool:
        rows = list(iter_rows_parallel(source, pieces, ["id"], pool, 3))
    assert ids_of(rows) == list(range(40))
    announced = [e[1:] for e in source.events if e[0] == "will_read"]
    assert announced == pieces
    for piece in pieces:
        assert source.events.index(("will_read", *piece)) < source.events.index(("read", *piece))
