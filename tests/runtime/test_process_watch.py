"""One `RankWatch` per process (`rayshard.runtime.process_watch`): every rank a process
reads for in its consumer, of any loader, is watched by that process's one watch actor
under its own key; closing or dropping an iterator releases its key (a dropped one
releases its rank to the others), and a rank's end is noticed without ending the others'.

That is how a process the coordinator cannot watch by its pid (on another node) is
watched: here, on one node, `RAYSHARD_WATCH_BY_PID=0` makes every process do so (the pid
watch: `tests/runtime/test_pid_watch.py`)."""

from __future__ import annotations

import gc

import pytest
import ray

from rayshard.loader import Loader
from rayshard.runtime import pid_watch
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import (
    real_ids,
    released_watch_in_task,
    unique_name,
    watch_of,
    watches_in_task,
    write_parquet,
)
from tests.timeouts import wait_until

ROWS = [40, 35, 26]  # 101 rows, row groups of 7

pytestmark = pytest.mark.ray
NO_PID_WATCH = {"env_vars": {pid_watch.ENABLE_VARIABLE: "0"}}  # for tasks' processes


@pytest.fixture(autouse=True)
def watch_actors_only(monkeypatch):
    """Iterators made in this process are watched through its `RankWatch`."""
    monkeypatch.setenv(pid_watch.ENABLE_VARIABLE, "0")


def make_loader(path: str, **options) -> Loader:
    return Loader(ParquetSource(path), name=unique_name("watch"), batch_size=8, **options)


def watched_keys(watch) -> list[str]:
    """The keys a watch (`watch_of` an open iterator) watches now."""
    return ray.get(watch.keys.remote())


def wait_for_lost_ranks(loader: Loader, count: int) -> list[dict]:
    """The loader's `rank_lost` events once there are `count` of them."""

    def lost() -> list[dict]:
        found = [e for e in loader.stats()["events"] if e["event"] == "rank_lost"]
        return found if len(found) >= count else []

    return wait_until(lost, f"{count} lost rank(s)")


def test_ranks_and_loaders_of_one_process_share_its_watch(ray_session, tmp_path):
    path = write_parquet(tmp_path, ROWS)
    loaders = [make_loader(path), make_loader(path)]
    try:
        its = [
            loader.iterator(world_rank=r, world_size=2, batch_format="numpy")
            for loader in loaders
            for r in range(2)
        ]
        assert all(it._local is not None for it in its)  # each reads in this process
        assert len({watch_of(it)._actor_id for it in its}) == 1
        keys = [it._holds.watch_key for it in its]
        assert len(set(keys)) == 4
        watch = watch_of(its[0])  # closing an iterator drops its handle to the watch
        wait_until(lambda: set(keys) <= set(watched_keys(watch)), "the coordinators' watches")
        assert all(loader.stats()["readers"] == 2 for loader in loaders)
        # Another process's ranks (of two other loaders) have that process's own watch.
        others = [make_loader(path), make_loader(path)]
        loaders += others
        task = ray.remote(num_cpus=0, runtime_env=NO_PID_WATCH)(watches_in_task)
        worker, ids = ray.get(task.remote(others))
        assert worker != ray.get_runtime_context().get_worker_id()
        assert len(set(ids)) == 1 and ids[0] != watch_of(its[0])._actor_id.hex()
        for it in its:
            it.close()
        wait_until(lambda: not set(keys) & set(watched_keys(watch)), "`close()`'s releases")
        for loader in loaders[:2]:  # released by leaving, not taken for a death
            events = loader.stats()["events"]
            assert [e["reason"] for e in events if e["event"] == "rank_lost"] == ["left"] * 2
    finally:
        for loader in loaders:
            loader.shutdown()


def test_one_ranks_end_releases_only_that_rank(ray_session, tmp_path):
    loader = make_loader(write_parquet(tmp_path, ROWS), policy="dynamic", equal_steps=False)
    try:
        its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
        ray.get(
            watch_of(its[1]).end_watch.remote(its[1]._holds.watch_key)
        )  # as if rank 1's process died
        (lost,) = wait_for_lost_ranks(loader, 1)
        assert (lost["dp_rank"], lost["reason"]) == (1, "reader died")
        wait_until(
            lambda: its[0]._holds.watch_key in watched_keys(watch_of(its[0])), "rank 0's watch"
        )
        assert sorted(real_ids(its[0])) == list(range(101))  # rank 0 reads on, alone
        assert len(wait_for_lost_ranks(loader, 1)) == 1
    finally:
        loader.shutdown()


def test_an_earlier_loaders_iterator_dropped_late_leaves_a_new_loader_of_its_name_alone(
    ray_session, tmp_path
):
    """A loader shut down and made again under the same name and configuration (same loader
    id, e.g. a resume in the same process) gets readers of its own names: the earlier
    loader's iterator, garbage-collected later, released the same key in this process's
    watch, and the new loader lost its rank (a `KeyError` at its next lease)."""
    path = write_parquet(tmp_path, ROWS)
    name = unique_name("again")
    first = Loader(ParquetSource(path), name=name, batch_size=8, policy="dynamic")
    old = first.iterator(world_rank=0, world_size=1, batch_format="numpy")
    next(iter(old))
    first.shutdown()
    second = Loader(ParquetSource(path), name=name, batch_size=8, policy="dynamic")
    try:
        assert second.loader_id == first.loader_id
        new = second.iterator(world_rank=0, world_size=1, batch_format="numpy")
        assert new._holds.watch_key != old._holds.watch_key
        del old
        gc.collect()  # its finalizer releases its key in the shared watch
        watched_keys(watch_of(new))  # answered after that release (one caller: in order)
        assert sorted(real_ids(new)) == list(range(101))
        assert second.stats()["ranks"] == [0]
        assert not [e for e in second.stats()["events"] if e["event"] == "rank_lost"]
    finally:
        second.shutdown()


def test_an_unused_watch_ends_and_a_later_iterator_gets_a_new_one(ray_session, tmp_path):
    """A process that no longer reads for any rank (its iterators closed or dropped) lets
    its watch go after `IDLE_RELEASE_S`: Ray ends the actor, and the process (a task
    worker that owns no actor) can be reclaimed. A later iterator in the same process gets
    a watch of its own, and its rank is watched and read as before."""
    path = write_parquet(tmp_path, ROWS)
    namespace = unique_name("released")
    loaders = [
        make_loader(path, policy="dynamic", namespace=namespace),
        make_loader(path, namespace=namespace),
    ]
    try:
        task = ray.remote(num_cpus=0, runtime_env=NO_PID_WATCH)(released_watch_in_task)
        found = ray.get(task.remote(loaders, 0.2))
        first, second = found["names"]
        assert first != second and first.rsplit("-", 1)[0] == second.rsplit("-", 1)[0]
        assert found["ids"] == [list(range(101))] * 2
        for loader, reason in zip(loaders, ("left", "reader died")):
            (lost,) = wait_for_lost_ranks(loader, 1)  # the drop's comes from the watch's end
            assert lost["reason"] == reason, lost  # one loss: at the close, or the drop
    finally:
        for loader in loaders:
            loader.shutdown()
