"""Dynamic splitting on a real local Ray: leases, equal steps, real reader deaths, joins,
a coordinator restart from its journal, and randomized churn."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter

import pytest
import ray

from rayshard.core.stragglers import late_rows_bound
from rayshard.errors import ConfigError
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import (
    end_rank_watch,
    epoch_ids_in_task,
    real_ids,
    run_lockstep,
    unique_name,
    write_parquet,
)
from tests.timeouts import EVENT_TIMEOUT_S, event_timeout_message, wait_until

pytestmark = [pytest.mark.ray]

ROWS = [60, 45, 75, 40, 80]  # 300 rows, row groups of 10 -> 30 splits


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_parquet(tmp_path_factory.mktemp("dynamic"), ROWS, row_group_size=10)


def dynamic_loader(dataset, **options):
    options.setdefault("batch_size", 8)
    return Loader(ParquetSource(dataset), name=unique_name("dyn"), policy="dynamic", **options)


class Consumer(threading.Thread):
    """Consumes one iterator in a thread, recording ids; stops at the first error."""

    def __init__(self, iterator, delay=0.0, stop_after=None, hold_after=None):
        super().__init__(daemon=True)
        self.iterator, self.delay, self.stop_after = iterator, delay, stop_after
        self.ids: list[int] = []
        self.batches = 0
        self.error: BaseException | None = None
        self.started_reading = threading.Event()
        # With `hold_after=n` the loop pauses after n batches until `go_on` is set: the
        # test's fault then lands mid-epoch, however fast or slow the machine is.
        self.hold_after, self.holding, self.go_on = hold_after, threading.Event(), threading.Event()

    def run(self):
        try:
            for batch in self.iterator:
                self.ids += real_ids([batch])
                self.batches += 1
                self.started_reading.set()
                if self.stop_after is not None and self.batches >= self.stop_after:
                    return
                if self.batches == self.hold_after:
                    self.holding.set()
                    self.go_on.wait(4 * EVENT_TIMEOUT_S)  # outlasts the waits a test makes
                time.sleep(self.delay)
        except BaseException as error:  # noqa: BLE001 - the test inspects it
            self.error = error
        finally:
            self.started_reading.set()


@pytest.mark.parametrize("reader_threads", [1, 3])
def test_dynamic_equal_steps_exact_coverage_and_stats(ray_session, dataset, reader_threads):
    # With 3 threads a rank has up to 3 leases being read at once.
    loader = dynamic_loader(dataset, reader_threads=reader_threads)
    its = [loader.iterator(world_rank=r, world_size=3, batch_format="numpy") for r in range(3)]
    lengths = [len(it) for it in its]
    assert lengths == [13, 13, 13]  # ceil(300 / (3 * 8))
    batches = run_lockstep(its)
    assert [len(b) for b in batches] == lengths
    ids = [i for rank in batches for i in real_ids(rank)]
    assert Counter(ids) == Counter(range(300))
    # The stats report what the consumers received.
    its[0].state_dict()  # waits until every rank's acknowledgements arrived
    stats = loader.stats()
    consumers = stats["consumers"]
    assert sum(c["samples"] for c in consumers.values()) == 300
    assert [consumers[r]["batches"] for r in range(3)] == [len(b) for b in batches]
    assert all(c["bytes"] > 0 for c in consumers.values())
    assert stats["leases"][0]["consumed_rows"] == 300
    assert sum(it.stats()["samples_received"] for it in its) == 300
    loader.shutdown()


@pytest.mark.parametrize("consumer_reads", [True, False])
def test_a_source_whose_reads_yield_empty_record_batches_reads_whole(
    ray_session, dataset, consumer_reads
):
    """Empty record batches from `Source.read` pass by (the dynamic reader took the last
    sample index of each batch: an `IndexError` on an empty one, as `data` did not)."""
    from tests.runtime.reading_fns import EmptyFirstSource

    loader = Loader(
        EmptyFirstSource(dataset),
        name=unique_name("dyn-empty"),
        policy="dynamic",
        batch_size=8,
        consumer_reads=consumer_reads,
    )
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    ids = [i for rank in run_lockstep(its) for i in real_ids(rank)]
    assert Counter(ids) == Counter(range(300))
    loader.shutdown()


def test_faster_rank_reads_more_without_equal_steps(ray_session, dataset):
    # The slow rank holds after its first batch until the fast rank has read everything
    # but what the held rank may already have leased (its read-ahead): without equal steps
    # nothing makes the fast rank wait for it. Ordered by events, not by sleeps.
    threads = 1
    loader = dynamic_loader(
        dataset, equal_steps=False, batches_per_object=1, reader_threads=threads
    )
    # What the held rank may have taken: its first batch, what its buffers hold past its
    # reader's check, and the leases (splits of 10 rows) its reading thread and its
    # rebatching hold before it.
    held_at_most = 8 + late_rows_bound(loader.settings) + (threads + 1) * 10
    assert held_at_most < 150, "the read-ahead bound must leave the fast rank the larger share"
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    fast, slow = Consumer(its[0]), Consumer(its[1], hold_after=1)
    slow.start()
    assert slow.holding.wait(EVENT_TIMEOUT_S), event_timeout_message("the slow rank's first batch")
    fast.start()
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    while len(fast.ids) < 300 - held_at_most - len(slow.ids) and fast.is_alive():
        assert time.monotonic() < deadline, event_timeout_message("the fast rank's share")
        time.sleep(0.05)
    slow.go_on.set()
    fast.join(EVENT_TIMEOUT_S), slow.join(EVENT_TIMEOUT_S)
    assert fast.error is None and slow.error is None
    assert Counter(fast.ids + slow.ids) == Counter(range(300))
    assert len(slow.ids) <= held_at_most
    loader.shutdown()


@pytest.mark.parametrize("equal_steps", [False, True])
def test_killed_reader_work_is_served_again(ray_session, dataset, equal_steps):
    # Every batch acknowledged on receipt: only batches in the consumer's hand can repeat.
    # With equal steps the survivors' capacities grow to take the returned work.
    loader = dynamic_loader(
        dataset, equal_steps=equal_steps, prefetch_depth=2, ack_interval_s=0, batches_per_object=4
    )
    its = [loader.iterator(world_rank=r, world_size=3, batch_format="numpy") for r in range(3)]
    # Rank 1 starts first and holds after its first batch; ranks 0 and 2 start only then,
    # so they cannot take the whole epoch before rank 1 has work, however slowly its
    # reader starts on a loaded machine (a reader leases at most a few blocks ahead).
    consumers = [
        Consumer(it, delay=0.02, hold_after=1 if r == 1 else None) for r, it in enumerate(its)
    ]
    consumers[1].start()
    assert consumers[1].holding.wait(EVENT_TIMEOUT_S), event_timeout_message("rank 1's 1st batch")
    consumers[0].start(), consumers[2].start()
    end_rank_watch(its[1])  # as if rank 1's process died, mid-epoch
    consumers[1].go_on.set()
    for c in consumers:
        c.join(90)
    assert consumers[0].error is None and consumers[2].error is None
    assert consumers[1].error is not None  # the dead rank's consumer saw its reader die
    seen = Counter(consumers[0].ids + consumers[1].ids + consumers[2].ids)
    assert set(seen) == set(range(300)), "lost samples"
    duplicates = sum(n - 1 for n in seen.values())
    # Only what the dead rank's consumer received without its acknowledgement arriving
    # first can repeat. Its loop outlives the reader here, so that is the two blocks it
    # had fetched (2 x batches_per_object=4 batches of 8 rows), acknowledged one batch at a
    # time after the reader's work went back to the queue.
    assert duplicates <= 2 * 4 * 8
    events = [e["event"] for e in loader.stats()["events"]]
    assert "rank_lost" in events
    loader.shutdown()


def test_rank_joining_mid_epoch_takes_splits_at_once(ray_session, dataset):
    loader = dynamic_loader(dataset, equal_steps=False, batches_per_object=1)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    # Both ranks hold after their first batch, leaving (at most their read-ahead taken)
    # most of the epoch unleased until the new rank has received its first batch.
    consumers = [Consumer(it, hold_after=1) for it in its]
    for c in consumers:
        c.start()
    for c in consumers:
        assert c.holding.wait(EVENT_TIMEOUT_S), event_timeout_message("a rank's first batch")
    late = Consumer(loader.iterator(world_rank=2, world_size=3, batch_format="numpy"))
    late.start()
    assert late.started_reading.wait(EVENT_TIMEOUT_S), event_timeout_message("the new rank")
    for c in consumers:
        c.go_on.set()
    for c in [*consumers, late]:
        c.join(EVENT_TIMEOUT_S)
    assert all(c.error is None for c in [*consumers, late])
    assert late.ids, "the new rank received no splits"
    assert Counter(consumers[0].ids + consumers[1].ids + late.ids) == Counter(range(300))
    loader.shutdown()


def test_coordinator_restarts_from_journal_mid_epoch(ray_session, dataset):
    loader = dynamic_loader(dataset, equal_steps=False)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    consumers = [Consumer(it, hold_after=2) for it in its]
    for c in consumers:
        c.start()
    for c in consumers:  # both mid-epoch: 2 batches of 8 taken, 300 rows in all
        assert c.holding.wait(EVENT_TIMEOUT_S), event_timeout_message("a rank's second batch")
    ray.kill(loader._coordinator, no_restart=False)  # the actor process dies; Ray restarts it
    for c in consumers:
        c.go_on.set()
    for c in consumers:
        c.join(EVENT_TIMEOUT_S)
    assert all(c.error is None for c in consumers), [c.error for c in consumers]
    assert Counter(consumers[0].ids + consumers[1].ids) == Counter(range(300))
    assert "coordinator_restarted" in [e["event"] for e in loader.stats()["events"]]
    journal = loader.journal_path  # the default one, which the restart replayed
    assert os.path.exists(journal)
    loader.shutdown()
    assert not os.path.exists(journal), "a default journal outlived its loader's shutdown"


def test_coordinator_over_an_in_memory_table_restarts_mid_epoch(ray_session):
    """A `TableSource` travels to the coordinator as a constructor argument held in the
    object store (1.5 MB here); a restarted coordinator gets it again and the epoch stays
    exact."""
    import numpy as np
    import pyarrow as pa

    from rayshard.sources.base import TableSource

    rows, parts = 3000, 12
    payload = np.random.default_rng(0).random((rows, 128), dtype=np.float32)
    table = pa.Table.from_batches(
        [
            pa.record_batch(
                {
                    "id": pa.array(range(start, start + rows // parts), pa.int64()),
                    "x": pa.FixedSizeListArray.from_arrays(
                        pa.array(payload[start : start + rows // parts].ravel()), 128
                    ),
                }
            )
            for start in range(0, rows, rows // parts)
        ]
    )
    assert table.nbytes > 1_000_000
    loader = Loader(
        TableSource(table),
        name=unique_name("table"),
        policy="dynamic",
        batch_size=50,
        equal_steps=False,
        columns=["id"],
    )
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    consumers = [Consumer(it, hold_after=2) for it in its]
    for c in consumers:
        c.start()
    for c in consumers:
        assert c.holding.wait(60), c.error
    ray.kill(loader._coordinator, no_restart=False)  # the actor process dies; Ray restarts it
    for c in consumers:
        c.go_on.set()
    for c in consumers:
        c.join(120)
    assert all(c.error is None for c in consumers), [c.error for c in consumers]
    assert Counter(consumers[0].ids + consumers[1].ids) == Counter(range(rows))
    assert "coordinator_restarted" in [e["event"] for e in loader.stats()["events"]]
    loader.shutdown()


def test_journal_of_another_loader_is_refused(ray_session, dataset, tmp_path):
    journal = tmp_path / "journal.jsonl"
    first = dynamic_loader(dataset, journal_path=str(journal))
    first.shutdown()
    assert journal.exists()  # a journal_path of the user's outlives the loader
    with pytest.raises(ConfigError, match="belongs to loader"):
        dynamic_loader(dataset, batch_size=4, journal_path=str(journal))
    journal.write_text("not json\n")
    with pytest.raises(ConfigError, match="corrupt"):
        dynamic_loader(dataset, journal_path=str(journal))
    (tmp_path / "a-file").write_text("")
    unwritable = tmp_path / "a-file" / "journal.jsonl"  # its folder would be a file
    with pytest.raises(ConfigError, match=r"journal_path=.*a-file/journal.jsonl'.*cannot be made"):
        dynamic_loader(dataset, journal_path=str(unwritable))


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(3))
def test_randomized_churn_never_loses_a_sample(ray_session, dataset, trial):
    rng = random.Random(1000 + trial)
    loader = dynamic_loader(dataset, equal_steps=False, batch_size=rng.choice([4, 8, 16]))
    consumers = []
    rank = 0
    for _ in range(rng.randint(2, 3)):
        it = loader.iterator(world_rank=rank, world_size=8, batch_format="numpy")
        consumers.append((it, Consumer(it, delay=rng.uniform(0.005, 0.03))))
        rank += 1
    for _, c in consumers:
        c.start()
    for _ in range(3):
        time.sleep(rng.uniform(0.05, 0.3))
        action = rng.choice(["kill", "join", "leave"])
        alive = [(it, c) for it, c in consumers if c.is_alive()]
        if action == "join" or len(alive) < 2:
            it = loader.iterator(world_rank=rank, world_size=8, batch_format="numpy")
            c = Consumer(it, delay=rng.uniform(0.005, 0.03))
            consumers.append((it, c))
            c.start()
            rank += 1
        elif action == "kill":
            end_rank_watch(rng.choice(alive)[0])
        else:
            it, c = rng.choice(alive)
            c.stop_after = c.batches + 1  # leaves gracefully after its next batch
            c.join(30)
            it.close()
    for _, c in consumers:
        c.join(120)
    seen = Counter(i for _, c in consumers for i in c.ids)
    lost = 300 - len(seen)
    assert lost == 0, f"trial {trial}: lost {lost}"
    loader.shutdown()


def test_rank_back_under_same_number_is_watched_again(ray_session, dataset):
    loader = dynamic_loader(dataset, equal_steps=False, batches_per_object=1)
    first = loader.iterator(world_rank=1, world_size=2, batch_format="numpy")
    taken = real_ids([next(iter(first))])
    end_rank_watch(first)
    again = loader.iterator(world_rank=1, world_size=2, batch_format="numpy")
    taken += real_ids([next(iter(again))])
    end_rank_watch(again)
    wait_until(
        lambda: sum(e["event"] == "rank_lost" for e in loader.stats()["events"]) == 2,
        "the second reader's death to be noticed",
    )
    survivor = loader.iterator(world_rank=0, world_size=2, batch_format="numpy")
    ids = real_ids(list(survivor))
    assert set(ids) | set(taken) == set(range(300)), "work of the second reader was lost"
    loader.shutdown()


def test_default_journal_is_private_to_user_cluster_and_job(ray_session):
    from rayshard.runtime.journal import default_path as default_journal_path

    path = default_journal_path("rayshard-01000000", "demo")
    address = ray.get_runtime_context().gcs_address.replace(":", "_")
    assert f"rayshard-{os.getuid()}" in path  # another user's folder is never shared
    assert os.path.basename(path).startswith(f"{address}-rayshard-01000000-demo-")
    # Names alike once made safe for a file name keep files of their own.
    alike = [("job1", "train/images"), ("job1", "train_images"), ("team-a", "x"), ("team", "a-x")]
    assert len({default_journal_path(*pair) for pair in alike}) == len(alike)
    assert default_journal_path("job1", "train/images") == default_journal_path(
        "job1", "train/images"
    )


# The ack timer's interval is an hour: if the epoch could end only when it fires, the test
# hangs until this timeout (far above a loaded machine's time for it) fails it.
@pytest.mark.timeout(300)
@pytest.mark.parametrize("trial", range(3))
def test_rank_that_finishes_and_exits_serves_nothing_again(ray_session, dataset, trial):
    # A worker that ends its epoch and exits takes its reader along; the coordinator sees
    # that death. Acknowledgements go out when a consumer waits and at the end of the
    # epoch (the timer's interval is an hour): they must be recorded before the epoch ends
    # for the worker, or its rows go back to the queue and the slower rank reads them a
    # second time. The slow rank registers first, so the fast one, once it is in, finds
    # the epoch still running and exits while the slow one reads (the slow one needs 1.5
    # s of steps for the whole epoch); whatever the timing, every epoch either rank read
    # comes out exactly once.
    loader = dynamic_loader(dataset, batch_size=10, ack_interval_s=3600)
    task = ray.remote(num_cpus=0)(epoch_ids_in_task)
    slow = task.remote(loader, 1, 2, 0.05)
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    while 1 not in loader.stats()["rank_epoch"]:
        assert time.monotonic() < deadline, event_timeout_message("the slow rank's first lease")
        if ray.wait([slow], timeout=0.02)[0]:
            ray.get(slow)  # it failed before its first lease: raise its error here
    fast = task.remote(loader, 0, 2, 0.0)
    by_epoch: dict[int, Counter] = {}
    for epoch, ids in ray.get([fast, slow]):
        by_epoch.setdefault(epoch, Counter()).update(ids)
    assert 0 in by_epoch
    for epoch, seen in by_epoch.items():
        assert seen == Counter(range(300)), (epoch, sum(seen.values()) - len(seen))
    assert loader.stats()["reserved_samples"] == 0
    loader.shutdown()


def test_journal_is_compacted_at_epoch_end_and_restart_replays_from_snapshot(
    ray_session, dataset, tmp_path
):
    """After an epoch the journal is its header and one snapshot (plus what came after the
    last acknowledgement), whatever the number of acknowledgements before; a coordinator
    killed mid-way through the next epoch restarts from that snapshot plus the commands
    after it, and the epoch is still covered exactly once."""
    journal = tmp_path / "compact.jsonl"
    loader = dynamic_loader(dataset, equal_steps=False, journal_path=str(journal), ack_interval_s=0)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    first = [Consumer(it) for it in its]
    for c in first:
        c.start()
    for c in first:
        c.join(120)
    assert Counter(first[0].ids + first[1].ids) == Counter(range(300))
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [e["op"] for e in lines[:2]] == ["header", "snapshot"]
    assert len(lines) < 10, [e["op"] for e in lines]  # ~40 acks and leases were compacted
    second = [Consumer(it, delay=0.03) for it in its]
    for c in second:
        c.start()
    second[0].started_reading.wait(30)
    wait_for(lambda: second[0].batches >= 3 and second[1].batches >= 3)
    ray.kill(loader._coordinator, no_restart=False)
    for c in second:
        c.join(120)
    assert all(c.error is None for c in second), [c.error for c in second]
    assert Counter(second[0].ids + second[1].ids) == Counter(range(300))
    assert "coordinator_restarted" in [e["event"] for e in loader.stats()["events"]]
    loader.shutdown()


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the awaited progress never came"
        time.sleep(0.01)
