"""Under `dynamic` with equal steps, a rank past its last step ends its epoch only once no
other rank holds unfinished work (README, Dynamic): a loop that has taken a batch of rank
1 (whose reader then holds leased rows) and reads rank 0's whole epoch before reading on
in rank 1 waits at rank 0's end until rank 1 has read what it holds."""

from __future__ import annotations

import math
import threading

import pytest

from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import real_ids, unique_name, write_parquet
from tests.timeouts import EVENT_TIMEOUT_S, event_timeout_message

pytestmark = pytest.mark.ray

SIZES, BATCH = [40, 24], 8


def test_a_rank_past_its_last_step_ends_only_after_what_the_others_hold_was_read(
    ray_session, tmp_path
):
    loader = Loader(
        ParquetSource(write_parquet(str(tmp_path / "d"), SIZES)),
        name=unique_name("endwait"),
        batch_size=BATCH,
        policy="dynamic",
    )
    first, second = (
        loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)
    )
    steps = math.ceil(sum(SIZES) / (2 * BATCH))
    rest = [next(iter(second))]  # rank 1 now holds leased rows
    got: list = []
    stepped, ended = threading.Event(), threading.Event()

    def read_first() -> None:
        for batch in first:
            got.append(batch)
            if len(got) == steps:
                stepped.set()
        ended.set()

    reader = threading.Thread(target=read_first, daemon=True)
    reader.start()
    assert stepped.wait(EVENT_TIMEOUT_S), event_timeout_message("rank 0's last step")
    # Rank 1 holds unfinished work, so rank 0's epoch does not end.
    assert not ended.wait(2.0), "rank 0 ended its epoch while rank 1 held unread rows"
    rest += list(second)
    assert ended.wait(EVENT_TIMEOUT_S), event_timeout_message("rank 0's end of epoch")
    assert len(got) == steps == len(rest)
    assert sorted(real_ids(got) + real_ids(rest)) == list(range(sum(SIZES)))
    first.close()
    second.close()
    loader.shutdown()
