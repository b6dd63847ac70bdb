"""Map-style datasets as a source, ESPnet3's ShardedDataset and CombinedDataset rules."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import Dataset, Subset

from rayshard.core.sharding import assign
from rayshard.errors import ConfigError, DataError
from rayshard.plan import PlanConfig
from rayshard.plan import intervals as iv
from rayshard.sources.torch_map import CombinedDataset, ShardedDataset, TorchMapSource


class Plain(Dataset):
    def __init__(self, n, base=0):
        self.n, self.base = n, base

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        j = self.base + i
        return {
            "id": j,
            "feat": torch.arange(j % 3 + 1, dtype=torch.float32),
            "grid": np.full((2, j % 2 + 1), j, dtype=np.int16),
            "text": f"t{j}",
            "score": np.float32(j / 2),
        }


class Sharded(ShardedDataset, Dataset):
    """Shard i holds the samples with index % total_shards == i (not contiguous)."""

    def __init__(self, n, total_shards=4, dist_world_size=None, base=0):
        self.n, self.base = n, base
        self.total_shards, self.dist_world_size = total_shards, dist_world_size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"id": self.base + i, "x": float(i)}

    def shard(self, shard_idx):
        return range(shard_idx, self.n, self.total_shards)


def ids(batches):
    return [v for b in batches for v in b.column("id").to_pylist()]


def test_rows_become_record_batches():
    source = TorchMapSource(Plain(10), batch_rows=4)
    schema = source.schema()
    assert schema.names == ["id", "feat", "grid", "text", "score"]
    assert schema.field("feat").type == pa.list_(pa.float32())
    assert schema.field("grid").type == pa.list_(pa.list_(pa.int16()))
    batches = list(source.read(2, 9))
    assert [b.num_rows for b in batches] == [4, 3]
    assert ids(batches) == list(range(2, 9))
    row = batches[0].to_pylist()[0]
    assert row["feat"] == [0.0, 1.0, 2.0] and row["grid"] == [[2], [2]] and row["text"] == "t2"
    assert all(b.schema == schema for b in batches)
    assert source.layout().num_samples == 10 and source.layout().file_rows is None
    projected = TorchMapSource(Plain(10), columns=["id", "text"])
    assert projected.schema().names == ["id", "text"]
    assert list(projected.read(0, 2))[0].schema.names == ["id", "text"]
    assert ids(pickle.loads(pickle.dumps(source)).read(0, 10)) == list(range(10))


def test_bad_datasets():
    with pytest.raises(ConfigError, match="not a map-style dataset"):
        TorchMapSource(iter([]))
    with pytest.raises(ConfigError, match="has no samples"):
        TorchMapSource(Plain(0))
    with pytest.raises(ConfigError, match=r"available keys are \['id', 'feat'"):
        TorchMapSource(Plain(3), columns=["nope"])
    with pytest.raises(ConfigError, match="samples must be dicts"):
        TorchMapSource([1, 2, 3])

    class Drifting(Plain):
        def __getitem__(self, i):
            return {"id": i} if i < 2 else {"id": i, "extra": 1}

    source = TorchMapSource(Drifting(4), batch_rows=1)
    with pytest.raises(DataError, match=r"Drifting\[2\] has keys"):
        list(source.read(0, 4))


def test_sharded_dataset_layout_follows_the_shards():
    source = TorchMapSource(Sharded(10, total_shards=4))
    assert source.layout().file_rows == (3, 3, 2, 2)
    assert source.splits() == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert ids(source.read(0, 3)) == [0, 4, 8]
    assert ids(source.read(0, 10)) == [0, 4, 8, 1, 5, 9, 2, 6, 3, 7]


def test_file_policy_over_shards_is_espnet3_rotation():
    dataset = Sharded(40, total_shards=8, dist_world_size=4)
    source = TorchMapSource(dataset)
    config = PlanConfig(total_shards=8, rotation="stride", expected_world_size=4)
    for epoch in range(4):
        got = assign("file", config, source, 4, epoch)
        seen = []
        for rank in range(4):
            shard = (epoch * 4 + rank) % 8  # ESPnet3's formula
            read = [i for a, b in got.ranges(rank) for i in ids(source.read(a, b))]
            assert read == list(dataset.shard(shard))
            seen += read
        assert len(set(seen)) == 20  # half the data per epoch, no overlap
    with pytest.raises(ConfigError, match="built for dist_world_size=4 but the job runs"):
        assign("file", config, source, 2, 0)


def test_coverage_check_catches_overlap_and_gaps():
    class Overlapping(Sharded):
        def shard(self, shard_idx):
            return list(range(0, 6)) if shard_idx == 0 else list(range(5, 10))

    class Gappy(Sharded):
        def shard(self, shard_idx):
            return range(shard_idx * 5, shard_idx * 5 + 4)

    class Repeating(Sharded):  # a sample twice within one shard: read twice every epoch
        def shard(self, shard_idx):
            return [0, 1, 2, 3, 1] if shard_idx == 0 else list(range(4, 10))

    with pytest.raises(ConfigError, match="shards 0 and 1 overlap"):
        TorchMapSource(Overlapping(10, total_shards=2))
    with pytest.raises(ConfigError, match=r"shard 0 lists samples \[1, 2\) twice"):
        TorchMapSource(Repeating(10, total_shards=2))
    with pytest.raises(ConfigError, match="add up to 8, not to the 10 samples"):
        TorchMapSource(Gappy(10, total_shards=2))

    class Unset(Sharded):
        def __init__(self):
            super().__init__(4)
            del self.total_shards

    with pytest.raises(ConfigError, match="must set total_shards"):
        TorchMapSource(Unset())


def test_subset_and_arrays_as_shards():
    class SubsetShards(Sharded):
        def shard(self, shard_idx):
            return Subset(self, np.arange(shard_idx, self.n, 2))

    source = TorchMapSource(SubsetShards(6, total_shards=2))
    assert ids(source.read(0, 6)) == [0, 2, 4, 1, 3, 5]


def test_combined_dataset_rules():
    with pytest.raises(ConfigError, match="all must be: 0: Sharded \\(sharded\\); 1: Plain"):
        CombinedDataset([Sharded(8), Plain(4)])
    with pytest.raises(ConfigError, match="share total_shards and dist_world_size"):
        CombinedDataset([Sharded(8, total_shards=4), Sharded(8, total_shards=2)])
    with pytest.raises(ConfigError, match="share total_shards"):
        CombinedDataset([Sharded(8, dist_world_size=2), Sharded(8, dist_world_size=4)])
    with pytest.raises(ConfigError, match="different sample keys"):
        CombinedDataset([Plain(3), _Keys(3)])
    with pytest.raises(ConfigError, match="at least one"):
        CombinedDataset([])


class _Keys(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"id": i}


def test_combined_sharded_dataset():
    combined = CombinedDataset([Sharded(10, total_shards=2), Sharded(6, total_shards=2, base=10)])
    assert len(combined) == 16 and combined[12]["id"] == 12
    assert list(combined.shard(1)) == [
        (1, 2),
        (3, 4),
        (5, 6),
        (7, 8),
        (9, 10),
        (11, 12),
        (13, 14),
        (15, 16),
    ]
    source = TorchMapSource(combined)
    assert source.layout().file_rows == (8, 8)
    assert ids(source.read(0, 8)) == [0, 2, 4, 6, 8, 10, 12, 14]
    nested = CombinedDataset([combined, Sharded(4, total_shards=2, base=16)])
    assert TorchMapSource(nested).layout().num_samples == 20
    plain = TorchMapSource(CombinedDataset([_Keys(3), _Keys(4)]))
    assert plain.layout().file_rows is None
    assert ids(plain.read(0, 7)) == [0, 1, 2, 0, 1, 2, 3]


def test_data_policy_over_a_map_dataset_covers_it():
    source = TorchMapSource(Plain(23), batch_rows=5)
    for world in (1, 2, 3, 5):
        got = assign("data", PlanConfig(), source, world, 1)
        seen = [i for r in range(world) for a, b in got.ranges(r) for i in ids(source.read(a, b))]
        assert sorted(seen) == list(range(23))
        assert list(iv.indices(iv.normalize(got.plan.delivered()))) == list(range(23))


class ZeroRankAndEmpty(Dataset):
    """Labels as 0-d tensors and arrays (`torch.tensor(label)`), and a key of empty arrays."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return (torch.ones(3) * i, torch.tensor(i), np.array(i * 0.5), np.zeros((0,), np.int32))


