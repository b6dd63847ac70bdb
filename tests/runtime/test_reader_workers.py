"""`reader_workers=k` on a real local Ray over real Parquet: reading and transforming run in
k worker processes per rank, the batches (order included) are those of one reader, and a
worker killed with SIGKILL mid-epoch loses and repeats nothing."""

from __future__ import annotations

import os
import signal
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from rayshard.data.packing import Packing
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import run_lockstep, unique_name
from tests.runtime.reading_fns import READ_PID, READ_THREAD, PidStampedSource, slow_stamped

pytestmark = pytest.mark.ray

SIZES = [23, 17, 31, 9, 20]  # 100 rows, uneven files, row groups of 7
N = sum(SIZES)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reader-workers")
    start = 0
    for number, rows in enumerate(SIZES):
        ids = np.arange(start, start + rows, dtype=np.int64)
        tokens = [list(range(1000 * i, 1000 * i + i % 11)) for i in ids]
        table = pa.table({"id": ids, "tokens": pa.array(tokens, pa.list_(pa.int32()))})
        pq.write_table(table, os.path.join(folder, f"part-{number}.parquet"), row_group_size=7)
        start += rows
    return str(folder)


def make_loader(source, **options):
    return Loader(source, name=unique_name("rw"), **{"batch_size": 4, "seed": 11, **options})


def iterators(loader, world=2):
    return [
        loader.iterator(world_rank=r, world_size=world, batch_format="numpy") for r in range(world)
    ]


def as_tuples(rank_batches, *columns):
    return [[tuple(b[c].tolist() for c in columns) for b in batches] for batches in rank_batches]


def real_ids(rank_batches) -> Counter:
    return Counter(
        int(i) for batches in rank_batches for b in batches for i in b["_index"][~b["_padded"]]
    )


def actor_pids(loader) -> tuple[list[int], list[int]]:
    """(reader pids, worker pids) of every rank of `loader`."""
    readers, workers = [], []
    for name in ray.get(loader._coordinator.reader_names.remote()):
        reader = ray.get_actor(name, namespace=loader.namespace)
        readers.append(ray.get(reader.__ray_call__.remote(lambda self: os.getpid())))
        handles = ray.get(reader.__ray_call__.remote(lambda self: self._workers or []))
        workers += ray.get([w.__ray_call__.remote(lambda self: os.getpid()) for w in handles])
    return readers, workers


def test_reader_workers_read_in_order_and_survive_a_worker_death(ray_session, dataset):
    options = {"transform": slow_stamped, "shuffle": True, "batches_per_object": 1}
    columns = ("_index", "_padded", "noise")
    # One rank: 100 rows, 17 pieces, more than its reader holds ahead at the kill. The
    # reference batches are one process's: the consumer's (a reader's, `test_consumer_reads`).
    single = make_loader(PidStampedSource(dataset), consumer_reads=True, **options)
    expected = as_tuples(run_lockstep(iterators(single, world=1)), *columns)
    single.shutdown()

    source = PidStampedSource(dataset, delay_s=0.05)  # reads still in flight at the kill
    loader = make_loader(source, reader_workers=2, **options)
    its = iterators(loader, world=1)
    first = run_lockstep(its, steps=2)
    readers, workers = actor_pids(loader)
    assert len(set(workers)) == 2  # each worker its own process
    os.kill(workers[0], signal.SIGKILL)  # a real process death mid-epoch
    rest = run_lockstep(its)
    got = [a + b for a, b in zip(first, rest)]
    assert as_tuples(got, *columns) == expected  # same batches, same order, same noise
    assert real_ids(got) == Counter(range(N))  # every sample once: nothing lost or repeated
    real = [b for batches in got for b in batches]
    read_by = {int(p) for b in real for p in b[READ_PID][~b["_padded"]]}
    done_by = {int(p) for b in real for p in b["pid"]}
    assert not (read_by | done_by) & set(readers)  # read and transformed in the workers
    assert read_by - set(workers), "a restarted worker process read the rest"
    assert done_by - set(workers), "a restarted worker process transformed the rest"
    assert loader.stats()["reserved_samples"] == 0
    loader.shutdown()


def test_reader_workers_without_a_transform_under_dynamic_read_in_threads(ray_session, dataset):
    source = PidStampedSource(dataset, delay_s=0.05)  # a lease's pieces overlap in a worker
    loader = make_loader(source, policy="dynamic", reader_workers=2, reader_threads=2)
    its = iterators(loader, world=1)  # kept: an iterator dropped takes its reader with it
    batches = run_lockstep(its)
    readers, workers = actor_pids(loader)
    assert real_ids(batches) == Counter(range(N))
    rows = [
        (int(pid), int(thread))
        for bs in batches
        for b in bs
        for pid, thread in zip(b[READ_PID][~b["_padded"]], b[READ_THREAD][~b["_padded"]])
    ]
    read_by = {pid for pid, _ in rows}
    assert read_by and read_by <= set(workers) and not read_by & set(readers)
    threads = Counter(pid for pid, _ in set(rows))  # worker pid -> threads that read
    assert max(threads.values()) >= 2, f"each worker read on one thread: {threads}"
    loader.shutdown()


def test_reader_workers_read_with_as_many_threads_as_the_cpus_each_asks(ray_session, dataset):
    # No `reader_threads`: each worker reads with the CPUs `transform_resources` gives it.
    source = PidStampedSource(dataset, delay_s=0.05)  # a worker's pieces overlap in time
    loader = make_loader(source, reader_workers=2, transform_resources={"CPU": 2})
    its = iterators(loader, world=1)  # kept: an iterator dropped takes its reader with it
    batches = run_lockstep(its)  # 2 workers x 2 CPUs: all 4 of the test Ray's
    readers, workers = actor_pids(loader)
    assert real_ids(batches) == Counter(range(N))
    rows = {
        (int(pid), int(thread))
        for b in batches[0]
        for pid, thread in zip(b[READ_PID][~b["_padded"]], b[READ_THREAD][~b["_padded"]])
    }
    threads = Counter(pid for pid, _ in rows)  # worker pid -> threads that read
    assert set(threads) <= set(workers) and max(threads.values()) == 2, threads
    loader.shutdown()


def test_reader_workers_under_packing_give_the_rows_of_one_reader(ray_session, dataset):
    packing = Packing(column="tokens", seq_len=16)
    options = {"packing": packing, "shuffle": True, "columns": ["tokens"]}
    runs = []
    for workers in (1, 2):  # one process's packing (the consumer's), then two workers'
        reads = {"consumer_reads": True} if workers == 1 else {"reader_workers": workers}
        loader = make_loader(ParquetSource(dataset), **reads, **options)
        its = iterators(loader, world=1)  # the rank's pieces are cut before the workers
        runs.append(as_tuples(run_lockstep(its), "tokens", "document_ids"))
        loader.shutdown()
    assert runs[0] == runs[1]
    docs = Counter(d for rank in runs[0] for _, ids in rank for row in ids for d in set(row))
    assert set(docs) - {-1} == {i for i in range(N) if i % 11}  # empty documents: none
