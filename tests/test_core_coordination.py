"""The coordinator's pure core without Ray: any sequence of commands, journaled as the actor
journals them, replays to the state the live core had after every prefix; a snapshot
(`to_dict`) taken anywhere, followed by the rest of the journal, gives the same final
state; every lease-book change goes through a command; and the core imports neither Ray
nor torch."""

from __future__ import annotations

import json
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayshard.config.loader_config import LoaderConfig
from rayshard.core import commands as cmd
from rayshard.core.coordination import CoordinatorCore
from rayshard.core.membership import Membership
from rayshard.errors import StaleClientError
from rayshard.plan import PlanConfig
from rayshard.plan import intervals as iv
from rayshard.plan.id_runs import MERGE_FLOOR
from rayshard.sources import TableSource

ROWS = 120


def _source() -> TableSource:
    table = pa.table({"id": pa.array(range(ROWS), pa.int64())})
    return TableSource(pa.Table.from_batches(table.to_batches(max_chunksize=10)))


def _core(policy: str, equal_steps: bool) -> CoordinatorCore:
    plan = PlanConfig(batch_size=8, equal_steps=equal_steps)
    return CoordinatorCore("core-test", _source(), LoaderConfig(plan=plan, policy=policy))


def _journal_round_trip(command: cmd.Command) -> cmd.Command:
    """What replay reads back: the command as a JSON line."""
    return cmd.command_from_entry(json.loads(json.dumps(command.to_entry())))


@st.composite
def scripts(draw):
    """A plausible life of a loader: ranks register, lease, acknowledge what they leased
    (part or all), die, come back; sometimes a restore of an earlier state."""
    policy = draw(st.sampled_from(["dynamic", "data"]))
    equal = draw(st.booleans())
    world = draw(st.integers(1, 3))
    steps = draw(
        st.lists(
            st.tuples(
                st.sampled_from(
                    ["register", "attach", "lease", "ack", "lost", "epoch", "restore", "release"]
                ),
                st.integers(0, world - 1),
                st.integers(1, 4),
                st.integers(0, 1),
            ),
            min_size=1,
            max_size=40,
        )
    )
    return policy, equal, world, steps


def _run(policy, equal, world, steps):
    """Drive a live core; returns (commands applied, state after each, core)."""
    core = _core(policy, equal)
    applied: list[cmd.Command] = []
    states: list[dict] = []
    held: dict[int, list] = {}
    clock = 0.0
    saved = None

    def apply(command):
        decision = core.apply(command)
        applied.append(command)
        states.append(core.to_dict())
        return decision

    for action, rank, count, epoch in steps:
        clock += 1.0
        members = core.members
        registered = members is not None and rank in members.ranks
        if action == "register" or members is None:
            apply(cmd.Register(rank, world, rank, world, clock))
            continue
        if not registered:
            continue
        if core.rank_epoch.get(rank, 0) > epoch:
            continue  # the actor refuses a stale epoch before any command
        if action == "attach" and count == 4:  # a group member's process, watched
            apply(cmd.Attach(rank, f"{members.readers[rank]}|member{epoch}", "pid-m", True))
        elif action == "attach":  # by its reader, or (count > 2) by its process's watch
            watch = f"watch-{count}" if count > 2 else ""
            apply(cmd.Attach(rank, members.readers[rank], watch))
        elif action == "release":  # a member's iterator closed
            apply(cmd.Release(f"{members.readers[rank]}|member{epoch}"))
        elif action == "epoch":  # (with its reading's lease-call floor)
            apply(cmd.StartEpoch(rank, epoch, clock, request=f"r{rank}:{len(applied)}"))
        elif action == "lease" and core.dynamic:
            leased = apply(cmd.Lease(rank, epoch, count, finishing=count > 2))
            held.setdefault(rank, []).extend(leased.pieces)
        elif action == "ack":
            pieces = held.pop(rank, [])[:count]
            if not core.dynamic and core.begun(epoch):
                plan = core.plan(epoch).ranks[rank]
                pieces = list(plan.ranges)[:count]
            apply(cmd.Ack(rank, epoch, count, tuple(tuple(p) for p in pieces)))
            saved = saved or core.state_at(epoch, 0)
        elif action == "lost":
            apply(cmd.Lost(rank, "reader died", clock))
            held.pop(rank, None)
        elif action == "restore" and saved is not None:
            apply(cmd.Restore(saved, clock))
    return applied, states, core


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scripts())
def test_replaying_any_journal_prefix_gives_the_live_state(script):
    applied, states, _ = _run(*script)
    policy, equal, _, _ = script
    replayed = _core(policy, equal)
    for command, expected in zip(applied, states):
        replayed.apply(_journal_round_trip(command))
        assert replayed.to_dict() == expected


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scripts(), st.data())
def test_snapshot_then_rest_of_journal_gives_the_same_state(script, data):
    applied, states, live = _run(*script)
    policy, equal, _, _ = script
    cut = data.draw(st.integers(0, len(applied)))
    restarted = _core(policy, equal)
    if cut:
        restarted.load_dict(json.loads(json.dumps(states[cut - 1])))
    for command in applied[cut:]:
        restarted.apply(_journal_round_trip(command))
    assert restarted.to_dict() == live.to_dict()
    # Queries agree too (plans are a cache, rebuilt from the same facts).
    for rank in restarted.active_ranks():
        for epoch in sorted({0, 1, *restarted.books}):
            assert restarted.length(rank, epoch) == live.length(rank, epoch)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scripts())
