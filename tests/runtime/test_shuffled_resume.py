"""A shuffled static loader resumed mid-epoch on the same world size reads, on every
rank, the tail of the uninterrupted reading in its order (the README's determinism and
resume claims; plain batches and packed rows alike). The rest's own pieces were permuted
with the epoch's key: another order, and under packing with `last_row="drop"` another set
of tokens dropped. Real local Ray, real Parquet."""

from __future__ import annotations

import json

import pytest

from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import real_ids, unique_name, write_parquet

pytestmark = pytest.mark.ray


def _read(loader: Loader, steps: int | None = None, state: dict | None = None) -> list:
    """Each of 2 ranks' batches, read in step (`steps` of them, else to the end)."""
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    if state is not None:
        for it in its:
            it.load_state_dict(state)
    streams, out = [iter(it) for it in its], [[], []]
    while steps is None or len(out[0]) < steps:
        batches = [next(stream, None) for stream in streams]
        if all(b is None for b in batches):
            break
        for rank, batch in enumerate(batches):
            if batch is not None:
                out[rank].append(batch)
    return out, its[0]


@pytest.mark.parametrize("batch_size", [4, 11])
def test_a_shuffled_resume_on_the_same_world_reads_the_uninterrupted_tail(
    ray_session, tmp_path, batch_size
):
    folder = write_parquet(tmp_path, [53, 41, 67, 29, 60], row_group_size=11)

    def loader() -> Loader:
        source = ParquetSource(folder)
        return Loader(source, batch_size=batch_size, shuffle=True, seed=4, name=unique_name())

    whole_loader = loader()
    whole, _ = _read(whole_loader)
    whole_loader.shutdown()
    first_loader = loader()
    before, it = _read(first_loader, steps=3)
    state = json.loads(json.dumps(it.state_dict()))
    first_loader.shutdown()
    resumed_loader = loader()
    state["loader"] = resumed_loader.loader_id  # (another name: the same data and options)
    after, _ = _read(resumed_loader, state=state)
    resumed_loader.shutdown()
    for rank in range(2):
        assert real_ids(before[rank]) + real_ids(after[rank]) == real_ids(whole[rank])
