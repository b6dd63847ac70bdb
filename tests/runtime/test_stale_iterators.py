"""An iterator that another iterator of the same loader in this process superseded (a new
generation: another world size; or a newer iterator of its rank) stops at its next batch
with `StaleClientError`, instead of reading on through rows of a plan no longer in force,
rows the newer iterator reads too."""

from __future__ import annotations

import pytest

from rayshard.errors import StaleClientError
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import real_ids, unique_name, write_parquet

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    return write_parquet(tmp_path_factory.mktemp("stale") / "data", [60, 40], row_group_size=10)


# Static policies: any other world size is a new generation. (Under `dynamic` a world that
# grows or shrinks with its old ranks alive stays one generation: a new iterator of a rank
# replaces the old one, which the coordinator refuses at its next lease.)
@pytest.mark.parametrize(("policy", "before", "after"), [("data", 1, 2), ("file", 2, 1)])
def test_an_iterator_of_an_older_generation_stops_at_its_next_batch(
    ray_session, dataset, policy, before, after
):
    loader = Loader(ParquetSource(dataset), name=unique_name("stale"), batch_size=10, policy=policy)
    old = loader.iterator(world_rank=0, world_size=before, batch_format="numpy")
    others = [  # the old world's other ranks, kept alive
        loader.iterator(world_rank=r, world_size=before, batch_format="numpy")
        for r in range(1, before)
    ]
    reading = iter(old)
    first = real_ids([next(reading)])
    assert len(first) == 10 and loader.stats()["generation"] == 1

    new = loader.iterator(world_rank=0, world_size=after, batch_format="numpy")
    assert loader.stats()["generation"] == 2
    with pytest.raises(StaleClientError, match="another iterator .* started generation 2"):
        next(reading)
    with pytest.raises(StaleClientError):  # and again from a new iteration
        next(iter(old))
    received = real_ids(list(new))  # the new world reads on undisturbed
    assert received and len(received) == len(set(received))
    assert set(received) <= set(range(100))
    for it in [new, *others]:
        it.close()
    loader.shutdown()


@pytest.mark.parametrize("policy", ["data", "dynamic"])
def test_an_iterator_whose_rank_a_newer_one_took_over_stops_at_its_next_batch(
    ray_session, dataset, policy
):
    loader = Loader(ParquetSource(dataset), name=unique_name("over"), batch_size=10, policy=policy)
    old = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    reading = iter(old)
    assert len(real_ids([next(reading)])) == 10
    new = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    with pytest.raises(StaleClientError, match="newer iterator of data-parallel rank 0"):
        next(reading)
    received = real_ids(list(new))
    assert len(received) == len(set(received)) and set(received) <= set(range(100))
    new.close()
    loader.shutdown()
