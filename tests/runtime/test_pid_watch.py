"""A rank that reads in a process on the coordinator's node is watched through that
process's pid (`rayshard.runtime.pid_watch`): no `RankWatch` actor is started for it,
its process's death (a real SIGKILL) releases its rank to the others, closing or dropping
its iterator ends the watch, a restarted coordinator watches it again, and a process the
coordinator cannot see gets a `RankWatch` (`tests/runtime/test_process_watch.py`)."""

from __future__ import annotations

import os
import signal
from collections import Counter

import pytest
import ray

from rayshard.loader import Loader
from rayshard.runtime import pid_watch
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import (
    real_ids,
    restart_coordinator,
    unique_name,
    watch_of,
    write_parquet,
)
from tests.timeouts import EVENT_TIMEOUT_S, wait_until

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(not pid_watch.pidfds_work(), reason="no pidfds on this system"),
]

ROWS = [40, 35, 26]  # 101 rows, row groups of 7


def make_loader(path: str, **options) -> Loader:
    return Loader(ParquetSource(path), name=unique_name("pid"), batch_size=8, **options)


def lost_ranks(loader: Loader) -> list[tuple[int, str]]:
    return [
        (e["dp_rank"], e["reason"]) for e in loader.stats()["events"] if e["event"] == "rank_lost"
    ]


def watch_actors(namespace: str) -> set[str]:
    """The `RankWatch` actors in `namespace` (an earlier test's may still be there, unused:
    `process_watch.IDLE_RELEASE_S`)."""
    return {
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == namespace and a["name"].startswith("rayshard-watch-")
    }


def rank_1_dropped_unread(loader: Loader, survivor) -> None:
    """Rank 1's iterator, made here and dropped unread: its rank is lost as at its
    process's death, and rank 0 (`survivor`) reads every row."""
    import gc

    dropped = loader.iterator(world_rank=1, world_size=2, batch_format="numpy")
    del dropped
    gc.collect()
    wait_until(lambda: lost_ranks(loader), "the dropped rank's release")
    assert lost_ranks(loader) == [(1, "reader died")]
    assert Counter(real_ids(survivor)) == Counter(range(101))


@ray.remote(num_cpus=0)
class RankProcess:
    """A consumer process of its own, reading for one rank."""

    def __init__(self, loader: Loader, rank: int, world: int) -> None:
        self.it = loader.iterator(world_rank=rank, world_size=world, batch_format="numpy")
        self.batches = iter(self.it)

    def take(self, count: int) -> dict:
        """`count` batches' real ids, acknowledged; this process's pid and what watches it."""
        ids = real_ids([next(self.batches) for _ in range(count)])
        self.it._acks.flush(wait=True)
        return {"ids": ids, "pid": os.getpid(), "watch": watch_of(self.it)._actor_id.hex()}


def test_ranks_of_the_coordinators_node_are_watched_by_pid_with_no_watch_actor(
    ray_session, tmp_path
):
    loader = make_loader(write_parquet(tmp_path, ROWS))
    before = watch_actors(loader.namespace)
    try:
        its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
        assert all(it._local is not None for it in its)  # each reads in this process
        coordinator = loader._coordinator._actor_id
        assert all(watch_of(it)._actor_id == coordinator for it in its)
        stats = loader.stats()
        assert (stats["readers"], stats["watched_by_pid"]) == (2, 2)
        assert stats["node_watches"] == 0  # this node's processes: the coordinator's own
        assert ray.get(loader._coordinator.shared_watches.remote()) == []
        assert watch_actors(loader.namespace) <= before  # none started
        ids = real_ids(its[0]) + real_ids(its[1])
        assert Counter(ids) == Counter(range(101))
        for it in its:
            it.close()  # leaves, and ends its watch
        wait_until(lambda: loader.stats()["watched_by_pid"] == 0, "the watches' ends")
        assert lost_ranks(loader) == [(0, "left"), (1, "left")]  # not taken for deaths
    finally:
        loader.shutdown()


def test_a_killed_consumer_process_releases_its_rank_to_the_others(ray_session, tmp_path):
    """Rank 1 reads in a process of its own, which is killed (SIGKILL) mid-epoch: the
    coordinator sees the process end through its pidfd and hands rank 1's unacknowledged
    rows to rank 0; every row is received once."""
    loader = make_loader(
        write_parquet(tmp_path, ROWS), policy="dynamic", equal_steps=False, batches_per_object=1
    )
    before = watch_actors(loader.namespace)
    try:
        survivor = loader.iterator(world_rank=0, world_size=2, batch_format="numpy")
        victim = RankProcess.remote(loader, 1, 2)
        taken = ray.get(victim.take.remote(2), timeout=EVENT_TIMEOUT_S)
        assert taken["watch"] == loader._coordinator._actor_id.hex()
        assert loader.stats()["watched_by_pid"] == 2
        assert watch_actors(loader.namespace) <= before  # none started, here or there
        os.kill(taken["pid"], signal.SIGKILL)
        wait_until(lambda: lost_ranks(loader), "the killed process's rank to be lost")
        assert lost_ranks(loader) == [(1, "reader died")]
        ids = real_ids(survivor)
        assert Counter(ids + taken["ids"]) == Counter(range(101))
    finally:
        loader.shutdown()


