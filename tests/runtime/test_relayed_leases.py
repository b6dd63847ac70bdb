"""`dynamic` lease calls through a node's relay (`ack_relay`): a rank reading in its
consumer sends them where its acknowledgements go, a reader actor once a lease answer
asks for it; delivery stays exact, a lease whose relay died or hangs is answered straight
with the same request id (granted once), and a call a late relay delivers after its
rank's next one is refused (real Ray, real Parquet)."""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from rayshard.errors import RayshardError, StaleClientError
from rayshard.loader import Loader
from rayshard.plan import intervals as iv
from rayshard.sources.parquet import ParquetSource
from tests.runtime.relay_standins import ended, exact_epochs_until, frozen, relaying_sender
from tests.timeouts import wait_until

pytestmark = [pytest.mark.ray]

ROWS = 240


def _dynamic_loader(tmp_path, **options) -> Loader:
    """A `dynamic` loader over `ROWS` ids in row groups of 30 (its pieces), batches of 8,
    relaying every group (`ack_relay="node"`, unless `options` say otherwise)."""
    path = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"id": np.arange(ROWS)}), path, row_group_size=30)
    return Loader(
        ParquetSource([str(path)]),
        batch_size=8,
        name=f"leases-{uuid.uuid4().hex[:8]}",
        policy="dynamic",
        **{"ack_relay": "node", **options},
    )


def test_a_rank_reading_in_its_consumer_leases_through_the_relay_exactly(ray_session, tmp_path):
    loader = _dynamic_loader(tmp_path)
    try:
        iterator = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        # until an epoch's worth of lease calls (a piece each at least) went through it
        epochs, stats = exact_epochs_until(
            loader, iterator, ROWS, lambda stats: stats["leases_relayed"] >= ROWS // 30
        )
        assert stats["ack_relays"] == 1 and stats["acks_relayed"] > 0, stats
        state = iterator.state_dict()
        assert (state["epoch"], state["consumed"]) == (epochs, [])  # every epoch ended
        iterator.close()
    finally:
        loader.shutdown()


def test_a_reader_actor_leases_through_the_relay_exactly(ray_session, tmp_path):
    """A rank read by its reader actor (`consumer_reads=False`: a model-parallel group's,
    or one with reader workers) sends no acknowledgement groups of its own: its leases take
    the node's relay once a lease answer asks for it."""
    loader = _dynamic_loader(tmp_path, consumer_reads=False)
    try:
        iterator = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        epochs, stats = exact_epochs_until(
            loader, iterator, ROWS, lambda stats: stats["leases_relayed"] >= ROWS // 30
        )
        assert stats["ack_relays"] == 1, stats  # the node's one relay, the consumer's too
        assert sum(calls["calls"] for calls in stats["lease_calls"].values()) > 0
        state = iterator.state_dict()
        assert (state["epoch"], state["consumed"]) == (epochs, [])
        iterator.close()
    finally:
        loader.shutdown()


def test_a_reader_actor_leases_straight_when_relays_are_off(ray_session, tmp_path):
    loader = _dynamic_loader(tmp_path, consumer_reads=False, ack_relay="off")
    try:
        iterator = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        _, stats = exact_epochs_until(
            loader, iterator, ROWS, lambda stats: stats["lease_calls"][0]["calls"] >= ROWS // 30
        )
        assert stats["leases_relayed"] == 0 and stats["ack_relays"] == 0, stats
        iterator.close()
    finally:
        loader.shutdown()


def _rank_in_epoch_zero(coordinator) -> int:
    """Rank 0 of 1 registered and in epoch 0: its generation."""
    dp = {"dp_rank": 0, "dp_size": 1, "group": [0]}
    generation = ray.get(coordinator.register.remote(0, 1, dp))["generation"]
    ray.get(coordinator.start_epoch.remote(generation, 0, 0))
    return generation


def _rank_with_relay(loader) -> tuple:
    """Rank 0 of 1 registered and in epoch 0, its first lease (one piece) taken straight,
    and an `AckSender` that acknowledged its first batch and took the node's relay:
    (sender, generation, the first lease's answer, the relay's handle)."""
    coordinator = loader._coordinator
    generation = _rank_in_epoch_zero(coordinator)
    leased = ray.get(coordinator.lease.remote(generation, 0, 0, 1, False, "stream:0"))
    sender, _, relay = relaying_sender(coordinator, generation, leased.pieces[0][0])
    return sender, generation, leased, relay


def _held(loader, generation: int) -> list:
    return iv.normalize(ray.get(loader._coordinator.held.remote(generation, 0, 0)))


