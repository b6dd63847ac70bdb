"""cluster.yaml is a valid Ray cluster launcher config, checked with Ray's own validation.

`ray up` resolves a config in `ray.autoscaler._private.commands._bootstrap_config`:
  1. `prepare_config`: merge with the provider's defaults.yaml, merge setup commands, fill
     per-node-type min/max workers (offline: it only reads files shipped with Ray);
  2. provider-specific `fillout_available_node_types_resources` (AWS: describe-instance-types);
  3. `validate_config`: ray-schema.json plus cross-field checks (offline);
  4. provider `bootstrap_config` (AWS: IAM role, key pair, subnets, security groups).
Steps 2 and 4 need boto3, network access and AWS credentials, so they are not run here; the
config declares every node type's resources explicitly, so step 2 has nothing to add to what
is validated. Steps 1 and 3 are run exactly as `ray up` runs them.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from rayshard.runtime.ray_tuning import RAY_ENV_DEFAULTS

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")
ray_util = pytest.importorskip("ray.autoscaler._private.util")

CLUSTER_YAML = Path(__file__).resolve().parents[1] / "cluster.yaml"


def _load() -> dict:
    with open(CLUSTER_YAML) as f:
        return yaml.safe_load(f)


def _prepare_and_validate(config: dict) -> dict:
    """What `ray up` does offline: prepare_config, then validate_config."""
    prepared = ray_util.prepare_config(copy.deepcopy(config))
    ray_util.validate_config(prepared)
    return prepared


@pytest.fixture(scope="module")
def raw() -> dict:
    return _load()


@pytest.fixture(scope="module")
def prepared(raw) -> dict:
    return _prepare_and_validate(raw)


def test_raw_config_matches_ray_schema(raw):
    # The file as written (before defaults are merged) already satisfies the schema.
    ray_util.validate_config({**raw, "cluster_synced_files": raw.get("cluster_synced_files", [])})


def test_prepared_config_is_valid(prepared):
    assert prepared["provider"]["type"] == "aws"
    assert prepared["cluster_name"] == "rayshard"


def test_node_types_and_workers_as_documented(prepared):
    types = prepared["available_node_types"]
    assert set(types) == {"head_cpu", "worker_gpu"}
    assert prepared["head_node_type"] == "head_cpu"

    head, gpu = types["head_cpu"], types["worker_gpu"]
    assert head["min_workers"] == 0 and head["max_workers"] == 0
    assert gpu["min_workers"] == 1
    assert gpu["max_workers"] == 4
    assert prepared["max_workers"] == 4
    assert gpu["min_workers"] <= gpu["max_workers"] <= prepared["max_workers"]

    # The autoscaler can only add GPU nodes for GPU requests if the type declares GPUs.
    assert gpu["resources"]["GPU"] == 1
    assert head["resources"].get("GPU", 0) == 0
    assert gpu["node_config"]["InstanceType"].startswith(("g", "p"))


def test_setup_installs_rayshard_from_synced_tree(prepared):
    assert prepared["file_mounts"]["~/rayshard-src"] == "."
    # prepare_config prepends setup_commands to both head and worker setup commands.
    for key in ("head_setup_commands", "worker_setup_commands"):
        commands = prepared[key]
        assert any("pip install" in c and "-e ~/rayshard-src" in c for c in commands), key
        assert any("RAY_AUTH_MODE=token" in c for c in commands), key
    # The autoscaler on the head needs boto3 to launch EC2 instances.
    assert any("boto3" in c for c in prepared["head_setup_commands"])


def test_start_commands(prepared):
    head = " ".join(prepared["head_start_ray_commands"])
    worker = " ".join(prepared["worker_start_ray_commands"])
    assert "ray start --head" in head and "--autoscaling-config=~/ray_bootstrap_config.yaml" in head
    assert "ray start --address=$RAY_HEAD_IP:6379" in worker
    for name, value in RAY_ENV_DEFAULTS.items():  # every node starts with rayshard's tuning
        export = f"export {name}={value}; ray start"
        assert export in head and export in worker


def test_ray_up_would_use_this_ssh_user(prepared):
    assert prepared["auth"]["ssh_user"] == "ubuntu"


# ------------------------------------------------------------------ broken copies are rejected


def test_rejects_more_min_workers_than_global_max(raw):
    broken = copy.deepcopy(raw)
    broken["max_workers"] = 0  # worker_gpu.min_workers is 1
    with pytest.raises(ValueError, match="max_workers"):
        _prepare_and_validate(broken)


def test_rejects_unknown_top_level_key(raw):
    broken = copy.deepcopy(raw)
    broken["max_worker"] = 4  # typo
    with pytest.raises(jsonschema.ValidationError, match="max_worker"):
        _prepare_and_validate(broken)


def test_rejects_negative_gpu_count(raw):
    broken = copy.deepcopy(raw)
    broken["available_node_types"]["worker_gpu"]["resources"]["GPU"] = -1
    with pytest.raises(jsonschema.ValidationError):
        _prepare_and_validate(broken)


def test_rejects_unknown_head_node_type(raw):
    broken = copy.deepcopy(raw)
    broken["head_node_type"] = "head_gpu"
    with pytest.raises(ValueError, match="head_node_type"):
        _prepare_and_validate(broken)


def test_rejects_node_type_without_resources(raw):
    broken = copy.deepcopy(raw)
    del broken["available_node_types"]["worker_gpu"]["resources"]
    with pytest.raises(jsonschema.ValidationError, match="resources"):
        _prepare_and_validate(broken)
