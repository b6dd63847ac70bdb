"""A model-parallel group's member whose process dies (a real SIGKILL), or whose iterator
is dropped unclosed: the others never wait for it for ever (`rayshard.runtime.member_watch`).
A death loses the rank: the other member's next read past its read-ahead raises an error
naming the member, and under `dynamic` the other ranks read the lost rank's unfinished
rows and end their epoch. A dropped iterator is no loss: the others read on."""

from __future__ import annotations

import gc
import os
import signal
from collections import Counter

import pytest
import ray

from rayshard.errors import RayshardError
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import (
    real_ids,
    restart_coordinator,
    run_lockstep,
    unique_name,
    write_parquet,
)
from tests.timeouts import EVENT_TIMEOUT_S, wait_until

pytestmark = pytest.mark.ray

ROWS = 240


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_parquet(tmp_path_factory.mktemp("members"), [80, 80, 80])


def make_loader(dataset: str, **options) -> Loader:
    options = {"batch_size": 8, "prefetch_depth": 1, "batches_per_object": 1, **options}
    return Loader(ParquetSource(dataset), name=unique_name("member"), **options)


def losses(loader: Loader) -> list[tuple[int, str]]:
    events = loader.stats()["events"]
    return [(e["dp_rank"], e["reason"]) for e in events if e["event"] == "rank_lost"]


@ray.remote(num_cpus=0)
class Member:
    """One member of a model-parallel group, in a process of its own."""

    def __init__(self, loader: Loader, world_rank: int, world_size: int) -> None:
        world = {"world_rank": world_rank, "world_size": world_size}
        self.it = loader.iterator(**world, batch_format="numpy")
        self.batches = iter(self.it)

    def take(self, count: int) -> dict:
        """`count` batches' real ids, acknowledged, and this process's pid."""
        ids = real_ids([next(self.batches) for _ in range(count)])
        self.it._acks.flush(wait=True)
        return {"ids": ids, "pid": os.getpid()}

    def close(self) -> None:
        self.it.close()

    def drop(self) -> None:
        """Drop the iterator unclosed (the process lives on)."""
        del self.it, self.batches
        gc.collect()

    def next_epoch(self) -> dict:
        """The next epoch's real ids, as `take_rest` (a new pass of the iterator)."""
        try:
            self.batches = iter(self.it)
        except RayshardError as error:  # (its start refused)
            return {"ids": [], "error": f"{type(error).__name__}: {error}"}
        return self.take_rest()

    def take_rest(self) -> dict:
        """The rest of the epoch's real ids, and the error that ended it (if any)."""
        ids: list[int] = []
        try:
            for batch in self.batches:
                ids += real_ids([batch])
        except RayshardError as error:
            return {"ids": ids, "error": f"{type(error).__name__}: {error}"}
        return {"ids": ids, "error": None}


def group_reading(loader: Loader, world_size: int, members: list) -> list[dict]:
    """Members 0 and 1 of data-parallel rank 0, each in a process of its own (put in
    `members`), member 0 first: its process makes the group's reader, so it must outlive
    the other. Each takes one batch; returns what `take` answered."""
    taken = []
    for world_rank in range(2):
        members.append(Member.remote(loader, world_rank, world_size))
        taken.append(ray.get(members[-1].take.remote(1), timeout=EVENT_TIMEOUT_S))
    return taken


@pytest.mark.timeout(300)
@pytest.mark.parametrize("policy", ["data", "dynamic"])
def test_a_dead_members_group_gets_an_error_and_the_others_finish(ray_session, dataset, policy):
    """Ranks 0 and 1 (data-parallel rank 0) in processes of their own, 2 and 3 (rank 1)
    here. Member 1 (not the one whose process made the group's reader) is killed: member
    0 raises an error naming it (it waited for ever before), the rank is lost, and under
    `dynamic` rank 1 reads every row rank 0 did not acknowledge, once (it waited at its
    epoch's end for ever before)."""
    loader = make_loader(dataset, model_parallel_size=2, policy=policy)
    first = Member.remote(loader, 0, 4)  # makes the reader: it must outlive the victim
    taken0 = ray.get(first.take.remote(1), timeout=EVENT_TIMEOUT_S)
    victim = Member.remote(loader, 1, 4)
    taken1 = ray.get(victim.take.remote(1), timeout=EVENT_TIMEOUT_S)
    assert taken0["ids"] == taken1["ids"] and taken0["pid"] != taken1["pid"]
    try:
        os.kill(taken1["pid"], signal.SIGKILL)
        rest = first.take_rest.remote()
        others = [loader.iterator(world_rank=r, world_size=4, batch_format="numpy") for r in (2, 3)]
        rank1 = run_lockstep(others)
        rest0 = ray.get(rest, timeout=EVENT_TIMEOUT_S)
        assert rest0["error"].startswith("StaleClientError: ")
        assert "member 1 (world rank)" in rest0["error"]
        assert "restart the whole group" in rest0["error"]
        assert losses(loader) == [(0, "model-parallel member 1 died")]
        assert real_ids(rank1[0]) == real_ids(rank1[1])
        if policy == "dynamic":  # rank 1 reads, once, every row rank 0 did not acknowledge
            ids1 = Counter(real_ids(rank1[0]))
            assert max(ids1.values()) == 1
            assert set(ids1) | set(taken0["ids"] + rest0["ids"]) == set(range(ROWS))
        for it in others:
            it.close()
    finally:
        ray.kill(first, no_restart=True)
        loader.shutdown()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("policy", ["data", "dynamic"])
