"""The six sharding policies over real Parquet files: for every policy and world size the
ranks together read exactly the dataset (or exactly the documented drop/padding), and the
sample ids agree with `rayshard plan` for the same configuration."""

from __future__ import annotations

import json
import pickle

import pytest
from click.testing import CliRunner
from parquet_fixtures import ids_of, uneven_dataset, write_dataset

from rayshard.cli import main
from rayshard.core.sharding import SHARD_HINT, ShardingPolicy, assign, bind_hints, hinted
from rayshard.errors import ConfigError
from rayshard.plan import DataLayout, PlanConfig, balanced_range, padding_indices
from rayshard.plan import intervals as iv
from rayshard.sources.parquet import ParquetSource

WORLDS = [1, 2, 3, 5]
EPOCHS = range(3)
F, R = 6, 10  # equal-size files, so `rayshard plan --files F --rows-per-file R` describes them


@pytest.fixture(autouse=True)
def _no_env_overrides(monkeypatch):
    for name in ("UNEVEN_FILES", "ROTATION", "LAST_BATCH", "PAD_LAST_BATCH"):
        monkeypatch.delenv(f"RAYSHARD_{name}", raising=False)


@pytest.fixture(scope="module")
def equal(tmp_path_factory):
    folder = tmp_path_factory.mktemp("equal")
    write_dataset(folder, [R] * F, row_group_size=4)
    return ParquetSource(folder)


@pytest.fixture(scope="module")
def three_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("three")
    write_dataset(folder, [20, 20, 20], row_group_size=6)
    return ParquetSource(folder)


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    folder = tmp_path_factory.mktemp("uneven")
    uneven_dataset(folder)
    return ParquetSource(folder)


