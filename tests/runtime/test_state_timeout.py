"""`state_dict()` that waits past `state_timeout_s` for the other ranks names the ranks
short of the batches it asked for, with where each one is: a hunt's restarted group had
its ranks in different epochs while the error said only "call state_dict() at the same
step on every rank", which its loop did."""

from __future__ import annotations

import pytest

from rayshard.errors import RayshardError
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import unique_name, write_parquet

pytestmark = pytest.mark.ray


def test_a_state_that_times_out_names_the_ranks_short_of_it(ray_session, tmp_path):
    path = write_parquet(tmp_path, [64, 64])
    loader = Loader(
        ParquetSource(path), name=unique_name("late"), batch_size=8, state_timeout_s=0.5
    )
    try:
        its = [loader.iterator(world_rank=r, world_size=3, batch_format="numpy") for r in range(3)]
        streams = [iter(it) for it in its[:2]]
        for _ in range(2):
            next(streams[0])
        next(streams[1])
        its[1]._acks.flush(wait=True)  # (its count is then the coordinator's, at any load)
        with pytest.raises(RayshardError) as raised:
            its[0].state_dict()  # rank 1 acknowledged 1 of 2, rank 2 never began
        message = str(raised.value)
        assert "acknowledged 2 batches of epoch 0 within state_timeout_s=0.5" in message
        short = "rank 1: 1 acknowledged, in epoch 0; rank 2: 0 acknowledged, no epoch begun"
        assert short in message
        assert "rank 0" not in message.split("(")[1]
    finally:
        loader.shutdown()
