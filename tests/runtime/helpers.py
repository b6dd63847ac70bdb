"""Shared helpers for the Ray-backed loader tests: real Parquet data and lockstep consumption."""

from __future__ import annotations

import itertools
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

_names = itertools.count()


def unique_name(prefix: str = "t") -> str:
    """A loader name no other test uses (loaders are named actors in one namespace)."""
    return f"{prefix}-{os.getpid()}-{next(_names)}"


def write_parquet(folder, sizes, row_group_size=7) -> str:
    """Files of the given row counts with a global `id` column and a 4-wide feature."""
    os.makedirs(folder, exist_ok=True)
    start = 0
    for index, rows in enumerate(sizes):
        ids = np.arange(start, start + rows, dtype=np.int64)
        table = pa.table(
            {
                "id": ids,
                "x": pa.FixedSizeListArray.from_arrays(
                    pa.array(np.repeat(ids, 4).astype(np.float32)), 4
                ),
            }
        )
        pq.write_table(
            table, os.path.join(folder, f"part-{index:02d}.parquet"), row_group_size=row_group_size
        )
        start += rows
    return str(folder)


def run_lockstep(iterators, steps=None):
    """Consume iterators one batch each in turn (like DDP). Returns per-rank batch lists."""
    gens = [iter(it) for it in iterators]
    out = [[] for _ in iterators]
    for step in itertools.count():
        if steps is not None and step >= steps:
            break
        progressed = False
        for rank, gen in enumerate(gens):
            batch = next(gen, None)
            if batch is not None:
                out[rank].append(batch)
                progressed = True
        if not progressed:
            break
    return out


def real_ids(batches) -> list[int]:
    """Sample ids of the real (not padded) rows of numpy batches."""
    return [int(i) for b in batches for i in b["id"][~b["_padded"]]]


def end_rank_watch(iterator) -> None:
    """End what the coordinator watches for this rank, as its process's death would: kill
    its reader actor, or, for a rank that reads in its consumer, end the rank's key in what
    watches its process, the coordinator (by pid) or its `RankWatch` (killing either would
    end more than this rank)."""
    import ray

    if iterator._holds.watch_key is None:
        ray.kill(iterator._holds.reader, no_restart=True)
    else:
        ray.get(watch_of(iterator).end_watch.remote(iterator._holds.watch_key))


def restart_coordinator(loader) -> None:
    """Kill the loader's coordinator process; Ray restarts it from its journal. Returns
    once the restarted one answered a call (its watches armed again)."""
    import ray

    from tests.timeouts import EVENT_TIMEOUT_S, wait_until

    ray.kill(loader._coordinator, no_restart=False)
    # (`ray.kill` is asynchronous: a call made at once may still reach the old one.)
    wait_until(
        lambda: "coordinator_restarted" in [e["event"] for e in loader.stats()["events"]],
        "the coordinator's restart",
    )
    ray.get(loader._coordinator.ping.remote(), timeout=EVENT_TIMEOUT_S)


def watch_of(iterator):
    """What watches a rank that reads in its consumer, once the coordinator answered its
    attach (`process_watch.watch_rank`): the coordinator, or its process's `RankWatch`."""
    return iterator._holds.reader.settled()


def watches_in_task(loaders) -> tuple[str, list[str]]:
    """In a Ray task: this worker's id, and the actor id of the watch of each of two ranks
    of every loader."""
    its = [
        loader.iterator(world_rank=r, world_size=2, batch_format="numpy")
        for loader in loaders
        for r in range(2)
    ]
    ids = [watch_of(it)._actor_id.hex() for it in its]
    for it in its:
        it.close()
    import ray

    return ray.get_runtime_context().get_worker_id(), ids


