"""One configuration: every plain-data option is a flat key (Python and YAML), resolution
is explicit > file or LoaderConfig > environment > default, and the loader id is stable."""

from __future__ import annotations

import pickle
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from rayshard.config.loader_config import OWNER, LoaderConfig, loader_config
from rayshard.core.sharding import ShardingPolicy
from rayshard.data.columns import Padding
from rayshard.data.packing import Packing
from rayshard.errors import ConfigError
from rayshard.loader import Loader
from rayshard.plan import PlanConfig, Rotation
from rayshard.sources.base import TableSource

NO_ENV: dict[str, str] = {}
ENV = {"RAYSHARD_ROTATION": "none", "RAYSHARD_LAST_BATCH": "fill"}

# A value other than the default for every key a YAML file may set.
EVERY_KEY = {
    "batch_size": 4,
    "total_shards": 6,
    "expected_world_size": 3,
    "rotation": "stride",
    "uneven": "drop",
    # the defaults: `dynamic` (which straggler_timeout_s needs) refuses others (own test)
    "last_batch": "partial",
    "pad_last_batch": False,
    "equal_steps": False,
    "seed": 9,
    "policy": "dynamic",
    "paths": ["data/*.parquet"],
    "source_format": "parquet",
    "split_rows": 100,
    "columns": ["tokens", "label"],
    "padding": {"tokens": {"max_length": 8, "pad_value": -1}},
    "fill_null": {"label": 0},
    "shuffle": True,
    "shuffle_buffer": 0,
    "shuffle_blocks": 0,
    "reader_threads": 2,
    "packing": None,
    "name": "train",
    "namespace": "job-7",
    "coordinator_max_restarts": 5,
    "prefetch_depth": 3,
    "batches_per_object": 2,
    "object_bytes": 1 << 20,
    "ack_interval_s": 0.2,
    "ack_relay": "node",
    "lease_poll_s": 0.1,
    "state_timeout_s": 30.0,
    "straggler_timeout_s": 5.0,
    "model_parallel_size": 2,
    "dp_groups": [[0, 1], [2, 3]],
    "reader_workers": 1,  # the default: transform_workers=2 excludes it (its own test below)
    "transform_workers": 2,
    "transform_resources": {"CPU": 1.0, "preprocess": 1.0},
    "reader_num_cpus": 0.5,
    "consumer_reads": False,
    "journal_path": "/tmp/journal.jsonl",
}


def test_every_option_is_settable_from_yaml(tmp_path):
    assert set(EVERY_KEY) == set(OWNER)  # a new option must be added here (and to README)
    path = tmp_path / "loader.yaml"
    path.write_text(yaml.safe_dump({"rayshard": EVERY_KEY}))
    config = LoaderConfig.from_yaml(path, environ=NO_ENV)
    flat = config.to_dict()
    assert flat.pop("padding")["tokens"] == {**vars(Padding()), "max_length": 8, "pad_value": -1}
    assert flat == {k: v for k, v in EVERY_KEY.items() if k != "padding"}
    assert config.padding == (("tokens", Padding(max_length=8, pad_value=-1)),)
    assert config.dp_groups == ((0, 1), (2, 3))
    assert config == LoaderConfig(**EVERY_KEY)
    assert pickle.loads(pickle.dumps(config)) == config
    packed = LoaderConfig(packing={"column": "tokens", "seq_len": 8})
    assert packed.to_dict()["packing"] == Packing(column="tokens", seq_len=8).to_dict()


def test_last_batch_options_from_yaml(tmp_path):
    path = tmp_path / "loader.yaml"
    path.write_text(yaml.safe_dump({"rayshard": {"last_batch": "fill", "pad_last_batch": True}}))
    config = LoaderConfig.from_yaml(path, environ=NO_ENV)
    assert (config.last_batch.value, config.pad_last_batch) == ("fill", True)
    assert config.to_dict()["last_batch"] == "fill" and config.to_dict()["pad_last_batch"] is True


