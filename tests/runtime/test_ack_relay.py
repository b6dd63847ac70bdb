"""Acknowledgements through a node's relay (`ack_relay`): delivery stays exact, a failed
relay's groups reach the coordinator straight and a new relay replaces it, and an unused
relay is ended (real Ray, real Parquet)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from rayshard.core.ack_pacing import AckPacing
from rayshard.errors import RayshardError
from rayshard.loader import Loader
from rayshard.runtime import ack_relay, relay_link
from rayshard.runtime.acks import AckSender
from rayshard.sources.parquet import ParquetSource
from tests.runtime.relay_standins import (
    ForwardRecorder,
    OneBatchGroups,
    RelayingCoordinator,
    ShortAnswers,
    ended,
    exact_epochs_until,
    frozen,
    relaying_sender,
)
from tests.timeouts import EVENT_TIMEOUT_S, wait_until

pytestmark = [pytest.mark.ray]

ROWS = 240


def _ids_file(tmp_path) -> str:
    path = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"id": np.arange(ROWS)}), path, row_group_size=30)
    return str(path)


def _relaying_loader(tmp_path, **options) -> Loader:
    """A loader over `ROWS` ids, batches of 8, relaying every group (`ack_relay="node"`)."""
    return Loader(
        ParquetSource([_ids_file(tmp_path)]),
        batch_size=8,
        name=f"relay-{uuid.uuid4().hex[:8]}",
        ack_relay="node",
        **options,
    )


def _one_rank_begun(tmp_path) -> tuple:
    """A `data` loader relaying every group, rank 0 of 1 registered and in epoch 0:
    (loader, generation, first sample id of the rank's plan)."""
    loader = _relaying_loader(tmp_path, policy="data")
    coordinator = loader._coordinator
    dp = {"dp_rank": 0, "dp_size": 1, "group": [0]}
    generation = ray.get(coordinator.register.remote(0, 1, dp))["generation"]
    first = ray.get(coordinator.start_epoch.remote(generation, 0, 0))["plan"].ranges[0][0]
    return loader, generation, first


def test_a_dynamic_epoch_through_the_relay_is_exact_and_ends(ray_session, tmp_path):
    # every batch acknowledged: the epoch's end rests on relayed groups
    loader = _relaying_loader(tmp_path, policy="dynamic", ack_interval_s=0)
    try:
        iterator = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        epochs, stats = exact_epochs_until(  # until an epoch's worth of groups went through
            loader, iterator, ROWS, lambda stats: stats["acks_relayed"] >= ROWS // 8
        )
        assert stats["ack_relays"] == 1, stats
        assert stats["acks_relayed"] >= ROWS // 8, f"{epochs} epochs: {stats['acks_relayed']}"
        # the epoch's end was seen through relayed groups: its state is complete
        state = iterator.state_dict()
        assert (state["epoch"], state["consumed"]) == (epochs, [])
        assert stats["consumers"][0]["batches"] == epochs * ROWS // 8
        iterator.close()
    finally:
        loader.shutdown()


def test_a_failed_relay_is_bypassed_and_replaced(ray_session, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rayshard.runtime.acks")
    loader, generation, first = _one_rank_begun(tmp_path)
    coordinator = loader._coordinator
    try:
        sender = AckSender(coordinator, generation, 0, interval_s=60)  # flushed by hand
        added = 0

        def one_more_batch() -> int:
            nonlocal added
            added += 1
            runs = np.array([[first + 8 * (added - 1), first + 8 * added]])
            sender.add(0, added, runs, 8, 64, 0.0)
            return added

        def relay_taken() -> str:  # (nothing pending: a flush takes a relay once it runs)
            sender.flush(wait=True)
            return sender.relay_token

        one_more_batch()
        sender.flush(wait=True)  # its answer asks for the relay
        token = wait_until(relay_taken, "the sender to take its node's relay")
        _, relay = ray.get(coordinator.relay.remote(ray.get_runtime_context().get_node_id()))
        ray.kill(relay)
        wait_until(lambda: ended(relay), "the relay to end")
        last = one_more_batch()
        sender.flush(wait=True)  # through the dead relay: sent again, straight
        assert "acknowledgement relay of this node ended" in caplog.text
        assert sender.relay_token == ""
        recorded = ray.get(coordinator.describe.remote())["consumers"][0]["batches"]
        assert recorded == last  # every batch recorded, the last one straight
        new = wait_until(relay_taken, "the sender to take a new relay")
        assert new != token  # the coordinator replaced the relay the sender saw end
        one_more_batch()
        sender.flush(wait=True)
        described = ray.get(coordinator.describe.remote())
        assert described["consumers"][0]["batches"] == added and described["ack_relays"] == 1
        sender.stop()
        assert sender.relay_token == ""  # a stopped sender holds no relay
    finally:
        loader.shutdown()


def _flush_in_thread(sender, first: int, batch: int) -> threading.Thread:
    """Add batch `batch` and `flush(wait=True)` on a thread (a test that would hang fails)."""

    def flush() -> None:
        runs = np.array([[first + 8 * (batch - 1), first + 8 * batch]])
        sender.add(0, batch, runs, 8, 64, 0.0)
        sender.flush(wait=True)

    thread = threading.Thread(target=flush, daemon=True)
    thread.start()
    return thread


def test_a_frozen_relay_is_bypassed_and_replaced(
    ray_session, tmp_path, caplog, short_relay_patience
):
    caplog.set_level(logging.INFO, logger="rayshard.runtime.acks")
    loader, generation, first = _one_rank_begun(tmp_path)
    coordinator = loader._coordinator
    try:
        sender, token, relay = relaying_sender(coordinator, generation, first)
        with frozen(relay):
            with short_relay_patience():
                flushing = _flush_in_thread(sender, first, 2)
                flushing.join(EVENT_TIMEOUT_S)
                assert not flushing.is_alive(), "flush(wait=True) still waits on the frozen relay"
            assert "ended or hangs (relay" in caplog.text and sender.relay_token == ""
            assert ray.get(coordinator.describe.remote())["consumers"][0]["batches"] == 2
            new = wait_until(
                lambda: sender.flush(wait=True) or sender.relay_token,
                "the sender to take a new relay",
            )
            assert new != token  # the coordinator replaced the frozen relay (and ended it)
            sender.stop()
    finally:
        loader.shutdown()


def test_flushes_that_do_not_wait_bypass_a_frozen_relay(
    ray_session, tmp_path, short_relay_patience
):
    loader, generation, first = _one_rank_begun(tmp_path)
    coordinator = loader._coordinator
    try:
        sender, _, relay = relaying_sender(coordinator, generation, first)
        with frozen(relay), short_relay_patience():
            sender.add(0, 2, np.array([[first + 8, first + 16]]), 8, 64, 0.0)
            sender.flush()  # to the frozen relay; not waited for (the background thread's way)

            def recorded_past_it() -> bool:
                sender.flush()  # probes the relay once the group is overdue, then goes straight
                described = ray.get(coordinator.describe.remote())
                return described["consumers"][0]["batches"] == 2

            wait_until(recorded_past_it, "the group to be recorded past the frozen relay")
            assert sender.relay_token == ""  # dropped: the next answer asks for a new one
            sender.stop()
    finally:
        loader.shutdown()


def test_a_group_its_frozen_relay_forwarded_and_sent_again_is_counted_once(
    ray_session, tmp_path, short_relay_patience
):
    """The relay takes a group to forward, then freezes before it answers: its consumer
    sends the group again straight. The relay's call reaches the coordinator before or
    after the straight one (its `waiting` count rises before the call leaves the
    process, which may be stopped first); either way progress takes the group twice
    harmlessly and the rank's consumer totals count it once."""
    loader, generation, first = _one_rank_begun(tmp_path)
    coordinator = loader._coordinator
    try:
        sender, _, relay = relaying_sender(coordinator, generation, first)
        relayed = ray.get(coordinator.describe.remote())["acks_relayed"]
        flag, started = str(tmp_path / "release"), str(tmp_path / "held")
        held = coordinator.__ray_call__.remote(_hold_until(flag, started))
        wait_until(lambda: (tmp_path / "held").exists(), "the coordinator to be held")
        with short_relay_patience():
            flushing = _flush_in_thread(sender, first, 2)
            wait_until(  # forwarded: the relay's call waits at the held coordinator
                lambda: ray.get(relay.counts.remote())["waiting"] == 1, "the relay to forward"
            )
            with frozen(relay):  # it never answers the group the coordinator records
                (tmp_path / "release").touch()
                ray.get(held)
                flushing.join(EVENT_TIMEOUT_S)
                assert not flushing.is_alive(), "flush(wait=True) still waits on the frozen relay"
                assert sender.relay_token == ""  # dropped: the group went again, straight
        wait_until(  # the relay did forward it (continued, if stopped before its call left)
            lambda: ray.get(coordinator.describe.remote())["acks_relayed"] == relayed + 1,
            "the relay's call to be recorded",
        )
        described = ray.get(coordinator.describe.remote())
        assert described["consumers"][0]["batches"] == 2, described["consumers"]
        assert described["consumers"][0]["samples"] == 16
        sender.stop()
    finally:
        (tmp_path / "release").touch()
        loader.shutdown()


def test_a_relay_waiting_on_a_slow_coordinator_is_kept(ray_session, tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG, logger="rayshard.runtime.acks")
    loader, generation, first = _one_rank_begun(tmp_path)
    coordinator = loader._coordinator
    try:
        sender, token, _ = relaying_sender(coordinator, generation, first)
        # Patience short once the relay runs, read by this process's sender; the relay
        # lives, so its probe's answer is waited for however loaded the machine (2 s
        # would take a slow relay process for a frozen one).
        monkeypatch.setattr(relay_link, "RELAY_PATIENCE_S", 0.5)
        monkeypatch.setattr(relay_link, "PROBE_S", EVENT_TIMEOUT_S)
        relayed = ray.get(coordinator.describe.remote())["acks_relayed"]
        flag, started = str(tmp_path / "release"), str(tmp_path / "held")
        held = coordinator.__ray_call__.remote(_hold_until(flag, started))
        wait_until(lambda: (tmp_path / "held").exists(), "the coordinator to be held")
        flushing = _flush_in_thread(sender, first, 2)
        wait_until(
            lambda: "answers, the coordinator is slow" in caplog.text,
            "the sender to find its relay alive past its patience",
        )
        (tmp_path / "release").touch()
        ray.get(held)
        flushing.join(EVENT_TIMEOUT_S)
        assert not flushing.is_alive(), "flush(wait=True) did not return"
        assert sender.relay_token == token and "ended or hangs" not in caplog.text
        described = ray.get(coordinator.describe.remote())
        assert described["acks_relayed"] == relayed + 1  # the group went through the relay
        assert described["consumers"][0]["batches"] == 2
        sender.stop()
    finally:
        (tmp_path / "release").touch()
        loader.shutdown()


def _hold_until(flag: str, started: str):
    """Run on the coordinator (`__ray_call__`): blocks its event loop until `flag` exists,
    having made `started` (how a test keeps the coordinator from answering)."""

    def hold(_actor) -> None:
        import time

        open(started, "w").close()
        while not os.path.exists(flag):
            time.sleep(0.01)

    return hold


def test_groups_that_arrive_while_a_call_is_in_flight_go_in_one_call(ray_session, tmp_path):
    loader, generation, first = _one_rank_begun(tmp_path)
    coordinator = loader._coordinator
    try:
        _, relay = ray.get(coordinator.relay.remote(ray.get_runtime_context().get_node_id()))
        ray.get(relay.counts.remote())  # started
        flag, started = str(tmp_path / "release"), str(tmp_path / "held")
        held = coordinator.__ray_call__.remote(_hold_until(flag, started))
        wait_until(lambda: (tmp_path / "held").exists(), "the coordinator to be held")
        usage = {"batches": 1, "samples": 8, "bytes": 64, "stall_s": 0.0}
        groups = [
            ((generation, 0, 0, n, np.array([[first + 8 * (n - 1), first + 8 * n]]), usage), {})
            for n in range(1, 11)
        ]
        answers = [relay.ack.remote(f"sender-{n}", group) for n, group in enumerate(groups)]
        wait_until(
            lambda: ray.get(relay.counts.remote())["waiting"] == len(groups),
            "every group to wait at the relay",
        )
        (tmp_path / "release").touch()
        ray.get(held)
        recorded = ray.get(answers)
        counts = ray.get(relay.counts.remote())
        # the first call took what had arrived (at least one group), the next the rest
        assert counts["groups"] == len(groups) and counts["calls"] <= 2, counts
        assert all(answer.relay for answer in recorded)  # ("node": every answer says so)
        described = ray.get(coordinator.describe.remote())
        assert described["acks_relayed"] == len(groups)
        assert described["consumers"][0]["batches"] == len(groups)
    finally:
        loader.shutdown()


def test_an_unused_relay_is_ended(ray_session, monkeypatch):
    monkeypatch.setattr(ack_relay, "IDLE_RELEASE_S", 0.2)

    async def made_then_idle() -> tuple[int, object]:
        relays = ack_relay.AckRelays(AckPacing(0.1), coordinator="none: it forwards nothing")
        _, handle = relays.relay(ray.get_runtime_context().get_node_id())
        assert len(relays) == 1
        while len(relays):  # ended once unused for IDLE_RELEASE_S (an event, bounded below)
            await asyncio.sleep(0.05)
        return len(relays), handle

    left, handle = asyncio.run(asyncio.wait_for(made_then_idle(), 60))
    assert left == 0
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(handle.counts.remote())


def test_a_relay_that_does_not_start_is_replaced(ray_session, tmp_path, monkeypatch, caplog):
    """An offered relay not running within `RELAY_START_S` is asked for again at once, in
    its place (`failed` names it), and the new one is taken; groups go straight meanwhile."""
    monkeypatch.setattr(relay_link, "RELAY_START_S", 0.5)  # read by `take` on each call
    never, ready = tmp_path / "never touched", tmp_path / "replacement may start"
    ready.touch()
    coordinator = ray.remote(RelayingCoordinator).remote(str(never), str(ready))
    sender = AckSender(coordinator, generation=1, dp_rank=0, interval_s=0)  # each at once
    one_more_batch = OneBatchGroups(sender)

    with caplog.at_level(logging.WARNING, logger="rayshard.runtime.acks"):
        wait_until(
            lambda: one_more_batch() or sender.relay_token == "replacement",
            "the replacement relay taken",
        )
    # (a loaded machine may start the replacement late too, and ask again meanwhile)
    assert ray.get(coordinator.asked.remote())[:2] == ["", "held"]
    assert "did not start within 0.5 s; asking again" in caplog.text
    replacement = ray.get(coordinator.__ray_call__.remote(lambda c: c.replacement))
    one_more_batch()
    sender.flush(wait=True)
    straight = ray.get(coordinator.counts.remote())[0]
    assert straight + ray.get(replacement.count.remote()) == one_more_batch.added  # each one way
    assert ray.get(replacement.count.remote()) >= 1
    sender.stop()
    never.touch()  # the held relay may end its start, and go with the coordinator
    ray.kill(coordinator)


def test_groups_go_straight_until_the_offered_relay_runs(ray_session, tmp_path):
    flag = tmp_path / "relay may start"
    coordinator = ray.remote(RelayingCoordinator).remote(str(flag))
    sender = AckSender(coordinator, generation=1, dp_rank=0, interval_s=0)  # each at once
    one_more_batch = OneBatchGroups(sender)

    # the first answers ask for the relay; the coordinator offers one that cannot start
    wait_until(lambda: one_more_batch() or ray.get(coordinator.counts.remote())[1], "an offer")
    for _ in range(5):  # each after a round trip to the coordinator, which answered the offer
        ray.get(coordinator.counts.remote())  # before: the sender takes it at a flush here
        one_more_batch()  # (so none of these may go to the relay, which is not running)
    wait_until(
        lambda: ray.get(coordinator.counts.remote())[0] == one_more_batch.added,
        "every group sent while the relay was starting to reach the coordinator",
    )
    assert sender.relay_token == ""
    flag.touch()  # the relay starts: the sender takes it, and sends there from then on
    wait_until(lambda: one_more_batch() or sender.relay_token == "held", "the relay taken")
    relay = ray.get(coordinator.__ray_call__.remote(lambda c: c.relay_handle))
    one_more_batch()
    sender.flush(wait=True)
    assert ray.get(relay.count.remote()) >= 1
    straight = ray.get(coordinator.counts.remote())[0]
    assert straight + ray.get(relay.count.remote()) == one_more_batch.added  # each one way
    sender.stop()


def test_a_relay_answers_the_longer_of_its_own_interval_and_the_coordinators(ray_session):
    coordinator = ray.remote(ForwardRecorder).remote(0.1)
    # a measured cost of 10 ms a call (no window closes: its calls never reach min_calls)
    pacing = AckPacing(0.1, cost_s=0.01, min_calls=10**9)
    node = ray.get_runtime_context().get_node_id()
    relay = ray.remote(ack_relay.AckRelay).remote(coordinator, node, "token", pacing)
    group = ((1, 0, 0, 1, np.array([[0, 1]]), {}), {})
    answers = [ray.get(relay.ack.remote(f"sender-{k}", group)) for k in range(1, 21)]
    # k consumers heard from: k x 10 ms / 0.8, once above the coordinator's 0.1 s
    for k, answer in enumerate(answers, start=1):
        assert answer.interval_s == pytest.approx(max(0.1, k * 0.01 / 0.8)), k
        assert answer.relay
    again = ray.get(relay.ack.remote("sender-1", group))  # a consumer counted once
    assert again.interval_s == pytest.approx(20 * 0.01 / 0.8)
    stale = ((0, 0, 0, 1, np.array([[0, 1]]), {}), {})
    assert ray.get(relay.ack.remote("sender-1", stale)) is None  # passed through
    refused = ((-1, 0, 0, 1, np.array([[0, 1]]), {}), {})
    with pytest.raises(ray.exceptions.RayTaskError, match="refused"):  # to its sender only
        ray.get(relay.ack.remote("sender-1", refused))
    assert ray.get(relay.ack.remote("sender-2", group)).relay  # the relay goes on
    assert sum(ray.get(coordinator.seen.remote())) == 24


def test_a_call_the_relay_gets_no_answer_for_fails_rather_than_waits(ray_session):
    """Whatever goes wrong in a relay's forwarding, each call ends: one left unanswered
    would hold its consumer while the relay still answers probes (so it is never dropped)."""
    coordinator = ray.remote(ShortAnswers).remote(0.1)
    node = ray.get_runtime_context().get_node_id()
    relay = ray.remote(ack_relay.AckRelay).remote(coordinator, node, "token", AckPacing(0.1))
    group = ((1, 0, 0, 1, np.array([[0, 1]]), {}), {})
    with pytest.raises(ray.exceptions.RayTaskError, match="lost this call's answer"):
        ray.get(relay.ack.remote("sender-1", group), timeout=EVENT_TIMEOUT_S)
    answer = ray.get(relay.lease.remote("sender-1", group), timeout=EVENT_TIMEOUT_S)
    assert isinstance(answer, RuntimeError) and "lost" in str(answer)  # returned, not raised


def test_one_refused_group_fails_alone_in_a_relayed_call(ray_session, tmp_path):
    loader, generation, first = _one_rank_begun(tmp_path)
    coordinator = loader._coordinator
    try:
        usage = {"batches": 1, "samples": 8, "bytes": 64, "stall_s": 0.0}
        good = ("ack", (generation, 0, 0, 1, np.array([[first, first + 8]]), usage), {})
        bad = ("ack", (generation, 0, 0, 2, "not runs", usage), {})
        node = ray.get_runtime_context().get_node_id()
        answers = ray.get(coordinator.relayed.remote(node, "no relay", [good, bad]))
        assert answers[0].relay and answers[0].interval_s == loader.settings.ack_interval_s
        assert isinstance(answers[1], RayshardError), answers[1]
        refusal = str(answers[1])
        assert "relayed ack {'generation': " in refusal and "'batches': 2} refused" in refusal
        described = ray.get(coordinator.describe.remote())
        assert described["consumers"][0]["batches"] == 1  # the good group, recorded
        assert (described["acks_relayed"], described["ack_relay_calls"]) == (2, 1)
    finally:
        loader.shutdown()
