"""Packing on a real local Ray over real Parquet files: every token of every
document delivered once per epoch, resume inside a split document on another world size,
and a reader killed mid-epoch."""

from __future__ import annotations

import json
import os
import re
import threading
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayshard.data.packing import Packing
from rayshard.errors import DataError
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import end_rank_watch, run_lockstep, unique_name

pytestmark = [pytest.mark.ray]

SEP = -1  # a separator no document token equals
PACKED = ("position_ids", "document_ids", "mask")
DOCS = 120


def write_documents(folder, docs=DOCS, seed=0, files=3, row_group_size=9) -> tuple[str, list]:
    """Parquet files with a `tokens` list<int32> column: document i holds 1000*i + (0..n-1)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 40, size=docs)
    lengths[5] = 0  # an empty document
    per_file = np.array_split(np.arange(docs), files)
    os.makedirs(folder, exist_ok=True)
    for f, ids in enumerate(per_file):
        tokens = [list(1000 * int(i) + np.arange(lengths[i])) for i in ids]
        table = pa.table({"tokens": pa.array(tokens, pa.list_(pa.int32())), "id": ids})
        pq.write_table(
            table, os.path.join(folder, f"part-{f}.parquet"), row_group_size=row_group_size
        )
    return str(folder), [int(n) for n in lengths]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_documents(tmp_path_factory.mktemp("packing"))


def make_loader(folder, packing, **options):
    options.setdefault("batch_size", 4)
    options.setdefault("shuffle", True)
    options.setdefault("seed", 3)
    return Loader(ParquetSource(folder), name=unique_name("pack"), packing=packing, **options)


def tokens_of(batches, packing):
    """(document, token offset) of every real token, checking each token's value."""
    out: Counter = Counter()
    for b in batches:
        b = {key: np.asarray(value) for key, value in b.items()}  # torch tensors too
        tokens, docs, pos, mask = (
            b[packing.column],
            b["document_ids"],
            b["position_ids"],
            b["mask"],
        )
        assert tokens.shape[1] == packing.seq_len
        assert (mask == (docs >= 0)).all()
        assert not mask[b["_padded"]].any()  # padding rows are all padding
        real = docs >= 0
        expect = np.where(tokens[real] == SEP, SEP, 1000 * docs[real] + pos[real])
        np.testing.assert_array_equal(tokens[real], expect)
        out.update(zip(docs[real].tolist(), pos[real].tolist()))
    return out


def every_token(lengths, packing):
    extra = packing.separator is not None
    return Counter((i, t) for i, n in enumerate(lengths) for t in range(n + extra))


@pytest.mark.parametrize("split", [True, False])
def test_two_ranks_deliver_every_token_once_with_equal_steps(ray_session, corpus, split):
    folder, lengths = corpus
    packing = Packing(column="tokens", seq_len=48, separator=SEP, split_documents=split)
    loader = make_loader(folder, packing)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    steps = [len(it) for it in its]
    assert steps[0] == steps[1] > 0
    for epoch in range(2):  # the second epoch is whole again
        batches = run_lockstep(its)
        assert [len(b) for b in batches] == steps
        # Only the token column is read (not `id`), with the packing columns.
        assert set(batches[0][0]) == {"tokens", *PACKED, "_index", "_padded"}
        got = tokens_of([b for rank in batches for b in rank], packing)
        assert got == every_token(lengths, packing), f"epoch {epoch}"
    state = its[0].state_dict()
    assert state["epoch"] == 2 and state["partial"] == []
    loader.shutdown()


def test_resume_inside_a_split_document_on_another_world_size(ray_session, corpus):
    folder, lengths = corpus
    packing = Packing(column="tokens", seq_len=32)
    loader = make_loader(folder, packing, batch_size=2)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    before = run_lockstep(its, steps=3)
    state = json.loads(json.dumps(its[1].state_dict()))
    assert state["epoch"] == 0 and state["partial"], "a document split across rows"
    delivered = tokens_of([b for rank in before for b in rank], packing)
    for index, tokens in state["partial"]:  # exactly the tokens the rows carried
        assert max(t for (i, t) in delivered if i == index) + 1 == tokens
    loader.shutdown()

    fresh = make_loader(folder, packing, batch_size=2)
    state["loader"] = fresh.loader_id  # same configuration, another name in this test
    # More ranks, then fewer: each restores the state again (a new membership, as a
    # restarted group's) on the same fresh loader.
    for new_world in [3, 1]:
        resumed = [  # torch tensors this time (the default format), on the CPU
            fresh.iterator(world_rank=r, world_size=new_world) for r in range(new_world)
        ]
        for it in resumed:
            it.load_state_dict(state)
        steps = {len(it) for it in resumed}
        after = run_lockstep(resumed)
        assert {len(b) for b in after} == steps and len(steps) == 1  # equal steps
        rest = tokens_of([b for rank in after for b in rank], packing)
        assert delivered + rest == every_token(lengths, packing), new_world
        for it in resumed:
            it.close()
    fresh.shutdown()


