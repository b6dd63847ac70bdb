"""Row groups read in parts are decoded once for the parts that follow: `DecodedChunks`
alone (pure, threads), and `ParquetSource` on real files written by pyarrow and polars."""

from __future__ import annotations

import threading

import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from parquet_fixtures import corrupt_row_group, ids_of, write_dataset
from real_data import write_polars

from rayshard.errors import DataError
from rayshard.sources._decoded import DecodedChunks
from rayshard.sources.parquet import ParquetSource


def test_keeps_the_last_values_and_decodes_a_kept_key_no_more():
    cache, decoded = DecodedChunks(2), []

    def decode(key):
        return lambda: decoded.append(key) or f"value {key}"

    assert [cache.get(k, decode(k)) for k in (1, 2, 1, 3, 1, 2)] == [
        f"value {k}" for k in (1, 2, 1, 3, 1, 2)
    ]
    # 1 stays (used after 2), 3 pushes 2 out, so 2 is decoded again at the end
    assert decoded == [1, 2, 3, 2]
    assert len(cache) == 2


def test_a_part_reaching_the_chunks_end_lets_it_go():
    cache, decoded = DecodedChunks(2), []
    for last in (False, False, True, False):
        cache.part("chunk", lambda: decoded.append(1) or "table", last=last)
    assert decoded == [1, 1]  # kept for the next two parts, decoded again after the last
    assert len(cache) == 1


def test_a_last_part_decoded_first_leaves_the_kept_chunks_alone():
    cache, decoded = DecodedChunks(2), []

    def decode(key):
        return lambda: decoded.append(key) or key

    for key, last in (("a", False), ("b", False), ("c", True), ("a", False), ("b", True)):
        assert cache.part(key, decode(key), last=last) == key
    assert decoded == ["a", "b", "c"]  # "c" was never kept, so "a" stayed
    assert len(cache) == 1  # "b" let go at its last part; "a" kept
    cache.let_go()
    assert len(cache) == 0


def test_a_waiter_decodes_for_itself_when_the_decoding_thread_is_interrupted():
    cache, started, release = DecodedChunks(2), threading.Event(), threading.Event()

    def interrupted():
        started.set()
        assert release.wait(30)
        raise KeyboardInterrupt

    outcomes = []

    def first():
        try:
            cache.get("k", interrupted)
        except KeyboardInterrupt:
            outcomes.append("interrupted")

    owner = threading.Thread(target=first)
    owner.start()
    assert started.wait(30)
    waiter = threading.Thread(target=lambda: outcomes.append(cache.get("k", lambda: "value")))
    waiter.start()
    release.set()
    owner.join(30)
    waiter.join(30)
    assert sorted(outcomes) == ["interrupted", "value"]
    assert cache.get("k", lambda: "not decoded again") == "value"


def test_threads_asking_at_once_wait_for_one_decode():
    cache, started, release, calls = DecodedChunks(1), threading.Event(), threading.Event(), []

    def decode():
        calls.append(1)
        started.set()
        assert release.wait(30)
        return object()

    results = []
    first = threading.Thread(target=lambda: results.append(cache.get("k", decode)))
    first.start()
    assert started.wait(30)  # the first thread is decoding
    second = threading.Thread(target=lambda: results.append(cache.get("k", decode)))
    second.start()
    release.set()
    first.join(30)
    second.join(30)
    assert len(calls) == 1 and len(results) == 2 and results[0] is results[1]


def test_a_failed_decode_reaches_the_waiters_and_is_not_kept():
    cache, started, release = DecodedChunks(2), threading.Event(), threading.Event()

    def failing():
        started.set()
        assert release.wait(30)
        raise OSError("disk gone")

    errors = []

    def ask():
        try:
            cache.get("k", failing)
        except OSError as error:
            errors.append(str(error))

    first = threading.Thread(target=ask)
    first.start()
    assert started.wait(30)
    second = threading.Thread(target=ask)
    second.start()
    release.set()
    first.join(30)
    second.join(30)
    assert errors == ["disk gone", "disk gone"]
    assert len(cache) == 0
    assert cache.get("k", lambda: "read again") == "read again"


def _pieces(total: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, total)) for a in range(0, total, size)]


@pytest.fixture(scope="module", params=["pyarrow", "polars"])
def files(request, tmp_path_factory):
    """120 rows in two files, row groups of 16 rows (the last of each file shorter)."""
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "pyarrow":
        write_dataset(folder, [70, 50], row_group_size=16)
    else:
        write_polars(folder / "part-000.parquet", range(70))
        write_polars(folder / "part-001.parquet", range(70, 120))
    return folder


