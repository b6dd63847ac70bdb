"""README claims on a real local Ray: `loader.stats()` and `iterator.stats()` hold what the
Observability section lists after an epoch, and a journal of an older format is refused
when a loader starts over it."""

from __future__ import annotations

import json
import re

import pytest

from rayshard.errors import ConfigError
from rayshard.loader import Loader
from rayshard.runtime.journal import JOURNAL_VERSION
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import real_ids, run_lockstep, unique_name, write_parquet

pytestmark = [pytest.mark.ray]

ROWS = [60, 40]  # 100 rows, row groups of 10


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_parquet(tmp_path_factory.mktemp("readme-stats"), ROWS, row_group_size=10)


def test_loader_stats_hold_the_documented_keys_after_an_epoch(ray_session, dataset):
    """README: membership, generation, per-epoch lease book (unleased, outstanding,
    re-served rows), per-rank consumption (batches, samples, bytes, stall seconds) and
    events (rank_joined, rank_lost, ...); `iterator.stats()` adds the worker's counters."""
    loader = Loader(
        ParquetSource(dataset), name=unique_name("readme-stats"), policy="dynamic", batch_size=10
    )
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    batches = run_lockstep(its)
    assert sorted(real_ids(batches[0]) + real_ids(batches[1])) == list(range(100))
    for it in its:  # sends its acknowledgements and waits until every rank's arrived
        it.state_dict()
    stats = loader.stats()

    assert stats["ranks"] == [0, 1] and stats["dp_size"] == 2  # membership
    assert stats["generation"] == 1
    book = stats["leases"][0]  # epoch 0's lease book
    assert {"unleased_rows", "outstanding", "requeued_rows"} <= set(book)
    assert book["unleased_rows"] == 0 and book["outstanding"] == 0
    assert book["requeued_rows"] == 0 and stats["reserved_samples"] == 0
    events = stats["events"]
    assert [(e["event"], e["dp_rank"]) for e in events] == [("rank_joined", 1)]
    assert all(isinstance(e["time"], float) for e in events)

    consumers = stats["consumers"]
    assert sorted(consumers) == [0, 1]
    for rank, it in enumerate(its):
        counters = it.stats()  # this worker's own counters
        assert {"epoch", "batches_received", "samples_received", "stall_seconds"} <= set(counters)
        assert counters["epoch"] == 0
        assert counters["batches_received"] == len(batches[rank])
        assert counters["samples_received"] == len(real_ids(batches[rank]))
        usage = consumers[rank]  # the same, as the coordinator has it
        assert {"batches", "samples", "bytes", "stall_s"} <= set(usage)
        assert usage["batches"] == len(batches[rank])
        assert usage["samples"] == counters["samples_received"]
        assert usage["bytes"] > 0
        assert usage["stall_s"] == pytest.approx(counters["stall_seconds"], rel=1e-9, abs=1e-12)
    assert sum(it.stats()["stall_seconds"] for it in its) > 0  # the first batches waited

    its[1].close()  # a dynamic rank that leaves is a rank_lost event
    after = loader.stats()
    assert after["ranks"] == [0]
    lost = [e for e in after["events"] if e["event"] == "rank_lost"]
    assert [(e["dp_rank"], e["reason"]) for e in lost] == [(1, "left")]
    loader.shutdown()


def test_a_new_data_parallel_size_is_a_new_generation_event(ray_session, dataset):
    loader = Loader(ParquetSource(dataset), name=unique_name("readme-gen"), batch_size=10)
    one = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    next(iter(one))
    assert loader.stats()["generation"] == 1
    # kept: an iterator dropped at once releases its rank, a rank_lost event (a race with
    # stats() that this test lost once under load)
    two = loader.iterator(world_rank=0, world_size=2, batch_format="numpy")
    stats = loader.stats()
    assert stats["generation"] == 2 and stats["dp_size"] == 2
    events = [(e["event"], e.get("dp_size")) for e in stats["events"]]
    assert events == [("new_generation", 2)], stats["events"]
    two.close()
    loader.shutdown()


def test_a_journal_of_an_older_format_is_refused_at_start_up(ray_session, dataset, tmp_path):
    journal = tmp_path / "old.jsonl"
    header = {"op": "header", "version": JOURNAL_VERSION - 1, "loader": "any"}
    journal.write_text(json.dumps(header) + "\n")
    message = rf"journal {re.escape(str(journal))} has version {JOURNAL_VERSION - 1}, "
    with pytest.raises(ConfigError, match=message):
        Loader(ParquetSource(dataset), name=unique_name("readme-old"), journal_path=str(journal))
