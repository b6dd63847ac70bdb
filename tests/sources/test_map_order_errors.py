"""Map-style sources: non-contiguous shard orders at scale, errors that name the sample and
key, loader ids that tell datasets apart, and the values the probes must understand."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import Subset, TensorDataset

from rayshard.errors import ConfigError, DataError
from rayshard.sources._runs import IndexRuns
from rayshard.sources.base import TableSource
from rayshard.sources.ray_data import RayDataSource
from rayshard.sources.torch_map import CombinedDataset, ShardedDataset, TorchMapSource


class Fn:
    """A map-style dataset of `n` samples `f(i)`."""

    def __init__(self, n, f):
        self.n, self.f = n, f

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(f"list index {i} out of range")
        return self.f(i)


class Stride(ShardedDataset):
    """ESPnet3's stride shards: shard k holds k, k + S, k + 2S, ... (one run per sample)."""

    def __init__(self, n, total_shards, kind="range"):
        self.n, self.total_shards, self.kind = n, total_shards, kind

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"id": int(i)}

    def shard(self, k):
        if self.kind == "tensor":
            return torch.arange(k, self.n, self.total_shards)
        return range(k, self.n, self.total_shards)


def ids(batches):
    return [v for b in batches for v in b.column("id").to_pylist()]


def test_a_large_strided_layout_reads_exact_rows_and_pickles_small():
    n, shards = 200_003, 7
    source = TorchMapSource(Stride(n, shards), batch_rows=512)
    model = [i for k in range(shards) for i in range(k, n, shards)]  # the plain list order
    assert source.layout().file_rows == tuple(len(range(k, n, shards)) for k in range(shards))
    rng = random.Random(0)
    cuts = [(0, 0), (0, 1), (n - 1, n), (n - 300, n), (0, 600)]
    cuts += [(a, min(a + rng.randint(0, 700), n)) for a in rng.sample(range(n), 40)]
    offsets = source.layout().offsets
    cuts += [(offsets[k] - 3, offsets[k] + 3) for k in range(1, shards)]  # across shards
    again = pickle.loads(pickle.dumps(source))
    for a, b in cuts:
        assert ids(source.read(a, b)) == model[a:b], (a, b)
        assert ids(again.read(a, b)) == model[a:b], (a, b)
    assert list(source.indices(n - 5, n)) == model[n - 5 :]
    # one (start, end) tuple per sample pickled at ~23 bytes a sample; numpy runs at ~5
    assert len(pickle.dumps(source)) < 8 * n


def test_permuted_and_combined_shards_read_in_their_order():
    perm = np.random.default_rng(1).permutation(5000)

    class Perm(Stride):
        def shard(self, k):
            return Subset(self, perm[k::3])

    combined = CombinedDataset([Perm(5000, 3), Stride(300, 3, "tensor")])
    source = TorchMapSource(combined, batch_rows=64)
    model = [j for k in range(3) for j in [*perm[k::3].tolist(), *range(5000 + k, 5300, 3)]]
    assert [combined[i]["id"] for i in source.indices(0, 5300)] == [
        i if i < 5000 else i - 5000 for i in model
    ]
    assert ids(source.read(1660, 1680)) == [i if i < 5000 else i - 5000 for i in model[1660:1680]]


def test_a_failing_getitem_is_a_data_error_naming_the_index_with_its_cause():
    def load(i):
        if i == 7:
            raise RuntimeError("cannot decode audio")
        return {"x": i}

    source = TorchMapSource(Fn(10, load), batch_rows=4)
    with pytest.raises(DataError, match=r"Fn\[7\] raised RuntimeError: cannot decode") as info:
        list(source.read(0, 10))
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(ConfigError, match=r"_Longer\[9\] raised IndexError") as info:
        TorchMapSource(_Longer(8, lambda i: {"x": i}))
    assert isinstance(info.value.__cause__, IndexError)


class _Longer(Fn):
    """`__len__` says two more samples than `__getitem__` has."""

    def __len__(self):
        return self.n + 2


PROBES = {0, 5, 9}  # of 10 samples: first, middle, last


@pytest.mark.parametrize(
    "probed, later, ragged, needle",
    [
        (np.arange(3), np.array([0.5, 1.5, 2.5]), (), r"holds an array of float64 shaped \(3,\)"),
        (5, 2**64, (), r"holds int 18446744073709551616, which does not convert to int64"),
        (True, 1, (), r"holds int 1, which does not convert to bool"),
        (np.arange(2), np.zeros((2, 2)), ("x",), r"holds an array of float64 shaped \(2, 2\)"),
    ],
)
def test_a_value_of_another_type_is_a_data_error_naming_sample_key_and_types(
    probed, later, ragged, needle
):
    source = TorchMapSource(
        Fn(10, lambda i: {"x": probed if i in PROBES else later}), batch_rows=4, ragged=ragged
    )
    with pytest.raises(DataError, match=r"Fn\[1\]: key 'x' " + needle) as info:
        list(source.read(0, 10))
    assert "the type the probe samples gave it" in str(info.value)
    assert "convert it in __getitem__" in str(info.value)


def test_probe_values_that_make_no_column_are_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"key 'x' of the probe samples.*Fn\[5\]: str 'a'"):
        TorchMapSource(Fn(10, lambda i: {"x": 1 if i == 0 else "a"}))
    with pytest.raises(ConfigError, match=r"key 'x'.*array of object"):
        TorchMapSource(Fn(3, lambda i: {"x": np.array([1, "a"], dtype=object)}))
    with pytest.raises(ConfigError, match="keys must be strings"):
        TorchMapSource(Fn(3, lambda i: {0: i}))
    with pytest.raises(ConfigError, match=r"Fn\[1\] lacks the keys \['y'\]"):
        TorchMapSource(Fn(3, lambda i: {"x": i} if i == 1 else {"x": i, "y": i}))


