"""Weighted mixing on a real local Ray: two Parquet sources written by different
writers (pyarrow and polars) with different extra columns, weights 0.7/0.3, exact
per-source counts per epoch under `data` and `dynamic`, resume on another world size,
and a reader killed mid-epoch."""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayshard.loader import Loader
from rayshard.sources.mixed import MixedSource
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import end_rank_watch, run_lockstep, unique_name
from tests.runtime.test_dynamic import Consumer

pytestmark = [pytest.mark.ray]

A_ROWS, B_ROWS, EPOCH = 70, 50, 120  # 0.7/0.3 of 120: 84 of A (upsampled), 36 of B (down)
B_DOC = 1000  # B's doc ids start here


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    import polars as pl

    root = tmp_path_factory.mktemp("mix")
    os.makedirs(root / "a"), os.makedirs(root / "b")
    docs = np.arange(A_ROWS)
    for part, rows in enumerate(np.array_split(docs, 2)):  # pyarrow: list<int32>, a string
        pq.write_table(
            pa.table(
                {
                    "doc": pa.array(rows, pa.int64()),
                    "tokens": pa.array(
                        [[int(d)] * (int(d) % 3 + 1) for d in rows], pa.list_(pa.int32())
                    ),
                    "lang": pa.array(["en"] * len(rows)),
                }
            ),
            root / "a" / f"part-{part}.parquet",
            row_group_size=10,
        )
    docs = np.arange(B_DOC, B_DOC + B_ROWS)
    pl.DataFrame(
        {  # polars: large_list<int64>, a float column A lacks
            "doc": docs,
            "score": docs / 7.0,
            "tokens": [[int(d)] * (int(d) % 4 + 1) for d in docs],
        }
    ).write_parquet(root / "b" / "part-0.parquet", row_group_size=10)
    return str(root / "a"), str(root / "b")


def mixed(sources, **options):
    a, b = sources
    return MixedSource(
        [ParquetSource(a), ParquetSource(b)],
        [0.7, 0.3],
        samples_per_epoch=EPOCH,
        columns=["doc", "tokens"],
        split_rows=8,
    )


def make_loader(sources, policy, **options):
    options.setdefault("batch_size", 8)
    return Loader(mixed(sources), name=unique_name("mix"), policy=policy, seed=5, **options)


def rows(batches):
    """(position, source, source index) of the real rows; checks each row's data."""
    out = []
    for b in batches:
        real = ~b["_padded"]
        doc = b["doc"][real]
        source, index = b["_source"][real], b["_source_index"][real]
        assert (doc == np.where(source == 0, index, B_DOC + index)).all()  # the right row
        assert (b["tokens"][real][:, 0] == doc).all()  # list columns of both writers
        out += zip(b["_index"][real].tolist(), source.tolist(), index.tolist())
    return out


def expected(source: MixedSource, epoch: int) -> list[tuple[int, int, int]]:
    s, i = source.mix(5).locate(epoch, 0, EPOCH)
    return list(zip(range(EPOCH), s.tolist(), i.tolist()))


def assert_exact(got, source, epoch):
    assert Counter(got) == Counter(expected(source, epoch)), f"epoch {epoch}"
    per_source = Counter(s for _, s, _ in got)
    assert [per_source[0], per_source[1]] == [84, 36]


@pytest.mark.parametrize(("policy", "new_world"), [("data", 3), ("dynamic", 1)])
def test_mixed_epochs_are_exact_and_resume_mid_epoch_on_another_world_size(
    ray_session, sources, policy, new_world
):
    """Two whole epochs deliver each pick once with exact counts; a stop three steps into
    the third resumes on a fresh loader on another world size with the counts exact."""
    loader = make_loader(sources, policy)
    assert loader.source.counts == (84, 36)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    b_subsets = []
    for epoch in range(2):
        got = [row for rank in run_lockstep(its) for row in rows(rank)]
        assert_exact(got, loader.source, epoch)
        b_subsets.append(sorted(i for _, s, i in got if s == 1))
        counts = Counter(i for _, s, i in got if s == 0)
        assert sorted(Counter(counts.values()).items()) == [(1, 56), (2, 14)]  # 1 cycle + 14
    assert b_subsets[0] != b_subsets[1]  # the downsampled source changes by epoch
    # Epochs 0 and 1 whole: the resume lands in epoch 2.
    before = [row for rank in run_lockstep(its, steps=3) for row in rows(rank)]
    state = json.loads(json.dumps(its[0].state_dict()))
    assert state["epoch"] == 2
    loader.shutdown()

    fresh = make_loader(sources, policy)
    state["loader"] = fresh.loader_id
    resumed = [
        fresh.iterator(world_rank=r, world_size=new_world, batch_format="numpy")
        for r in range(new_world)
    ]
    for it in resumed:
        it.load_state_dict(state)
    after = [row for rank in run_lockstep(resumed) for row in rows(rank)]
    assert_exact(before + after, fresh.source, 2)
    fresh.shutdown()


