"""The coordinator's per-rank totals for `loader.stats()` (pure: no Ray)."""

from __future__ import annotations

from rayshard.core import commands as cmd
from rayshard.runtime import rank_usage
from rayshard.runtime.rank_usage import RankUsage


def test_lease_calls_count_answers_rows_paced_asks_and_reported_waits():
    usage = RankUsage()
    usage.leased(1, cmd.Leased(pieces=((0, 10), (30, 35))), paced=False, waited_s=0.5)
    usage.leased(1, cmd.Leased(pieces=((10, 20),)), paced=True, waited_s=0.25)
    usage.leased(1, cmd.Leased(wait=True), paced=False, waited_s=0.0)  # no work yet
    usage.leased(0, cmd.Leased(), paced=False, waited_s=-1.0)  # done; a clock step back
    usage.leased(0, cmd.Noted(), paced=False, waited_s=3.0)  # not an answer to a lease
    leases = usage.summary()["lease_calls"]
    assert list(leases) == [0, 1]
    assert leases[1] == {"calls": 3, "paced": 1, "rows": 25, "waited_s": 0.75}
    assert leases[0] == {"calls": 1, "paced": 0, "rows": 0, "waited_s": 0.0}


def test_consumer_totals_add_up_and_the_summary_is_a_copy():
    usage = RankUsage()
    usage.acked(2, {"batches": 3, "samples": 24, "bytes": 192, "stall_s": 0.5})
    usage.acked(2, {"batches": 1, "samples": 8, "bytes": 64, "stall_s": 0.25})
    usage.acked(0, None)  # an acknowledgement without usage: the rank is listed, at zero
    summary = usage.summary()
    assert summary["consumers"] == {
        0: {"batches": 0, "samples": 0, "bytes": 0, "stall_s": 0.0},
        2: {"batches": 4, "samples": 32, "bytes": 256, "stall_s": 0.75},
    }
    summary["consumers"][2]["batches"] = 99
    assert usage.summary()["consumers"][2]["batches"] == 4
    assert summary["lease_calls"] == {}


def test_a_numbered_group_is_counted_once_in_any_order_and_gaps_are_bounded():
    usage = RankUsage()
    one = {"batches": 1, "samples": 8, "bytes": 64, "stall_s": 0.5}
    for number in (0, 2, 1, 2, 0):  # sent straight past a relay, which forwards it later
        usage.acked(0, {**one, "group": f"sender-a:{number}"})
    usage.acked(0, {**one, "group": "sender-b:0"})  # another consumer numbers from 0 too
    usage.acked(0, one)  # not numbered: counted
    totals = usage.summary()["consumers"][0]
    assert totals == {"batches": 5, "samples": 40, "bytes": 320, "stall_s": 2.5}
    # group 3 never comes (its call failed): past GROUPS_HELD later ones, the gap is closed
    later = range(4, 4 + rank_usage.GROUPS_HELD + 1)
    for number in later:
        usage.acked(0, {"batches": 1, "group": f"sender-a:{number}"})
    assert usage.summary()["consumers"][0]["batches"] == 5 + len(later)
    numbers = usage._counted[0]["sender-a"]
    assert (numbers.low, numbers.above) == (later[-1] + 1, set())


def test_a_rank_keeps_the_numbers_of_its_latest_senders_only():
    """An iterator per epoch is a sender per epoch: the numbers kept stay bounded, and a
    repeat from one of the latest senders is still not counted."""
    usage = RankUsage()
    senders = [f"epoch-{e}" for e in range(100)]
    for sender in senders:
        usage.acked(3, {"batches": 1, "group": f"{sender}:0"})
    assert list(usage._counted[3]) == senders[-rank_usage.SENDERS_HELD :]
    usage.acked(3, {"batches": 1, "group": f"{senders[-1]}:0"})  # (sent again)
    assert usage.summary()["consumers"][3]["batches"] == len(senders)
    # A group's members send all along: each one heard from lately keeps its numbers.
    members = [f"member-{m}" for m in range(rank_usage.SENDERS_HELD)]
    for number in range(3):
        for member in members:
            usage.acked(4, {"batches": 1, "group": f"{member}:{number}"})
    usage.acked(4, {"batches": 1, "group": f"{members[0]}:2"})  # (sent again)
    assert usage.summary()["consumers"][4]["batches"] == 3 * len(members)
