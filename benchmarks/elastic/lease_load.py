"""Many `dynamic` ranks leasing and acknowledging at once (see `benchmarks/elastic_bench.py`):
each simulated rank holds a real `AckSender`, leases one piece of `PIECE_BATCHES` batches
through it (`AckSender.lease`: through its node's relay once it took one) whenever its
hand is empty, and acknowledges one received batch every `step_s`. Measured: each lease's
round trip, the coordinator's CPU, and the calls that reached it."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._cpu import process_cpu_s
from benchmarks.elastic.ack_load import take_relays
from benchmarks.elastic.common import pid_of

BATCH = 16
PIECE_BATCHES = 4  # a piece (`split_rows`) holds 4 batches: a lease every 4 steps
ROWS_PER_RANK = 20_000  # more than a rank receives in the load (no rank runs out)


class _LeasingRanks:
    """Simulated `dynamic` training loops in one process (see module docstring)."""

    def __init__(self, coordinator, generation: int, ranks: list, interval_s: float) -> None:
        from rayshard.runtime.acks import AckSender

        self.generation, self.coordinator = generation, coordinator
        self.ranks = {rank: AckSender(coordinator, generation, rank, interval_s) for rank in ranks}
        self.hands: dict[int, list] = {rank: [] for rank in ranks}  # rows leased, not received
        self.calls = {rank: 0 for rank in ranks}
        self.received = {rank: 0 for rank in ranks}
        self.steps = 0

    def _lease_empty_hands(self, round_trips: list) -> None:
        """One lease call for each rank whose hand is empty, all in flight together; each
        call's round trip ends when its answer arrives (`ray.wait`), not when it is read."""
        import ray

        sent, sent_at = {}, {}
        for rank, hand in self.hands.items():
            if not hand:
                self.calls[rank] += 1
                args = (self.generation, rank, 0, 1, False, f"load-{rank}:{self.calls[rank]}")
                sent[rank], sent_at[rank] = self.ranks[rank].lease(args, {}), time.perf_counter()
        waiting = {call.ref: rank for rank, call in sent.items()}
        while waiting:
            done, _ = ray.wait(list(waiting), num_returns=1)
            round_trips.append(time.perf_counter() - sent_at[waiting.pop(done[0])])
        for rank, call in sent.items():
            for start, end in self.ranks[rank].answer(call).pieces:
                self.hands[rank].extend(range(start, end, BATCH))

    def _step(self, round_trips: list) -> None:
        """Lease for the ranks whose hands are empty, then each rank receives a batch.
        Rank r begins receiving at step r % `PIECE_BATCHES`, so its leases fall on other
        steps than most ranks' (not all ranks' calls at once)."""
        self.steps += 1
        self._lease_empty_hands(round_trips)
        for rank, hand in self.hands.items():
            if hand and self.steps > rank % PIECE_BATCHES:
                start = hand.pop(0)
                self.received[rank] += 1
                runs = np.array([[start, start + BATCH]], dtype=np.int64)
                self.ranks[rank].add(0, self.received[rank], runs, BATCH, 8 * BATCH, 0.0)

    def groups(self) -> int:
        """Acknowledgement groups its senders sent so far."""
        return sum(sender.groups_sent for sender in self.ranks.values())

    def warm(self, take_relay: bool) -> None:
        """The first steps (every rank's first lease), and with `take_relay` every sender
        takes its node's relay: kept out of the measured load."""
        for _ in range(PIECE_BATCHES):
            self._step([])
        if take_relay:
            take_relays(list(self.ranks.values()))

    def run(self, seconds: float, step_s: float) -> dict:
        """Step every `step_s` for `seconds`, then stop the senders."""
        round_trips: list[float] = []
        steps_before = self.steps
        began = time.time()
        while time.time() - began < seconds:
            self._step(round_trips)
            time.sleep(step_s)
        for sender in self.ranks.values():
            sender.stop()
        groups = sum(sender.groups_sent for sender in self.ranks.values())
        return {
            "steps": self.steps - steps_before,
            "round_trips": round_trips,
            "received": dict(self.received),
            "groups": groups,
        }


