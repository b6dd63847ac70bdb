"""Stragglers in the coordinator's pure core, without Ray: with
`straggler_timeout_s`, any life of a dynamic loader (leases, acknowledgements, ranks that
go silent and come back, deaths, time passing) replays from its journal to the live state
after every prefix; no sample is lost; work held by a rank is leased to another rank only
once that rank was silent for the timeout; late deliveries are counted as duplicates."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rayshard.config.loader_config import LoaderConfig
from rayshard.core import commands as cmd
from rayshard.core.coordination import CoordinatorCore
from rayshard.core.leases import LeaseBook
from rayshard.core.stragglers import late_rows_bound
from rayshard.errors import ConfigError
from rayshard.plan import PlanConfig
from rayshard.plan import intervals as iv
from rayshard.sources import TableSource

ROWS = 120
TIMEOUT = 5.0


def _core(equal_steps: bool, timeout: float | None = TIMEOUT) -> CoordinatorCore:
    table = pa.table({"id": pa.array(range(ROWS), pa.int64())})
    source = TableSource(pa.Table.from_batches(table.to_batches(max_chunksize=20)))
    plan = PlanConfig(batch_size=8, equal_steps=equal_steps)
    settings_ = LoaderConfig(plan=plan, policy="dynamic", straggler_timeout_s=timeout)
    return CoordinatorCore("straggler-test", source, settings_)


def _replayed(command: cmd.Command) -> cmd.Command:
    return cmd.command_from_entry(json.loads(json.dumps(command.to_entry())))


@st.composite
def scripts(draw):
    """Ranks lease (asking with the time), acknowledge part of what they hold, fall silent
    while time passes, die; time moves by small and large steps."""
    equal = draw(st.booleans())
    world = draw(st.integers(2, 3))
    steps = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["lease", "lease", "ack", "lost", "register", "wait"]),
                st.integers(0, world - 1),
                st.integers(1, 3),
                st.sampled_from([0.5, 1.0, 2.0, 6.0, 12.0]),
            ),
            min_size=1,
            max_size=50,
        )
    )
    return equal, world, steps


class Life:
    """Drives a live core and checks, at every lease, when another rank's work moved."""

    def __init__(self, equal: bool, world: int) -> None:
        self.core = _core(equal)
        self.world = world
        self.applied: list[cmd.Command] = []
        self.states: list[dict] = []
        self.held: dict[int, list] = {}  # rank -> pieces leased, not yet acknowledged
        self.progress: dict[int, float] = {}  # rank -> time of its last lease or ack
        self.delivered: list[tuple[int, int]] = []
        self.late: dict[int, list] = {}  # rank -> pieces taken back from it, not delivered
        self.clock = 0.0

    def apply(self, command: cmd.Command):
        decision = self.core.apply(command)
        self.applied.append(command)
        self.states.append(self.core.to_dict())
        return decision

    def step(self, action: str, rank: int, count: int, dt: float) -> None:
        self.clock += dt
        members = self.core.members
        if action == "register" or members is None or rank not in members.ranks:
            self.apply(cmd.Register(rank, self.world, rank, self.world, self.clock))
            self.held.pop(rank, None)  # registering again replaces the rank: its work is back
            self.late.pop(rank, None)
            return
        if action == "lease":
            self.lease(rank, count, finishing=count > 2)
        elif action == "ack":
            store = self.held if self.held.get(rank) else self.late  # late: it woke up
            mine = store.get(rank, [])
            pieces, store[rank] = mine[:count], mine[count:]
            self.apply(cmd.Ack(rank, 0, 1, tuple(pieces), self.clock))
            self.delivered += pieces
            self.progress[rank] = self.clock
        elif action == "lost":
            self.apply(cmd.Lost(rank, "reader died", self.clock))
            self.held.pop(rank, None)
            self.late.pop(rank, None)
            self.progress.pop(rank, None)

    def lease(self, rank: int, count: int, finishing: bool = False) -> cmd.Leased:
        book = self.core.books.get(0)
        done = book.consumed() if book else ()
        others = {
            r: iv.subtract(iv.normalize(p), done)
            for r, p in self.held.items()
            if r != rank and r in self.core.members.ranks
        }
        leased = self.apply(cmd.Lease(rank, 0, count, finishing, self.clock))
        for other, rows in others.items():
            if iv.intersect(iv.normalize(leased.pieces), rows):
                # Another member's unacknowledged rows: only after its silence.
                assert self.clock - self.progress[other] >= TIMEOUT, (other, self.clock)
                assert other in leased.stragglers
        for other in leased.stragglers:
            # Taken back: whatever it delivers now is late.
            self.late.setdefault(other, []).extend(self.held.pop(other, []))
        if leased.pieces:
            self.held.setdefault(rank, []).extend(leased.pieces)
            self.progress[rank] = self.clock
        return leased

    def drain(self) -> None:
        """Every member leases and acknowledges until the epoch is over; silent ranks
        (those holding work) never answer again, so time passes past the timeout."""
        silent = {r for r, p in self.held.items() if p}
        live = [r for r in sorted(self.core.members.ranks) if r not in silent]
        if not live:
            self.apply(cmd.Register(self.world, self.world + 1, self.world, self.world + 1, 0))
            live = [self.world]
        for _ in range(4 * ROWS):
            self.clock += TIMEOUT
            progressed = False
            for rank in live:
                leased = self.lease(rank, 2, finishing=True)
                pieces, self.held[rank] = self.held.get(rank, []), []
                if pieces:
                    self.apply(cmd.Ack(rank, 0, 1, tuple(pieces), self.clock))
                    self.delivered += pieces
                    self.progress[rank] = self.clock
                progressed |= bool(pieces) or not leased.done
            if not progressed:
                return

    def wake(self) -> None:
        """The stragglers wake after the epoch and deliver what they had read."""
        for rank, pieces in sorted(self.late.items()):
            if pieces and rank in self.core.members.ranks:
                self.clock += 1.0
                self.apply(cmd.Ack(rank, 0, 9, tuple(pieces), self.clock))
                self.delivered += pieces
        self.late.clear()


