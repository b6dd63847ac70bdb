"""`MixedSource` without Ray: bad weights and counts fail at construction (on the driver,
before any actor), columns agree up to a safe promotion, reads follow the mix, every
static policy plans it."""

from __future__ import annotations

import collections
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayshard.core.sharding import assign
from rayshard.data.batching import iter_rows_parallel
from rayshard.errors import ConfigError
from rayshard.plan import PlanConfig
from rayshard.sources import TableSource
from rayshard.sources.mixed import MixedSource
from rayshard.sources.parquet import ParquetSource


def two_sources():
    a = TableSource(pa.table({"x": pa.array(np.arange(10), pa.int32()), "lang": ["en"] * 10}))
    b = TableSource(pa.table({"x": np.arange(100, 104), "score": np.ones(4)}))
    return [a, b]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"weights": [0.7, -0.3]}, ["weights[1]=-0.3", "negative", "use 0"]),
        ({"weights": [0, 0.0]}, ["weights=[0, 0.0]", "all zero", "positive weight"]),
        ({"weights": [0.5, 0.3, 0.2]}, ["3 value(s)", "2 sources", "one weight per source"]),
        ({"weights": [1.0]}, ["1 value(s)", "2 sources"]),
        ({"weights": [float("inf"), 1]}, ["weights[0]=inf", "finite"]),
        ({"weights": [0.5, "0.5"]}, ["weights[1]='0.5'", "finite number"]),
        ({}, ["either weights=", "counts="]),
        ({"weights": [1, 1], "counts": [1, 1]}, ["not both"]),
        ({"counts": [3, -1]}, ["counts[1]=-1", "counts[1]>=0"]),
        ({"counts": [3, 1.5]}, ["counts[1]=1.5", "must be an integer >= 0"]),
        ({"counts": [0, 0]}, ["all zero"]),
        ({"counts": [1, 2, 3]}, ["counts=[1, 2, 3]", "one integer per source (2 sources)"]),
        ({"counts": [1, 1], "samples_per_epoch": 5}, ["samples_per_epoch=5", "drop one"]),
        ({"weights": [1, 1], "samples_per_epoch": 0}, ["samples_per_epoch=0", "epoch>=1"]),
    ],
)
def test_bad_weights_and_counts_are_config_errors_naming_value_and_fix(options, words):
    with pytest.raises(ConfigError) as error:
        MixedSource(two_sources(), **options)
    for word in words:
        assert word in str(error.value)


def test_an_empty_source_with_a_weight_is_refused():
    empty = TableSource(pa.table({"x": pa.array([], pa.int64())}))
    with pytest.raises(ConfigError, match=r"sources\[1\].*no rows.*weight 0"):
        MixedSource([two_sources()[0], empty], [0.5, 0.5])
    MixedSource([two_sources()[0], empty], [1, 0])  # weight 0: left out


def test_columns_default_to_the_shared_ones_and_promote_safely():
    source = MixedSource(two_sources(), [0.7, 0.3], samples_per_epoch=20)
    assert source.schema().names == ["x", "_source", "_source_index"]
    assert source.schema().field("x").type == pa.int64()  # int32 and int64
    with pytest.raises(ConfigError, match=r"'lang' is not in sources\[1\].*columns="):
        MixedSource(two_sources(), [0.7, 0.3], columns=["x", "lang"])
    clash = TableSource(pa.table({"x": ["a", "b"]}))
    with pytest.raises(ConfigError, match="column 'x' is int32 .* but string .* no safe"):
        MixedSource([two_sources()[0], clash], [1, 1])


def test_reads_follow_the_mix_of_the_epoch_and_seed():
    source = MixedSource(two_sources(), [0.7, 0.3], samples_per_epoch=20, split_rows=6)
    assert source.counts == (14, 6) and source.layout().num_samples == 20
    for epoch, seed in [(0, 0), (3, 9)]:
        table = pa.Table.from_batches(list(source.for_epoch(epoch, seed).read(2, 17)))
        kind, index = source.mix(seed).locate(epoch, 2, 17)
        assert table.column("_source").to_pylist() == kind.tolist()
        assert table.column("_source_index").to_pylist() == index.tolist()
        assert table.column("x").to_pylist() == np.where(kind == 0, index, 100 + index).tolist()


@pytest.mark.parametrize("policy", ["data", "file", "file_or_data", "off", "dynamic"])
def test_every_policy_plans_the_mixed_positions(policy):
    source = MixedSource(two_sources(), [0.7, 0.3], samples_per_epoch=20, split_rows=4)
    assignment = assign(policy, PlanConfig(batch_size=2), source, 2, epoch=1)
    if policy == "dynamic":
        covered = sorted(i for a, b in assignment.splits for i in range(a, b))
    else:
        covered = sorted(i for r in range(2) for a, b in assignment.ranges(r) for i in range(a, b))
    assert covered == sorted(list(range(20)) * (2 if policy == "off" else 1))