def test_zero_rank_tensors_are_scalars_and_empty_arrays_a_fixed_shape_of_zero():
    source = TorchMapSource(ZeroRankAndEmpty(), names=["x", "y", "w", "none"], batch_rows=4)
    schema = source.schema()
    assert schema.field("y").type == pa.int64() and schema.field("w").type == pa.float64()
    assert schema.field("none").type == pa.list_(pa.int32(), 0)
    table = pa.Table.from_batches(list(source.read(0, 6)))
    assert table["y"].to_pylist() == list(range(6))
    assert table["w"].to_pylist() == [i * 0.5 for i in range(6)]
    assert table["none"].to_pylist() == [[]] * 6
    assert table["x"].to_pylist()[5] == [5.0, 5.0, 5.0]


class TypedScalars(torch.utils.data.Dataset):
    def __len__(self):
        return 5

    def __getitem__(self, i):
        return {
            "label": torch.tensor(i, dtype=torch.int8),
            "weight": torch.tensor(0.1 * i, dtype=torch.float32),
            "half": np.float16(i / 4),
            "count": i,  # a Python int: Arrow's int64
            "bf": torch.full((2,), i, dtype=torch.bfloat16),
        }


def test_scalars_keep_their_dtype_and_bfloat16_is_read_as_float32():
    source = TorchMapSource(TypedScalars(), batch_rows=2)
    types = {f.name: f.type for f in source.schema()}
    assert types == {
        "label": pa.int8(),
        "weight": pa.float32(),
        "half": pa.float16(),
        "count": pa.int64(),
        "bf": pa.list_(pa.float32(), 2),
    }
    table = pa.Table.from_batches(list(source.read(0, 5)))
    assert table.schema.field("weight").type == pa.float32()
    assert table["label"].to_pylist() == list(range(5))
    assert table["weight"].to_pylist() == [np.float32(0.1 * i).item() for i in range(5)]
    assert table["bf"].to_pylist()[3] == [3.0, 3.0]
