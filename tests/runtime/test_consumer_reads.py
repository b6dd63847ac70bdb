"""Consumer reads (`rayshard.runtime.local_reads`): a rank's only consumer reads its
batches itself. The batches are the reader actor's, batch for batch (shuffles included);
a `RankWatch` stands in for the reader; what cannot share the consumer's reading is
refused before any work starts."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from rayshard.config.loader_config import LoaderConfig
from rayshard.data.batching import FLUSH
from rayshard.data.packing import Packing
from rayshard.errors import ConfigError
from rayshard.loader import Loader
from rayshard.runtime.local_reads import LocalReads, reads_in_consumer
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import (
    arrow_columns_of_next_block,
    as_seen,
    run_lockstep,
    unique_name,
    watch_of,
    write_parquet,
)
from tests.timeouts import EVENT_TIMEOUT_S, wait_until

ROWS = [40, 35, 26]  # 101 rows, row groups of 7


def indices(loader: Loader, world: int, epochs: int) -> list[list[list[int]]]:
    """Per epoch and rank, the `_index` of every batch, the ranks consumed in lockstep."""
    its = [
        loader.iterator(world_rank=r, world_size=world, batch_format="numpy") for r in range(world)
    ]
    out = []
    for _ in range(epochs):
        per_rank = run_lockstep(its)
        out.append([[b["_index"].tolist() for b in batches] for batches in per_rank])
    for it in its:
        it.close()
    return out


@pytest.mark.ray
# Without a shuffle both read the plan's pieces in order through the same `static_rows`
# as these cases: `test_string_and_binary_columns_arrive_alike_...` compares them so.
@pytest.mark.parametrize("shuffle", ["pieces", "buffer"])
def test_consumer_reads_give_the_reader_actors_batches(ray_session, tmp_path, shuffle):
    source = ParquetSource(write_parquet(tmp_path, ROWS))
    options = {
        "pieces": {"shuffle": True},
        "buffer": {"shuffle": True, "shuffle_buffer": 16},
    }[shuffle]
    seen = {}
    for consumer_reads in (True, False):
        loader = Loader(
            source,
            name=unique_name("local"),
            batch_size=8,
            seed=3,
            consumer_reads=consumer_reads,
            **options,
        )
        try:
            seen[consumer_reads] = indices(loader, world=2, epochs=2)
        finally:
            loader.shutdown()
    assert seen[True] == seen[False]
    for epoch in seen[True]:
        real = sorted(i for rank in epoch for batch in rank for i in batch)
        assert set(real) == set(range(101))  # padding repeats a sample, nothing is lost
    assert seen[True][0] != seen[True][1]  # the order changes per epoch


@pytest.mark.ray
def test_a_watch_stands_in_for_the_reader_and_small_batches_are_slices_of_one_conversion(
    ray_session, tmp_path
):
    """A rank that reads in its consumer has no reader process: the coordinator, on this
    process's node, watches the process's pid (elsewhere, a `RankWatch` this process
    makes: `tests/runtime/test_pid_watch.py`). Batches of 8 rows cut from one 101-row row
    group reach the loop as views of one Arrow-to-numpy conversion
    (`rayshard.data.bulk_batches`), not one conversion each; every row once, in order."""
    source = ParquetSource(write_parquet(tmp_path, [101], row_group_size=101))
    loader = Loader(source, name=unique_name("bulk"), batch_size=8)
    try:
        it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        assert it._local is not None
        batches = list(it)
        kind = ray.get(watch_of(it).__ray_call__.remote(lambda self: type(self).__name__))
        assert kind == "Coordinator"
        stats = loader.stats()  # attached: its death releases the rank
        assert (stats["readers"], stats["watched_by_pid"]) == (1, 1)
        it.close()
    finally:
        loader.shutdown()
    assert [i for b in batches for i in b["_index"].tolist()] == list(range(101))
    bases = {id(b["_index"].base) for b in batches[:12] if b["_index"].base is not None}
    assert len(bases) == 1  # the first 96 rows: one conversion


def test_who_reads_by_default_and_on_request():
    plain = LoaderConfig(batch_size=4)
    assert reads_in_consumer(plain, consumers=1, transform=None)
    assert not reads_in_consumer(plain, consumers=2, transform=None)  # a model-parallel group
    assert not reads_in_consumer(plain, consumers=1, transform=lambda b, c: b)
    assert not reads_in_consumer(LoaderConfig(reader_workers=2), consumers=1, transform=None)
    assert not reads_in_consumer(LoaderConfig(transform_workers=2), consumers=1, transform=None)
    packing = LoaderConfig(packing=Packing(column="tokens", seq_len=8))
    assert not reads_in_consumer(packing, consumers=1, transform=None)
    # CPUs reserved for reader actors ask for them: else they would be ignored unsaid
    cpus = LoaderConfig(reader_num_cpus=0.5)
    assert not reads_in_consumer(cpus, consumers=1, transform=None)
    asked = LoaderConfig(consumer_reads=True)
    assert reads_in_consumer(asked, consumers=1, transform=lambda b, c: b)
    refused = LoaderConfig(consumer_reads=False)
    assert not reads_in_consumer(refused, consumers=1, transform=None)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"consumer_reads": "yes"}, r"consumer_reads='yes' must be True, False or None"),
        ({"consumer_reads": True, "model_parallel_size": 2}, r"model-parallel groups share"),
        ({"consumer_reads": True, "dp_groups": [[0, 1]]}, r"model-parallel groups share"),
        ({"consumer_reads": True, "reader_workers": 2}, r"worker processes are fed"),
        ({"consumer_reads": True, "transform_workers": 2}, r"worker processes are fed"),
        ({"consumer_reads": True, "reader_num_cpus": 1}, r"no reader actor to reserve CPUs"),
    ],
)
def test_consumer_reads_that_cannot_work_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        LoaderConfig(**options)


def _text_table(rows: int) -> pa.Table:
    ids = np.arange(rows)
    text = [None if i % 9 == 4 else "é" * (i % 5) + str(i) for i in ids]  # a null to fill
    blobs = [bytes([i % 256, 255]) * (i % 4) for i in ids]  # not UTF-8
    return pa.table(
        {
            "id": ids,
            "s": pa.array(text, pa.string()),
            "ls": pa.array([t or "" for t in text], pa.large_string()),
            "b": pa.array(blobs, pa.binary()),
            "lb": pa.array(blobs, pa.large_binary()),
        }
    )


@pytest.mark.ray
def test_string_and_binary_columns_arrive_alike_from_a_reader_and_from_the_consumer(
    ray_session, tmp_path
):
    """A reader actor ships string and binary columns as Arrow (`rayshard.data.wire`); the
    loop gets them exactly as when it reads itself, under every batch format."""
    pq.write_table(_text_table(61), tmp_path / "t.parquet", row_group_size=7)
    seen: dict = {}
    for consumer_reads in (True, False):
        loader = Loader(
            ParquetSource(str(tmp_path)),
            name=unique_name("text"),
            batch_size=8,
            fill_null={"s": "?"},
            pad_last_batch=True,  # 61 rows: the last batch has 3 padding rows
            consumer_reads=consumer_reads,
        )
        try:
            for fmt in ("numpy", "torch", "arrow"):
                its = [loader.iterator(world_rank=0, world_size=1, batch_format=fmt, device="cpu")]
                seen[consumer_reads, fmt] = [[as_seen(b) for b in r] for r in run_lockstep(its)]
                if not consumer_reads and fmt == "arrow":  # the reader's blocks: text as Arrow
                    assert arrow_columns_of_next_block(its[0]) == {"s", "ls", "b", "lb"}
                its[0].close()
        finally:
            loader.shutdown()
    for fmt in ("numpy", "torch", "arrow"):
        assert seen[True, fmt] == seen[False, fmt]
        assert sum(len(r) for r in seen[True, fmt]) == 8  # 61 rows and 3 padding rows
    # under "arrow" the types are those of the object arrays: large ones come down
    (schema, _) = seen[False, "arrow"][0][0]
    assert schema.split("\n")[:5] == [
        "id: int64",
        "s: string",
        "ls: string",
        "b: binary",
        "lb: binary",
    ]
    first = dict((k, v) for k, _, v in seen[False, "numpy"][0][0])
    assert first["s"][4] == ("str", "?") and first["b"][3] == ("bytes", b"\x03\xff" * 3)


@ray.remote(num_cpus=0)
class EpochStarter:
    """The coordinator's `start_epoch` answer for a scripted reading."""

    def start_epoch(self, generation: int, dp_rank: int, epoch: int) -> dict:
        return {"batches": 4, "plan": None}