@pytest.mark.parametrize("by_pid", [True, False])
def test_a_dropped_iterator_ends_its_watch_and_its_rank_goes_to_the_others(
    ray_session, tmp_path, monkeypatch, by_pid
):
    """Its finalizer ends the rank's watch while the process lives on: the coordinator's
    pid watch of it, or (`by_pid=False`, as on another node) its key in the process's
    `RankWatch`."""
    import gc

    monkeypatch.setenv(pid_watch.ENABLE_VARIABLE, "1" if by_pid else "0")
    loader = make_loader(
        write_parquet(tmp_path, ROWS), policy="dynamic", equal_steps=False, batches_per_object=1
    )
    try:
        survivor = loader.iterator(world_rank=0, world_size=2, batch_format="numpy")
        dropped = loader.iterator(world_rank=1, world_size=2, batch_format="numpy")
        assert loader.stats()["watched_by_pid"] == (2 if by_pid else 0)
        taken = real_ids([next(iter(dropped))])
        dropped._acks.flush(wait=True)  # what it received is acknowledged, not requeued
        del dropped
        gc.collect()
        wait_until(lambda: lost_ranks(loader), "the dropped rank's release")
        assert lost_ranks(loader) == [(1, "reader died")]
        assert loader.stats()["watched_by_pid"] == (1 if by_pid else 0)
        ids = real_ids(survivor)
        assert Counter(ids + taken) == Counter(range(101)), "rows of the dropped rank were lost"
    finally:
        loader.shutdown()


def test_a_restarted_coordinator_watches_the_processes_again(ray_session, tmp_path):
    """After a restart the coordinator watches the journal's processes by pid again: rank
    1's process, SIGKILLed after it, is noticed, and rank 0 (this process) reads on."""
    loader = make_loader(
        write_parquet(tmp_path, ROWS), policy="dynamic", equal_steps=False, batches_per_object=1
    )
    try:
        survivor = loader.iterator(world_rank=0, world_size=2, batch_format="numpy")
        reading = iter(survivor)
        first = [next(reading)]
        victim = RankProcess.remote(loader, 1, 2)
        taken = ray.get(victim.take.remote(1), timeout=EVENT_TIMEOUT_S)
        survivor._acks.flush(wait=True)
        restart_coordinator(loader)  # (from its journal: it watches the processes again)
        stats = loader.stats()
        assert stats["watched_by_pid"] == 2 and lost_ranks(loader) == []
        os.kill(taken["pid"], signal.SIGKILL)
        wait_until(lambda: lost_ranks(loader), "the killed process's rank to be lost")
        assert lost_ranks(loader) == [(1, "reader died")]
        ids = real_ids(first) + real_ids(reading)
        assert Counter(ids + taken["ids"]) == Counter(range(101))
    finally:
        loader.shutdown()


@pytest.mark.parametrize("coordinator_elsewhere", [False, True])
def test_a_process_the_coordinator_cannot_see_gets_a_watch_actor(
    ray_session, tmp_path, monkeypatch, coordinator_elsewhere
):
    """A token naming another node (as a process there would send) is refused, nothing
    attached; the iterator then starts its process's `RankWatch`, and reads as before:
    when it is made, or (`coordinator_elsewhere`: a worker on another node than the
    coordinator's does not wait for its attach's answer) once the refusal comes."""
    loader = make_loader(write_parquet(tmp_path, ROWS))
    elsewhere = pid_watch.token_here("b" * 56)
    try:
        attach = loader._coordinator.attach_reader.remote(0, 0, "reader-x", elsewhere)
        assert ray.get(attach) is False
        assert loader.stats()["readers"] == 0
        monkeypatch.setattr(pid_watch, "token_here", lambda node: elsewhere)
        if coordinator_elsewhere:
            loader._coordinator_node = "c" * 56
        it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        wait_until(lambda: it._holds.reader._watch is not None, "the RankWatch, before any read")
        assert sorted(real_ids(it)) == list(range(101))
        assert watch_of(it)._actor_id != loader._coordinator._actor_id
        kind = ray.get(watch_of(it).__ray_call__.remote(lambda self: type(self).__name__))
        assert kind == "RankWatch"
        stats = loader.stats()
        assert (stats["readers"], stats["watched_by_pid"]) == (1, 0)
        it.close()
    finally:
        loader.shutdown()


