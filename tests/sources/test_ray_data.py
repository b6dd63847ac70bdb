"""A ray.data.Dataset as a source, on the shared local Ray."""

from __future__ import annotations

import pytest
from parquet_fixtures import ids_of

from rayshard.core.sharding import assign
from rayshard.errors import ConfigError
from rayshard.plan import PlanConfig
from rayshard.sources.ray_data import RayDataSource

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def source(ray_session):
    ds = ray_session.data.range(300, override_num_blocks=7).map_batches(
        lambda b: {"id": b["id"], "double": b["id"] * 2}
    )
    return RayDataSource(ds).materialize()


def test_blocks_are_the_splits_and_reads_are_exact(source):
    splits = source.splits()
    assert len(splits) >= 2 and splits[0][0] == 0 and splits[-1][1] == 300
    assert all(b1 == a2 for (_, b1), (a2, _) in zip(splits, splits[1:]))
    assert source.layout().num_samples == 300
    assert source.schema().names == ["id", "double"]
    for start, end in [(0, 300), (5, 6), (40, 250), (299, 300), (10, 10)]:
        assert ids_of(source.read(start, end)) == list(range(start, end))
    only = list(source.read(3, 9, columns=["double"]))
    assert [v for b in only for v in b.column("double").to_pylist()] == [6, 8, 10, 12, 14, 16]


def test_policies_cover_the_dataset(source):
    for world in (1, 2, 3, 5):
        got = assign("data", PlanConfig(), source, world, 0)
        seen = [
            i for r in range(world) for a, b in got.ranges(r) for i in ids_of(source.read(a, b))
        ]
        assert sorted(seen) == list(range(300))
        queue = assign("dynamic", PlanConfig(), source, world, 1).splits
        assert sorted(i for a, b in queue for i in ids_of(source.read(a, b))) == list(range(300))


def test_source_travels_to_a_remote_task(ray_session, source):
    @ray_session.remote
    def read(src, start, end):
        # (no test helpers here: the worker cannot import them)
        return [v for b in src.read(start, end, columns=["id"]) for v in b.column(0).to_pylist()]

    assert ray_session.get(read.remote(source, 100, 220)) == list(range(100, 220))


def test_lazy_materialization_and_projection(ray_session):
    items = [{"id": i, "value": i * 0.5, "label": f"s{i}"} for i in range(35)]
    ds = ray_session.data.from_items(items, override_num_blocks=4)
    lazy = RayDataSource(ds, columns=["id", "label"])
    assert "not materialized" in lazy.describe()
    assert lazy.schema().names == ["id", "label"]  # materializes now
    assert sorted(ids_of(lazy.read(0, 35))) == list(range(35))
    assert ids_of(lazy.read(0, 35)) == ids_of(lazy.read(0, 35))


def test_errors(ray_session):
    with pytest.raises(ConfigError, match="needs a ray.data.Dataset"):
        RayDataSource([1, 2, 3])
    empty = ray_session.data.range(10).limit(0)
    with pytest.raises(ConfigError, match="has no rows"):
        RayDataSource(empty).layout()
    with pytest.raises(ConfigError, match="available columns are"):
        RayDataSource(ray_session.data.range(5), columns=["nope"]).layout()