@settings(max_examples=25, deadline=None)
@given(size=st.integers(1, 40))
def test_parts_read_in_order_decode_each_row_group_once(files, size):
    source = ParquetSource(files, columns=["id"], split_rows=size)
    groups = len(source.splits(10**6))  # whole row groups
    assert ids_of(b for a, z in _pieces(120, size) for b in source.read(a, z)) == list(range(120))
    assert source.stats()["chunks_read"] == groups
    assert source.stats()["rows_decoded"] == 120


@settings(max_examples=25, deadline=None)
@given(size=st.integers(1, 40), data=st.data())
def test_parts_in_any_order_read_exactly_their_rows(files, size, data):
    source = ParquetSource(files, columns=["id"], split_rows=size)
    pieces = data.draw(st.permutations(_pieces(120, size)))
    for start, end in pieces:
        assert ids_of(source.read(start, end)) == list(range(start, end))


def test_threads_reading_parts_of_one_row_group_decode_it_once(tmp_path):
    write_dataset(tmp_path, [1000], row_group_size=1000)
    source, got = ParquetSource(tmp_path, columns=["id"]), {}
    readers = [
        threading.Thread(target=lambda a=a: got.update({a: ids_of(source.read(a, a + 100))}))
        for a in (0, 100, 200)  # none reaches the row group's end
    ]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(60)
    assert got == {a: list(range(a, a + 100)) for a in (0, 100, 200)}
    assert source.stats()["chunks_read"] == 1


def test_filtered_row_groups_read_in_parts(tmp_path):
    write_dataset(tmp_path, [60], row_group_size=20)
    kept = [i for i in range(60) if i % 3 == 0 or i > 45]
    source = ParquetSource(tmp_path, columns=["id"], filter=pc.field("id").isin(kept))
    total = source.layout().num_samples
    assert ids_of(b for a, z in _pieces(total, 4) for b in source.read(a, z)) == kept
    assert source.stats()["chunks_read"] == 3


def test_a_corrupt_row_group_fails_every_part_that_needs_it(tmp_path):
    paths = write_dataset(tmp_path, [30], row_group_size=10)
    corrupt_row_group(paths[0], 1)
    source = ParquetSource(paths, columns=["id"])
    assert ids_of(source.read(0, 5)) == list(range(5))
    for start in (10, 12):  # a failure is not kept: each part tries the row group again
        with pytest.raises(DataError, match=r"part-000\.parquet: row group 1 is unreadable"):
            list(source.read(start, start + 2))
    assert ids_of(source.read(25, 30)) == list(range(25, 30))


def test_a_whole_read_takes_a_kept_chunk_and_let_go_drops_them(tmp_path):
    write_dataset(tmp_path, [32], row_group_size=16)
    source = ParquetSource(tmp_path, columns=["id"])
    assert ids_of(source.read(0, 5)) == list(range(5))  # part of row group 0: kept
    assert ids_of(source.read(0, 16)) == list(range(16))  # all of it: the kept copy
    assert ids_of(source.read(16, 20)) == list(range(16, 20))  # row group 1 kept
    assert source.stats()["chunks_read"] == 2
    source.let_go()
    assert ids_of(source.read(20, 24)) == list(range(20, 24))  # decoded again
    assert ids_of(source.read(5, 6)) == [5]  # row group 0 was let go by the whole read
    assert source.stats()["chunks_read"] == 4


def test_an_epochs_stream_lets_the_source_go_however_it_ends():
    from rayshard.runtime.row_streams import _then_let_go

    class Kept:
        released = 0

        def let_go(self):
            self.released += 1

    source = Kept()
    assert list(_then_let_go(iter([1, 2]), source)) == [1, 2]
    assert source.released == 1
    stream = _then_let_go(iter([1, 2]), source)
    next(stream)
    stream.close()  # a consumer that stopped early
    assert source.released == 2


@pytest.mark.parametrize(
    ("split_rows", "options", "warned"),
    [
        (4, {"shuffle": True}, "up to 4 times the decoding"),
        (4, {"shuffle": True, "policy": "dynamic"}, "up to 4 times the decoding"),
        (4, {"shuffle_blocks": 32}, "shuffle_blocks=32 with split_rows=4"),
        (4, {"shuffle": False}, None),  # parts read in a row: decoded once
        (16, {"shuffle": True}, None),  # whole row groups
        (None, {"shuffle": True}, None),
    ],
)
def test_a_shuffle_that_scatters_a_row_groups_parts_is_warned_of(
    tmp_path, caplog, split_rows, options, warned
):
    from rayshard.config.checked import checked_config

    write_dataset(tmp_path, [64], row_group_size=16)
    source = ParquetSource(tmp_path, columns=["id"], split_rows=split_rows)
    with caplog.at_level("WARNING", logger="rayshard.config.checked"):
        checked_config(source, None, {"batch_size": 4, **options}, None)
    messages = [r.getMessage() for r in caplog.records]
    if warned is None:
        assert messages == []
    else:
        (message,) = messages
        assert warned in message and "split_rows=None, or at least 16" in message
        assert ("shuffle_buffer" in message) is (options.get("policy") != "dynamic")