def test_a_member_killed_at_an_epochs_end_stops_its_group_at_the_next(ray_session, dataset, policy):
    """Both groups read epoch 0 to its end, then member 1 of rank 0 is killed: member 0's
    next epoch raises the error naming it (its reader, stopped after the epoch's end,
    started epoch 1 anew and it waited for ever; under `dynamic` the lost rank leased
    epoch 1's rows too), and rank 1 reads its epoch 1 to its end (under `dynamic` every
    row: the lost rank's share went to it)."""
    loader = make_loader(dataset, model_parallel_size=2, policy=policy)
    members: list = []
    try:
        pids = [taken["pid"] for taken in group_reading(loader, 4, members)]
        rests = [m.take_rest.remote() for m in members]
        others = [loader.iterator(world_rank=r, world_size=4, batch_format="numpy") for r in (2, 3)]
        run_lockstep(others)
        assert [ray.get(r, timeout=EVENT_TIMEOUT_S)["error"] for r in rests] == [None, None]
        os.kill(pids[1], signal.SIGKILL)
        wait_until(lambda: losses(loader), "the killed member's rank to be lost")
        survivor = members[0].next_epoch.remote()
        rank1 = run_lockstep(others)
        rest0 = ray.get(survivor, timeout=EVENT_TIMEOUT_S)
        assert rest0["ids"] == [] and rest0["error"].startswith("StaleClientError: "), rest0
        assert "member 1 (world rank)" in rest0["error"], rest0
        assert losses(loader) == [(0, "model-parallel member 1 died")]
        assert others[0].epoch == 2 and real_ids(rank1[0]) == real_ids(rank1[1])
        rows = Counter(real_ids(rank1[0]))
        missing = set(range(ROWS)) - set(rows) if policy == "dynamic" else set()
        assert max(rows.values()) == 1 and not missing, (rows, missing, loader.stats())
        for it in others:
            it.close()
    finally:
        for member in members:
            ray.kill(member, no_restart=True)
        loader.shutdown()


@pytest.mark.timeout(200)
def test_a_dropped_members_group_reads_on(ray_session, dataset):
    """A member's iterator dropped unclosed while its process lives: the reader keeps no
    block for it and the other member reads the epoch to its end (it waited for ever
    before), also where the dropped member's process made the group's reader (it ended
    with that handle before); no rank is lost. (Each member in a process of its own, as
    in training: with two members in one process Ray may free a block the other's answer
    names.)"""
    loader = make_loader(dataset, model_parallel_size=2)
    members: list = []
    try:
        first = group_reading(loader, 2, members)
        assert first[0]["ids"] == first[1]["ids"]
        assert loader.stats()["watched_by_pid"] == 0  # (counts ranks: members are not)
        ray.get(members[0].drop.remote(), timeout=EVENT_TIMEOUT_S)  # (its handle kept)
        rest = ray.get(members[1].take_rest.remote(), timeout=EVENT_TIMEOUT_S)
        assert rest["error"] is None
        assert Counter(first[1]["ids"] + rest["ids"]) == Counter(range(ROWS))
        assert losses(loader) == [] and loader.stats()["ranks"] == [0]
    finally:
        for member in members:
            ray.kill(member, no_restart=True)
        loader.shutdown()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("closed", [False, True])
def test_a_restarted_coordinator_watches_the_members_again(ray_session, dataset, closed):
    """The coordinator restarted from its journal watches the group members that still
    read: member 1, SIGKILLed after the restart, loses the rank and member 0 raises the
    error naming it (it waited for ever before). A member that closed before the restart
    (`closed`) is not watched again: its process's end is no loss, and member 0 reads the
    epoch to its end."""
    loader = make_loader(dataset, model_parallel_size=2)
    members: list = []
    try:
        first = group_reading(loader, 2, members)
        if closed:
            ray.get(members[1].close.remote(), timeout=EVENT_TIMEOUT_S)
        restart_coordinator(loader)
        assert loader.stats()["members_watched"] == (1 if closed else 2)
        os.kill(first[1]["pid"], signal.SIGKILL)
        rest = ray.get(members[0].take_rest.remote(), timeout=EVENT_TIMEOUT_S)
        if closed:
            assert rest["error"] is None and losses(loader) == []
            assert Counter(first[0]["ids"] + rest["ids"]) == Counter(range(ROWS))
        else:
            assert "member 1 (world rank)" in rest["error"]
            assert losses(loader) == [(0, "model-parallel member 1 died")]
    finally:
        for member in members:
            ray.kill(member, no_restart=True)
        loader.shutdown()


def test_a_groups_reader_ends_with_its_last_member_with_the_coordinator_gone(ray_session, dataset):
    """The coordinator gone for good, then both members close: the reader the group's
    processes keep alive for each other (`member_watch.keep_reader`) is stopped all the
    same, and ends (it lived on, holding its process and blocks, when the last member's
    leave failed first)."""
    loader = make_loader(dataset, model_parallel_size=2, coordinator_max_restarts=0)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    name, namespace = its[0]._holds.reader_name, loader.namespace
    ray.kill(loader._coordinator, no_restart=True)
    for it in its:
        it.close()
    del its, it
    gc.collect()

    def reader_gone() -> bool:
        try:
            ray.get_actor(name, namespace=namespace)
        except ValueError:
            return True
        return False

    wait_until(reader_gone, "the group's reader's end")
    loader.shutdown()
