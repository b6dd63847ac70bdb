"""The loader's own settings: block sizing by policy and the checks on reading knobs."""

from __future__ import annotations

import numpy as np
import pytest

from rayshard.config.loader_config import LoaderConfig
from rayshard.errors import ConfigError
from rayshard.plan import PlanConfig


def settings(**options) -> LoaderConfig:
    return LoaderConfig(plan=PlanConfig(batch_size=8), **options)


@pytest.mark.parametrize(
    ("policy", "blocks"), [("data", 16), ("file", 16), ("off", 16), ("dynamic", 4)]
)
def test_block_size_defaults_by_policy(policy, blocks):
    assert settings(policy=policy).block_batches == blocks


@pytest.mark.parametrize("policy", ["data", "dynamic"])
def test_explicit_batches_per_object_wins(policy):
    assert settings(policy=policy, batches_per_object=7).block_batches == 7


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("object_bytes", 0, r"object_bytes=0 is not in the range object_bytes>=1 \(bytes per"),
        ("object_bytes", 1.5, r"object_bytes=1.5 must be an integer >= 1"),
        ("batches_per_object", 0, r"batches_per_object=0 is not in the range"),
        ("batches_per_object", True, r"batches_per_object=True must be an integer"),
        ("reader_threads", 0, r"reader_threads=0 is not in the range reader_threads>=1"),
        ("reader_workers", 0, r"reader_workers=0 is not in the range reader_workers>=1 \(proc"),
        ("reader_workers", "2", r"reader_workers='2' must be an integer >= 1"),
        ("prefetch_depth", 0, r"prefetch_depth=0 is not in the range prefetch_depth>=1"),
        ("shuffle_buffer", -1, r"shuffle_buffer=-1 is not in the range shuffle_buffer>=0"),
        ("ack_relay", "sometimes", r"ack_relay='sometimes' must be one of auto, node, off"),
    ],
)
def test_bad_reading_knobs_are_refused_by_name(option, value, message):
    with pytest.raises(ConfigError, match=message):
        settings(**{option: value})


def test_transform_resources_are_normalized_to_sorted_pairs():
    settings = LoaderConfig(
        plan=PlanConfig(batch_size=2), transform_resources={"preprocess": 1, "CPU": 2}
    )
    assert settings.transform_resources == (("CPU", 2.0), ("preprocess", 1.0))


@pytest.mark.parametrize(
    "resources",
    [
        {},
        {"CPU": 0},
        {"gpu_free": -1},
        {"": 1},
        {"CPU": "many"},
        [1, 2],
        {"CPU": float("inf")},
        {"CPU": float("nan")},
    ],
)
def test_bad_transform_resources_are_refused_naming_the_value(resources):
    with pytest.raises(ConfigError, match="transform_resources="):
        LoaderConfig(plan=PlanConfig(batch_size=2), transform_resources=resources)


def test_shuffle_buffer_under_dynamic_is_refused_with_the_alternative():
    with pytest.raises(ConfigError, match=r"shuffle_buffer=8 with policy='dynamic'.*shuffle=True"):
        LoaderConfig(plan=PlanConfig(batch_size=2), policy="dynamic", shuffle_buffer=8)
    assert LoaderConfig(plan=PlanConfig(batch_size=2), policy="dynamic", shuffle=True).shuffle


def test_reader_workers_and_transform_workers_are_one_or_the_other():
    with pytest.raises(
        ConfigError, match=r"reader_workers=2 with transform_workers=3: .*set reader_workers alone"
    ):
        settings(reader_workers=2, transform_workers=3)
    assert settings(reader_workers=3).worker_count == 3
    assert settings(transform_workers=2).worker_count == 2
    assert settings(reader_workers=2, reader_threads=4).reader_threads == 4  # threads per worker


@pytest.mark.parametrize(
    ("groups", "needle"),
    [
        (5, "is not a list of non-empty lists"),
        ([], "is not a list of non-empty lists"),
        ([[]], "is not a list of non-empty lists"),
        (["01"], "is not a list of non-empty lists"),
        ([["a"]], r"dp_groups\[0\]\[0\]='a' must be an integer"),
        ([[0.7], [1.9]], r"dp_groups\[0\]\[0\]=0.7 must be an integer"),
        ([[0, True]], r"dp_groups\[0\]\[1\]=True must be an integer"),
        ([[0, -1]], r"dp_groups\[0\]\[1\]=-1 is not in the range"),
        ([[0, 1], [1, 2]], r"names ranks \[1\] more than once"),
        ([[0, 1], [2]], "groups of different sizes"),
    ],
)
def test_bad_dp_groups_are_config_errors_naming_them(groups, needle):
    with pytest.raises(ConfigError, match=needle):
        LoaderConfig(dp_groups=groups)


def test_dp_groups_and_a_disagreeing_model_parallel_size_are_refused():
    with pytest.raises(ConfigError, match="model_parallel_size=2 and dp_groups=.* disagree"):
        LoaderConfig(dp_groups=[[0], [1]], model_parallel_size=2)
    agreeing = LoaderConfig(dp_groups=[[0, 2], [1, 3]], model_parallel_size=2)
    assert agreeing.dp_groups == ((0, 2), (1, 3))
    assert LoaderConfig(dp_groups=[(0, np.int64(1))]).dp_groups == ((0, 1),)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"last_batch": "drop"}, "last_batch='drop'"),
        ({"last_batch": "fill"}, "last_batch='fill'"),
        ({"pad_last_batch": True}, "pad_last_batch"),
    ],
)
def test_dynamic_refuses_last_batch_options_it_cannot_honour(options, named):
    with pytest.raises(ConfigError, match=f"{named} with policy='dynamic'"):
        LoaderConfig(policy="dynamic", **options)
    assert LoaderConfig(policy="data", **options).policy.value == "data"