@pytest.mark.parametrize("policy", ["data", "file"])
def test_a_rank_reads_a_run_of_one_row_groups_splits_in_one_read(files, policy):
    """A static rank's pieces in order: the splits of one row group it reads in a row are
    one `read` (not one per split), cut where a row group ends; the rows are the same."""
    import threading

    import numpy as np

    from rayshard.config.loader_config import LoaderConfig
    from rayshard.core.planning import epoch_plan
    from rayshard.data.batching import INDEX_KEY, PADDED_KEY, iter_rows
    from rayshard.runtime.row_streams import RankReading

    source = ParquetSource(files, columns=["id"], split_rows=5)
    groups = source.split_array(10**6)  # whole row groups
    assert source.read_units().tolist() == groups.tolist()
    group_ends = set(groups.reshape(-1).tolist())
    settings = LoaderConfig(batch_size=8, policy=policy)
    for rank in epoch_plan(settings, source, 2, 0).ranks:
        asked: list[tuple[int, int]] = []

        def reads(pieces, columns, asked=asked):
            asked.extend(pieces)
            return iter_rows(source, asked, columns)

        reading = RankReading(None, source, settings, rank.rank)
        batches = list(reading.epoch({"plan": rank}, 0, 0, cancel=threading.Event, reads=reads))
        real = [b[INDEX_KEY][~b[PADDED_KEY]] for b in batches]  # padding: not read in pieces
        delivered = np.concatenate(real).tolist()
        assert delivered == [i for a, b in rank.ranges for i in range(a, b)]
        assert [i for a, b in asked for i in range(a, b)] == delivered
        assert len(asked) < len(delivered) / 5  # fewer reads than splits of 5 rows
        for (_, b), (c, _) in zip(asked, asked[1:]):  # joined unless a row group ends
            assert b != c or c in group_ends
        for a, b in asked:  # one row group each
            assert not any(a < end < b for end in group_ends)


@pytest.mark.parametrize("ranks", [2, 3])
def test_dynamic_and_off_queues_keep_a_row_groups_splits_together(files, ranks):
    """`dynamic` leases, and `off` orders, small splits by row group (the row groups in a
    seeded order), and each `dynamic` rank leases from its own stretch of the queue:
    ranks taking leases of two splits in turns from the lease book decode the row groups
    about once in all (at most 2 more per extra rank: a stretch's end and a steal may cut
    one; in turns from one queue, each rank decoded nearly every one); a rank under `off`
    reads its row groups' splits in a row, each row group decoded once."""
    import pickle

    from rayshard.config.loader_config import LoaderConfig
    from rayshard.core.leases import LeaseBook
    from rayshard.core.sharding import assign
    from rayshard.data.reading_order import cut_pieces
    from rayshard.plan import PlanConfig
    from rayshard.runtime.row_streams import RankReading

    source = ParquetSource(files, columns=["id"], split_rows=3)
    groups = len(source.read_units())
    cuts = RankReading(None, source, LoaderConfig(batch_size=8), 0).boundaries()  # a rank's
    queue = list(assign("dynamic", PlanConfig(seed=4), source, ranks, epoch=1).splits)
    assert queue != sorted(queue) and len(queue) > 2 * groups  # seeded, and small splits
    book = LeaseBook(queue, range(ranks), batch_size=8)
    readers = [pickle.loads(pickle.dumps(source)) for _ in range(ranks)]  # a process each
    got, leasing = [], True
    while leasing:
        leasing = False
        for rank, reader in enumerate(readers):
            leases = [le for le in (book.lease(rank), book.lease(rank)) if le is not None]
            for a, b in cut_pieces([(le.start, le.end) for le in leases], cuts):
                got += ids_of(reader.read(a, b))
            leasing |= bool(leases)
    assert sorted(got) == list(range(120))
    assert sum(r.stats()["chunks_read"] for r in readers) <= groups + 2 * (ranks - 1)
    for rank in assign("off", PlanConfig(batch_size=8, seed=4), source, 2, epoch=1).plan.ranks:
        reader = pickle.loads(pickle.dumps(source))
        assert sorted(
            i for a, b in cut_pieces(rank.ranges, cuts) for i in ids_of(reader.read(a, b))
        ) == list(range(120))
        assert reader.stats()["chunks_read"] == groups
