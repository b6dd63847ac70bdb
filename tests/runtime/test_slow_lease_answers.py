"""A `dynamic` rank whose lease answers come late (on a real local Ray, a relay actor holds
every lease call for 0.2 s on its way to the loader's real coordinator, as a queue of many
ranks' acknowledgements does): it asks earlier and for more pieces per call, so it makes
far fewer calls than it reads pieces, and it still reads every row once; `loader.stats()`
shows how it leased."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pyarrow as pa
import pytest
import ray

from rayshard.data.batching import FLUSH, INDEX_KEY, iter_rows
from rayshard.loader import Loader
from rayshard.runtime.dynamic_rows import dynamic_rows
from rayshard.sources.base import TableSource
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import real_ids, unique_name, write_parquet

pytestmark = [pytest.mark.ray]

DELAY_S = 0.2
ROWS, PIECE = 4_000, 10  # 400 pieces: unpaced, 400 lease calls


@ray.remote(num_cpus=0)
class SlowLink:
    """Relays the calls a `dynamic` rank's reading makes; each lease call is held
    `DELAY_S` first. Counts the lease calls."""

    def __init__(self, coordinator) -> None:
        self.coordinator, self.leases = coordinator, 0

    async def lease(self, *args, **kwargs):
        self.leases += 1
        await asyncio.sleep(DELAY_S)
        return await self.coordinator.lease.remote(*args, **kwargs)

    async def held(self, *args):
        return await self.coordinator.held.remote(*args)

    def lease_calls(self) -> int:
        return self.leases


def _dynamic_loader(source, name: str):
    """A one-rank `dynamic` loader without equal steps, and its coordinator."""
    loader = Loader(
        source, batch_size=8, policy="dynamic", equal_steps=False, name=unique_name(name)
    )
    return loader, loader._coordinator


def _first_epoch(coordinator, rank: int = 0, ranks: int = 1) -> tuple[int, dict]:
    """`rank` of `ranks` registered and its epoch 0 started: the generation, `start_epoch`'s
    answer."""
    registered = ray.get(
        coordinator.register.remote(
            rank, ranks, {"dp_rank": rank, "dp_size": ranks, "group": [rank]}
        )
    )
    generation = registered["generation"]
    return generation, ray.get(coordinator.start_epoch.remote(generation, rank, 0))


def test_a_rank_with_late_lease_answers_asks_ahead_and_reads_every_row_once(ray_session):
    table = pa.table({"id": pa.array(range(ROWS), pa.int64())})
    source = TableSource(pa.Table.from_batches(table.to_batches(max_chunksize=PIECE)))
    loader, coordinator = _dynamic_loader(source, "slow")
    try:
        generation, started = _first_epoch(coordinator)
        link = SlowLink.remote(coordinator)
        stop = threading.Event()

        def reads(pieces, columns):  # piece by piece, as the reading asks for them
            return iter_rows(source, pieces, columns)

        rows = dynamic_rows(
            link,
            source,
            source.splits(),
            loader.settings,
            (generation, 0, 0),
            lambda: stop,
            reads,
            started["reader"],
        )
        ids = [int(i) for batch in rows if batch is not FLUSH for i in batch.column(INDEX_KEY)]
        assert Counter(ids) == Counter(range(ROWS))
        calls = ray.get(link.lease_calls.remote())
        # Unpaced, one call per piece (400, 80 s of answers); paced, the asks grow once a
        # round trip is measured and halve with what is unleased: a few dozen at most.
        assert calls <= ROWS // PIECE // 10, f"{calls} lease calls for {ROWS // PIECE} pieces"
        # `stats()` counts the calls the coordinator answered, the rows they granted, the
        # paced ones, and the time the reading waited for answers: every call's answer
        # came 0.2 s or more after it went out, and the first (the stream's start, before
        # any piece was in hand) was waited for whole; the waits before the last call are
        # reported with it.
        leasing = loader.stats()["lease_calls"][0]
        assert leasing["calls"] == calls and leasing["rows"] == ROWS, leasing
        assert 0 < leasing["paced"] < calls, leasing
        assert leasing["waited_s"] >= DELAY_S, leasing
    finally:
        loader.shutdown()


def test_quick_lease_answers_lease_more_than_a_piece_per_call_once_paced(ray_session, tmp_path):
    """Answers come at once (no relay), pieces read in well under `min_lease_s`: once the
    reading pace is measured (after `first_pieces` pieces), a lease asks for 250 ms of
    reading, not one piece per call (a Ray call's CPU on both sides each time). Real
    Parquet files, the rank reading in its consumer; every row once in every epoch."""
    # Row groups of 40 rows; batches of 8, 4 to an object's worth: a base of one piece a
    # call. Unpaced, one lease call per piece: 50 an epoch.
    pieces = 50
    dataset = write_parquet(tmp_path / "small_groups", [500] * 4, row_group_size=40)
    loader = Loader(
        ParquetSource(dataset), batch_size=8, policy="dynamic", name=unique_name("quick")
    )
    try:
        it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        calls = []  # lease calls answered by the end of each epoch
        for _ in range(2):
            assert Counter(real_ids(it)) == Counter(range(2_000))
            calls.append(loader.stats()["lease_calls"][0]["calls"])
        it.state_dict()  # every acknowledgement recorded
        assert loader.stats()["lease_calls"][0]["rows"] == 2 * 2_000
        # Unpaced: 50 calls and more in each epoch. Paced through the second: even were
        # a piece of 40 rows read in 20 ms (2.5 pieces a call), under half as many calls
        # as pieces.
        assert calls[1] - calls[0] < pieces / 2, calls
        it.close()
    finally:
        loader.shutdown()


def test_a_dynamic_rank_reads_its_leased_small_splits_a_row_group_at_a_time(ray_session, tmp_path):
    """`split_rows` far below the row group size under `dynamic`: the queue keeps each row
    group's splits in a row and the rank's reading (its `Cuts`) joins what it leases of one
    row group into one read, so every row group is decoded once and read in a few calls,
    not once per split of 5 rows. Real Parquet files and coordinator; every row once."""
    from rayshard.runtime.row_streams import RankReading

    dataset = write_parquet(tmp_path / "small_splits", [500] * 4, row_group_size=40)
    source = ParquetSource(dataset, split_rows=5)
    loader, coordinator = _dynamic_loader(source, "units")
    try:
        generation, started = _first_epoch(coordinator)
        stop, asked = threading.Event(), []

        def reads(pieces, columns):
            return iter_rows(source, (asked.append(p) or p for p in pieces), columns)

        reading = RankReading(coordinator, source, loader.settings, 0)
        batches = reading.epoch(started, generation, 0, cancel=lambda: stop, reads=reads)
        ids = [int(i) for b in batches if b is not FLUSH for i in b[INDEX_KEY]]
        assert Counter(ids) == Counter(range(2_000))
        groups = source.read_units().tolist()  # 13 a file: 12 of 40 rows and one of 20
        within = [[u for u in groups if u[0] <= a and b <= u[1]] for a, b in asked]
        assert all(within), asked  # each read inside one row group
        assert len(asked) <= 3 * len(groups), f"{len(asked)} reads for 400 splits"
        assert source.stats()["chunks_read"] == len(groups)  # each row group decoded once
    finally:
        loader.shutdown()


def test_two_dynamic_ranks_decode_each_row_group_about_once_in_all(ray_session, tmp_path):
    """Two ranks of a real coordinator read their leases at once, each with its own copy
    of the source (as two processes): each leases from its own stretch of the queue and
    steals half of the other's once its own is empty, so a row group is decoded by one
    rank, twice only where the stretches meet or a steal cuts it (each steal at least
    halves what is queued: a few steals). Leasing in turns from one queue, each rank
    decoded nearly every row group. Every row once."""
    import math
    import pickle

    import numpy as np

    from rayshard.plan.id_runs import union
    from rayshard.runtime.row_streams import RankReading

    dataset = write_parquet(tmp_path / "two_ranks", [500] * 4, row_group_size=40)
    source = ParquetSource(dataset, split_rows=5)
    splits, groups = len(source.split_array()), len(source.read_units())
    loader, coordinator = _dynamic_loader(source, "two")
    try:
        starts = [_first_epoch(coordinator, rank, 2) for rank in (0, 1)]
        copies = [pickle.loads(pickle.dumps(source)) for _ in starts]
        stop, ids = threading.Event(), {0: [], 1: []}

        def read(rank: int) -> None:
            generation, started = starts[rank]
            reading = RankReading(coordinator, copies[rank], loader.settings, rank)
            batches = reading.epoch(started, generation, 0, cancel=lambda: stop)
            for count, batch in enumerate((b for b in batches if b is not FLUSH), 1):
                got = [int(i) for i in batch[INDEX_KEY]]  # received, and acknowledged
                ids[rank] += got
                runs = union(np.array([[i, i + 1] for i in got], dtype=np.int64))
                ray.get(coordinator.ack.remote(generation, rank, 0, count, runs))

        threads = [threading.Thread(target=read, args=(rank,)) for rank in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
        assert Counter(ids[0] + ids[1]) == Counter(range(2_000))
        decoded = sum(copy.stats()["chunks_read"] for copy in copies)
        steals = 2 * math.ceil(math.log2(splits))  # (far more than each halving allows)
        assert groups <= decoded <= groups + 1 + steals < 2 * groups, (decoded, groups)
    finally:
        stop.set()
        loader.shutdown()