def run_lease_load(
    workdir: Path,
    ranks: int,
    seconds: float,
    step_s: float,
    interval_s: float,
    relay: str = "auto",
    callers: int = 2,
) -> dict:
    """`ranks` ranks of the `dynamic` policy leasing and acknowledging for `seconds` with
    `ack_relay` `relay`; lease round trips, the coordinator's CPU per lease and per
    acknowledgement group, what went through the relay, and whether every received batch
    was recorded."""
    import ray

    from rayshard.loader import Loader
    from rayshard.sources.parquet import ParquetSource

    path = workdir / "leases.parquet"
    ids = np.arange(ranks * ROWS_PER_RANK, dtype=np.int64)
    pq.write_table(pa.table({"id": ids}), path, row_group_size=1 << 20)
    loader = Loader(
        ParquetSource([str(path)], split_rows=BATCH * PIECE_BATCHES),
        batch_size=BATCH,
        name=f"leases-{uuid.uuid4().hex[:8]}",
        policy="dynamic",
        equal_steps=False,
        ack_relay=relay,
    )
    coordinator = loader._coordinator
    try:
        dp = [{"dp_rank": r, "dp_size": ranks, "group": [r]} for r in range(ranks)]
        registered = ray.get([coordinator.register.remote(r, ranks, dp[r]) for r in range(ranks)])
        generation = registered[-1]["generation"]
        ray.get([coordinator.start_epoch.remote(generation, r, 0) for r in range(ranks)])
        loops = [
            ray.remote(num_cpus=0)(_LeasingRanks).remote(
                coordinator, generation, list(range(i, ranks, callers)), interval_s
            )
            for i in range(callers)
        ]
        ray.get([loop.warm.remote(relay == "node") for loop in loops])
        pid = ray.get(coordinator.__ray_call__.remote(pid_of))
        before = ray.get(coordinator.describe.remote())
        groups_before = sum(ray.get([loop.groups.remote() for loop in loops]))
        cpu_before, began = process_cpu_s(pid), time.time()
        loads = ray.get([loop.run.remote(seconds, step_s) for loop in loops])
        wall = time.time() - began
        cpu = process_cpu_s(pid) - cpu_before
        described = ray.get(coordinator.describe.remote())
        for loop in loops:
            ray.kill(loop)
    finally:
        loader.shutdown()
    trips = [t for load in loads for t in load["round_trips"]]
    received = {rank: n for load in loads for rank, n in load["received"].items()}
    consumers = described["consumers"]
    calls = {r: described["lease_calls"].get(r, {}).get("calls", 0) for r in range(ranks)}
    leases = sum(calls.values()) - sum(
        before["lease_calls"].get(r, {}).get("calls", 0) for r in range(ranks)
    )
    relayed = described["leases_relayed"] - before["leases_relayed"]
    groups = sum(load["groups"] for load in loads) - groups_before
    groups_relayed = described["acks_relayed"] - before["acks_relayed"]
    relay_calls = described["ack_relay_calls"] - before["ack_relay_calls"]
    coordinator_calls = leases - relayed + groups - groups_relayed + relay_calls
    return {
        "config": {  # (`seconds`, `step_s` and `callers` as the acks load has them)
            **dict(ranks=ranks, seconds=seconds, step_s=step_s, ack_interval_s=interval_s),
            **dict(ack_relay=relay, piece_batches=PIECE_BATCHES, callers=callers),
        },
        "steps_per_caller": [load["steps"] for load in loads],
        "leases": leases,
        "leases_relayed": relayed,
        "lease_round_trip_s_median": float(np.median(trips)) if trips else None,
        "lease_round_trip_s_p90": float(np.percentile(trips, 90)) if trips else None,
        "coordinator_cpu_share": cpu / wall,
        "groups": groups,
        "groups_relayed": groups_relayed,
        "relay_calls": relay_calls,
        # the calls that reached the coordinator, and its CPU per lease or group they carried
        "coordinator_calls": coordinator_calls,
        "coordinator_cpu_us_per_item": 1e6 * cpu / max(leases + groups, 1),
        # every batch each rank received, recorded once its sender stopped
        "recorded_all": all(
            consumers.get(rank, {}).get("batches") == n for rank, n in received.items() if n
        ),
    }