def test_lease_books_change_only_through_commands(script):
    """Queries never change a lease book: every change is a journaled command."""
    applied, states, core = _run(*script)
    before = core.to_dict()
    for rank in core.active_ranks():
        for epoch in (0, 1):
            core.length(rank, epoch)
            core.steps(rank, epoch)
            core.settled(epoch, 3)
            core.epoch_complete(epoch)
    assert core.to_dict() == before


def test_dynamic_epoch_leases_each_sample_once_and_lost_work_comes_back():
    core = _core("dynamic", True)
    for rank in (0, 1):
        core.apply(cmd.Register(rank, 2, rank, 2, 0.0))
    core.apply(cmd.StartEpoch(0, 0))
    first = core.apply(cmd.Lease(0, 0, 3))
    second = core.apply(cmd.Lease(1, 0, 3))
    assert first.pieces and second.pieces
    # Each answer says what no rank holds once it was given, and the members sharing it
    # (a reader's pacing asks for at most its share).
    assert second.unleased == ROWS - iv.total(first.pieces) - iv.total(second.pieces)
    assert (first.ranks, second.ranks) == (2, 2)
    lost = core.apply(cmd.Lost(1, "reader died", 1.0))
    assert lost.requeued == second.pieces  # nothing of rank 1 was acknowledged
    got = list(first.pieces)
    while True:
        leased = core.apply(cmd.Lease(0, 0, 5, finishing=True))
        if leased.done:
            break
        got += leased.pieces
        core.apply(cmd.Ack(0, 0, 1, tuple(leased.pieces)))
    core.apply(cmd.Ack(0, 0, 1, first.pieces))
    assert iv.normalize(got) == ((0, ROWS),) and iv.total(got) == ROWS
    assert core.epoch_complete(0)


def test_a_lease_answer_carries_the_step_count_the_rank_pads_to():
    """Under equal steps a rank whose leases ran out pads to the step count of the answer
    that said so (no call of its own); a lost rank's rows raise it in the next answer."""
    core = _core("dynamic", True)
    for rank in (0, 1, 2):
        core.apply(cmd.Register(rank, 3, rank, 3, 0.0))
    core.apply(cmd.StartEpoch(0, 0))
    assert core.apply(cmd.Lease(2, 0, 100)).steps == 5  # 120 rows, 3 ranks, batch 8
    while (leased := core.apply(cmd.Lease(0, 0, 100))).pieces:
        core.apply(cmd.Ack(0, 0, 1, tuple(leased.pieces)))
    assert not leased.wait and leased.steps == core.steps(0, 0) == 5  # its capacity: 40
    asked = cmd.Lease(1, 0, 100, request="reading:0")
    granted = core.apply(asked)
    core.apply(cmd.Lost(2, "reader died", 1.0))  # its 40 rows go back to the queue
    again = core.apply(cmd.Lease(0, 0, 100))
    assert again.pieces and again.steps == core.steps(0, 0) > 5
    # A retried call (Ray's, after a coordinator restart) gets the pieces granted then,
    # with the count as of now; and a snapshot keeps the count of the answer it holds.
    retried = core.apply(asked)
    assert retried.pieces == granted.pieces and retried.steps == core.steps(1, 0) > 5
    restarted = CoordinatorCore("core-test", _source(), core.settings)
    restarted.load_dict(json.loads(json.dumps(core.to_dict())))
    assert restarted.last_lease[1][1].steps == granted.steps == 5
    free = _core("dynamic", False)  # without equal steps a rank reads until the data ends
    free.apply(cmd.Register(0, 1, 0, 1, 0.0))
    free.apply(cmd.StartEpoch(0, 0))
    assert free.apply(cmd.Lease(0, 0, 1)).steps is None