def test_reader_workers_from_yaml_and_keyword(tmp_path):
    path = tmp_path / "loader.yaml"
    path.write_text(yaml.safe_dump({"rayshard": {"reader_workers": 3, "reader_threads": 2}}))
    config = LoaderConfig.from_yaml(path, environ=NO_ENV)
    assert (config.reader_workers, config.reader_threads) == (3, 2)
    assert config.to_dict()["reader_workers"] == 3 and LoaderConfig().reader_workers == 1
    assert LoaderConfig.from_yaml(path, environ=NO_ENV, reader_workers=2).reader_workers == 2
    path.write_text(yaml.safe_dump({"reader_workers": 0}))
    with pytest.raises(ConfigError, match=r"reader_workers=0 is not in the range"):
        LoaderConfig.from_yaml(path, environ=NO_ENV)


def test_workers_without_work_are_refused_before_ray_starts():
    source = TableSource(pa.table({"id": list(range(10))}))
    with pytest.raises(ConfigError, match=r"transform_workers=2 needs a transform"):
        Loader(source, transform_workers=2)
    with pytest.raises(ConfigError, match=r"transform_resources=\{'CPU': 1.0\} places worker"):
        Loader(source, transform_resources={"CPU": 1})
    with pytest.raises(ConfigError, match=r"reader_workers=2 with transform_workers=2"):
        Loader(source, reader_workers=2, transform_workers=2)


def test_parts_and_flat_keys():
    config = LoaderConfig(plan=PlanConfig(batch_size=8, seed=2), seed=5, policy="file")
    assert config.plan == PlanConfig(batch_size=8, seed=5) and config.batch_size == 8
    assert config.read.policy is ShardingPolicy.FILE is config.policy
    assert config.runtime.ack_interval_s == 0.1 == config.ack_interval_s
    assert LoaderConfig is LoaderConfig
    assert config.replace(seed=None, prefetch_depth=4).seed == 5  # None: not given
    with pytest.raises(ConfigError, match="unknown loader option 'seeed' in arguments"):
        LoaderConfig(seeed=1)


@pytest.mark.parametrize("form", ["mapping", "yaml", "LoaderConfig"])
def test_explicit_over_config_over_environment_over_default(tmp_path, form):
    file = {"batch_size": 4, "rotation": "stride", "seed": 5, "equal_steps": False}
    config = {"mapping": file, "yaml": tmp_path / "c.yaml", "LoaderConfig": None}[form]
    if form == "yaml":
        config.write_text(yaml.safe_dump(file))
    if form == "LoaderConfig":
        config = LoaderConfig.resolve(file=file, environ=ENV)
    # keyword options left unset (None) never override the file: no default sneaks in
    unset = {"seed": None, "equal_steps": None, "rotation": None, "prefetch_depth": None}
    got = loader_config(config, unset, environ=ENV)
    assert got.seed == 5 and got.equal_steps is False  # config over default
    assert got.rotation is Rotation.STRIDE  # config over environment
    assert got.last_batch.value == "fill"  # environment over default
    assert got.prefetch_depth == 2 and got.ack_interval_s == 0.1  # defaults
    explicit = loader_config(config, {"seed": 3, "equal_steps": True, "rotation": "shift"})
    assert (explicit.seed, explicit.equal_steps, explicit.rotation) == (3, True, Rotation.SHIFT)


def test_environment_over_default_and_defaults_once():
    got = loader_config(None, {"batch_size": 2}, environ=ENV)
    assert got.rotation is Rotation.NONE and got.last_batch.value == "fill"
    assert loader_config(None, {}, environ=NO_ENV) == LoaderConfig()


def test_unknown_keyword_is_refused_before_ray_starts():
    source = TableSource(pa.table({"id": list(range(10))}))
    with pytest.raises(ConfigError, match="unknown loader option 'batchsize'.*known options"):
        Loader(source, batchsize=2)
    with pytest.raises(ConfigError, match="not both"):
        Loader(source, {"seed": 1}, config_file={"seed": 2})


