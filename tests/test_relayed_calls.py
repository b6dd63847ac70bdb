"""The pure parts of relayed calls, without Ray: a relayed call's coordinator method must
finish without suspending (its journal batch is written before any answer goes out), one
refused call fails alone, and a rank reading's lease ids order its calls."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from rayshard.core import commands as cmd
from rayshard.errors import RayshardError, StaleClientError
from rayshard.runtime.ack_relay import finished_now, record_each
from rayshard.runtime.dynamic_rows import LeaseIds


async def _at_once(value: int) -> int:
    return value * 2


async def _suspends(value: int) -> int:
    await asyncio.sleep(0)
    return value


def test_a_coroutine_that_ends_at_once_gives_its_value_and_one_that_suspends_is_refused():
    assert finished_now(_at_once(4)) == 8
    with pytest.raises(RuntimeError, match="_suspends suspended inside a relayed call"):
        finished_now(_suspends(4))


def test_each_relayed_call_is_answered_in_order_and_a_refused_one_fails_alone():
    def refuse(generation, dp_rank, epoch, count):
        raise StaleClientError(f"generation {generation} is stale")

    methods = {"ack": lambda *args: ("acked", args), "lease": _at_once, "refused": refuse}
    calls = [
        ("lease", (3,), {}),
        ("refused", (1, 0, 2, 5), {}),
        ("ack", (1, 0, 2, 7), {}),
        ("lease", (), {"value": 2}),
    ]
    answers = record_each(methods, calls)
    assert answers[0] == 6 and answers[2] == ("acked", (1, 0, 2, 7)) and answers[3] == 4
    assert isinstance(answers[1], RayshardError)
    assert "'generation': 1, 'dp_rank': 0, 'epoch': 2, 'count': 5} refused" in str(answers[1])
    assert "generation 1 is stale" in str(answers[1])
    # a method that suspends is refused alone too (its journal batch would be unsafe)
    answers = record_each(
        {"lease": _suspends, "ack": _at_once}, [("lease", (1,), {}), ("ack", (1,), {})]
    )
    assert isinstance(answers[0], RayshardError) and "suspended" in str(answers[0])
    assert answers[1] == 2


def test_a_readings_lease_ids_order_its_calls_across_its_streams():
    ids = LeaseIds()
    first, second, third = ids(), ids(), ids()
    assert len({first.rpartition(":")[0], second.rpartition(":")[0]}) == 1
    for older, later in ((first, second), (first, third), (second, third)):
        with pytest.raises(StaleClientError):  # a late call is refused after a later one
            cmd.Lease(0, 0, request=older).check_after(later)
        cmd.Lease(0, 0, request=later).check_after(older)  # the later one goes on
    cmd.Lease(0, 0, request=LeaseIds()()).check_after(third)  # another reading: not ordered


def test_a_copy_of_a_readings_lease_ids_is_a_new_reading():
    """A `RankReading` pickled into its reader actor carries its `LeaseIds`: the copy must
    not reuse the original's ids (the coordinator would answer one with the other's)."""
    ids = LeaseIds()
    ids(), ids()
    copy = pickle.loads(pickle.dumps(ids))
    first = copy()
    assert first.rpartition(":")[0] != ids().rpartition(":")[0]
    assert first.endswith(":0")
