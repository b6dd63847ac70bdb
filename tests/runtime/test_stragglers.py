"""A straggler under `dynamic` on a real local Ray: one rank's reader process is
frozen with SIGSTOP mid-epoch; the other ranks finish the epoch with exact coverage while
it is still stopped; after SIGCONT what it delivers late is within the documented bound
and counted as duplicates. The test waits for events only (timeouts from
tests/timeouts.py); `straggler_timeout_s` is a loader setting, not an assertion."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

import pytest
import ray

from rayshard.core.stragglers import late_rows_bound
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import real_ids, unique_name, write_parquet
from tests.timeouts import EVENT_TIMEOUT_S, event_timeout_message

pytestmark = [pytest.mark.ray]

ROWS = [60, 45, 75, 40, 80]  # 300 rows, row groups of 10 -> 30 splits


class Consumer(threading.Thread):
    """One rank's training loop in a thread; with `hold_after=n` it pauses after n batches
    until `go_on` is set, so the freeze lands mid-epoch however slow the machine is."""

    def __init__(self, iterator, hold_after=None):
        super().__init__(daemon=True)
        self.iterator, self.hold_after = iterator, hold_after
        self.ids: list[int] = []
        self.error: BaseException | None = None
        self.holding, self.go_on = threading.Event(), threading.Event()
        self.lock = threading.Lock()

    def run(self):
        try:
            for count, batch in enumerate(self.iterator, 1):
                with self.lock:
                    self.ids += real_ids([batch])
                if count == self.hold_after:
                    self.holding.set()
                    self.go_on.wait(EVENT_TIMEOUT_S)
        except BaseException as error:  # noqa: BLE001 - the test inspects it
            self.error = error

    def received(self) -> list[int]:
        with self.lock:
            return list(self.ids)


@pytest.mark.parametrize("equal_steps", [False, True])
def test_frozen_rank_work_goes_to_the_others_and_its_late_rows_are_bounded(
    ray_session, tmp_path, equal_steps
):
    # With equal steps the others' step counts grow to take the straggler's rows.
    loader = Loader(
        ParquetSource(write_parquet(tmp_path, ROWS, row_group_size=10)),
        name=unique_name("straggler"),
        policy="dynamic",
        batch_size=8,
        equal_steps=equal_steps,
        batches_per_object=1,
        ack_interval_s=0,  # every batch acknowledged on receipt
        straggler_timeout_s=2.0,
        consumer_reads=False,  # the reader actor holds the leases: its process is frozen
    )
    its = [loader.iterator(world_rank=r, world_size=3, batch_format="numpy") for r in range(3)]
    consumers = [Consumer(it, hold_after=1 if r == 1 else None) for r, it in enumerate(its)]
    consumers[1].start()
    assert consumers[1].holding.wait(EVENT_TIMEOUT_S), event_timeout_message("rank 1's batch")
    pid = ray.get(its[1]._holds.reader.__ray_call__.remote(lambda self: os.getpid()))
    os.kill(pid, signal.SIGSTOP)  # rank 1's reader process, holding leases, frozen
    try:
        consumers[1].go_on.set()
        for c in (consumers[0], consumers[2]):
            c.start()
        for c in (consumers[0], consumers[2]):
            c.join(EVENT_TIMEOUT_S)
            assert not c.is_alive(), event_timeout_message("the other ranks' epoch end")
            assert c.error is None, c.error
        # The epoch ended while rank 1 is still stopped: exact coverage by what was
        # delivered (rank 1's rows before the freeze included), nothing beyond the bound.
        stopped = Counter(consumers[0].ids + consumers[2].ids + consumers[1].received())
        assert set(stopped) == set(range(300)), "lost samples"
        assert consumers[1].is_alive()
        stats = loader.stats()
        stragglers = [e for e in stats["events"] if e["event"] == "straggler"]
        assert 1 in [e["dp_rank"] for e in stragglers]
    finally:
        os.kill(pid, signal.SIGCONT)
    consumers[1].join(EVENT_TIMEOUT_S)
    assert not consumers[1].is_alive(), event_timeout_message("rank 1's epoch end")
    assert consumers[1].error is None, consumers[1].error
    seen = Counter(consumers[0].ids + consumers[1].ids + consumers[2].ids)
    assert set(seen) == set(range(300))
    duplicates = sum(n - 1 for n in seen.values())
    assert duplicates <= late_rows_bound(loader.settings)
    # Each loop's epoch end waited until the coordinator recorded its acknowledgements.
    leases = loader.stats()["leases"][0]
    assert leases["duplicate_rows"] == duplicates
    reoffered = sum(e["reoffered_rows"] for e in stragglers)
    bound = late_rows_bound(loader.settings)
    print(f"reoffered {reoffered} rows, {duplicates} delivered twice, bound {bound}")
    loader.shutdown()
