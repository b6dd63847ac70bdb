"""A consumer's fetch from a reader actor (`rayshard.runtime.fetch`): it keeps exactly
`blocks_ahead` block requests in flight beyond the block it is using, and refuses a block
that is not the one it asked for. A small real actor serves the blocks."""

from __future__ import annotations

import pytest

from rayshard.errors import RayshardError
from rayshard.runtime.fetch import fetch_batches
from tests.runtime.reading_fns import BLOCKS, BlockServer


@pytest.mark.parametrize("ahead", [1, 3])
def test_requests_stay_the_budget_ahead_of_the_block_in_use(ray_session, ahead):
    import ray

    server = ray.remote(BlockServer).remote()
    stream = fetch_batches(server, 0, 1, flush=lambda: None, where="test", blocks_ahead=ahead)
    for block, (meta, batch) in enumerate(stream):
        assert batch["_index"].tolist() == [block] and meta.runs.tolist() == [[block, block + 1]]
        # calls from one caller run in order: every request sent so far is recorded
        assert max(ray.get(server.requests.remote())) == block + ahead
    assert block == BLOCKS - 1
    asked = ray.get(server.requests.remote())
    # the end is found by asking past it: the budget ahead of the first missing block
    assert sorted(asked) == list(range(BLOCKS + ahead + 1))


def test_a_block_from_another_epoch_is_refused(ray_session):
    import ray

    server = ray.remote(BlockServer).remote(wrong_at=2)
    stream = fetch_batches(server, 0, 1, flush=lambda: None, where="rank 0")
    assert [batch["_index"][0] for _, batch in (next(stream), next(stream))] == [0, 1]
    with pytest.raises(RayshardError, match=r"rank 0: asked for block 2 .* of \(0, 2\)"):
        next(stream)


def test_text_columns_come_as_numpy_objects_or_under_arrow_as_arrow(ray_session):
    import numpy as np
    import pyarrow as pa
    import ray

    server = ray.remote(BlockServer).remote(text=True)
    plain = [batch["s"] for _, batch in fetch_batches(server, 0, 1, flush=lambda: None, where="t")]
    assert all(isinstance(s, np.ndarray) and s.dtype == object for s in plain)
    server = ray.remote(BlockServer).remote(text=True)
    stream = fetch_batches(server, 0, 1, flush=lambda: None, where="t", arrow=True)
    arrow = [batch["s"] for _, batch in stream]
    assert all(isinstance(s, pa.Array) and s.type == pa.string() for s in arrow)  # cast down
    assert [s.to_pylist() for s in arrow] == [s.tolist() for s in plain]