def test_a_zero_weight_leaves_a_source_out_with_a_warning(caplog):
    with caplog.at_level("WARNING", logger="rayshard.sources.mixed"):
        source = MixedSource(two_sources(), [1, 0], samples_per_epoch=12)
    assert source.counts == (12, 0)
    assert "sources[1]" in caplog.text and "no samples" in caplog.text


def test_readme_mixing_snippet_builds_its_source(tmp_path, monkeypatch):
    import pathlib
    import re

    import pyarrow.parquet as pq

    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### Mixing sources", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    build = snippet.split("loader = Loader(")[0]  # the Loader line needs Ray (tests/runtime)
    for name, rows in [("code", 70_000), ("docs", 50_000)]:
        (tmp_path / name).mkdir()
        table = pa.table({"tokens": [[1, 2]] * rows, name: np.zeros(rows)})
        pq.write_table(table, tmp_path / name / "part-0.parquet")
    monkeypatch.chdir(tmp_path)
    scope = {"ParquetSource": ParquetSource}
    exec(build, scope)  # noqa: S102 - the README's own code
    assert scope["mix"].counts == (70_000, 30_000)
    assert scope["mix"].schema().names == ["tokens", "_source", "_source_index"]


class _CountedParquet(ParquetSource):
    """A real ParquetSource that counts its reads per (start, end) and makes each one
    last a little, so reading threads overlap as they do on real row groups."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads: collections.Counter = collections.Counter()
        self._count_lock = threading.Lock()

    def read(self, start, end, columns=None):
        with self._count_lock:
            self.reads[(start, end)] += 1
        threading.Event().wait(0.02)  # a slower decode; nothing waits on the clock
        return super().read(start, end, columns)


def test_reading_threads_decode_each_split_of_a_mixed_source_once(tmp_path):
    """Pieces smaller than a row group read on several threads at once share the split
    they need: one thread decodes it, the others wait for it (they each decoded it)."""
    for name, offset in (("a", 0), ("b", 1000)):
        ids = np.arange(offset, offset + 256)
        pq.write_table(pa.table({"x": ids}), tmp_path / f"{name}.parquet", row_group_size=64)
    sources = [_CountedParquet(str(tmp_path / f"{n}.parquet")) for n in "ab"]
    mix = MixedSource(sources, [0.5, 0.5], split_rows=8, columns=["x"])
    pieces = mix.splits()
    with ThreadPoolExecutor(4) as pool:
        read = iter_rows_parallel(mix.for_epoch(0, 0), pieces, ["x"], pool, 4)
        rows = pa.Table.from_batches(list(read))
    decodes = [dict(source.reads) for source in sources]
    alone = pa.Table.from_batches(list(mix.for_epoch(0, 0).read(0, mix.layout().num_samples)))
    assert rows.column("x").to_pylist() == alone.column("x").to_pylist()
    for counts in decodes:
        assert counts and max(counts.values()) == 1, counts


def test_dynamic_pieces_decode_each_row_group_once_by_default(tmp_path):
    """By default pieces follow the widest row groups (5000 rows, 10000 positions of a
    50/50 mix): two ranks taking the `dynamic` queue in turns decode every row group once.
    Pieces of a fixed 8192 positions cut row groups in two or three, decoded by both."""
    for name, offset in (("a", 0), ("b", 100_000)):
        ids = np.arange(offset, offset + 40_000)
        pq.write_table(pa.table({"x": ids}), tmp_path / f"{name}.parquet", row_group_size=5000)
    sources = [_CountedParquet(str(tmp_path / f"{n}.parquet")) for n in "ab"]
    mix = MixedSource(sources, [0.5, 0.5], columns=["x"])
    queue = assign("dynamic", PlanConfig(seed=4), mix, 2, epoch=1).splits
    ranks = [mix.for_epoch(1, 4), mix.for_epoch(1, 4)]  # a reader's cache each
    got = []
    for turn, (a, b) in enumerate(queue):
        got += pa.Table.from_batches(list(ranks[turn % 2].read(a, b))).column("x").to_pylist()
    source, index = mix.mix(4).locate(1, 0, mix.layout().num_samples)
    assert sorted(got) == sorted((index + 100_000 * source).tolist())  # each pick once
    for counted in sources:
        assert len(counted.reads) == 8 and set(counted.reads.values()) == {1}, counted.reads
