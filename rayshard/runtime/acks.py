"""Acknowledgements from a training loop to the coordinator: what the loop received, sent
in groups from a background thread (`AckSender`), as runs of sample ids
(`rayshard.plan.id_runs.sample_runs`), straight or through the node's relay."""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from typing import Any

import numpy as np
import ray

from rayshard.core.ack_pacing import AckAnswer
from rayshard.plan.id_runs import as_runs, union
from rayshard.runtime.metrics import record_batches
from rayshard.runtime.ray_held import ray_held

log = logging.getLogger(__name__)


class AckSender:
    """Sends acknowledgements to the coordinator in groups: every `interval_s` from a
    background thread (so they go out even while the training loop is blocked in a
    collective), and at once before `state_dict()`, at the end of an epoch and on close.
    `interval_s <= 0` acknowledges every batch as it is received. The interval bounds what
    a lost rank had received without acknowledging: the samples served again. With
    `interval_s > 0` one group is in flight at a time (see `flush`): when the coordinator
    takes longer than the interval to record a group, the next goes once it has.

    `flush(wait=True)` returns once the coordinator recorded every acknowledgement sent so
    far. The end of an epoch and `close()` wait: a worker that finishes an epoch and exits
    takes its reader with it, and the coordinator must not see that death before the
    acknowledgements (an async actor does not run one caller's calls in order), or it
    would serve the last rows again to the other ranks.

    The coordinator answers each group with the interval it asks for (`AckPacing`: longer
    than `interval_s` when so many consumers acknowledge that their calls would outrun it);
    the background thread waits the longer of the two between groups (`pause_s`). An answer
    may also ask for the node's relay (`rayshard.runtime.ack_relay`): the sender then asks
    the coordinator for it and sends its groups there from then on. A group whose relay
    failed is sent again straight to the coordinator, and the next relay asked for replaces
    the failed one."""

    def __init__(
        self,
        coordinator: Any,
        generation: int,
        dp_rank: int,
        interval_s: float = 0.1,
        loader_name: str = "",
    ) -> None:
        self._coordinator, self.generation, self._rank = coordinator, generation, dp_rank
        self._loader_name = loader_name
        self._lock = threading.Lock()
        # epoch -> [last batch count, run arrays, samples, bytes, stall seconds, batches in
        #           group, packing's split documents {sample index: tokens delivered}]
        self._pending: dict[int, list] = {}
        self._sent: list[_Sent] = []  # acknowledgement calls not known to be recorded
        self._wake = threading.Event()
        self._interval = interval_s
        self._asked_s = 0.0  # the interval the coordinator asked for in its last answer
        self._relay: tuple[str, Any] | None = None  # (token, handle) of the node's relay
        # the `Coordinator.relay` call in flight, then the offered relay's readiness call
        self._relay_asked: Any = None
        self._relay_offered: tuple[str, Any] | None = None  # (token, handle) not yet running
        self._relay_failed = ""  # token of the relay that failed last (to be replaced)
        self._stopping = False  # `stop()` began: no relay asked for any more
        self._sender_id = f"{dp_rank}-{uuid.uuid4().hex[:8]}"  # for the relay's pacing
        self.groups_sent = 0  # groups sent (not counting one sent again past a failed relay)
        self._thread: threading.Thread | None = None
        if interval_s > 0:
            self._thread = threading.Thread(target=self._run, daemon=True, name="rayshard-acks")
            self._thread.start()

    def add(
        self,
        epoch: int,
        batches: int,
        runs: np.ndarray,
        samples: int,
        nbytes: int,
        stall: float,
        partial: list | None = None,
    ) -> None:
        with self._lock:
            entry = self._pending.setdefault(epoch, [0, [], 0, 0, 0.0, 0, {}])
            for index, tokens in partial or ():
                entry[6][index] = max(entry[6].get(index, 0), tokens)
            entry[0] = batches
            entry[5] += 1
            entry[1].append(runs)
            entry[2] += samples
            entry[3] += nbytes
            entry[4] += stall
        if self._interval <= 0:
            self.flush()

    def flush(self, wait: bool = False) -> None:
        """Send what is pending; with `wait`, block until everything added so far was
        recorded. Without `wait`, and with an `interval_s` above 0, nothing is sent while
        the group sent last is not recorded yet: what is pending goes with a later flush.
        One group in flight per rank bounds the coordinator's queue to a group per rank;
        the interval it asks for (`asked_s`) keeps the queue short."""
        if not wait:
            with self._lock:
                self._sent, answers = self._settle(self._sent)
                self._take_asked(answers)
                if self._interval > 0 and self._sent:
                    return
                self._send_pending()
            return
        with self._lock:
            self._send_pending()
            sent, self._sent = self._sent, []
        answers = [self._recorded(entry) for entry in sent]
        with self._lock:
            self._take_asked(answers)

    @property
    def asked_s(self) -> float:
        """The interval the coordinator asked for in the last answer taken (0: none yet)."""
        return self._asked_s

    @property
    def pause_s(self) -> float:
        """How long the background thread waits between groups: `interval_s`, or the
        longer interval the coordinator asked for."""
        return max(self._interval, self._asked_s)

    @property
    def relay_token(self) -> str:
        """The token of the relay this sender sends through ("": straight)."""
        return self._relay[0] if self._relay is not None else ""

    def _take_asked(self, answers: list) -> None:
        """Keep the interval the newest of `answers` asked for (None: an answer without one,
        as from a coordinator that does not pace, or a call that failed; under `_lock`), and
        ask for the node's relay if it says so."""
        wants_relay = any(isinstance(a, AckAnswer) and a.relay for a in answers)
        idle = self._relay is None and self._relay_asked is None  # no relay, none asked
        if wants_relay and idle and not self._stopping:
            node = ray.get_runtime_context().get_node_id()
            self._relay_asked = self._coordinator.relay.remote(node, self._relay_failed)
        asked = [a.interval_s if isinstance(a, AckAnswer) else a for a in answers]
        asked = [a for a in asked if isinstance(a, (int, float))]
        if not asked:
            return
        paced = self._interval > 0 and asked[-1] > self._interval
        if paced and self._asked_s <= self._interval:  # the first time: say why
            log.info(
                "the coordinator asks rank %d for acknowledgements every %.3g s instead of "
                "ack_interval_s=%g: it serves so many consumers that their calls would "
                "outrun it; a lost rank repeats up to that interval's batches",
                self._rank,
                asked[-1],
                self._interval,
            )
        self._asked_s = float(asked[-1])

    def _send_pending(self) -> None:
        """Send what is pending, one call per epoch, adding the calls to `_sent` (under
        `_lock`)."""
        self._take_relay()
        pending, self._pending = self._pending, {}
        for epoch, entry in sorted(pending.items()):
            batches, held, samples, nbytes, stall, count, partial = entry
            # (n, 2) the group's runs, merged: consecutive batches' runs join
            runs = union(np.concatenate([as_runs(r) for r in held]))
            usage = {"batches": count, "samples": samples, "bytes": nbytes, "stall_s": stall}
            record_batches(self._loader_name, self._rank, count, nbytes, stall)
            args = (self.generation, self._rank, epoch, batches, runs, usage)
            # only under packing: split documents' progress
            options = {"partial": sorted(partial.items())} if partial else {}
            self._sent.append(self._send((args, options), self._relay))
            self.groups_sent += 1

    def _send(self, group: tuple, relay: tuple[str, Any] | None) -> _Sent:
        """One call carrying `group` (the arguments of `Coordinator.ack`): through `relay`
        (token, handle), or straight to the coordinator."""
        if relay is not None:
            return _Sent(relay[1].ack.remote(self._sender_id, group), group, relay[0])
        args, options = group
        return _Sent(self._coordinator.ack.remote(*args, **options), group, "")

    def _take_relay(self) -> None:
        """Take the relay the coordinator answered with once it runs: the coordinator's
        answer comes before the actor started, and groups sent to a relay still starting
        would wait unrecorded, growing what a lost rank repeats (under `_lock`). A failed
        step is logged; the next answer that asks for a relay asks again, replacing a relay
        that failed to start."""
        if self._relay_asked is None or ray.wait([self._relay_asked], timeout=0)[1]:
            return
        offered, self._relay_offered = self._relay_offered, None
        try:
            answer = ray.get(self._relay_asked)
        except Exception as error:  # noqa: BLE001 - straight to the coordinator meanwhile
            log.warning("could not get this node's acknowledgement relay: %r", error)
            self._relay_failed = offered[0] if offered else self._relay_failed
            self._relay_asked = None
            return
        if offered is None:  # the coordinator answered: now wait until the relay runs
            self._relay_offered = tuple(answer)
            self._relay_asked = self._relay_offered[1].__ray_ready__.remote()
            return
        self._relay, self._relay_asked = offered, None

    def _relay_failed_call(self, entry: _Sent, error: Exception) -> _Sent:
        """A call through the relay failed: the group goes again, straight (returned).
        If the relay itself ended (released while idle, or died, alone or with its node),
        send straight until a new one runs; the next relay asked for replaces it (under
        `_lock`)."""
        gone = isinstance(error, ray.exceptions.RayActorError)
        if gone and self._relay is not None and self._relay[0] == entry.relay:
            log.info(
                "the acknowledgement relay of this node ended (%s): rank %d sends its "
                "groups straight to the coordinator until a new one runs",
                type(error).__name__,
                self._rank,
            )
            self._relay, self._relay_failed = None, entry.relay
        elif not gone:
            log.warning("a relayed acknowledgement failed, sent again straight: %r", error)
        return self._send(entry.group, None)

    def _settle(self, entries: list[_Sent]) -> tuple[list[_Sent], list]:
        """The calls of `entries` that have not returned yet (a group whose relay failed
        is sent again, straight), and the answers of those that returned, in call order
        (None for a failed straight call; under `_lock`)."""
        if not entries:
            return entries, []
        refs = [entry.ref for entry in entries]
        done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        busy, answers = [], []
        for entry in entries:
            if entry.ref not in done:
                busy.append(entry)
                continue
            try:  # returned already: no wait
                answers.append(ray.get(entry.ref))
            except Exception as error:  # noqa: BLE001 - its rows are served again, as before
                if entry.relay:
                    busy.append(self._relay_failed_call(entry, error))
                    continue
                log.warning(
                    "an acknowledgement call failed (its rows may be served again): %r", error
                )
                answers.append(None)
        return busy, answers

    def _recorded(self, entry: _Sent) -> Any:
        """Wait until `entry` is recorded and return its answer; a group whose relay failed
        is sent again straight to the coordinator, and waited for. Raises if a straight
        call failed."""
        try:
            return ray.get(entry.ref)
        except Exception as error:
            if not entry.relay:
                raise
            with self._lock:
                again = self._relay_failed_call(entry, error)
            return ray.get(again.ref)

    def stop(self) -> None:
        """End the background thread, then send what is pending and wait until it is
        recorded. After `ray.shutdown()` there is no one to send to: the acknowledgements
        are dropped, and no Ray call is made (it would start a new local Ray)."""
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()  # no flush of the thread's can follow
        with ray_held() as up:
            self._stopping = True  # asks for no relay from now on
            if up:
                self.flush(wait=True)
            self._forget()  # (under `ray_held()`: references dropped while Ray is up)

    def _run(self) -> None:
        """Flush every `interval_s` until `stop()`, or until Ray is shut down under it
        (a `ray.shutdown()` with the iterator still open)."""
        while not self._wake.wait(self.pause_s):
            with ray_held() as up:
                if not up:
                    self._forget()
                    return
                self.flush()

    def _forget(self) -> None:
        """Drop what is pending and the references to what was sent and to the relay (at
        `stop()`, or once Ray is down; under `ray_held()`, since a dropped `ObjectRef` calls
        into Ray's core worker, which ends the process once Ray was shut down)."""
        with self._lock:
            self._pending, self._sent = {}, []
            self._relay, self._relay_asked, self._relay_offered = None, None, None


@dataclasses.dataclass(frozen=True)
class _Sent:
    """An acknowledgement call in flight: its reference, the group it carries (to send it
    again if its relay fails) and the relay's token ("": straight to the coordinator)."""

    ref: Any
    group: tuple
    relay: str


__all__ = ["AckSender"]
