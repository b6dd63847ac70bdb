"""Acknowledgements from a training loop to the coordinator: what the loop received, sent
in groups from a background thread (`AckSender`), as runs of sample ids
(`rayshard.plan.id_runs.sample_runs`), straight or through the node's relay."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import numpy as np
import ray

from rayshard.core.ack_pacing import AckAnswer
from rayshard.plan.id_runs import as_runs, union
from rayshard.runtime.metrics import record_batches
from rayshard.runtime.ray_held import ray_held
from rayshard.runtime.relay_link import RelayHung, RelayLink, Sent

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
    the coordinator for it and, once it runs, sends its groups there (`RelayLink`). A group
    whose relay failed, or hangs (no answer within `RELAY_PATIENCE_S`, and none to a probe),
    is sent again straight to the coordinator, and the next relay asked for replaces it.
    A rank's `dynamic` lease calls go the same way (`lease`): a reader actor has a sender
    for them alone, which asks for the relay when a lease answer says so."""

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
        self._sent: list[Sent] = []  # acknowledgement calls not known to be recorded
        self._waiting = threading.Lock()  # held by the one `flush(wait=True)` waiting
        self._claimed: set[int] = set()  # ids of the `_sent` entries it waits for
        self._wake = threading.Event()
        self._dropped = False  # the iterator was dropped unclosed (`end_soon`)
        self._interval = interval_s
        self._asked_s = 0.0  # the interval the coordinator asked for in its last answer
        self._link = RelayLink(coordinator, dp_rank)  # the way to the node's relay
        self.groups_sent = 0  # groups sent (not counting one sent again past a failed relay)
        self._name = uuid.uuid4().hex  # its groups are "<name>:<groups_sent>" (`RankUsage`)
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
        with self._waiting:  # (one waiter: a second waits for the first, then the rest)
            with self._lock:
                self._send_pending()
                sent = list(self._sent)
                self._claimed = {id(entry) for entry in sent}  # `_settle` leaves them be
            answers = []
            try:
                for entry in sent:  # each leaves `_sent` once recorded: an interrupt keeps
                    answers.append(self._recorded(entry))  # the rest for the next wait
                    with self._lock:
                        self._sent = [kept for kept in self._sent if kept is not entry]
            finally:
                with self._lock:
                    self._claimed = set()
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

    def lease(self, args: tuple, options: dict) -> Sent:
        """A `Coordinator.lease` call of this rank's reading (`dynamic`), through the relay
        its groups go through, or that a lease answer asked for (none taken: straight);
        its answer is `answer(sent)`."""
        with self._lock:
            self._link.take()
            return self._link.send((args, options), method="lease")

    def answer(self, sent: Sent) -> Any:
        """The answer to lease call `sent`: a relayed one is sent again straight past a
        relay that failed or hangs, as a group is (`_recorded`), or whose answer is an
        error (a relay returns a lease's errors: see `AckRelay.lease`). An answer that
        asks for the node's relay (`Leased.relay`) has it asked for, as a group's does:
        a reader actor, which sends no groups, relays its leases so."""
        answer = self._recorded(sent)
        if sent.relay and isinstance(answer, Exception):
            with self._lock:
                again = self._link.failed(sent, answer)
            answer = ray.get(again.ref)
        if getattr(answer, "relay", False):
            with self._lock:
                self._link.want()
        return answer

    @property
    def relay_token(self) -> str:
        """The token of the relay this sender sends through ("": straight)."""
        return self._link.token

    def _take_asked(self, answers: list) -> None:
        """Keep the interval the newest of `answers` asked for (None: an answer without one,
        as from a coordinator that does not pace, or a call that failed; under `_lock`), and
        ask for the node's relay if it says so."""
        if any(isinstance(a, AckAnswer) and a.relay for a in answers):
            self._link.want()
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
        self._link.take()
        pending, self._pending = self._pending, {}
        for epoch, entry in sorted(pending.items()):
            batches, held, samples, nbytes, stall, count, partial = entry
            # (n, 2) the group's runs, merged: consecutive batches' runs join
            runs = union(np.concatenate([as_runs(r) for r in held]))
            usage = {"batches": count, "samples": samples, "bytes": nbytes, "stall_s": stall}
            usage["group"] = f"{self._name}:{self.groups_sent}"  # (one sent again: counted once)
            record_batches(self._loader_name, self._rank, count, nbytes, stall)
            args = (self.generation, self._rank, epoch, batches, runs, usage)
            # only under packing: split documents' progress
            options = {"partial": sorted(partial.items())} if partial else {}
            self._sent.append(self._link.send((args, options)))
            self.groups_sent += 1

    def _settle(self, entries: list[Sent]) -> tuple[list[Sent], list]:
        """The calls of `entries` that have not returned yet (a group whose relay failed
        or hangs is sent again, straight: see `RelayLink.verdict`), and the answers of those
        that returned, in call order (None for a failed straight call; under `_lock`)."""
        if not entries:
            return entries, []
        refs = [entry.ref for entry in entries]
        done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        busy, answers, now = [], [], time.monotonic()
        for entry in entries:
            if id(entry) in self._claimed:  # a waiter's: it sends it again if need be
                busy.append(entry)
                continue
            if entry.ref not in done:
                busy.append(self._link.verdict(entry, now) if entry.overdue(now) else entry)
                continue
            try:  # returned already: no wait
                answers.append(ray.get(entry.ref))
            except Exception as error:  # noqa: BLE001 - its rows are served again, as before
                if entry.relay:
                    busy.append(self._link.failed(entry, error))
                    continue
                log.warning(
                    "an acknowledgement call failed (its rows may be served again): %r", error
                )
                answers.append(None)
        return busy, answers

    def _recorded(self, entry: Sent) -> Any:
        """Wait until `entry` is recorded and return its answer. A relayed group past
        `RELAY_PATIENCE_S` has its relay probed (outside the lock): a relay that answers is
        waited on (the coordinator is slow); one that fails or does not answer is dropped,
        and the group sent again straight and waited for. Raises if a straight call
        failed."""
        while True:
            try:
                return ray.get(entry.ref, timeout=entry.patience_s())
            except ray.exceptions.GetTimeoutError:
                with self._lock:
                    handle = self._link.handle_of(entry.relay)
                if handle is not None and RelayLink.answers(handle):
                    entry = self._link.waiting_on(entry)  # alive: the coordinator is slow
                    continue
                error: Exception = RelayHung(entry)
            except Exception as failed:
                if not entry.relay:
                    raise
                error = failed
            with self._lock:
                again = self._link.failed(entry, error)
            return ray.get(again.ref)

    def stop(self) -> None:
        """End the background thread, then send what is pending and wait until it is
        recorded. After `ray.shutdown()` there is no one to send to: the acknowledgements
        are dropped, and no Ray call is made (it would start a new local Ray)."""
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()  # no flush of the thread's can follow
        with ray_held() as up:
            with self._lock:
                self._link.stopping = True  # asks for no relay from now on
            if up:
                self.flush(wait=True)
            self._forget()  # (under `ray_held()`: references dropped while Ray is up)

    def end_soon(self) -> None:
        """Its iterator was dropped without `close()` (called by a finalizer: it must not
        wait): the thread sends what is pending and ends (a `ray.shutdown()` in another
        thread waits for Ray's lock, so the thread does not wait for the answers)."""
        self._dropped = True
        self._wake.set()

    def _run(self) -> None:
        """Flush every `interval_s` until `stop()` or `end_soon()`, or until Ray is shut
        down under it (a `ray.shutdown()` with the iterator still open)."""
        while not self._wake.wait(self.pause_s):
            with ray_held() as up:
                if not up:
                    self._forget()
                    return
                self.flush()
        if self._dropped:  # what is pending goes out, not waited for under Ray's lock
            with ray_held() as up:
                if up:
                    with self._lock:
                        self._send_pending()
                self._forget()

    def _forget(self) -> None:
        """Drop what is pending and the references to what was sent and to the relay (at
        `stop()`, or once Ray is down; under `ray_held()`, since a dropped `ObjectRef` calls
        into Ray's core worker, which ends the process once Ray was shut down)."""
        with self._lock:
            self._pending, self._sent = {}, []
            self._link.forget()


__all__ = ["AckSender"]