class ScriptedReading:
    """A rank's reading whose epoch is `script`: batches, `FLUSH` marks, and events the
    stream waits for (a reading that is slower than its consumer)."""

    def __init__(self, coordinator, script: list) -> None:
        self.coordinator, self.script = coordinator, script
        self.dp_rank, self.settings = 0, LoaderConfig()

    def start_epoch(self, generation: int, epoch: int) -> dict:
        return ray.get(self.coordinator.start_epoch.remote(generation, self.dp_rank, epoch))

    def epoch(self, started, generation, epoch, *, cancel, keep_text, leases=None):
        for step in self.script:
            if isinstance(step, threading.Event):
                step.wait()
            else:
                yield step

    def close(self) -> None:
        pass


def _batch(first: int) -> dict:
    return {"_index": np.arange(first, first + 2), "_padded": np.zeros(2, dtype=bool)}


@pytest.mark.ray
def test_a_waiting_consumer_sends_acknowledgements_only_once_its_leases_ended(ray_session):
    # Under `dynamic` no rank waits for another's acknowledgements before that one's
    # leases ended: a consumer outpacing its reading waits at every piece, and sending
    # then would be a coordinator call per piece. After the reading passed a `FLUSH` (a
    # lease answer without pieces), a wait sends them at once.
    before_flush, after_flush = threading.Event(), threading.Event()
    script = [_batch(0), _batch(2), before_flush, FLUSH, _batch(4), after_flush, _batch(6)]
    reads = LocalReads(ScriptedReading(EpochStarter.remote(), script))
    reads.start(generation=1, epoch=0)
    waits, sent = [], []
    flush = reads.when_awaited(lambda: sent.append(len(waits)))

    def waiting() -> None:
        waits.append(True)
        flush()

    received = []
    consumer = threading.Thread(
        target=lambda: received.extend(reads.batches(0, flush=waiting, where="test"))
    )
    consumer.start()
    wait_until(lambda: waits, "the consumer waiting for the reading")
    assert sent == []  # waiting, but the leases have not ended: nothing sent
    before_flush.set()
    wait_until(lambda: sent, "the consumer's wait after the FLUSH")
    after_flush.set()
    consumer.join(timeout=EVENT_TIMEOUT_S)
    assert [t.batch["_index"].tolist() for t in received] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    reads.close()
