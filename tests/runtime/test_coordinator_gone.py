"""A coordinator gone for good (it died more often than `coordinator_max_restarts`
allows: here 0, and one real kill) is named as such in the training loop, with what to do,
whichever path meets it first: the loop's own reads (`consumer_reads`), a reader actor's
lease calls, or the acknowledgements at a static epoch's end. A hunt saw "reader failed:
ActorDiedError()" and Ray's bare `ActorDiedError` instead."""

from __future__ import annotations

import pytest
import ray

from rayshard.errors import RayshardError
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import unique_name, write_parquet

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_parquet(tmp_path_factory.mktemp("gone"), [400, 400], row_group_size=8)


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "policy, consumer_reads", [("data", None), ("dynamic", None), ("dynamic", False)]
)
def test_a_coordinator_gone_for_good_is_named(ray_session, dataset, policy, consumer_reads):
    loader = Loader(
        ParquetSource(dataset),
        name=unique_name("gone"),
        batch_size=8,
        policy=policy,
        consumer_reads=consumer_reads,
        coordinator_max_restarts=0,
    )
    it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    stream = iter(it)
    next(stream)
    ray.kill(loader._coordinator, no_restart=True)
    with pytest.raises(RayshardError, match=r"coordinator is gone.*coordinator_max_restarts"):
        for _ in range(len(it) + 2):
            next(stream)
    with pytest.raises(RayshardError, match=r"coordinator is gone.*restore the last"):
        it.state_dict()
    loader.shutdown()
