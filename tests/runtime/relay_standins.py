"""Stand-ins for the relay tests, importable by Ray's workers (a coordinator that offers a
relay whose start is held), and the tests' ways to stop or check a relay."""

from __future__ import annotations

import contextlib
import os
import signal

import numpy as np
import ray

from rayshard.core.ack_pacing import AckAnswer
from rayshard.runtime.acks import AckSender
from tests.timeouts import wait_until


class HeldRelay:
    """A relay whose start waits until `flag` exists; then it records what it is sent."""

    def __init__(self, flag: str) -> None:
        import os
        import time

        while not os.path.exists(flag):
            time.sleep(0.01)
        self.groups = 0

    def ack(self, sender: str, group: tuple):
        self.groups += 1
        return AckAnswer(0.1, relay=True)

    def count(self) -> int:
        return self.groups


class RelayingCoordinator:
    """A stand-in coordinator that asks for the relay in every answer and offers one whose
    start is held (`HeldRelay`); asked again in place of that one (`failed="held"`), it
    offers a relay held by `replacement_flag`, if given. `asks` records each ask's `failed`."""

    def __init__(self, flag: str, replacement_flag: str | None = None) -> None:
        self.straight, self.flag, self.relay_handle = 0, flag, None
        self.replacement_flag, self.replacement, self.asks = replacement_flag, None, []

    def ack(self, *args, **kwargs):
        self.straight += 1
        return AckAnswer(0.1, relay=True)

    def relay(self, node: str, failed: str = ""):
        self.asks.append(failed)
        if failed == "held" and self.replacement_flag is not None:
            if self.replacement is None:
                self.replacement = ray.remote(HeldRelay).remote(self.replacement_flag)
            return ("replacement", self.replacement)
        if self.relay_handle is None:
            self.relay_handle = ray.remote(HeldRelay).remote(self.flag)
        return ("held", self.relay_handle)

    def asked(self) -> list:
        return list(self.asks)

    def counts(self) -> tuple:
        return self.straight, self.relay_handle is not None


class OneBatchGroups:
    """Called, adds one batch to `sender` (a group of its own at `interval_s=0`); `added`
    counts them."""

    def __init__(self, sender: AckSender) -> None:
        self.sender, self.added = sender, 0

    def __call__(self) -> None:
        self.added += 1
        self.sender.add(0, self.added, np.array([[self.added, self.added + 1]]), 1, 8, 0.0)


class ForwardRecorder:
    """A stand-in coordinator for a relay: records each `relayed` call's groups and
    answers the configured interval, None (stale) for a group of generation 0, and an
    error (refused) for a negative generation."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s, self.calls = interval_s, []

    def relayed(self, node: str, token: str, groups: list) -> list:
        self.calls.append(len(groups))
        return [
            ValueError("refused")
            if args[0] < 0
            else AckAnswer(self.interval_s, True)
            if args[0]
            else None
            for _, args, _ in groups
        ]

    def seen(self) -> list:
        return self.calls


class ShortAnswers(ForwardRecorder):
    """A broken stand-in coordinator: it answers every `relayed` call but the last."""

    def relayed(self, node: str, token: str, groups: list) -> list:
        return super().relayed(node, token, groups)[:-1]


@contextlib.contextmanager
def frozen(relay):
    """The relay's process stopped (`SIGSTOP`: alive, not answering), continued at exit."""
    pid = ray.get(relay.__ray_call__.remote(lambda _: os.getpid()))
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def ended(actor) -> bool:
    try:
        ray.get(actor.counts.remote())
    except ray.exceptions.RayActorError:
        return True
    return False


def relaying_sender(coordinator, generation: int, first: int) -> tuple:
    """An `AckSender` of rank 0 that acknowledged its first batch and took its node's relay
    (flushed by hand); (sender, relay token, relay handle)."""
    sender = AckSender(coordinator, generation, 0, interval_s=60)
    sender.add(0, 1, np.array([[first, first + 8]]), 8, 64, 0.0)
    sender.flush(wait=True)  # its answer asks for the relay

    def relay_taken() -> str:
        sender.flush(wait=True)  # (nothing pending: takes the relay once it runs)
        return sender.relay_token

    token = wait_until(relay_taken, "the sender to take its node's relay")
    _, relay = ray.get(coordinator.relay.remote(ray.get_runtime_context().get_node_id()))
    return sender, token, relay


def exact_epochs_until(loader, iterator, rows: int, enough) -> tuple[int, dict]:
    """Read epochs from 0 on, each holding every sample id in `range(rows)` once, until
    `enough(loader.stats())`; (epochs read, those stats)."""
    epochs = 0

    def an_exact_epoch_then_enough() -> dict | None:
        nonlocal epochs
        iterator.set_epoch(epochs)
        seen = np.concatenate([batch["id"] for batch in iterator])
        assert np.array_equal(np.sort(seen), np.arange(rows)), f"epoch {epochs}"
        epochs += 1
        stats = loader.stats()
        return stats if enough(stats) else None

    stats = wait_until(an_exact_epoch_then_enough, "enough epochs relayed", poll=0)
    return epochs, stats