class MixConsumer(Consumer):
    """`Consumer` recording (position, source, source index) rows in `got`."""

    def run(self):
        self.got = []
        try:
            for batch in self.iterator:
                self.got += rows([batch])
                self.batches += 1
                if self.batches == self.hold_after:
                    self.holding.set()
                    self.go_on.wait(120)
                time.sleep(self.delay)
        except BaseException as error:  # noqa: BLE001 - the test inspects it
            self.error = error


def test_killed_reader_under_mixing_loses_nothing(ray_session, sources):
    loader = make_loader(
        sources, "dynamic", prefetch_depth=2, ack_interval_s=0, batches_per_object=2
    )
    its = [loader.iterator(world_rank=r, world_size=3, batch_format="numpy") for r in range(3)]
    consumers = [
        MixConsumer(it, delay=0.02, hold_after=1 if r == 1 else None) for r, it in enumerate(its)
    ]
    for c in consumers:
        c.start()
    assert consumers[1].holding.wait(60), "rank 1 received no batch"
    end_rank_watch(its[1])  # as if rank 1's process died, mid-epoch
    consumers[1].go_on.set()
    for c in consumers:
        c.join(90)
    assert consumers[0].error is None and consumers[2].error is None
    assert consumers[1].error is not None  # the dead rank's consumer saw its reader die
    seen = [row for c in consumers for row in c.got]
    want = set(expected(loader.source, 0))
    assert set(seen) == want, "lost samples"  # every position, with its (source, index)
    per_source = Counter(s for _, s, _ in set(seen))
    assert [per_source[0], per_source[1]] == [84, 36]
    # Repeats only from what the dead rank's loop had fetched: two blocks of
    # batches_per_object=2 batches of 8 rows (README, churn under dynamic).
    assert len(seen) - len(want) <= 2 * 2 * 8
    assert "rank_lost" in [e["event"] for e in loader.stats()["events"]]
    loader.shutdown()


def test_default_pieces_follow_row_groups_and_deliver_each_pick_once(ray_session, tmp_path):
    """`split_rows` left out: pieces cut at the row groups of the source whose row groups
    span the most positions (B's, downsampled: expected boundaries); under `dynamic` with
    shuffle on 2 ranks an epoch still delivers each pick once, counts exact."""
    for name, rows_, group in (("a", 30_000, 3000), ("b", 40_000, 10_000)):
        ids = np.arange(rows_) + (B_DOC * 100 if name == "b" else 0)
        pq.write_table(pa.table({"doc": ids}), tmp_path / f"{name}.parquet", row_group_size=group)
    source = MixedSource(
        [ParquetSource(str(tmp_path / "a.parquet")), ParquetSource(str(tmp_path / "b.parquet"))],
        [0.7, 0.3],
        samples_per_epoch=60_000,
    )
    assert source.counts == (42_000, 18_000)  # A upsampled, B downsampled
    assert len(source.splits()) == 4 and min(b - a for a, b in source.splits()) >= 8192
    loader = Loader(
        source, name=unique_name("mixal"), policy="dynamic", shuffle=True, seed=5, batch_size=1000
    )
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    for epoch in range(2):
        got = []
        for batch in (b for rank in run_lockstep(its) for b in rank):
            real = ~batch["_padded"]
            src, index = batch["_source"][real], batch["_source_index"][real]
            assert (batch["doc"][real] == index + np.where(src == 1, B_DOC * 100, 0)).all()
            got += zip(batch["_index"][real].tolist(), src.tolist(), index.tolist())
        s, i = source.mix(5).locate(epoch, 0, 60_000)
        assert Counter(got) == Counter(zip(range(60_000), s.tolist(), i.tolist())), epoch
    loader.shutdown()
