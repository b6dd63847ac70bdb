"""LoaderConfig from YAML: same validation as the Python API, explicit > file > environment."""

from __future__ import annotations

import textwrap

import pytest
import yaml
from parquet_fixtures import ids_of, write_dataset

from rayshard.config.loader_config import LoaderConfig
from rayshard.core.sharding import ShardingPolicy
from rayshard.errors import ConfigError
from rayshard.plan import LastBatch, PlanConfig, Rotation
from rayshard.sources.parquet import ParquetSource

NO_ENV: dict[str, str] = {}


def write(tmp_path, text, name="loader.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_espnet3_style_file(tmp_path):
    path = write(
        tmp_path,
        """
        total_shards: 16
        dist_world_size: 8
        policy: file
        rotation: stride
        batch_size: 32
        last_batch: drop
        pad_last_batch: false
        uneven: drop
        seed: 7
        shuffle_buffer: 1000
        prefetch_depth: 3
        paths: [data/*.parquet]
        columns: [id, label]
        """,
    )
    config = LoaderConfig.from_yaml(path, environ=NO_ENV)
    assert config.total_shards == 16 and config.expected_world_size == 8
    assert config.policy is ShardingPolicy.FILE and config.rotation is Rotation.STRIDE
    assert config.last_batch is LastBatch.DROP and config.batch_size == 32
    assert config.paths == ("data/*.parquet",) and config.columns == ("id", "label")
    assert config.plan == PlanConfig(
        total_shards=16,
        expected_world_size=8,
        rotation="stride",
        batch_size=32,
        last_batch="drop",
        uneven="drop",
        seed=7,
    )
    assert yaml.safe_load(yaml.safe_dump(config.to_dict()))["policy"] == "file"
    again = LoaderConfig.resolve(file=config.to_dict(), environ=NO_ENV)
    assert again == config


def test_explicit_over_file_over_environment(tmp_path):
    path = write(tmp_path, "rotation: stride\nbatch_size: 4\npolicy: data\n")
    env = {"RAYSHARD_ROTATION": "none", "RAYSHARD_LAST_BATCH": "fill"}
    dynamic_env = {"RAYSHARD_ROTATION": "none"}  # dynamic refuses last_batch='fill'
    config = LoaderConfig.from_yaml(path, environ=env)
    assert config.rotation is Rotation.STRIDE  # file over environment
    assert config.last_batch is LastBatch.FILL  # environment over default
    config = LoaderConfig.from_yaml(
        path, environ=dynamic_env, rotation="shift", policy="dynamic", batch_size=None
    )
    assert config.rotation is Rotation.SHIFT and config.policy is ShardingPolicy.DYNAMIC
    assert config.batch_size == 4  # None means "not given"


def test_nested_under_rayshard_key(tmp_path):
    path = write(tmp_path, "rayshard:\n  batch_size: 8\n  policy: off\n")
    config = LoaderConfig.from_yaml(path, environ=NO_ENV)
    assert config.batch_size == 8 and config.policy is ShardingPolicy.OFF
    assert (
        LoaderConfig.from_yaml(write(tmp_path, "", "empty.yaml"), environ=NO_ENV) == LoaderConfig()
    )
    # inside a larger training configuration: the other sections are not the loader's
    larger = "model:\n  lr: 0.1\nrayshard:\n  batch_size: 8\ntrainer:\n  epochs: 3\n"
    config = LoaderConfig.from_yaml(write(tmp_path, larger, "train.yaml"), environ=NO_ENV)
    assert config.batch_size == 8


def test_unknown_keys_list_the_known_ones(tmp_path):
    path = write(tmp_path, "batch_size: 4\nbatchsize: 8\n")
    with pytest.raises(ConfigError, match=r"unknown loader option 'batchsize' in .*loader\.yaml"):
        LoaderConfig.from_yaml(path, environ=NO_ENV)
    with pytest.raises(
        ConfigError, match="known options are ack_interval_s, ack_relay, batch_size, batches_per"
    ):
        LoaderConfig.from_yaml(path, environ=NO_ENV)
    with pytest.raises(ConfigError, match="unknown loader option 'transform' in arguments"):
        LoaderConfig.resolve(explicit={"transform": print}, environ=NO_ENV)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("batch_size", 0, "batch_size=0 is not in the range batch_size>=1"),
        ("rotation", "spiral", "rotation='spiral' is not a valid choice: use one of none, shift"),
        ("policy", "random", "policy='random' is not a valid choice: use one of off, file"),
        ("shuffle_buffer", -1, "shuffle_buffer=-1 is not in the range shuffle_buffer>=0"),
        ("prefetch_depth", 0, "prefetch_depth=0 is not in the range prefetch_depth>=1"),
        ("pad_last_batch", "maybe", "pad_last_batch='maybe' is not a yes/no value"),
        ("source_format", "csv", "source_format='csv' is not a valid choice"),
        ("paths", [], r"paths=\[\] is empty"),
    ],
)
def test_file_and_python_api_validate_alike(tmp_path, key, value, message):
    path = write(tmp_path, yaml.safe_dump({key: value}))
    with pytest.raises(ConfigError, match=message):
        LoaderConfig.from_yaml(path, environ=NO_ENV)
    with pytest.raises(ConfigError, match=message):
        LoaderConfig(**{key: value})


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="no such configuration file"):
        LoaderConfig.from_yaml(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        LoaderConfig.from_yaml(write(tmp_path, "a: [1, 2\n"))
    with pytest.raises(ConfigError, match=f"{tmp_path} is a folder, not a configuration file"):
        LoaderConfig.from_yaml(tmp_path)
    binary = tmp_path / "part-0.parquet"
    binary.write_bytes(b"PAR1\x15\x04\x15\xa0\xff\x00")
    with pytest.raises(ConfigError, match=f"{binary} is not a configuration file: not UTF-8"):
        LoaderConfig.from_yaml(binary)
    with pytest.raises(ConfigError, match="must hold a mapping"):
        LoaderConfig.from_yaml(write(tmp_path, "- 1\n- 2\n"))
    for text in (
        "expected_world_size: 4\ndist_world_size: 2\n",
        "dist_world_size: 2\nexpected_world_size: 4\n",
    ):
        with pytest.raises(ConfigError, match="sets both .*world_size=. and .*world_size=."):
            LoaderConfig.from_yaml(write(tmp_path, text))
    for given in (
        {"expected_world_size": 4, "dist_world_size": 2},
        {"dist_world_size": 2, "expected_world_size": 4},
    ):
        with pytest.raises(ConfigError, match="arguments sets both"):
            LoaderConfig.resolve(given)
    assert (
        LoaderConfig.resolve({"dist_world_size": 2, "expected_world_size": 2}).expected_world_size
        == 2
    )


def test_make_source(tmp_path):
    write_dataset(tmp_path / "data", [5, 7], row_group_size=3)
    path = write(tmp_path, f"paths: {tmp_path / 'data'}\ncolumns: [id]\nsplit_rows: 2\n")
    config = LoaderConfig.from_yaml(path, environ=NO_ENV)
    source = config.make_source()
    assert isinstance(source, ParquetSource)
    assert source.schema().names == ["id"] and max(b - a for a, b in source.splits()) == 2
    assert ids_of(source.read(0, 12)) == list(range(12))
    with pytest.raises(ConfigError, match="no paths configured"):
        LoaderConfig().make_source()
    # Given with a source made otherwise, split_rows would be ignored: refused instead.
    from rayshard.config.checked import checked_config

    assert checked_config(source, config, {}, None).split_rows == 2  # the source's own
    with pytest.raises(ConfigError, match=r"split_rows=2 applies to the source the loader makes"):
        checked_config(ParquetSource(str(tmp_path / "data")), config, {}, None)