def released_watch_in_task(loaders: list, idle_s: float) -> dict:
    """In a Ray task, with watches released after `idle_s` unused: one epoch of the first
    loader's only rank, closed; then the second's, dropped unclosed. After each, the
    watch's end is awaited (looked up by name), and the second loader's iterator is made
    after the first watch ended. Returns the watch names and the ids each epoch read."""
    import gc

    import ray

    from rayshard.runtime import process_watch as watches
    from tests.timeouts import wait_until

    namespace = loaders[0].namespace  # the loaders' own: no other test's watch is there

    def ended(name: str) -> bool:
        try:
            ray.get_actor(name, namespace=namespace)
        except ValueError:
            return True
        return False

    found: dict = {"names": [], "ids": []}
    kept, watches.IDLE_RELEASE_S = watches.IDLE_RELEASE_S, idle_s
    try:  # this worker may run later tests: the idle time is put back
        for number, loader in enumerate(loaders):
            it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
            use = watches._watches[namespace]
            assert watch_of(it)._actor_id == use.handle._actor_id and use.keys == {
                it._holds.watch_key
            }
            watch_name = use.name
            found["ids"].append(sorted(real_ids(it)))
            found["names"].append(watch_name)
            if number == 0:
                it.close()
            else:
                del it
                gc.collect()
            wait_until(lambda n=watch_name: ended(n), f"the unused watch {watch_name} to end")
    finally:
        watches.IDLE_RELEASE_S = kept
    return found


def epoch_and_reading_threads(loader) -> tuple[list[int], int]:
    """In a Ray task: one rank's epoch ids and how many threads read them."""
    it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    ids = real_ids(it)
    threads = it._local._reading.threads  # the rank reads in this task (consumer reads)
    it.close()
    return ids, threads


def epoch_ids_in_task(loader, rank: int, world: int, delay: float) -> tuple[int, list[int]]:
    """One rank's epoch, meant to run as its own Ray task (its reader dies when the task
    returns); returns the epoch it read (a rank that registers once the others received
    the whole running epoch starts with the next one) and the real ids received."""
    iterator = loader.iterator(world_rank=rank, world_size=world, batch_format="numpy")
    epoch, ids = iterator.epoch, []
    for batch in iterator:
        ids += real_ids([batch])
        time.sleep(delay)
    return epoch, ids


class RestartCheck:
    """An actor class (made remote by the test): what the coordinator's restart check
    returns in an actor, and the warnings it and Ray's own property raise."""

    def check(self) -> tuple[bool, list[str], list[str]]:
        import warnings

        import ray

        from rayshard.runtime.journal import actor_was_restarted

        with warnings.catch_warnings(record=True) as ours:
            warnings.simplefilter("always")
            restarted = actor_was_restarted()
        with warnings.catch_warnings(record=True) as rays:
            warnings.simplefilter("always")
            _ = ray.get_runtime_context().was_current_actor_reconstructed
        return restarted, [str(w.message) for w in ours], [str(w.message) for w in rays]


def as_seen(batch) -> list:
    """A batch as comparable values with the type of every column and element."""
    if isinstance(batch, pa.RecordBatch):
        return [str(batch.schema), batch.to_pydict()]
    out = []
    for key, value in sorted(batch.items()):
        kind = type(value).__name__ + str(getattr(value, "dtype", ""))
        rows = value.tolist() if hasattr(value, "tolist") else list(value)
        out.append((key, kind, [(type(v).__name__, v) for v in rows]))
    return out


def arrow_columns_of_next_block(iterator) -> set[str]:
    """The columns a rank's reader actor holds as Arrow arrays in the first batch it reads
    of `iterator.epoch` (the next epoch once the iterator finished one), started on the
    reader as the iterator would start it; the iterator is spent after this."""
    import ray

    reader, generation, epoch = iterator._holds.reader, iterator._generation, iterator.epoch
    ray.get(reader.start.remote(generation, epoch))
    block = ray.get(ray.get(reader.next.remote(generation, epoch, 0)))
    _, batch = block.batches[0]
    return {key for key, value in batch.items() if isinstance(value, pa.Array)}
