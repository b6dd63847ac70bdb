"""Under `dynamic`, a rank told to wait for the others' leases (its share read, theirs not
yet acknowledged) is woken by the coordinator when the epoch ends or work goes back to the
queue (`Coordinator.await_change`), not after a fixed pause.

Each test sets `lease_poll_s` to an hour: a waiting rank that is not woken does not end its
epoch within the event timeout (nor asks again: a quiet rank's asks are a second apart at
the least, but each wait lasts `lease_poll_s`), so the tests fail on a lost wake-up,
whatever the machine's speed. The order of events is forced by holding one rank's loop
before its last batch (its last lease stays open) until the coordinator holds the other
rank's wait (`stats()["waits_held"]`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter

import pytest
import ray

from rayshard.runtime.epoch_waits import wait_for_change
from tests.runtime.helpers import end_rank_watch, write_parquet
from tests.runtime.test_dynamic import ROWS, Consumer, dynamic_loader
from tests.timeouts import EVENT_TIMEOUT_S, event_timeout_message, wait_until

pytestmark = [pytest.mark.ray]

HOUR_S = 3600.0  # the waiting rank's poll: never reached within the event timeout


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """300 rows in row groups of 10: 30 splits (as `tests/runtime/test_dynamic.py`)."""
    return write_parquet(tmp_path_factory.mktemp("wake"), ROWS, row_group_size=10)


def _two_ranks_one_held(loader):
    """Rank 1 holds before its last batch; rank 0 reads its whole share and waits. Returns
    both consumers once rank 0 received its share and the coordinator holds its wait."""
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    lengths = [len(it) for it in its]
    held = Consumer(its[1], hold_after=lengths[1] - 1)
    waiting = Consumer(its[0])
    held.start()
    assert held.holding.wait(EVENT_TIMEOUT_S), event_timeout_message("rank 1's last-but-one batch")
    # Rank 1's reading, past its share, waits too: rank 0's share is still queued (rows
    # that would come to it if rank 0 died). Then rank 0 reads and waits for rank 1's.
    wait_until(lambda: loader.stats()["waits_held"] == 1, "rank 1's reading's wait held")
    waiting.start()
    wait_until(lambda: waiting.batches == lengths[0], "rank 0's whole share")
    wait_until(lambda: loader.stats()["waits_held"] == 2, "rank 0's wait held")
    assert waiting.is_alive()  # its loop waits for the epoch's end
    return waiting, held


def test_a_waiting_rank_ends_its_epoch_with_the_last_acknowledgement(ray_session, dataset):
    loader = dynamic_loader(dataset, lease_poll_s=HOUR_S)
    waiting, held = _two_ranks_one_held(loader)
    held.go_on.set()  # its last batch: its acknowledgement ends the epoch
    held.join(EVENT_TIMEOUT_S)
    waiting.join(EVENT_TIMEOUT_S)
    assert not waiting.is_alive(), event_timeout_message("the waiting rank's end of epoch")
    assert waiting.error is None and held.error is None
    assert Counter(waiting.ids + held.ids) == Counter(range(300))
    loader.shutdown()


def test_a_waiting_rank_takes_the_work_of_a_rank_lost_meanwhile(ray_session, dataset):
    # Every batch acknowledged on receipt: the lost rank's last batch goes back whole.
    loader = dynamic_loader(dataset, lease_poll_s=HOUR_S, ack_interval_s=0)
    waiting, held = _two_ranks_one_held(loader)
    end_rank_watch(held.iterator)  # as if rank 1's process died before its last batch
    waiting.join(EVENT_TIMEOUT_S)
    assert not waiting.is_alive(), event_timeout_message("the lost rank's work, read by rank 0")
    assert waiting.error is None
    # Rank 0 read what rank 1 had not acknowledged: every sample, none of rank 1's twice.
    assert Counter(waiting.ids + held.ids) == Counter(range(300))
    assert "rank_lost" in [e["event"] for e in loader.stats()["events"]]
    held.go_on.set()
    held.join(EVENT_TIMEOUT_S)
    loader.shutdown()


def _one_rank_and_a_token(dataset):
    """A `dynamic` loader, its one rank's iterator (registered) and a change token, which
    a wait without one gets at once."""
    loader = dynamic_loader(dataset)
    it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    call = loader._coordinator.await_change.remote(it._generation, 0, "", HOUR_S)
    outcome, token = ray.get(call)
    assert outcome == "changed"
    return loader, it, token


def test_the_coordinator_holds_a_bounded_number_of_waits(ray_session, dataset):
    # Over MAX_WAITING, a wait is refused at once (the rank pauses on its side): Ray runs at
    # most 1,000 calls of the async coordinator at a time, and acknowledgements must find
    # room. A change (here a rank leaving) ends every wait held.
    from rayshard.runtime.epoch_waits import MAX_WAITING

    loader, it, token = _one_rank_and_a_token(dataset)
    coordinator, generation = loader._coordinator, it._generation
    held = [
        coordinator.await_change.remote(generation, 0, token, HOUR_S) for _ in range(MAX_WAITING)
    ]
    wait_until(lambda: loader.stats()["waits_held"] == MAX_WAITING, f"{MAX_WAITING} waits held")
    assert ray.get(coordinator.await_change.remote(generation, 0, token, HOUR_S)) == (
        "busy",
        token,
    )
    assert ray.wait(held, num_returns=len(held), timeout=0)[0] == []  # still held
    it.close()  # the rank leaves: a change
    answers = ray.get(held, timeout=EVENT_TIMEOUT_S)
    assert {outcome for outcome, _ in answers} == {"changed"}
    assert all(new_token != token for _, new_token in answers)
    assert loader.stats()["waits_held"] == 0
    loader.shutdown()


def test_a_stopped_rank_leaves_its_wait_at_once(ray_session, dataset):
    # `wait_for_change` in a reading thread: its stop (the next epoch's start, a close)
    # ends the wait at once, hour-long as it is.
    loader, it, token = _one_rank_and_a_token(dataset)
    settings = dataclasses.replace(loader.settings, lease_poll_s=HOUR_S)
    stop, returned = threading.Event(), []
    key = (it._generation, 0)
    thread = threading.Thread(
        target=lambda: returned.append(
            wait_for_change(loader._coordinator, key, token, settings, stop)
        ),
        daemon=True,
    )
    thread.start()
    wait_until(lambda: loader.stats()["waits_held"] == 1, "the rank's wait held")
    stop.set()
    thread.join(EVENT_TIMEOUT_S)
    assert not thread.is_alive(), event_timeout_message("the stopped rank's return")
    assert returned == [""]  # cancelled: no token learned
    # Its held call was cancelled too, but Ray's cancel is best effort (a run here kept
    # it until a change): the place it held is not asserted.
    loader.shutdown()
