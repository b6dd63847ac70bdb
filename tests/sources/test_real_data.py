"""Real data through a real `Loader` on the local Ray, default torch format: files written
by polars, duckdb, pandas (hive partitions) and fastparquet, variable-length token lists,
strings, nulls, partitions and filters, map-style datasets of fixed-shape tensors."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import pytest
import torch

from rayshard.data.columns import Padding
from rayshard.errors import ConfigError, DataError
from rayshard.loader import Loader
from rayshard.sources.arrow_files import ArrowFileSource
from rayshard.sources.parquet import ParquetSource
from rayshard.sources.torch_map import TorchMapSource
from tests.sources.real_data import (
    Images,
    Pairs,
    Shapes,
    epoch,
    indices,
    token_rows,
    unique_name,
    write_duckdb,
    write_polars,
)

pytestmark = pytest.mark.ray


@pytest.fixture
def mixed(tmp_path):
    """polars (large_list<int32>, int64 id) then duckdb (list<int32>, int32 id): 120 rows."""
    write_polars(tmp_path / "a-polars.parquet", range(0, 70))
    write_duckdb(tmp_path / "b-duckdb.parquet", range(70, 120))
    expected = dict(zip(range(0, 70), token_rows(range(0, 70))))
    expected.update(zip(range(70, 120), token_rows(range(70, 120))))
    return tmp_path, expected


def check_padded(batch, expected, pad=0, max_length=None, multiple=None):
    ids = batch["id"].tolist()
    rows = [expected[i][:max_length] if max_length else expected[i] for i in ids]
    width = max(len(r) for r in rows)
    if multiple:
        width = -(-width // multiple) * multiple
    tokens, mask, lengths = batch["tokens"], batch["tokens_mask"], batch["tokens_lengths"]
    assert isinstance(tokens, torch.Tensor) and tokens.dtype == torch.int32
    assert tokens.shape == (len(ids), width) and mask.dtype == torch.bool
    assert lengths.tolist() == [len(r) for r in rows]
    assert mask.tolist() == [[j < len(r) for j in range(width)] for r in rows]
    assert tokens.tolist() == [r + [pad] * (width - len(r)) for r in rows]


def test_polars_and_duckdb_lists_padded_under_torch(ray_session, mixed, caplog):
    folder, expected = mixed
    with caplog.at_level(logging.INFO, logger="rayshard.sources._catalog"):
        source = ParquetSource(folder)
    assert "promoted" in caplog.text and "'id'" in caplog.text and "'tokens'" in caplog.text
    loader = Loader(source, name=unique_name("mixed"), batch_size=16, shuffle=True, seed=3)
    batches = epoch(loader, world=2)
    assert sorted(indices(batches)) == list(range(120))  # every sample once
    for batch in batches:
        assert batch["id"].dtype == torch.int64
        assert batch["text"] == [f"doc {i}" for i in batch["id"].tolist()]
        check_padded(batch, expected)
    loader.shutdown()


def test_padding_under_dynamic_policy_and_shuffled_leases(ray_session, mixed):
    folder, expected = mixed
    loader = Loader(
        ParquetSource(folder),
        name=unique_name("dynpad"),
        batch_size=16,
        policy="dynamic",
        shuffle=True,
        equal_steps=False,
    )
    batches = epoch(loader, world=2)
    assert sorted(indices(batches)) == list(range(120))
    for batch in batches:
        check_padded(batch, expected)
    loader.shutdown()


def test_arrow_files_promoted_partitioned_and_filtered(tmp_path):
    for split, type_ in (("train", pa.int32()), ("test", pa.int64())):
        (tmp_path / f"split={split}").mkdir()
        table = pa.table({"id": pa.array(range(10), type_), "t": [[1] * i for i in range(10)]})
        feather.write_feather(table, tmp_path / f"split={split}" / "0.arrow")
    source = ArrowFileSource(tmp_path, filter=(pc.field("split") == "test") & (pc.field("id") > 6))
    assert source.schema().field("id").type == pa.int64()
    (batch,) = list(source.read(0, 3))
    assert batch.column("id").to_pylist() == [7, 8, 9]
    assert batch.column("split").to_pylist() == ["test"] * 3


def test_max_length_truncates_or_refuses(ray_session, mixed):
    folder, expected = mixed
    padding = {"tokens": Padding(pad_value=-1, max_length=50, pad_to_multiple=8)}
    loader = Loader(ParquetSource(folder), name=unique_name("trunc"), batch_size=8, padding=padding)
    batches = epoch(loader)
    assert indices(batches) == list(range(120))
    for batch in batches:
        check_padded(batch, expected, pad=-1, max_length=50, multiple=8)
    loader.shutdown()
    refuse = {"tokens": Padding(max_length=50, truncate=False)}
    loader = Loader(ParquetSource(folder), name=unique_name("refuse"), batch_size=8, padding=refuse)
    with pytest.raises(DataError, match=r"'tokens': sample \d+ has \d+ elements.*max_length=50"):
        epoch(loader)
    loader.shutdown()


def test_nested_jagged_tensors(ray_session, mixed):
    folder, expected = mixed
    loader = Loader(
        ParquetSource(folder, columns=["id", "tokens"]),
        name=unique_name("nested"),
        batch_size=10,
        padding={"tokens": Padding(nested=True, max_length=100)},
    )
    batches = epoch(loader)
    assert indices(batches) == list(range(120))
    for batch in batches:
        assert batch["tokens"].is_nested and "tokens_offsets" not in batch
        rows = [t.tolist() for t in batch["tokens"].unbind()]
        assert rows == [expected[i][:100] for i in batch["id"].tolist()]
    loader.shutdown()


def test_collate_fn_under_numpy_and_arrow(ray_session, mixed):
    folder, _ = mixed
    loader = Loader(ParquetSource(folder), name=unique_name("collate"), batch_size=32)
    sizes = epoch(loader, batch_format="numpy", collate_fn=lambda b: len(b["_index"]))
    assert sizes == [32, 32, 32, 24]
    for b in epoch(loader, batch_format="numpy"):
        assert b["tokens"].ndim == 2 and b["tokens_mask"].shape == b["tokens"].shape
        assert (b["tokens_mask"].sum(axis=1) == b["tokens_lengths"]).all()
        assert b["text"].dtype == object and b["text"][0] == f"doc {b['id'][0]}"
    records = epoch(loader, batch_format="arrow", collate_fn=lambda rb: rb.to_pydict())
    assert [len(r["id"]) for r in records] == [32, 32, 32, 24]
    assert records[0]["text"][0] == "doc 0" and len(records[0]["tokens_mask"][0]) > 0
    with pytest.raises(TypeError, match="collate_fn='x' is not callable"):
        loader.iterator(world_rank=0, world_size=1, batch_format="numpy", collate_fn="x")
    loader.shutdown()


def test_collate_fn_runs_in_the_loops_thread_before_the_batch_counts_as_received(
    ray_session, mixed
):
    """Under numpy and arrow the `collate_fn` runs as the loop asks for a batch, in the
    loop's thread, before the batch counts as received (and so before its acknowledgement
    can go out): a `collate_fn` that records the batch somewhere durable has it recorded
    before the coordinator may count it delivered (the elastic experiment's audit)."""
    folder, _ = mixed
    loader = Loader(ParquetSource(folder), name=unique_name("collate_order"), batch_size=32)
    for fmt in ("numpy", "arrow"):
        calls, made = [], {}

        def record(batch, calls=calls, made=made):
            calls.append((threading.current_thread(), made["it"].stats()["batches_received"]))
            return batch

        it = loader.iterator(world_rank=0, world_size=1, batch_format=fmt, collate_fn=record)
        made["it"] = it
        for received, _ in enumerate(it):
            assert calls[-1] == (threading.current_thread(), received), fmt
        assert len(calls) == 4, fmt
    loader.shutdown()


def test_hive_partitions_filtered_on_the_driver(ray_session, tmp_path):
    pd = pytest.importorskip("pandas")
    ids = np.arange(200)
    frame = pd.DataFrame(
        {"id": ids, "x": ids * 0.5, "split": np.where(ids % 4 == 0, "test", "train")}
    )
    frame.to_parquet(tmp_path / "hive", partition_cols=["split"], index=False, row_group_size=25)
    everything = ParquetSource(tmp_path / "hive")
    assert everything.schema().names == ["id", "x", "split"]
    train = (pc.field("split") == "train") & (pc.field("id") >= 150)
    source = ParquetSource(tmp_path / "hive", filter=train)
    want = [i for i in ids if i % 4 and i >= 150]
    assert source.layout().num_samples == len(want)
    # train's 6 row groups of 25: statistics rule out 0-3, row group 4 keeps 13 rows
    assert [(g, b - a) for _, g, a, b in source.row_groups()] == [(4, 13), (5, 25)]
    (path,) = [p for p in everything._files if "split=train" in p.path]
    fs = everything._filesystems[0]
    assert source._prune_chunks(fs, path.path, train, {"split": "train"}, 6) == [4, 5]
    loader = Loader(source, name=unique_name("hive"), batch_size=7)
    batches = epoch(loader, world=2)
    assert sorted(indices(batches)) == list(range(len(want)))
    assert sorted(i for b in batches for i in b["id"][~b["_padded"]].tolist()) == want
    assert {s for b in batches for s in b["split"]} == {"train"}
    for b in batches:
        assert torch.equal(b["x"], b["id"] * 0.5)
    loader.shutdown()
    with pytest.raises(ConfigError, match="keeps no row"):
        ParquetSource(tmp_path / "hive", filter=pc.field("split") == "validation")
    plain = ParquetSource(tmp_path / "hive", partitioning=None)
    assert plain.schema().names == ["id", "x"] and plain.layout().num_samples == 200


def test_fastparquet_and_pandas_strings_and_nulls(ray_session, tmp_path):
    pd = pytest.importorskip("pandas")
    fastparquet = pytest.importorskip("fastparquet")
    first = pd.DataFrame({"id": np.arange(30), "text": [f"t{i}" for i in range(30)]})
    second = pd.DataFrame(
        {"id": np.arange(30, 50), "text": [None if i == 42 else f"t{i}" for i in range(30, 50)]}
    )
    fastparquet.write(str(tmp_path / "a.parquet"), first, write_index=False)
    second.to_parquet(tmp_path / "b.parquet", engine="pyarrow", index=False)
    loader = Loader(ParquetSource(tmp_path), name=unique_name("nulls"), batch_size=8)
    with pytest.raises(DataError, match=r"column 'text' is null at sample 42.*fill_null"):
        epoch(loader)
    loader.shutdown()
    loader = Loader(
        ParquetSource(tmp_path), name=unique_name("fill"), batch_size=8, fill_null={"text": "?"}
    )
    batches = epoch(loader)
    assert indices(batches) == list(range(50))
    texts = [t for b in batches for t in b["text"]]
    assert texts == [("?" if i == 42 else f"t{i}") for i in range(50)]
    loader.shutdown()


def test_unsafe_schema_difference_names_both_files(tmp_path):
    write_polars(tmp_path / "a.parquet", range(10))
    import polars as pl

    pl.DataFrame({"id": [10], "tokens": [[1.5]], "text": ["x"]}).write_parquet(
        tmp_path / "b.parquet"
    )
    with pytest.raises(ConfigError) as info:
        ParquetSource(tmp_path)
    message = str(info.value)
    assert "a.parquet" in message and "b.parquet" in message and "'tokens'" in message
    assert "no safe promotion" in message


def test_torch_map_fixed_shapes_and_tuples(ray_session):
    loader = Loader(TorchMapSource(Images()), name=unique_name("images"), batch_size=4)
    batches = epoch(loader, world=2)
    assert sorted(indices(batches)) == list(range(26))
    for b in batches:
        n = len(b["label"])
        assert b["img"].shape == (n, 2, 3) and b["vol"].shape == (n, 2, 2, 2)
        assert torch.equal(b["img"], b["label"].float()[:, None, None].expand(n, 2, 3))
        base = torch.arange(8, dtype=torch.int16).reshape(2, 2, 2)
        assert torch.equal(b["vol"], base + b["label"].to(torch.int16)[:, None, None, None])
    loader.shutdown()
    named = Loader(TorchMapSource(Pairs(), names=("x", "y")), name=unique_name("p"), batch_size=5)
    batches = epoch(named)
    assert indices(batches) == list(range(11))
    assert all(torch.equal(b["x"], b["y"].float()[:, None].expand(-1, 4)) for b in batches)
    named.shutdown()
    assert TorchMapSource(Pairs()).schema().names == ["0", "1"]
    assert TorchMapSource(Pairs(), ragged=["0"]).schema().field("0").type == pa.list_(pa.float32())
    shapes = TorchMapSource(Shapes())
    assert shapes.schema().field("a").type == pa.list_(pa.list_(pa.int64(), 2), 2)
    with pytest.raises(DataError, match=r"Shapes\[1\]\['a'\] has shape \(3, 2\).*\(2, 2\)"):
        list(shapes.read(0, 3))
    with pytest.raises(ConfigError, match=r"names=\('x',\) names 1"):
        TorchMapSource(Pairs(), names=("x",))


# Each damage both ways and each reading place both ways, not every pair: either damage
# becomes a `DataError` naming the file in the source (`_files.py`, the same in both
# places), and either place hands on whatever `DataError` its reading raised.
@pytest.mark.parametrize(
    "damage, consumer_reads",  # None: read in the loop's process; False: in the reader actor
    [("delete", None), ("corrupt", False)],
)
def test_data_error_is_catchable_in_the_loop(ray_session, tmp_path, damage, consumer_reads):
    write_polars(tmp_path / "a.parquet", range(30))
    write_polars(tmp_path / "b.parquet", range(30, 60))
    name = unique_name("damaged")
    loader = Loader(
        ParquetSource(tmp_path),
        name=name,
        batch_size=10,
        batches_per_object=1,
        consumer_reads=consumer_reads,
    )
    if damage == "delete":
        (tmp_path / "b.parquet").unlink()
    else:
        (tmp_path / "b.parquet").write_bytes(b"PAR1" + b"\0" * 100 + b"PAR1")
    it = loader.iterator(world_rank=0, world_size=1)
    received = []
    with pytest.raises(DataError) as info:
        for batch in it:
            received += batch["_index"].tolist()
    message = str(info.value)
    assert type(info.value) is DataError
    assert f"loader {name.split(':')[0]!r}" in message or name in message
    assert "rank 0" in message and "epoch 0" in message and "b.parquet" in message
    assert "reader traceback" in message
    assert received == list(range(30))  # what came before the failure, once
    assert it.stats()["samples_received"] == 30
    it.close()
    loader.shutdown()


def test_loader_columns_typo_fails_on_the_driver(ray_session, tmp_path):
    write_polars(tmp_path / "a.parquet", range(5))
    with pytest.raises(ConfigError, match=r"\['tokns'\] not in ParquetSource\(.*a\.parquet.*"):
        Loader(ParquetSource(tmp_path), name=unique_name("typo"), batch_size=2, columns=["tokns"])
    with pytest.raises(ConfigError, match=r"\['tokns'\] do not exist in the dataset \(.*a\.parq"):
        ParquetSource(tmp_path, columns=["id", "tokns"])
