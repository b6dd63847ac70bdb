"""Real Ray: a static rank lost mid-epoch (as its process's death ends its watch) while
the other goes on into the next epoch; that one's `state_dict()` then resumes the lost
rank's unread rest of the epoch, so a restarted group reads every row of it once (with
the survivor's batch of the next epoch read again), instead of a state of the next
epoch that left the rest unread for good."""

from __future__ import annotations

from collections import Counter

import pytest

from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import end_rank_watch, real_ids, run_lockstep, unique_name, write_parquet
from tests.timeouts import wait_until

pytestmark = pytest.mark.ray


@pytest.mark.parametrize("consumer_reads", [True, False])
def test_a_state_after_a_lost_rank_resumes_the_rest_it_left(ray_session, tmp_path, consumer_reads):
    data = write_parquet(tmp_path, [23, 17, 31, 9, 20])  # 100 rows
    loader = Loader(
        ParquetSource(data),
        name=unique_name("lost"),
        batch_size=8,
        ack_interval_s=0,  # each batch acknowledged as it is received
        consumer_reads=consumer_reads,
    )
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    streams = [iter(it) for it in its]
    before = [next(streams[1]), next(streams[1])]
    its[1]._acks.flush(wait=True)  # (its acknowledgements in)
    end_rank_watch(its[1])  # as if its process died
    lost = lambda: [e for e in loader.stats()["events"] if e["event"] == "rank_lost"]  # noqa: E731
    wait_until(lost, "rank 1 counted as lost")
    before += list(streams[0])  # rank 0 ends epoch 0
    next_epoch = next(iter(its[0]))
    state = its[0].state_dict()
    assert state["epoch"] == 0  # the lost rank's rest is still to read
    its[0].close()
    again = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    for it in again:
        it.load_state_dict(state)
    rest = [b for rank in run_lockstep(again) for b in rank]
    assert Counter(real_ids(before + rest)) == Counter(range(100))  # epoch 0, each row once
    assert set(real_ids([next_epoch])) <= set(real_ids(list(again[0])))  # epoch 1 again
    loader.shutdown()