def _run(equal, world, steps) -> Life:
    life = Life(equal, world)
    for step in steps:
        life.step(*step)
    return life


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scripts())
@example((True, 2, [("lease", 0, 1, 1.0), ("lease", 1, 3, 6.0)]))
@example((False, 2, [("lease", 0, 1, 1.0), ("lease", 1, 1, 1.0), ("lease", 1, 3, 6.0)]))
def test_no_sample_lost_and_work_moves_only_after_the_timeout(script):
    life = _run(*script)
    life.drain()
    assert iv.normalize(life.delivered) == ((0, ROWS),), "a sample was lost"
    assert life.core.epoch_complete(0)
    life.wake()
    duplicates = iv.total(life.delivered) - ROWS
    assert life.core.books[0].duplicate_rows == duplicates


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scripts())
def test_replaying_any_journal_prefix_gives_the_live_state(script):
    life = _run(*script)
    life.drain()
    life.wake()
    replayed = _core(script[0])
    for command, expected in zip(life.applied, life.states):
        replayed.apply(_replayed(command))
        assert replayed.to_dict() == expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scripts(), st.data())
def test_snapshot_then_rest_of_journal_gives_the_same_state(script, data):
    life = _run(*script)
    cut = data.draw(st.integers(0, len(life.applied)))
    restarted = _core(script[0])
    if cut:
        restarted.load_dict(json.loads(json.dumps(life.states[cut - 1])))
    for command in life.applied[cut:]:
        restarted.apply(_replayed(command))
    assert restarted.to_dict() == life.core.to_dict()


def test_silent_rank_work_goes_to_an_idle_rank_and_late_delivery_is_counted():
    core = _core(equal_steps=False)
    for rank in (0, 1):
        core.apply(cmd.Register(rank, 2, rank, 2, 0.0))
    slow = core.apply(cmd.Lease(1, 0, 1, time=0.0))
    rest = core.apply(cmd.Lease(0, 0, 20, time=1.0))  # rank 0 reads everything else
    core.apply(cmd.Ack(0, 0, 1, rest.pieces, 1.0))
    assert iv.total(rest.pieces) + iv.total(slow.pieces) == ROWS
    leased = core.apply(cmd.Lease(0, 0, 3, time=TIMEOUT - 0.5))
    assert leased.wait and not leased.stragglers  # rank 1 is not silent long enough yet
    clock = TIMEOUT
    leased = core.apply(cmd.Lease(0, 0, 3, time=clock))
    assert leased.stragglers == (1,) and leased.pieces == slow.pieces
    assert core.held(1, 0) == ()
    core.apply(cmd.Ack(0, 0, 2, leased.pieces, clock))
    assert core.apply(cmd.Lease(0, 0, 3, time=clock)).done  # the epoch ends without rank 1
    assert core.epoch_complete(0)
    core.apply(cmd.Ack(1, 0, 1, slow.pieces, clock + 100))  # rank 1 wakes and delivers
    assert core.books[0].duplicate_rows == iv.total(slow.pieces)
    events = [e for e in core.events if e["event"] == "straggler"]
    assert events == [
        {"time": clock, "event": "straggler", "dp_rank": 1, "reoffered_rows": iv.total(slow.pieces)}
    ]


def test_equal_steps_give_the_stragglers_rows_to_the_others():
    core = _core(equal_steps=True)
    for rank in (0, 1):
        core.apply(cmd.Register(rank, 2, rank, 2, 0.0))
    first = core.apply(cmd.Lease(1, 0, 1, time=0.0)).pieces
    book = core.books[0]
    steps_before = book.steps(0)
    clock, got = 0.0, []
    while True:
        clock += TIMEOUT
        leased = core.apply(cmd.Lease(0, 0, 4, finishing=True, time=clock))
        if leased.done:
            break
        core.apply(cmd.Ack(0, 0, 1, leased.pieces, clock))
        got += leased.pieces
    assert iv.normalize(got) == ((0, ROWS),) and iv.total(got) == ROWS
    assert book.steps(0) > steps_before  # rank 0's capacity grew to take rank 1's rows
    assert first and book.steps(1) == 0  # it kept nothing: its capacity stopped there


