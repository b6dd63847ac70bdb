"""A transform's string and binary output on its way to the loop (`rayshard.data.wire`),
on a real local Ray over real Parquet: object arrays of only bytes or only str cross the
processes (transform workers -> reader -> consumer) as Arrow and reach the loop exactly as
the transform returned them, as when the consumer runs the transform itself; the bytes
metric counts their values."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import arrow_columns_of_next_block, as_seen, run_lockstep, unique_name
from tests.runtime.transform_fns import text_objects

pytestmark = pytest.mark.ray

SIZES = [23, 17, 30]  # 70 rows, row groups of 7


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wire")
    start = 0
    for number, rows in enumerate(SIZES):
        ids = np.arange(start, start + rows, dtype=np.int64)
        table = pa.table(
            {
                "id": ids,
                "text": pa.array([f"s-{i}" * (i % 3) for i in ids], pa.large_string()),
                "blob": [bytes([i % 256, 255]) * (i % 4) for i in ids],
            }
        )
        pq.write_table(table, os.path.join(folder, f"part-{number}.parquet"), row_group_size=7)
        start += rows
    return str(folder)


def _seen(dataset, **options) -> tuple[list, int, list, set | None]:
    """An epoch's batches under "numpy" as seen, the bytes the coordinator counted for them,
    an epoch's batches under "arrow", and (with a reader actor) the columns the reader's
    blocks hold as Arrow arrays."""
    loader = Loader(
        ParquetSource(dataset),
        name=unique_name("wire"),
        batch_size=8,
        transform=text_objects,
        **options,
    )
    try:
        it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        (batches,) = run_lockstep([it])
        it.state_dict()  # sends its acknowledgements
        counted = loader.stats()["consumers"][0]["bytes"]
        it.close()
        it = loader.iterator(world_rank=0, world_size=1, batch_format="arrow")
        (arrow,) = run_lockstep([it])
        blocks = None if it._local is not None else arrow_columns_of_next_block(it)
        it.close()
        return [as_seen(b) for b in batches], counted, [as_seen(b) for b in arrow], blocks
    finally:
        loader.shutdown()


@pytest.fixture(scope="module")
def in_consumer(ray_session, dataset):
    """The consumer running the transform itself: its output never leaves the process."""
    return _seen(dataset, consumer_reads=True)


def _expected_bytes(batches: list) -> int:
    """Numeric columns' bytes, bytes and str columns' values (UTF-8), other objects 8 a row."""
    total = 0
    for batch in batches:
        for key, kind, rows in batch:
            if key == "listed":
                total += sum(len(v) for _, v in rows)
            elif key in ("text", "blob"):
                total += sum(len(v.encode() if isinstance(v, str) else v) for _, v in rows)
            elif kind == "ndarrayobject":
                total += 8 * len(rows)
            else:
                total += np.asarray([v for _, v in rows]).nbytes
    return total


@pytest.mark.parametrize("where", ["reader", "transform_workers"])
def test_a_transforms_text_output_arrives_as_when_the_consumer_runs_it(
    ray_session, dataset, in_consumer, where
):
    options = {"transform_workers": 2} if where == "transform_workers" else {}
    shipped, counted, arrow, blocks = _seen(dataset, consumer_reads=False, **options)
    mine, counted_mine, arrow_mine, _ = in_consumer
    assert shipped == mine and arrow == arrow_mine
    assert sum(len(b[0][2]) for b in mine) == 70
    first = {key: (kind, rows) for key, kind, rows in mine[0]}
    assert first["text"][0] == "ndarrayobject"
    assert first["text"][1][:2] == [("str", "é"), ("str", "s-1é")]
    assert first["holes"][1][0] == ("NoneType", None) and first["mixed"][1][0] == ("bytes", b"")
    assert counted == counted_mine == _expected_bytes(mine)
    if where == "reader":  # the reader's blocks hold bytes and str output as Arrow
        assert blocks == {"text", "blob"}