def test_a_paced_ask_is_granted_a_share_of_what_is_unleased_and_no_stragglers_work():
    """A reader asks early, with rows in hand (`share`): it gets at most 1 / (2 x members)
    of the rows no rank holds (a piece at least) whatever its count, and a share ask that
    finds nothing is not given a silent rank's work (the rank is not idle)."""
    plan = PlanConfig(batch_size=8, equal_steps=False)
    settings = LoaderConfig(plan=plan, policy="dynamic", straggler_timeout_s=5.0)
    core = CoordinatorCore("core-test", _source(), settings)
    for rank in (0, 1):
        core.apply(cmd.Register(rank, 2, rank, 2, 0.0))
    core.apply(cmd.StartEpoch(0, 0, 0.0))
    granted = []
    while True:
        before = core.books[0].unleased_rows()
        leased = core.apply(cmd.Lease(0, 0, count=1_000, time=1.0, share=True))
        if not leased.pieces:
            break
        rows = iv.total(leased.pieces)
        assert rows - (leased.pieces[-1][1] - leased.pieces[-1][0]) < -(-before // 4)
        assert leased.unleased == before - rows
        granted.append(rows)
    assert sum(granted) == ROWS and len(granted) > 2  # halving, not all at once
    # Rank 0 now holds everything, silent past the timeout: a share ask of rank 1 gets
    # none of it; an ask with nothing in hand does.
    late = 1.0 + 10.0
    assert core.apply(cmd.Lease(1, 0, count=5, time=late, share=True)).pieces == ()
    offered = core.apply(cmd.Lease(1, 0, count=5, time=late))
    assert offered.pieces and offered.stragglers == (0,)
    # Unpaced asks are granted their count, as before.
    whole = _core("dynamic", False)
    whole.apply(cmd.Register(0, 1, 0, 1, 0.0))
    whole.apply(cmd.StartEpoch(0, 0))
    assert iv.total(whole.apply(cmd.Lease(0, 0, count=1_000)).pieces) == ROWS


def _lease_order(shuffle: bool, seed: int, epoch: int) -> list:
    plan = PlanConfig(batch_size=8, equal_steps=False, seed=seed)
    settings = LoaderConfig(plan=plan, policy="dynamic", shuffle=shuffle)
    core = CoordinatorCore("core-test", _source(), settings)
    core.apply(cmd.Register(0, 1, 0, 1, 0.0))
    core.apply(cmd.StartEpoch(0, epoch))
    got = []
    while not (leased := core.apply(cmd.Lease(0, epoch, 1, finishing=True))).done:
        got += leased.pieces
        core.apply(cmd.Ack(0, epoch, len(got), tuple(leased.pieces)))
    return got


def test_shuffled_leases_cover_each_sample_once_in_a_seeded_order():
    """`shuffle=True` under `dynamic`: the splits are leased in a random order that is the
    same for (seed, epoch) and changes by epoch; every sample once."""
    plain = _lease_order(False, 3, 0)
    orders = {(seed, epoch): _lease_order(True, seed, epoch) for seed in (3, 4) for epoch in (0, 1)}
    for order in orders.values():
        assert iv.normalize(order) == ((0, ROWS),) and iv.total(order) == ROWS
        assert order != plain
    assert orders[3, 0] == _lease_order(True, 3, 0)
    assert len({tuple(order) for order in orders.values()}) == 4


def test_a_retried_lease_call_gets_the_same_answer_across_a_restart():
    """Ray retries a `lease` call in flight when the coordinator restarts. The journal
    already holds the first call's grant; the retry (same request id) must be answered with
    those pieces, not given more while the first ones stay leased to a reader that never
    got them (that left one rank waiting for them forever)."""
    core = _core("dynamic", False)
    core.apply(cmd.Register(0, 1, 0, 1, 0.0))
    core.apply(cmd.StartEpoch(0, 0))
    first = core.apply(cmd.Lease(0, 0, 2, request="reader-a:0"))
    assert first.pieces
    restarted = CoordinatorCore("core-test", _source(), core.settings)
    restarted.load_dict(json.loads(json.dumps(core.to_dict())))  # snapshot, then the retry
    for replica in (core, restarted):
        again = replica.apply(cmd.Lease(0, 0, 2, request="reader-a:0"))
        assert again == first
        nxt = replica.apply(cmd.Lease(0, 0, 2, request="reader-a:1"))
        assert nxt.pieces and not set(nxt.pieces) & set(first.pieces)
    # A snapshot from before answers carried `unleased` and `ranks` loads as not known.
    older = json.loads(json.dumps(core.to_dict()))
    for _rank, _request, leased in older["last_lease"]:
        del leased["unleased"], leased["ranks"]
    restarted.load_dict(older)
    assert restarted.apply(cmd.Lease(0, 0, 2, request="reader-a:1")).unleased == -1
    # Without a request id every call is a new one (older readers and journals).
    assert core.apply(cmd.Lease(0, 0, 1)).pieces != core.apply(cmd.Lease(0, 0, 1)).pieces


def test_a_lease_call_its_rank_went_past_is_refused_and_grants_nothing():
    """A relay that was late (frozen) delivers a lease call its rank had meanwhile sent
    straight and followed with the next one: granting it would lease pieces that no
    reader reads. It is refused, and what the rank holds is its answered calls' pieces."""
    core = _core("dynamic", False)
    core.apply(cmd.Register(0, 1, 0, 1, 0.0))
    core.apply(cmd.StartEpoch(0, 0))
    first = core.apply(cmd.Lease(0, 0, 1, request="stream-a:1"))
    second = core.apply(cmd.Lease(0, 0, 1, request="stream-a:2"))
    held = iv.normalize(core.held(0, 0))
    for late in ("stream-a:0", "stream-a:1"):
        with pytest.raises(StaleClientError, match="came after its later call 'stream-a:2'"):
            core.apply(cmd.Lease(0, 0, 1, request=late))
        assert iv.normalize(core.held(0, 0)) == held
    assert held == iv.normalize([*first.pieces, *second.pieces])
    assert core.apply(cmd.Lease(0, 0, 1, request="stream-a:2")) == second  # a retry
    # Another stream (the rank's next reading), or ids without a number, are not ordered.
    assert core.apply(cmd.Lease(0, 0, 1, request="stream-b:0")).pieces
    assert core.apply(cmd.Lease(0, 0, 1, request="no-number")).pieces


def test_a_lease_call_in_flight_across_a_restart_of_the_epoch_is_refused():
    """`set_epoch` in the middle of a `dynamic` epoch: the stopped stream's next lease call
    may still be on its way (in a relay's forward) when the restart, sent straight,
    arrives. Granted, its rows would be leased to no reader, and the other ranks would wait
    at the epoch's end forever. The restart carries an id of the reading's calls taken
    then: the late call comes before it and is refused. The rank's loop counts its batches
    from the first again, so a state saved after the restart waits for its new acks."""
    core = _core("dynamic", True)
    for rank in (0, 1):
        core.apply(cmd.Register(rank, 2, rank, 2, 0.0))
        core.apply(cmd.StartEpoch(rank, 0, 0.0, request=f"r{rank}:0"))
    first = core.apply(cmd.Lease(0, 0, 1, request="r0:1"))
    core.apply(cmd.Ack(0, 0, 1, first.pieces))
    core.apply(cmd.Ack(1, 0, 1, core.apply(cmd.Lease(1, 0, 1, request="r1:1")).pieces))
    assert core.settled(0, 1)  # each rank's first batch is in
    core.apply(cmd.StartEpoch(0, 0, 1.0, request="r0:3"))  # the restart ("r0:2": in flight)
    assert not core.settled(0, 1)  # rank 0's first batch since the restart is not in
    with pytest.raises(StaleClientError, match="came after its later call 'r0:3'"):
        core.apply(cmd.Lease(0, 0, 1, request="r0:2"))
    assert core.held(0, 0) == ()  # nothing leased to the stream that stopped
    again = core.apply(cmd.Lease(0, 0, 1, request="r0:4"))  # the new stream is served
    assert again.pieces and not iv.intersect(iv.normalize(again.pieces), iv.normalize(first.pieces))


@pytest.mark.parametrize(
    ("request_id", "last", "refused"),
    [
        ("s:1", "s:2", True),
        ("s:9", "s:10", True),  # numbers, not strings, compared
        ("s:2", "s:1", False),
        ("s:1", "t:2", False),
        ("s:1", "", False),
        ("", "s:2", False),
        ("s:x", "s:2", False),
        ("a:b:1", "a:b:2", True),  # the stream is everything before the last ':'
    ],
)
def test_lease_call_order_is_read_from_its_stream_and_number(request_id, last, refused):
    call = cmd.Lease(0, 0, request=request_id)
    if refused:
        with pytest.raises(StaleClientError):
            call.check_after(last)
    else:
        call.check_after(last)


def test_a_rank_read_in_its_consumer_is_watched_by_its_process_watch_until_lost():
    core = _core("dynamic", equal_steps=False)
    for rank in range(2):
        core.apply(cmd.Register(rank, 2, rank, 2, 1.0))
    names = dict(core.members.readers)
    core.apply(cmd.Attach(0, names[0], "watch-a"))  # rank 0 reads in its consumer
    core.apply(cmd.Attach(1, names[1]))  # rank 1 has a reader actor
    core.apply(cmd.Attach(0, names[0], "watch-b"))  # another group member: the first stays
    members = core.members
    assert members.shared_watch(0, names[0]) == "watch-a"
    assert members.shared_watch(1, names[1]) is None  # its reader watches itself
    assert members.shared_watch(0, "an older reader") is None
    saved = json.loads(json.dumps(members.to_dict()))
    assert Membership.from_dict(saved).watches == {0: "watch-a"}
    del saved["watches"]  # a journal written before shared watches
    assert Membership.from_dict(saved).watches == {}
    core.apply(cmd.Lost(0, "reader died", 2.0))
    assert core.members.watches == {}


def test_group_members_watches_are_kept_until_released_or_their_rank_is_lost():
    """A group member's watch is state (a restarted coordinator watches it again): kept
    across a snapshot, gone when the member releases it or its rank is lost."""
    core = _core("dynamic", equal_steps=False)
    for rank in range(2):
        core.apply(cmd.Register(rank, 2, rank, 2, 1.0))
    names = dict(core.members.readers)
    keys = [f"{names[0]}|member0", f"{names[0]}|member1", f"{names[1]}|member2"]
    core.apply(cmd.Attach(0, keys[0], "pid-a", member=True))
    core.apply(cmd.Attach(0, keys[1], "watch-b", member=True))
    core.apply(cmd.Attach(1, keys[2], "pid-c", member=True))
    assert core.members.readers == names  # (a member's key is no reader)
    saved = json.loads(json.dumps(core.members.to_dict()))
    assert Membership.from_dict(saved).member_watches == {
        keys[0]: (0, "pid-a"),
        keys[1]: (0, "watch-b"),
        keys[2]: (1, "pid-c"),
    }
    del saved["member_watches"]  # a journal written before member watches
    assert Membership.from_dict(saved).member_watches == {}
    core.apply(_journal_round_trip(cmd.Release(keys[1])))
    assert core.members.member_watches == {keys[0]: (0, "pid-a"), keys[2]: (1, "pid-c")}
    core.apply(cmd.Lost(0, "model-parallel member 0 died", 2.0))
    assert core.members.member_watches == {keys[2]: (1, "pid-c")}


@pytest.mark.parametrize("policy", ["data", "dynamic"])
def test_a_lost_rank_starts_no_epoch_and_leases_nothing(policy):
    """A rank lost at an epoch's end (a group member died) may not start the next one:
    its reader would read a share no one trains on (under `dynamic`, lease rows that only
    its death watch could give back, which had fired already). Registered again, it may."""
    core = _core(policy, equal_steps=True)
    for rank in range(2):
        core.apply(cmd.Register(rank, 2, rank, 2, 1.0))
    core.check_epoch(1, 0, 0)
    core.apply(cmd.Lost(0, "model-parallel member 1 died", 2.0))
    with pytest.raises(StaleClientError, match="data-parallel rank 0 was lost"):
        core.check_epoch(1, 0, 1)
    core.check_epoch(1, 1, 1)  # (the other rank reads on)
    core.apply(cmd.Register(0, 2, 0, 2, 3.0))
    core.check_epoch(core.members.generation, 0, 1)


def test_group_members_registering_again_share_one_new_reader():
    """World ranks 0 and 1 form data-parallel rank 0. When both register again (new
    iterators, a restarted group), the first replaces the group's reader and the second
    joins that replacement: one new reader, not one each."""
    core = CoordinatorCore(
        "core-test", _source(), LoaderConfig(batch_size=8, model_parallel_size=2)
    )
    first = [core.apply(cmd.Register(w, 4, w // 2, 2, 0.0)).reader for w in range(4)]
    assert first[0] == first[1] != first[2] == first[3]
    again = [core.apply(cmd.Register(w, 4, w // 2, 2, 1.0)).reader for w in range(4)]
    assert again[0] == again[1] != again[2] == again[3]
    assert not set(again) & set(first)
    replaced = [e for e in core.events if e.get("reason") == "replaced"]
    assert len(replaced) == 2  # once per group, not once per member
    saved = json.loads(json.dumps(core.members.to_dict()))
    assert Membership.from_dict(saved).given == core.members.given
    del saved["given"]  # a journal written before this
    assert Membership.from_dict(saved).given == {}


def test_dynamic_registration_from_a_smaller_world_after_the_others_left_shrinks_it():
    core = _core("dynamic", True)
    for rank in range(3):
        core.apply(cmd.Register(rank, 3, rank, 3, 0.0))
    core.apply(cmd.Register(0, 2, 0, 2, 1.0))  # rank 2 still registered: no shrink
    assert core.members.dp_size == 3
    for rank in range(3):
        core.apply(cmd.Lost(rank, "left", 2.0))
    core.apply(cmd.Register(0, 2, 0, 2, 3.0))
    assert core.members.dp_size == 2


def test_dynamic_plans_the_next_epoch_for_a_smaller_world_once_the_larger_ones_last_ranks_died():
    """A group of 2 registers while the old group of 3 is still alive (not closed; its
    deaths are noticed later): the epoch under way keeps 3 shares, and the first epoch
    begun after the old rank 2 died is planned for 2: equal, exact lengths."""
    core = _core("dynamic", True)
    for rank in range(3):
        core.apply(cmd.Register(rank, 3, rank, 3, 0.0))
    core.apply(cmd.StartEpoch(0, 0, 0.5))
    for rank in range(2):
        core.apply(cmd.Register(rank, 2, rank, 2, 1.0))
    core.apply(cmd.StartEpoch(0, 1, 1.5))  # old rank 2 alive: it may still read its share
    assert core.members.dp_size == 3 and core.length(0, 1) == -(-ROWS // (3 * 8))
    core.apply(cmd.Lost(2, "died", 2.0))
    assert core.length(0, 2) == core.length(1, 2) == -(-ROWS // (2 * 8))  # a query agrees
    core.apply(cmd.StartEpoch(0, 2, 3.0))
    assert core.members.dp_size == 2
    assert [core.length(r, 2) for r in range(2)] == [-(-ROWS // (2 * 8))] * 2
    assert core.events[-1] == {"time": 3.0, "event": "world_shrunk", "dp_size": 2, "epoch": 2}
    saved = json.loads(json.dumps(core.members.to_dict()))
    assert Membership.from_dict(saved).sizes == {0: 2, 1: 2}
    del saved["sizes"]  # a journal written before this: no shrink without the sizes
    assert Membership.from_dict(saved).live_size() == 2  # dp_size itself was saved as 2


def test_dynamic_keeps_its_size_while_a_rank_of_the_larger_world_lives():
    """Ranks registering with their own views of the world (a growing group, or the
    experiments' `world_size=rank+1`): the largest living view is the world."""
    core = _core("dynamic", True)
    for rank in range(3):
        core.apply(cmd.Register(rank, rank + 1, rank, rank + 1, 0.0))
    core.apply(cmd.StartEpoch(0, 0, 1.0))
    assert core.members.dp_size == 3
    core.apply(cmd.Lost(1, "died", 2.0))  # a middle rank: 0 and 2 cannot become a world of 2
    core.apply(cmd.StartEpoch(0, 1, 3.0))
    assert core.members.dp_size == 3
    core.apply(cmd.Lost(2, "died", 4.0))  # the last: rank 0 registered for a world of 1
    core.apply(cmd.StartEpoch(0, 2, 5.0))
    assert core.members.dp_size == 1 and core.length(0, 2) == ROWS // 8


def test_finished_epochs_leave_little_behind():
    """Over many epochs the core keeps per epoch what an epoch needs, not its history:
    acknowledged pieces are merged as they accumulate (10,000 pieces an epoch kept 1.6 MB
    per finished epoch), and a book's closed leases leave no emptied table behind."""
    table = pa.table({"id": pa.array(range(400), pa.int64())})
    source = TableSource(pa.Table.from_batches(table.to_batches(max_chunksize=1)))
    core = CoordinatorCore("many-pieces", source, LoaderConfig(batch_size=4, policy="dynamic"))
    for rank in range(2):
        core.apply(cmd.Register(rank, 2, rank, 2))
    for epoch in range(3):
        batches, done = [0, 0], [False, False]
        while not all(done):
            for rank in (r for r in range(2) if not done[r]):
                leased = core.apply(cmd.Lease(rank, epoch, count=1))
                if leased.pieces:
                    batches[rank] += 1
                    core.apply(cmd.Ack(rank, epoch, batches[rank], leased.pieces))
                else:
                    done[rank] = core.apply(cmd.Lease(rank, epoch, finishing=True)).pieces == ()
        assert core.epoch_complete(epoch)
        assert core.all_consumed(epoch) == ((0, 400),)
        assert len(core.consumed[epoch]) <= 64
        assert sys.getsizeof(core.books[epoch]._leases) == sys.getsizeof({})


def test_scattered_acknowledgements_are_merged_as_they_come_and_by_snapshots():
    """A shuffled epoch's acknowledgements (about one interval per sample) are merged as
    they accumulate, and a snapshot leaves them merged: the core does not keep one pair
    per sample, nor merge every earlier epoch again at every snapshot."""
    rows = 4 * MERGE_FLOOR
    table = pa.table({"id": pa.array(range(rows), pa.int64())})
    core = CoordinatorCore(
        "core-test", TableSource(table), LoaderConfig(plan=PlanConfig(batch_size=64))
    )
    order = [(i * 7919) % rows for i in range(rows)]  # every sample once, scattered
    for step, start in enumerate(range(0, rows, 64)):
        ids = tuple((i, i + 1) for i in order[start : start + 64])
        core.apply(_journal_round_trip(cmd.Ack(0, 0, step + 1, ids)))
    assert len(core.consumed[0]) <= rows // 2
    assert core.to_dict()["consumed"] == [[0, [[0, rows]]]]
    assert core.consumed[0].merged() == ((0, rows),) and len(core.consumed[0]) == 1


def test_a_journal_entry_holds_the_ack_s_ids_flat_and_replays_them_as_pairs():
    ids = tuple((i, i + 1) for i in range(0, 2000, 2))
    ack = cmd.Ack(0, 0, 1, ids, 1.0)
    entry = ack.to_entry()
    # one flat list of ints (no list per pair), whether the ids came as pairs or an array
    assert entry["args"]["ids"] == [x for pair in ids for x in pair]
    assert cmd.Ack(0, 0, 1, np.array(ids), 1.0).to_entry() == entry
    assert _journal_round_trip(ack) == ack


@pytest.mark.parametrize("equal_steps", [True, False])
def test_dynamic_a_rank_joining_a_running_loader_starts_at_the_running_epoch(equal_steps):
    """Rank 0 read epochs 0-2 alone; rank 1 joins: it starts where rank 0 is (epoch 3), not
    at epoch 0, whose book has nothing left (it used to walk through finished epochs, one
    empty epoch per `iter()`, while rank 0 read the running one alone)."""
    core = _core("dynamic", equal_steps)
    core.apply(cmd.Register(0, 1, 0, 1, 0.0))
    for epoch in range(3):
        core.apply(cmd.StartEpoch(0, epoch, 0.0))
        batches = 0
        while leased := core.apply(cmd.Lease(0, epoch, count=4)).pieces:
            batches += 1
            core.apply(cmd.Ack(0, epoch, batches, leased))
        assert core.epoch_complete(epoch)
    assert core.apply(cmd.Register(1, 2, 1, 2, 1.0)).epoch == 3
    assert core.apply(cmd.Register(0, 2, 0, 2, 1.0)).epoch == 3  # rank 0's next iterator too


def _read_epoch(core: CoordinatorCore, epoch: int, ranks: int) -> None:
    """Every rank reads `epoch` whole through the core, acknowledging as a reader does."""
    for rank in range(ranks):
        started = core.apply(cmd.StartEpoch(rank, epoch, 0.0))
        if not isinstance(started, int):  # a static plan: its ranges, in one acknowledgement
            core.apply(cmd.Ack(rank, epoch, started.batches, tuple(started.ranges)))
            continue
        batches = 0
        while leased := core.apply(cmd.Lease(rank, epoch, count=2, finishing=True)).pieces:
            batches += 1
            core.apply(cmd.Ack(rank, epoch, batches, leased))


@pytest.mark.parametrize("policy", ["data", "dynamic"])
def test_the_core_keeps_only_the_epochs_in_play_however_many_ran(policy):
    """Compacting at each epoch's end (as the coordinator does) drops the progress of epochs
    two behind every rank: after 40 epochs a snapshot is the size it was after 3 (it grew
    by every epoch's books, counts and consumed samples before), and the loader-wide state
    and a new rank's start are as without it."""
    core = _core(policy, True)
    for rank in range(2):
        core.apply(cmd.Register(rank, 2, rank, 2, 0.0))
    sizes = {}
    for epoch in range(40):
        _read_epoch(core, epoch, 2)
        core.forget_past_epochs()
        sizes[epoch] = len(json.dumps(core.to_dict()))
    assert sizes[39] <= sizes[2] + 64  # a few digits longer, no more
    assert {*core.received, *core.consumed, *core.books, *core.started} <= {38, 39}
    assert core.state_at(39, 1 << 30)["epoch"] == 40  # the last epoch is whole
    assert core.apply(cmd.Register(2, 3, 2, 3, 1.0)).epoch == 40  # a new rank: what runs


def test_a_rank_that_has_not_begun_holds_every_epoch_back_under_static_policies():
    core = _core("data", True)
    for rank in range(2):
        core.apply(cmd.Register(rank, 2, rank, 2, 0.0))
    for epoch in range(5):
        _read_epoch(core, epoch, 1)  # rank 1 has not begun: it will read epoch 0 first
        assert core.forget_past_epochs() == []
    assert core.apply(cmd.StartEpoch(1, 0, 0.0)).batches == core.plan(0).ranks[1].batches


@pytest.mark.parametrize("policy", ["data", "dynamic"])
def test_a_group_regrouped_past_an_epoch_a_lost_rank_left_unfinished_reads_its_rest(policy):
    """Rank 0 took all of its epoch 0 and began epoch 1; rank 1 was acknowledged for 2 of
    its 5 batches (the rest pending in its group) and died. The group re-forms on one rank
    with no state loaded: it resumes epoch 0's rest (rank 0's start of epoch 1 is read
    again), not epoch 1 with epoch 0's last rows lost."""
    source = TableSource(pa.table({"id": np.arange(40)}))
    core = CoordinatorCore("regroup", source, LoaderConfig(batch_size=4, policy=policy))
    for rank in (0, 1):
        core.apply(cmd.Register(rank, 2, rank, 2))
        core.apply(cmd.StartEpoch(rank, 0))
    if policy == "dynamic":  # the rows acknowledged below were leased first
        core.apply(cmd.Lease(0, 0, 40))
    core.apply(cmd.Ack(0, 0, 5, ((0, 20),)))
    core.apply(cmd.Ack(1, 0, 2, ((20, 28),)))
    core.apply(cmd.StartEpoch(0, 1))
    core.apply(cmd.Ack(0, 1, 1, ((0, 4),)))
    core.apply(cmd.Lost(1, "reader died"))
    core.apply(cmd.Register(0, 1, 0, 1))  # a new generation, one rank
    assert core.resume.epoch == 0 and core.resume.consumed == ((0, 28),)
    assert core.start_of(0) == 0
    if policy == "data":
        assert core.plan(0).ranks[0].ranges == ((28, 40),)


def test_a_registration_that_replaces_a_rank_says_what_it_gave_back():
    """A rank registering again (its worker restarted) gives back its unacknowledged rows,
    as a loss does: the decision says how many (`rayshard_reserved_samples` counts them),
    and the reply to the worker leaves that out."""
    core = _core("dynamic", True)
    core.apply(cmd.Register(0, 1, 0, 1, 0.0))
    core.apply(cmd.StartEpoch(0, 0))
    leased = core.apply(cmd.Lease(0, 0, 2))
    again = core.apply(cmd.Register(0, 1, 0, 1, 1.0))
    assert again.requeued_rows == iv.total(leased.pieces) > 0
    assert "requeued_rows" not in again.reply() and again.reply()["generation"] == 1
    assert core.apply(cmd.Register(0, 1, 0, 1, 2.0)).requeued_rows == 0  # nothing held