def test_away_from_the_coordinator_the_first_reads_wait_for_the_attach(ray_session, tmp_path):
    """A worker on another node than the coordinator's does not wait in `iterator()` for
    its attach's answer (its node's `NodeWatch` may be starting); its first reads do. Here
    the workers only look like such (the loader's coordinator node is made another's):
    a rank is watched by its pid all the same, and an iterator dropped before its first
    reads, its attach perhaps still unanswered, releases its rank to the others. (A
    process that ends before its first reads: the next test.)"""
    loader = make_loader(
        write_parquet(tmp_path, ROWS), policy="dynamic", equal_steps=False, batches_per_object=1
    )
    loader._coordinator_node = "c" * 56
    try:
        survivor = loader.iterator(world_rank=0, world_size=2, batch_format="numpy")
        rank_1_dropped_unread(loader, survivor)
        assert watch_of(survivor)._actor_id == loader._coordinator._actor_id
        assert loader.stats()["watched_by_pid"] == 1
        survivor.close()
    finally:
        loader.shutdown()


def test_a_rank_whose_process_ended_before_its_attach_was_answered_is_lost(
    ray_session, tmp_path, monkeypatch
):
    """The attach by pid is not waited for (`process_watch.watch_rank`): a process may end
    before the coordinator answers, and can then never fall back to a `RankWatch`. Its
    token (here: this pid with another start, as once the pid is given again) is watched
    all the same, the watch ends at once, and the rank's work goes to the others."""
    loader = make_loader(
        write_parquet(tmp_path, ROWS), policy="dynamic", equal_steps=False, batches_per_object=1
    )
    try:
        survivor = loader.iterator(world_rank=0, world_size=2, batch_format="numpy")
        watched = pid_watch.parse(pid_watch.token_here(ray.get_runtime_context().get_node_id()))
        ended = f"pid:{watched.node}:{watched.namespace}:{watched.pid}:{watched.start + 1}"
        monkeypatch.setattr(pid_watch, "token_here", lambda node: ended)
        loader._coordinator_node = "c" * 56  # as on another node: the attach not waited for
        gone = loader.iterator(world_rank=1, world_size=2, batch_format="numpy")
        wait_until(lambda: lost_ranks(loader), "the ended process's rank to be lost")
        assert lost_ranks(loader) == [(1, "reader died")]
        assert watch_of(gone)._actor_id == loader._coordinator._actor_id  # attached by pid
        assert Counter(real_ids(survivor)) == Counter(range(101))
        gone.close()
    finally:
        loader.shutdown()


@ray.remote(num_cpus=0)
class RefusedProcess:
    """A consumer process on what looks like another node than the coordinator's, whose
    attach by pid the coordinator refuses (its token names a node that is not there)."""

    def __init__(self, loader: Loader, rank: int, world: int) -> None:
        elsewhere = pid_watch.token_here("b" * 56)
        pid_watch.token_here = lambda node: elsewhere
        loader._coordinator_node = "c" * 56
        self.it = loader.iterator(world_rank=rank, world_size=world, batch_format="numpy")

    def pid(self) -> int:
        return os.getpid()


def test_a_refused_process_that_dies_before_its_first_reads_releases_its_rank(
    ray_session, tmp_path
):
    """The refusal of an attach not waited for makes the process's `RankWatch` as soon as
    it comes, not at the first reads: a process that dies before those (building its
    model, say) still releases its rank, and the others read its share."""
    loader = make_loader(
        write_parquet(tmp_path, ROWS), policy="dynamic", equal_steps=False, batches_per_object=1
    )
    try:
        survivor = loader.iterator(world_rank=0, world_size=2, batch_format="numpy")
        victim = RefusedProcess.remote(loader, 1, 2)
        pid = ray.get(victim.pid.remote(), timeout=EVENT_TIMEOUT_S)
        shared = loader._coordinator.shared_watches
        wait_until(lambda: ray.get(shared.remote()), "the RankWatch's attach, with no read")
        assert loader.stats()["watched_by_pid"] == 1  # the survivor only
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: lost_ranks(loader), "the killed process's rank to be lost")
        assert lost_ranks(loader) == [(1, "reader died")]
        assert Counter(real_ids(survivor)) == Counter(range(101))
    finally:
        loader.shutdown()


def test_a_refused_iterator_dropped_unread_releases_its_rank(ray_session, tmp_path, monkeypatch):
    """An iterator whose attach not waited for is refused, dropped before any read (the
    `RankWatch` made or not yet): its rank is released as at its process's death, and
    the others read its share."""
    loader = make_loader(
        write_parquet(tmp_path, ROWS), policy="dynamic", equal_steps=False, batches_per_object=1
    )
    try:
        survivor = loader.iterator(world_rank=0, world_size=2, batch_format="numpy")
        elsewhere = pid_watch.token_here("b" * 56)
        monkeypatch.setattr(pid_watch, "token_here", lambda node: elsewhere)
        loader._coordinator_node = "c" * 56
        rank_1_dropped_unread(loader, survivor)
    finally:
        loader.shutdown()