def test_fingerprint_is_unchanged():
    """The ids of saved states and journals: values computed before the refactor."""
    plan = PlanConfig(batch_size=8, seed=3, rotation="stride")
    cases = [
        ({}, "0bbe0ed1a938c0c3"),
        (
            {"policy": "file", "columns": ("a", "b"), "shuffle": True, "shuffle_buffer": 10},
            "255fbac86f5383c8",
        ),
        ({"shuffle_blocks": 40}, "d63de71f87d25967"),
        ({"packing": Packing(column="tokens", seq_len=16)}, "d279c4f4106df2fb"),
        ({"policy": "dynamic", "shuffle": True}, "be18aaec1cbbad3c"),
    ]
    for options, want in cases:
        assert LoaderConfig(plan=plan, **options).fingerprint("src", 100) == want, options


def test_readme_lists_every_key():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("### Configuration and YAML")[1].split("### Environment")[0]
    missing = [key for key in LoaderConfig.known_keys() if f"`{key}`" not in section]
    assert not missing, f"README's YAML key list lacks {missing}"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("ack_interval_s", -1, r"ack_interval_s=-1 is not in the range ack_interval_s>=0"),
        ("state_timeout_s", 0, r"state_timeout_s=0 is not in the range state_timeout_s>0"),
        ("lease_poll_s", "fast", r"lease_poll_s='fast' must be a number"),
        ("model_parallel_size", 0, r"model_parallel_size=0 is not in the range"),
        ("transform_workers", 1.5, r"transform_workers=1.5 must be an integer >= 1"),
        ("reader_workers", -1, r"reader_workers=-1 is not in the range reader_workers>=1"),
        ("name", "", r"name='' must be a non-empty string"),
        ("shuffle", "maybe", r"shuffle='maybe' is not a yes/no value"),
        ("padding", {"tokens": {"max_len": 3}}, r"padding\['tokens'\]: unknown option"),
    ],
)
def test_runtime_and_reading_keys_are_validated_by_name(key, value, message):
    with pytest.raises(ConfigError, match=message):
        LoaderConfig(**{key: value})


def test_zero_intervals_are_allowed():
    config = LoaderConfig(ack_interval_s=0, lease_poll_s=0)  # acknowledge on receipt
    assert config.ack_interval_s == 0 and config.lease_poll_s == 0


def test_seed_and_equal_steps_from_the_environment_at_every_level(tmp_path):
    env = {"RAYSHARD_SEED": "11", "RAYSHARD_EQUAL_STEPS": "0"}
    unset = {"seed": None, "equal_steps": None}
    got = loader_config(None, unset, environ=env)
    assert (got.seed, got.equal_steps) == (11, False)  # environment over default
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"seed": 5}))
    got = loader_config(path, unset, environ=env)
    assert (got.seed, got.equal_steps) == (5, False)  # file over environment
    got = loader_config(path, {"seed": 3, "equal_steps": True}, environ=env)
    assert (got.seed, got.equal_steps) == (3, True)  # explicit over file
    assert PlanConfig.resolve(environ=env).seed == 11  # the planner reads the same names
    with pytest.raises(ConfigError, match=r"RAYSHARD_SEED='x1' is not an integer"):
        loader_config(None, {}, environ={"RAYSHARD_SEED": "x1"})
    with pytest.raises(ConfigError, match=r"equal_steps='maybe' is not a yes/no value"):
        loader_config(None, {}, environ={"RAYSHARD_EQUAL_STEPS": "maybe"})


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("RAYSHARD_ROTATION", "spin", "rotation='spin' is not a valid choice"),
        ("RAYSHARD_SEED", "-1", "seed=-1 is not in the range seed>=0"),
        ("RAYSHARD_LAST_BATCH", "trim", "last_batch='trim' is not a valid choice"),
        ("RAYSHARD_PAD_LAST_BATCH", "maybe", "pad_last_batch='maybe' is not a yes/no value"),
    ],
)
def test_a_bad_environment_value_names_its_variable(variable, value, message):
    expected = re.escape(f"{variable}={value!r} in the environment: {message}")
    for resolve in (
        lambda env: loader_config(None, {}, environ=env),
        lambda env: PlanConfig.resolve(environ=env),
    ):
        with pytest.raises(ConfigError, match=expected) as info:
            resolve({variable: value})
        assert str(info.value).endswith(f"; fix it, or unset {variable}")


