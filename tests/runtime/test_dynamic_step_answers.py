"""A `dynamic` rank pads to the step count of a lease answer asked for after its last rows
were delivered, and pads on when an answer to its finishing ask says the count grew (a
rank lost meanwhile): on a real local Ray, a scripted coordinator actor gives the answers
(what the real one answers when a rank is lost at those moments; the core's counts are
tested in `tests/test_core_coordination.py`), and `dynamic_rows` reads real rows."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
import ray

from rayshard.config.loader_config import LoaderConfig
from rayshard.core.commands import Leased
from rayshard.data.batching import FLUSH, INDEX_KEY, PADDED_KEY, iter_rows
from rayshard.plan import PlanConfig
from rayshard.runtime.dynamic_rows import dynamic_rows
from rayshard.sources.base import TableSource

pytestmark = [pytest.mark.ray]

BATCH = 8


@ray.remote(num_cpus=0)
class ScriptedCoordinator:
    """Answers lease calls from `script` in turn (then its last answer again), noting
    whether each ask was a finishing one."""

    def __init__(self, script: list) -> None:
        self.script, self.finishing = script, []

    def lease(self, generation, rank, epoch, count, finishing, request, **options):
        self.finishing.append(finishing)
        return self.script[min(len(self.finishing), len(self.script)) - 1]

    def asks(self) -> list:
        return self.finishing


def test_a_rank_pads_to_the_count_of_answers_given_after_its_rows_and_its_finishing(
    ray_session,
):
    source = TableSource(pa.table({"id": pa.array(range(10), pa.int64())}))
    settings = LoaderConfig(plan=PlanConfig(batch_size=BATCH), policy="dynamic")
    script = [
        Leased(pieces=((0, 10),), unleased=0, ranks=2, steps=2),
        # given as its last piece went out: what it says is not acted on
        Leased(unleased=0, ranks=2, steps=2),
        Leased(unleased=0, ranks=2, steps=2),  # asked once its 10 rows were delivered
        Leased(unleased=0, ranks=2, steps=3),  # its finishing ask: a rank was lost since
    ]
    coordinator = ScriptedCoordinator.remote(script)
    rows = dynamic_rows(
        coordinator,
        source,
        source.splits(),
        settings,
        (0, 0, 0),
        threading.Event,
        lambda pieces, columns: iter_rows(source, pieces, columns),
    )
    batches = [batch for batch in rows if batch is not FLUSH]
    padded = [flag for batch in batches for flag in batch.column(PADDED_KEY).to_pylist()]
    real = [
        int(i)
        for b in batches
        for i, p in zip(b.column(INDEX_KEY), b.column(PADDED_KEY))
        if not p.as_py()
    ]
    assert sorted(real) == list(range(10))
    # 3 steps of 8: padded from 10 rows to 17 (the last step's first row), not ended at 10
    assert len(padded) == (3 - 1) * BATCH + 1 and padded.count(True) == 7
    # the stream's two calls; the re-ask; finishing; two padding batches; finishing again
    assert ray.get(coordinator.asks.remote()) == [False, False, False, True, False, False, True]