def test_killed_reader_under_packing_loses_no_token(ray_session, corpus):
    # Acknowledged on receipt (ack_interval_s=0): what rank 1's loop received is recorded.
    folder, lengths = corpus
    packing = Packing(column="tokens", seq_len=24)
    loader = make_loader(folder, packing, batch_size=2, ack_interval_s=0, batches_per_object=1)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    first = run_lockstep(its, steps=2)
    end_rank_watch(its[1])  # a real reader actor death, mid-epoch for rank 1
    # Rank 1's loop may still receive batches fetched before the death (acknowledged on
    # receipt, so they count as delivered), then sees its reader die.
    late = []
    with pytest.raises(Exception):  # noqa: B017 - rank 1's loop sees its reader die
        batches = iter(its[1])
        for _ in range(len(its[1]) + 1):
            late.append(next(batches))
    more = run_lockstep([its[0]], steps=2)  # rank 0 goes on
    received = first[0] + first[1] + late + more[0]
    delivered = tokens_of(received, packing)
    # A restarted group resumes from rank 0's state (rank 1 is noticed lost).
    done = threading.Event()
    state: dict = {}

    def checkpoint():
        state.update(its[0].state_dict())
        done.set()

    threading.Thread(target=checkpoint, daemon=True).start()
    assert done.wait(60), "state_dict after the reader's death"
    restarted = [
        loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)
    ]
    for it in restarted:
        it.load_state_dict(state)
    rest = tokens_of([b for rank in run_lockstep(restarted) for b in rank], packing)
    whole = every_token(lengths, packing)
    total = delivered + rest
    assert set(total) == set(whole), "lost tokens"
    # Repeats are bounded by what rank 1 received without its acknowledgement recorded:
    # with per-batch acknowledgements, none.
    assert sum(total.values()) - sum(whole.values()) <= 0
    loader.shutdown()


def test_packing_a_weighted_mix_delivers_each_picked_document_once_per_epoch(ray_session, tmp_path):
    """Packing over a `MixedSource` (0.7/0.3, one source upsampled, one downsampled): per
    epoch, the tokens delivered under each document id (a position of the epoch's mix) are
    exactly that position's document, so every pick arrives once, per-source counts exact."""
    from rayshard.sources.mixed import MixedSource

    a, _ = write_documents(tmp_path / "a", docs=30, seed=1, files=2)
    b, _ = write_documents(tmp_path / "b", docs=60, seed=2, files=2)
    source = MixedSource(
        [ParquetSource(a), ParquetSource(b)], [0.7, 0.3], samples_per_epoch=80, split_rows=16
    )
    packing = Packing(column="tokens", seq_len=40)
    loader = Loader(source, name=unique_name("packmix"), batch_size=4, seed=5, packing=packing)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    for epoch in range(2):
        batches = [b for rank in run_lockstep(its) for b in rank]
        picked = pa.Table.from_batches(
            list(source.for_epoch(epoch, 5).read(0, 80, ["tokens", "_source"]))
        )
        assert Counter(picked["_source"].to_pylist()) == Counter({0: 56, 1: 24})
        got: dict[int, dict[int, int]] = {}
        for batch in batches:
            real = batch["document_ids"] >= 0
            for doc, pos, token in zip(
                batch["document_ids"][real], batch["position_ids"][real], batch["tokens"][real]
            ):
                assert int(pos) not in got.setdefault(int(doc), {}), (epoch, doc, pos)
                got[int(doc)][int(pos)] = int(token)
        expected = {
            p: dict(enumerate(tokens)) for p, tokens in enumerate(picked["tokens"].to_pylist())
        }
        assert got == {p: d for p, d in expected.items() if d}
    loader.shutdown()


@pytest.mark.parametrize("consumer_reads", [False, True])
def test_a_null_token_list_reaches_the_loop_as_a_data_error_naming_the_rank(
    ray_session, tmp_path, consumer_reads
):
    """The coordinator counts tokens when an epoch starts; its `DataError` arrives as the
    README says: itself, not Ray's `RayTaskError`, naming loader, rank and epoch."""
    tokens = pa.array([[1] * 5, None, [3] * 3], pa.list_(pa.int32()))
    pq.write_table(pa.table({"tokens": tokens}), tmp_path / "part.parquet")
    loader = Loader(
        ParquetSource(str(tmp_path)),
        name=unique_name("null"),
        batch_size=2,
        packing=Packing(column="tokens", seq_len=4),
        consumer_reads=consumer_reads,
    )
    iterator = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    try:
        with pytest.raises(DataError) as caught:
            list(iterator)
        assert type(caught.value) is DataError, type(caught.value).__mro__
        message = str(caught.value)
        where = rf"loader '{loader.name}:\w+', data-parallel rank 0, epoch 0: sample 1 "
        assert re.match(where, message), message
        assert "'tokens'" in message and "Traceback" not in message
    finally:
        iterator.close()
        loader.shutdown()