def test_ray_resource_amounts_ray_would_refuse_are_config_errors():
    """Ray holds resources to 0.0001 and takes CPUs and GPUs by keyword: an amount finer
    than that, or an int too large for a float, is refused at the configuration (Ray
    refused it at the first batch, inside the reader); a GPU goes to `num_gpus`."""
    from rayshard.runtime.reader_workers import actor_resources

    with pytest.raises(ConfigError, match=r"reader_num_cpus=1e-05: Ray counts CPUs in steps"):
        LoaderConfig(reader_num_cpus=1e-5)
    with pytest.raises(ConfigError, match=r"in steps of 0.0001.*bad: \[\('CPU', 1e-05\)\]"):
        LoaderConfig(reader_workers=2, transform_resources={"CPU": 1e-5})
    with pytest.raises(ConfigError, match=r"state_timeout_s=1000+ is not in the range"):
        LoaderConfig(state_timeout_s=10**400)
    with pytest.raises(ConfigError, match="must map Ray resource names to amounts"):
        LoaderConfig(reader_workers=2, transform_resources={"CPU": 10**400})
    assert LoaderConfig(reader_num_cpus=0.25).reader_num_cpus == 0.25
    config = LoaderConfig(reader_workers=2, transform_resources={"GPU": 0.5, "CPU": 2, "n1": 1})
    assert actor_resources(config.transform_resources) == {
        "num_cpus": 2.0,
        "num_gpus": 0.5,
        "resources": {"n1": 1.0},
    }


def test_yaml_off_for_ack_relay_and_straggler_timeout_and_frozen_fills(tmp_path):
    """YAML 1.1 reads a bare `off` as false: `ack_relay: off` is 'off' (it was refused as
    "ack_relay=False must be one of auto, node, off"), `straggler_timeout_s: off` is unset.
    A struct's fill dict is the configuration's own copy (hashable config, not changed by
    the caller's dict changing)."""
    path = tmp_path / "loader.yaml"
    path.write_text("policy: dynamic\nack_relay: off\nstraggler_timeout_s: off\n")
    config = LoaderConfig.from_yaml(path, environ=NO_ENV)
    assert (config.ack_relay, config.straggler_timeout_s) == ("off", None)
    assert LoaderConfig(ack_relay=" Node").ack_relay == "node"
    fill = {"x": 0}
    config = LoaderConfig(fill_null={"point": fill})
    fill["x"] = 99
    assert config.fill_null == (("point", {"x": 0}),)
    assert hash(config) == hash(LoaderConfig(fill_null={"point": {"x": 0}}))


def test_a_last_batch_rule_under_dynamic_names_the_option_to_change():
    with pytest.raises(ConfigError, match=r"use policy='data', or pad_last_batch=False"):
        LoaderConfig(policy="dynamic", pad_last_batch=True)
    with pytest.raises(ConfigError, match=r"use policy='data', or last_batch='partial'"):
        LoaderConfig(policy="dynamic", last_batch="drop")


def test_misused_parts_and_columns_named_twice_are_clear_errors():
    from rayshard.config.parts import ReadConfig

    with pytest.raises(TypeError, match="read= takes a ReadConfig, got PlanConfig"):
        LoaderConfig(read=PlanConfig())
    with pytest.raises(TypeError, match="plan= takes a PlanConfig, got dict"):
        LoaderConfig(plan={"batch_size": 4})
    with pytest.raises(ConfigError, match=r"columns=\['a', 'b', 'a'\] names \['a'\] twice"):
        LoaderConfig(columns=["a", "b", "a"])
    assert LoaderConfig(read=ReadConfig(columns=("a",))).columns == ("a",)


def test_from_config_takes_a_mapping_of_paths_as_loader_does(tmp_path):
    """`Loader.from_config({...})` makes its source from the mapping's `paths` (it raised
    `AttributeError: 'dict' object has no attribute 'make_source'`); checked before Ray."""
    pq.write_table(pa.table({"id": list(range(10))}), tmp_path / "a.parquet")
    with pytest.raises(ConfigError, match=r"column\(s\) \['nope'\] do not exist"):
        Loader.from_config({"paths": [str(tmp_path)], "columns": ["nope"]})
