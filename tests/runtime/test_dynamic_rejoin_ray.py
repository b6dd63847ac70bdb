"""`dynamic` with equal steps on a real local Ray: a lone rank's iterator closed (or
dropped) after 5 of the epoch's 15 batches, and a new iterator of that rank. The new one
gets the rest of the shared epoch: 10 batches of rows. It used to report `len()` 21 and
yield 11 batches all of padding after the rows (a Hugging Face Trainer step on one is a
NaN loss). The pure core's cases, 2 and 3 ranks too: `tests/test_dynamic_rejoin_steps.py`."""

from __future__ import annotations

import gc
import os
import signal
from collections import Counter

import pytest
import ray

from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import real_ids, unique_name, write_parquet

pytestmark = [pytest.mark.ray]

ROWS, BATCH = [50, 40, 30], 8  # 120 rows: 15 batches


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_parquet(tmp_path_factory.mktemp("rejoin"), ROWS, row_group_size=8)


@pytest.mark.parametrize("close", [True, False])
def test_a_lone_ranks_new_iterator_gets_the_rest_of_the_epoch(ray_session, dataset, close):
    loader = Loader(
        ParquetSource(dataset),
        batch_size=BATCH,
        name=unique_name("rejoin"),
        shuffle=True,
        seed=2,
        policy="dynamic",
    )
    try:
        old = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        assert len(old) == 15
        first: list[int] = []
        for batch in old:
            first += real_ids([batch])
            if len(first) >= 5 * BATCH:
                break
        if close:
            old.close()
        del old, batch
        gc.collect()
        new = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        length, epoch = len(new), new.epoch
        batches = list(new)
        rest = real_ids(batches)
        assert epoch == 0 and len(batches) == length
        counts = Counter(first + rest)
        assert sorted(counts) == list(range(sum(ROWS)))
        # What the old loop received but had not acknowledged (none once closed) comes
        # again; no batch is all padding, and there are just enough for the rows.
        again = sum(n - 1 for n in counts.values())
        assert again == 0 if close else again <= len(first)
        assert length == -(-len(rest) // BATCH) == 10 + -(-again // BATCH)
        assert all((~batch["_padded"]).any() for batch in batches)
        new.close()
    finally:
        loader.shutdown()


@ray.remote(num_cpus=0)
class RankProcess:
    """A training process reading one rank, in lockstep with the others' (`step`)."""

    def __init__(self, loader: Loader, rank: int, world: int) -> None:
        self.it = loader.iterator(world_rank=rank, world_size=world, batch_format="numpy")
        self.batches = iter(self.it)

    def length(self) -> tuple[int, int, int]:
        """(pid, epoch, len) of its iterator."""
        return os.getpid(), self.it.epoch, len(self.it)

    def step(self) -> list[int] | None:
        """The next batch's real ids, acknowledged; None at the epoch's end."""
        batch = next(self.batches, None)
        self.it._acks.flush(wait=True)
        return None if batch is None else real_ids([batch])


def test_a_group_restarted_without_a_state_goes_on_with_equal_steps(ray_session, dataset):
    """Two ranks in processes of their own read 3 batches each, both processes are killed
    (a Ray Train group dying before its first checkpoint) and two new ones take the same
    ranks with no state: they read the epoch's rest, every row once, in equal steps. (They
    got 66 and 39 steps of a 30-step epoch in a hunt's run before: a DDP loop hung.) Each
    batch is acknowledged before the kill: batches received and not acknowledged come
    again and may make a step's difference (README, Limitations)."""
    loader = Loader(
        ParquetSource(dataset), batch_size=BATCH, name=unique_name("restart"), policy="dynamic"
    )
    try:
        first = [RankProcess.remote(loader, rank, 2) for rank in (0, 1)]
        before: list[int] = []
        for _ in range(3):
            before += [i for ids in ray.get([p.step.remote() for p in first]) for i in ids]
        for pid, _, _ in ray.get([p.length.remote() for p in first]):
            os.kill(pid, signal.SIGKILL)
        again = [RankProcess.remote(loader, rank, 2) for rank in (0, 1)]
        lengths = [length for _, _, length in ray.get([p.length.remote() for p in again])]
        steps, after = [0, 0], []
        while (got := ray.get([p.step.remote() for p in again])) != [None, None]:
            for rank, ids in enumerate(got):
                steps[rank] += ids is not None
                after += ids or []
        # (A death noticed after a new process asked its `len()` may grow its steps
        # beyond it, the other's alike: the loops stay in step.)
        assert steps[0] == steps[1] >= max(lengths)
        assert Counter(after) == Counter(set(range(sum(ROWS))) - set(before))
    finally:
        loader.shutdown()
