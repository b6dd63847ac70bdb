"""The real coordinator asks its consumers to acknowledge less often when their calls would
outrun it, and an `AckSender` takes the interval it asks for (real Ray, real Parquet)."""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from rayshard.core.ack_pacing import AckAnswer
from rayshard.loader import Loader
from rayshard.runtime.acks import AckSender
from rayshard.sources.parquet import ParquetSource
from tests.timeouts import wait_until

pytestmark = [pytest.mark.ray]

CONSUMERS = 16
CONFIGURED_S = 0.001  # below what 16 consumers' calls allow: a measured cost lifts it


def test_the_coordinator_paces_many_consumers_and_a_sender_follows(ray_session, tmp_path):
    path = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"id": np.arange(CONSUMERS * 64)}), path, row_group_size=64)
    loader = Loader(
        ParquetSource([str(path)]),
        batch_size=4,
        name=f"pacing-{uuid.uuid4().hex[:8]}",
        policy="data",
        ack_interval_s=CONFIGURED_S,
    )
    coordinator = loader._coordinator
    try:
        dp = lambda r: {"dp_rank": r, "dp_size": CONSUMERS, "group": [r]}  # noqa: E731
        registered = ray.get(
            [coordinator.register.remote(r, CONSUMERS, dp(r)) for r in range(CONSUMERS)]
        )
        generation = registered[-1]["generation"]
        plans = ray.get(
            [coordinator.start_epoch.remote(generation, r, 0) for r in range(CONSUMERS)]
        )
        firsts = [plan["plan"].ranges[0][0] for plan in plans]
        usage = {"batches": 1, "samples": 1, "bytes": 8, "stall_s": 0.0}
        rounds = iter(range(1, 64))  # (each consumer's 64 rows: ample for a 1 s window)

        def a_round_of_acks() -> AckAnswer:
            """Each consumer acknowledges one more row; the answer to the last."""
            step = next(rounds)
            calls = [
                coordinator.ack.remote(
                    generation, r, 0, step, np.array([[first, first + step]]), usage
                )
                for r, first in enumerate(firsts)
            ]
            return ray.get(calls)[-1]

        # Until the coordinator measured its cost per call (a window of 1 s and 20 calls),
        # it asks for the configured interval; then for as long as 16 consumers need.
        answer = wait_until(
            lambda: (answer := a_round_of_acks()).interval_s > CONFIGURED_S and answer,
            "the coordinator to ask for a longer interval than the configured one",
        )
        described = ray.get(coordinator.describe.remote())
        assert described["ack_interval_asked_s"] == pytest.approx(answer.interval_s)
        # paced, it asks them to send through their node's relay (`ack_relay="auto"`)
        assert answer.relay and described["ack_relays"] == 0
        # a sender takes the interval the coordinator asks for, and then the relay
        sender = AckSender(coordinator, generation, 0, interval_s=CONFIGURED_S)
        sender.add(0, 64, np.array([[firsts[0], firsts[0] + 64]]), 1, 8, 0.0)
        sender.flush(wait=True)
        assert sender.asked_s > CONFIGURED_S
        assert sender.pause_s == sender.asked_s  # its thread now waits that long
        sender.add(0, 64, np.array([[firsts[0], firsts[0] + 64]]), 1, 8, 0.0)
        wait_until(lambda: sender.flush(wait=True) or sender.relay_token, "a relay to be taken")
        sender.add(0, 64, np.array([[firsts[0], firsts[0] + 64]]), 1, 8, 0.0)
        sender.flush(wait=True)
        described = ray.get(coordinator.describe.remote())
        assert described["ack_relays"] == 1 and described["acks_relayed"] >= 1
        sender.stop()
    finally:
        loader.shutdown()


def test_a_few_consumers_are_asked_for_the_configured_interval(ray_session, tmp_path):
    path = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"id": np.arange(200)}), path, row_group_size=50)
    loader = Loader(ParquetSource([str(path)]), batch_size=8, name=f"pacing-{uuid.uuid4().hex[:8]}")
    try:
        iterator = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        assert sum(len(batch["id"]) for batch in iterator) == 200
        # the epoch's end waited for the last group: its answer was taken
        assert iterator.stats()["ack_interval_asked_s"] == loader.settings.ack_interval_s
        assert loader.stats()["ack_interval_asked_s"] == loader.settings.ack_interval_s
    finally:
        loader.shutdown()


def test_the_loader_benchmark_gives_its_ack_interval_to_every_rayshard_loader(
    ray_session, tmp_path
):
    from benchmarks.loaders import on_ray

    path = tmp_path / "ids.parquet"
    x = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(100 * 128, np.float32)), 128)
    pq.write_table(pa.table({"x": x, "label": np.zeros(100), "id": np.arange(100)}), path)
    on_ray.LOADER_OPTIONS["ack_interval_s"] = 0.5  # what `--ack-interval 0.5` sets
    try:
        loader = on_ray._rayshard_loader([str(path)])
        dynamic = on_ray._rayshard_loader([str(path)], policy="dynamic")
        assert loader.settings.ack_interval_s == dynamic.settings.ack_interval_s == 0.5
        loader.shutdown()
        dynamic.shutdown()
    finally:
        on_ray.LOADER_OPTIONS.clear()