def cli_plan(*args: str) -> dict:
    result = CliRunner().invoke(main, ["plan", *args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def read_ranges(source, ranges) -> list[int]:
    return [i for a, b in ranges for i in ids_of(source.read(a, b))]


def check_exact_cover(per_rank: list[list[int]], num_samples: int) -> None:
    flat = [i for ids in per_rank for i in ids]
    assert sorted(flat) == list(range(num_samples)), "not exactly the dataset"


@pytest.mark.parametrize("world", WORLDS)
def test_data_policy(equal, world):
    document = cli_plan("--samples", str(F * R), "--world-size", str(world), "--epochs", "3")
    for epoch in EPOCHS:
        got = assign("data", PlanConfig(), equal, world, epoch)
        assert got.policy is ShardingPolicy.DATA
        per_rank = [read_ranges(equal, got.ranges(r)) for r in range(world)]
        check_exact_cover(per_rank, F * R)
        for rank, ids in enumerate(per_rank):
            expected = document["epochs"][epoch]["ranks"][rank]
            assert [list(x) for x in got.ranges(rank)] == expected["ranges"]
            assert ids == list(iv.indices(expected["ranges"]))
            assert got.rank_plan(rank).shard == expected["shard"]


@pytest.mark.parametrize("world", WORLDS)
def test_file_policy(equal, world):
    document = cli_plan(
        "--files", str(F), "--rows-per-file", str(R), "--world-size", str(world), "--epochs", "3"
    )
    for epoch in EPOCHS:
        got = assign(ShardingPolicy.FILE, PlanConfig(), equal, world, epoch)
        assert got.by_files
        per_rank = [read_ranges(equal, got.ranges(r)) for r in range(world)]
        check_exact_cover(per_rank, F * R)
        for rank, ids in enumerate(per_rank):
            expected = document["epochs"][epoch]["ranks"][rank]
            plan = got.rank_plan(rank)
            assert [list(x) for x in plan.files] == expected["ranges"]
            assert [list(x) for x in plan.ranges] == expected["sample_ranges"]
            assert ids == list(iv.indices(expected["sample_ranges"]))
            files = {i // R for i in ids}  # whole files only
            assert len(ids) == R * len(files)


@pytest.mark.parametrize("world", WORLDS)
def test_file_or_data_policy(equal, three_files, world):
    for epoch in EPOCHS:
        many = assign("file_or_data", PlanConfig(), equal, world, epoch)
        assert many.policy is ShardingPolicy.FILE and many.requested is ShardingPolicy.FILE_OR_DATA
        assert many.plan == assign("file", PlanConfig(), equal, world, epoch).plan
        few = assign("file_or_data", PlanConfig(), three_files, world, epoch)
        expected = ShardingPolicy.FILE if world <= 3 else ShardingPolicy.DATA
        assert few.policy is expected
        per_rank = [read_ranges(three_files, few.ranges(r)) for r in range(world)]
        check_exact_cover(per_rank, 60)
    if world > 3:  # the fallback is the data plan, sample for sample
        document = cli_plan("--samples", "60", "--world-size", str(world), "--epochs", "3")
        for epoch in EPOCHS:
            few = assign("file_or_data", PlanConfig(), three_files, world, epoch)
            expected = [rank["ranges"] for rank in document["epochs"][epoch]["ranks"]]
            assert [[list(x) for x in few.ranges(r)] for r in range(world)] == expected


@pytest.mark.parametrize("world", WORLDS)
def test_off_policy(equal, world):
    whole = cli_plan("--samples", str(F * R), "--world-size", "1")["epochs"][0]["ranks"][0]
    orders = {}
    for epoch in EPOCHS:
        got = assign("off", PlanConfig(seed=5), equal, world, epoch)
        for rank in range(world):
            ids = read_ranges(equal, got.ranges(rank))
            assert sorted(ids) == list(iv.indices(whole["ranges"]))  # everything, once
            assert got.rank_plan(rank).batches == whole["batches"]
            orders[epoch, rank] = ids
        if world > 1:
            assert orders[epoch, 0] != orders[epoch, 1]  # each rank its own order
    assert orders[0, 0] != orders[1, 0]  # and a new one every epoch
    assert assign("off", PlanConfig(seed=5), equal, world, 0) == assign(
        "off", PlanConfig(seed=5), equal, world, 0
    )


def make_pipeline(source, num_shards, index):
    """A user's own pipeline: reads its balanced slice of the source."""
    start, end = balanced_range(index, num_shards, source.layout().num_samples)
    return ids_of(source.read(start, end))


@pytest.mark.parametrize("world", WORLDS)
def test_hint_policy(equal, world):
    document = cli_plan("--samples", str(F * R), "--world-size", str(world), "--epochs", "3")
    pipeline = hinted(make_pipeline, equal, num_shards=SHARD_HINT, index=SHARD_HINT)
    for epoch in EPOCHS:
        got = assign("hint", PlanConfig(), equal, world, epoch)
        assert got.plan is None and len(got.hints) == world
        per_rank = [bind_hints(pipeline, *got.hints[r]) for r in range(world)]
        check_exact_cover(per_rank, F * R)
        for rank, ids in enumerate(per_rank):
            expected = document["epochs"][epoch]["ranks"][rank]
            assert got.hints[rank] == (world, expected["shard"])
            assert ids == list(iv.indices(expected["ranges"]))


@pytest.mark.parametrize("world", WORLDS)
def test_dynamic_policy(equal, world):
    whole = cli_plan("--samples", str(F * R), "--world-size", "1")["epochs"][0]["ranks"][0]
    queues = []
    for epoch in EPOCHS:
        got = assign("dynamic", PlanConfig(seed=1), equal, world, epoch)
        assert sorted(got.splits) == equal.splits()  # row groups, permuted
        queues.append(got.splits)
        # lease splits to ranks of different speeds: rank r takes r+1 splits per turn
        per_rank: list[list[int]] = [[] for _ in range(world)]
        queue = list(got.splits)
        while queue:
            for rank in range(world):
                for _ in range(rank + 1):
                    if queue:
                        a, b = queue.pop(0)
                        per_rank[rank].extend(ids_of(equal.read(a, b)))
        check_exact_cover(per_rank, F * R)
        assert iv.normalize(got.splits) == tuple(tuple(r) for r in whole["ranges"])
    assert queues[0] != queues[1]
    assert assign("dynamic", PlanConfig(seed=1), equal, world, 0).splits == queues[0]
    with pytest.raises(ConfigError, match="no static per-rank plan"):
        assign("dynamic", PlanConfig(), equal, world, 0).ranges(0)


@pytest.mark.parametrize("world", WORLDS)
def test_data_policy_drop_and_padding_are_exactly_the_documented_ones(uneven, world):
    config = PlanConfig(batch_size=4, last_batch="drop")
    document = cli_plan(
        "--samples", "112", "--world-size", str(world), "--batch-size", "4", "--last-batch", "drop"
    )
    got = assign("data", config, uneven, world, 0)
    per_rank = [read_ranges(uneven, got.ranges(r)) for r in range(world)]
    flat = sorted(i for ids in per_rank for i in ids)
    dropped = sum(got.rank_plan(r).dropped for r in range(world))
    assert len(flat) == len(set(flat)) == 112 - dropped
    for rank in range(world):
        expected = document["epochs"][0]["ranks"][rank]
        assert per_rank[rank] == list(iv.indices(expected["ranges"]))
        assert got.rank_plan(rank).dropped == expected["dropped"]

    padded = assign("data", PlanConfig(batch_size=4, pad_last_batch=True), uneven, world, 1)
    for rank in range(world):
        plan = padded.rank_plan(rank)
        real = read_ranges(uneven, plan.ranges)
        pads = [i for p in padding_indices(plan) for i in ids_of(uneven.read(p, p + 1))]
        assert len(pads) == plan.padded and set(pads) <= {real[-1]}
        assert (len(real) + len(pads)) % 4 == 0
    check_exact_cover([read_ranges(uneven, padded.ranges(r)) for r in range(world)], 112)


@pytest.mark.parametrize("world", [2, 3, 5])
def test_data_policy_reads_only_the_row_groups_a_rank_owns(uneven, world):
    got = assign("data", PlanConfig(), uneven, world, 0)
    groups = uneven.row_groups()
    total_decoded = 0
    for rank in range(world):
        reader = pickle.loads(pickle.dumps(uneven))  # what a shard actor holds: fresh counters
        ranges = got.ranges(rank)
        assert sorted(read_ranges(reader, ranges)) == list(iv.indices(ranges))
        owned = [g for g in groups if iv.intersect(((g[2], g[3]),), iv.normalize(ranges))]
        assert reader.stats()["chunks_read"] == len(owned)
        assert reader.stats()["rows_decoded"] == sum(e - s for _, _, s, e in owned)
        total_decoded += reader.stats()["rows_decoded"]
    # every row group is decoded once, plus at most one shared group per rank boundary
    assert total_decoded <= 112 + (world - 1) * 10


def test_file_policy_with_too_few_files(three_files):
    with pytest.raises(ConfigError, match="3 files cannot be split over 5 shards"):
        assign("file", PlanConfig(), three_files, 5, 0)
    got = assign("file", PlanConfig(uneven="replicate"), three_files, 5, 0)
    for rank in range(5):
        assert sorted(read_ranges(three_files, got.ranges(rank))) == list(range(60))


def test_file_policy_uneven_drop_matches_the_cli(equal):
    config = PlanConfig(uneven="drop")
    document = cli_plan(
        "--files",
        str(F),
        "--rows-per-file",
        str(R),
        "--world-size",
        "4",
        "--uneven",
        "drop",
        "--epochs",
        "3",
    )
    sat_out = set()
    for epoch in EPOCHS:
        got = assign("file", config, equal, 4, epoch)
        per_rank = [read_ranges(equal, got.ranges(r)) for r in range(4)]
        flat = sorted(i for ids in per_rank for i in ids)
        assert len(flat) == len(set(flat)) == (F - F % 4) * R
        sat_out |= set(range(F * R)) - set(flat)
        for rank in range(4):
            expected = document["epochs"][epoch]["ranks"][rank]
            assert per_rank[rank] == list(iv.indices(expected["sample_ranges"]))
    assert len(sat_out) == 3 * 2 * R  # which files sit out rotates


def test_policy_on_a_bare_layout_and_errors():
    layout = DataLayout.of_samples(10)
    assert assign("file_or_data", PlanConfig(), layout, 2, 0).policy is ShardingPolicy.DATA
    assert sorted(assign("dynamic", PlanConfig(), layout, 2, 0).splits) == [(0, 10)]
    with pytest.raises(ConfigError, match="needs a file-based source"):
        assign("file", PlanConfig(), layout, 2, 0)
    with pytest.raises(
        ConfigError, match="use one of off, file, data, file_or_data, hint, dynamic"
    ):
        assign("random", PlanConfig(), layout, 2, 0)
    with pytest.raises(ConfigError, match="expects world_size=4"):
        assign("off", PlanConfig(expected_world_size=4), layout, 2, 0)
    with pytest.raises(ConfigError, match="expects world_size=4"):
        assign("dynamic", PlanConfig(expected_world_size=4), layout, 2, 0)
    # off and dynamic ignore shards and rotation
    assert assign("off", PlanConfig(total_shards=3, rotation="none"), layout, 2, 0).plan
    doc = assign("data", PlanConfig(), layout, 2, 0).to_dict()
    assert json.loads(json.dumps(doc))["policy"] == "data"


def test_shard_hint_placeholder():
    assert pickle.loads(pickle.dumps(SHARD_HINT)) is SHARD_HINT
    assert repr(SHARD_HINT) == "SHARD_HINT"

    def shard(items, num_shards, index):
        return items[index::num_shards]

    positional = hinted(shard, list(range(10)), SHARD_HINT, SHARD_HINT)
    assert bind_hints(positional, 3, 1) == [1, 4, 7]
    assert bind_hints(lambda n, i: (n, i), 4, 2) == (4, 2)
    with pytest.raises(ConfigError, match="needs SHARD_HINT"):
        hinted(shard, [], 2, 1)
    with pytest.raises(ConfigError, match="keyword placeholders must be named"):
        hinted(shard, [], count=SHARD_HINT)
    with pytest.raises(ConfigError, match="index=3 is not in the range"):
        bind_hints(positional, 3, 3)
