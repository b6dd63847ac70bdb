"""A worker's rank and size when `iterator()` is not told (`rayshard.runtime.worlds`),
without Ray: a launcher's `RANK` and `WORLD_SIZE` (torchrun, accelerate launch) give them,
and `dynamic` in such a process is refused (each is a driver with a coordinator of its own:
a hunt's two torchrun processes each read the whole epoch)."""

from __future__ import annotations

import pytest

from rayshard.core.sharding import ShardingPolicy
from rayshard.errors import ConfigError
from rayshard.runtime.worlds import launched_world, worker_world

DATA, DYNAMIC = ShardingPolicy.DATA, ShardingPolicy.DYNAMIC


@pytest.fixture
def launched(monkeypatch):
    def launch(rank: str, size: str) -> None:
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", size)

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return launch


def test_without_a_launcher_a_lone_worker_or_the_ranks_given(launched):
    assert worker_world(None, None, DYNAMIC) == (0, 1)
    assert worker_world(1, 3, DYNAMIC) == (1, 3)
    with pytest.raises(ConfigError, match=r"world_rank=1, world_size=None.*give both"):
        worker_world(1, None, DATA)


def test_a_launchers_rank_and_size_stand_in_for_those_not_given(launched):
    launched("1", "2")
    assert launched_world() == (1, 2)
    assert worker_world(None, None, DATA) == (1, 2)
    assert worker_world(0, 4, DATA) == (0, 4)  # given: they win


@pytest.mark.parametrize("given", [(None, None), (1, 2)])
def test_dynamic_in_a_launchers_process_is_refused(launched, given):
    launched("1", "2")
    with pytest.raises(ConfigError, match=r"RANK=1 of WORLD_SIZE=2.*inside Ray Train.*static"):
        worker_world(*given, DYNAMIC)


@pytest.mark.parametrize("rank, size", [("0", "1"), ("x", "2"), ("2", "2"), ("-1", "2")])
def test_a_lone_process_or_unreadable_variables_are_no_launch(launched, rank, size):
    launched(rank, size)
    assert launched_world() is None
    assert worker_world(None, None, DYNAMIC) == (0, 1)