def test_a_lease_through_a_dead_relay_is_answered_straight_once(ray_session, tmp_path):
    loader = _dynamic_loader(tmp_path)
    try:
        sender, generation, first, relay = _rank_with_relay(loader)
        relayed = sender.lease((generation, 0, 0, 1, False, "stream:1"), {})
        assert relayed.relay == sender.relay_token != ""
        second = sender.answer(relayed)
        assert ray.get(loader._coordinator.describe.remote())["leases_relayed"] == 1
        ray.kill(relay)
        wait_until(lambda: ended(relay), "the relay to end")
        third = sender.answer(sender.lease((generation, 0, 0, 1, False, "stream:2"), {}))
        assert sender.relay_token == ""  # dropped: the next answer asks for a new one
        pieces = [*first.pieces, *second.pieces, *third.pieces]
        assert third.pieces and iv.total(iv.normalize(pieces)) == iv.total(pieces)  # disjoint
        assert _held(loader, generation) == iv.normalize(pieces)  # granted once each
        sender.stop()
    finally:
        loader.shutdown()


def test_a_lease_a_frozen_relay_delivers_late_is_refused(
    ray_session, tmp_path, short_relay_patience
):
    loader = _dynamic_loader(tmp_path)
    coordinator = loader._coordinator
    try:
        sender, generation, first, relay = _rank_with_relay(loader)
        # Its answers ask for the relay: a new one would replace (end) the frozen one
        # before it thaws; this rank asks for none, so the late delivery happens.
        sender._link.stopping = True
        with frozen(relay), short_relay_patience():
            late = sender.lease((generation, 0, 0, 1, False, "stream:1"), {})
            assert late.relay != ""
            # past the patience and a failed probe: sent straight, with the same id
            second = sender.answer(late)
            assert sender.relay_token == ""
            third = sender.answer(sender.lease((generation, 0, 0, 1, False, "stream:2"), {}))
            assert third.pieces
        # The relay goes on: it forwards "stream:1" after the rank's "stream:2".
        wait_until(
            lambda: ray.get(coordinator.describe.remote())["leases_relayed"] == 1,
            "the thawed relay to forward its late lease",
        )
        pieces = [*first.pieces, *second.pieces, *third.pieces]
        assert _held(loader, generation) == iv.normalize(pieces)  # nothing more was granted
        sender.stop()
    finally:
        loader.shutdown()


def test_a_lease_refused_through_the_relay_raises_the_coordinators_error(ray_session, tmp_path):
    loader = _dynamic_loader(tmp_path)
    try:
        sender, generation, _, _ = _rank_with_relay(loader)
        token = sender.relay_token
        stale = sender.lease((generation - 1, 0, 0, 1, False, "stream:1"), {})
        assert stale.relay == token
        with pytest.raises(StaleClientError, match=f"generation {generation - 1}"):
            sender.answer(stale)  # the relay's refusal, sent again straight: its own error
        assert sender.relay_token == token  # a refusal does not drop a working relay
        sender.stop()
    finally:
        loader.shutdown()


def test_relayed_lease_calls_fail_alone_and_a_retry_gets_the_same_answer(ray_session, tmp_path):
    loader = _dynamic_loader(tmp_path)
    coordinator = loader._coordinator
    try:
        generation = _rank_in_epoch_zero(coordinator)
        good = ("lease", (generation, 0, 0, 1, False, "stream:0"), {"waited_s": 0.5})
        refused = ("lease", (generation + 1, 0, 0, 1, False, "stream:1"), {})
        node = ray.get_runtime_context().get_node_id()
        leased, error = ray.get(coordinator.relayed.remote(node, "no relay", [good, refused]))
        assert leased.pieces and isinstance(error, RayshardError)
        assert "relayed lease {'generation': " in str(error) and "refused" in str(error)
        # the same call sent again straight (its relay failed after forwarding it)
        again = ray.get(coordinator.lease.remote(*good[1], **good[2]))
        assert again == leased and _held(loader, generation) == iv.normalize(leased.pieces)
        described = ray.get(coordinator.describe.remote())
        assert (described["leases_relayed"], described["ack_relay_calls"]) == (2, 1)
        assert described["lease_calls"][0]["calls"] == 1  # the retry, answered again, once
        assert described["lease_calls"][0]["waited_s"] == 0.5
    finally:
        loader.shutdown()


def test_a_lease_call_answered_again_is_traced_once(ray_session, tmp_path):
    """The coordinator's trace (`trace()`, read by the elastic benchmarks) holds a grant
    once: the same call sent again straight, past a relay that had forwarded it, is
    answered again, not granted again."""
    loader = _dynamic_loader(tmp_path)
    coordinator = loader._coordinator
    try:
        generation = _rank_in_epoch_zero(coordinator)
        ray.get(coordinator.trace.remote(True))
        call = ("lease", (generation, 0, 0, 1, False, "stream:0"), {})
        node = ray.get_runtime_context().get_node_id()
        (leased,) = ray.get(coordinator.relayed.remote(node, "no relay", [call]))
        assert ray.get(coordinator.lease.remote(*call[1])) == leased  # again, straight
        later = ray.get(coordinator.lease.remote(generation, 0, 0, 1, False, "stream:1"))
        traced = ray.get(coordinator.trace.remote(False))
        assert [(kind, rank, pieces) for _, kind, rank, pieces in traced] == [
            ("lease", 0, list(leased.pieces)),
            ("lease", 0, list(later.pieces)),
        ]
        assert ray.get(coordinator.describe.remote())["lease_calls"][0]["calls"] == 2
    finally:
        loader.shutdown()
