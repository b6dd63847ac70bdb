"""The warning for actor resources no node offers (`rayshard.runtime.placement_check`):
the rule alone, and at `Loader(...)` on a real local Ray."""

from __future__ import annotations

import logging

import pytest

from rayshard.loader import Loader
from rayshard.runtime.placement_check import unplaceable
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import unique_name, write_parquet

NODES = [{"CPU": 2.0, "memory": 1e9}, {"CPU": 8.0, "gpu_free": 1.0}]


@pytest.mark.parametrize(
    ("request_", "warned"),
    [
        ({"CPU": 2}, False),
        ({"CPU": 8, "gpu_free": 1}, False),  # the second node has both
        ({"CPU": 4, "memory": 1}, True),  # each alone fits a node, together none
        ({"preprocess": 1}, True),
        ({"CPU": 9}, True),
        ({"CPU": 0}, False),  # asks for nothing
    ],
)
def test_a_request_is_unplaceable_when_no_node_has_all_of_it(request_, warned):
    assert unplaceable(request_, NODES) is warned
    assert unplaceable(request_, []) is any(v > 0 for v in request_.values())


@pytest.mark.ray
def test_a_loader_asking_for_resources_no_node_has_warns_naming_the_option(
    ray_session, tmp_path, caplog
):
    source = ParquetSource(write_parquet(tmp_path, [10, 10]))
    for options, named in (
        ({"reader_workers": 2, "transform_resources": {"preprocess": 1}}, "transform_resources"),
        ({"reader_num_cpus": 10_000}, "reader_num_cpus"),
        ({"reader_workers": 2, "transform_resources": {"CPU": 1}}, None),
    ):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rayshard.runtime.placement_check"):
            loader = Loader(source, batch_size=4, name=unique_name(), **options)
        loader.shutdown()
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        if named is None:
            assert warnings == []
        else:
            assert len(warnings) == 1 and warnings[0].startswith(f"{named} asks for"), warnings
            assert "no node of this Ray cluster offers now" in warnings[0]