def test_describe_tells_orders_schemas_and_subsets_apart_and_keeps_the_plain_case():
    class Contiguous(Stride):
        def shard(self, k):
            return range(10 * k, 10 * k + 10)

    stride, plain = TorchMapSource(Stride(40, 4)), TorchMapSource(Contiguous(40, 4))
    assert plain.describe() == "Contiguous (40 samples, 4 shards)"
    assert stride.describe().startswith("Stride (40 samples, 4 shards, order ")
    assert TorchMapSource(Stride(40, 4)).describe() == stride.describe()  # deterministic

    a = TableSource(pa.table({"tokens": [[1, 2]] * 4, "label": [0, 1, 0, 1]}))
    b = TableSource(pa.table({"image": [b"x"] * 4}))
    assert a.describe() == "in-memory table (4 rows; tokens: list<item: int64>, label: int64)"
    assert a.describe() != b.describe()

    base = TensorDataset(torch.arange(100))
    head, tail = (
        TorchMapSource(Subset(base, range(50))),
        TorchMapSource(Subset(base, range(50, 100))),
    )
    assert head.describe() == "Subset (50 samples)"
    assert tail.describe().startswith("Subset (50 samples, indices ")
    nested = TorchMapSource(Subset(Subset(base, range(50, 100)), range(50)))
    assert nested.describe() == tail.describe()  # the same samples: the same id


def test_a_ray_dataset_is_described_by_rows_and_schema_not_blocks():
    source = RayDataSource.__new__(RayDataSource)  # as materialize() leaves it, without Ray
    source._refs, source._offsets, source._columns = [None] * 3, (0, 2, 4, 6), None
    source._schema = pa.schema([("id", pa.int64())])
    assert source.describe() == "ray.data.Dataset (6 rows; id: int64)"


def test_numpy_datetimes_and_durations_keep_their_types():
    start = np.datetime64("2024-01-01T00:00:00", "ns")
    source = TorchMapSource(
        Fn(3, lambda i: {"t": start + i, "d": np.timedelta64(i, "ns")}), batch_rows=2
    )
    assert source.schema().field("t").type == pa.timestamp("ns")
    assert source.schema().field("d").type == pa.duration("ns")
    table = pa.Table.from_batches(list(source.read(0, 3)))
    assert table["t"].cast(pa.int64()).to_pylist() == [start.astype(np.int64) + i for i in range(3)]
    assert table["d"].cast(pa.int64()).to_pylist() == [0, 1, 2]


class _MyTensor(torch.Tensor):
    pass


def test_torch_sizes_tensor_subclasses_and_tensor_shards():
    image = torch.zeros(3, 4, 5)
    source = TorchMapSource(
        Fn(4, lambda i: {"size": image[: i + 1].shape, "x": torch.ones(2).as_subclass(_MyTensor)})
    )
    assert source.schema().field("size").type == pa.list_(pa.int64())
    table = pa.Table.from_batches(list(source.read(0, 4)))
    assert table["size"].to_pylist()[1] == [2, 4, 5] and table["x"].to_pylist()[0] == [1.0, 1.0]
    tensors = TorchMapSource(Stride(10, 2, "tensor"))
    assert ids(tensors.read(0, 10)) == [0, 2, 4, 6, 8, 1, 3, 5, 7, 9]


def test_a_key_none_in_the_probes_is_probed_further_or_refused_at_start_up():
    source = TorchMapSource(Fn(10, lambda i: {"x": None if i in (0, 5, 9) else i, "y": i}))
    assert source.schema().field("x").type == pa.int64()
    table = pa.Table.from_batches(list(source.read(0, 10)))
    assert table["x"].to_pylist() == [None, 1, 2, 3, 4, None, 6, 7, 8, None]
    lists = TorchMapSource(Fn(10, lambda i: {"x": [] if i in (0, 5, 9) else [i]}))
    assert lists.schema().field("x").type == pa.list_(pa.int64())
    with pytest.raises(ConfigError, match=r"key 'x' of Fn is None or empty in all 32 samples"):
        TorchMapSource(Fn(1000, lambda i: {"x": None, "y": i}))
    assert TorchMapSource(
        Fn(1000, lambda i: {"x": None, "y": i}), columns=["y"]
    ).schema().names == ["y"]


def test_combination_message_and_numpy_total_shards():
    class Plain(Fn):
        total_shards = 2

        def shard(self, k):
            return range(2 * k, 2 * k + 2)

    with pytest.raises(ConfigError, match="Make the others ShardedDataset subclasses"):
        CombinedDataset([Stride(4, 2), Plain(4, lambda i: {"id": i})])
    numpy_shards = Stride(4, np.int64(2))
    source = TorchMapSource(numpy_shards)
    assert source.total_shards == 2 and type(source.total_shards) is int
    assert ids(TorchMapSource(CombinedDataset([numpy_shards])).read(0, 4)) == [0, 2, 1, 3]


def test_an_order_taken_past_its_end_is_cut_there():
    """`TorchMapSource.indices` (public) of a range past the end gives what is there, as
    slicing does, not an IndexError."""
    runs = IndexRuns(np.array([[0, 3], [10, 12]], dtype=np.int64))
    assert list(runs.indices(0, 6)) == [0, 1, 2, 10, 11]
    assert list(runs.indices(4, 9)) == [11] and list(runs.indices(5, 7)) == []