def test_a_member_that_never_leased_is_a_straggler_after_others_came_and_went():
    """Every member's clock starts at the epoch's first lease; ranks that joined and left
    before it keep no clock, or a member that never leases (frozen from the start) would
    have none, never be silent, and its share would never go to the others."""
    book = LeaseBook([(i, i + 4) for i in range(0, 40, 4)], [0, 1], 4)
    for rank in (2, 3):
        book.join(rank, 0.0)
    for rank in (2, 3):
        book.release(rank)
    clock = 0.0
    while book.lease(0, clock) is not None:  # rank 0 reads its share; rank 1 is frozen
        clock += 1.0
    assert book.unleased_rows() and book.stragglers(clock + TIMEOUT, TIMEOUT, 0) == [1]


def test_book_round_trip_keeps_the_straggler_state():
    book = LeaseBook([(0, 10), (10, 20)], [0, 1], 4, equal_steps=False)
    book.lease(1, now=1.0)
    book.revoke(1)
    book.ack([(0, 5)], rank=0, now=3.0)
    again = LeaseBook.from_dict(json.loads(json.dumps(book.to_dict())))
    assert again.to_dict() == book.to_dict()
    assert again.snapshot()["stalled"] == [1]


def test_late_rows_bound_follows_the_settings():
    plan = PlanConfig(batch_size=8)
    base = LoaderConfig(plan=plan, policy="dynamic", straggler_timeout_s=2.0)
    assert late_rows_bound(base) == ((2 * 1 + 3) * 4 + 1 + 2) * 8  # defaults: blocks of 4 batches
    deeper = LoaderConfig(plan=plan, policy="dynamic", straggler_timeout_s=2.0, prefetch_depth=9)
    assert late_rows_bound(deeper) == ((2 * 3 + 3) * 4 + 1 + 9) * 8
    # 2 transform workers: 2 calls each in flight and the group being filled, 16 batches each
    workers = LoaderConfig(
        plan=plan, policy="dynamic", straggler_timeout_s=2.0, transform_workers=2
    )
    assert late_rows_bound(workers) == ((2 * 1 + 3) * 4 + 1 + 2 + (2 * 2 + 1) * 16) * 8


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"straggler_timeout_s": 0}, "straggler_timeout_s>0"),
        ({"straggler_timeout_s": float("inf")}, "straggler_timeout_s>0"),
        ({"straggler_timeout_s": 5, "policy": "data"}, "needs policy='dynamic'"),
        ({"straggler_timeout_s": 0.15}, "must exceed twice ack_interval_s=0.1"),
    ],
)
def test_straggler_timeout_is_validated(options, match):
    options = {"policy": "dynamic", **options}
    with pytest.raises(ConfigError, match=match):
        LoaderConfig(plan=PlanConfig(batch_size=8), **options)
    # a string is a ConfigError like every other numeric option's, not a TypeError
    with pytest.raises(ConfigError, match=r"straggler_timeout_s='5' must be a number in the"):
        LoaderConfig(plan=PlanConfig(batch_size=8), policy="dynamic", straggler_timeout_s="5")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scripts(), st.data())
def test_the_count_that_gates_the_completion_check_never_denies_a_complete_epoch(script, data):
    # Every acknowledgement of a `dynamic` epoch's tail asks `epoch_may_be_complete` (a
    # count of acknowledged rows) before the full `epoch_complete`: the count must say yes
    # whenever the epoch is complete, with churn, late duplicates and new registrations,
    # live and on a core rebuilt from a snapshot (which does not carry the count).
    life = _run(*script)
    life.drain()
    life.wake()
    cut = data.draw(st.integers(0, len(life.applied)))
    restarted = _core(script[0])
    if cut:
        restarted.load_dict(json.loads(json.dumps(life.states[cut - 1])))
    for core, commands in ((_core(script[0]), life.applied), (restarted, life.applied[cut:])):
        for command in commands:
            core.apply(_replayed(command))
            if core.members is not None and core.epoch_complete(0):
                assert core.epoch_may_be_complete(0), command
        assert core.epoch_complete(0) and core.epoch_may_be_complete(0)


def test_the_count_stays_short_of_the_epoch_until_its_last_rows_come():
    core = _core(equal_steps=False)
    for rank in range(2):
        core.apply(cmd.Register(rank, 2, rank, 2, 0.0))
    pieces = [p for rank in (0, 1) for p in core.apply(cmd.Lease(rank, 0, 99, False, 1.0)).pieces]
    assert iv.total(pieces) == ROWS
    for k, piece in enumerate(pieces):
        assert not core.epoch_may_be_complete(0)
        core.apply(cmd.Ack(k % 2, 0, k + 1, (piece,), 2.0))
    assert core.epoch_may_be_complete(0) and core.epoch_complete(0)
