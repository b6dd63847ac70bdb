"""The coordinator under more acknowledgements than it can record (see
`benchmarks/elastic_bench.py`): many ranks' real `AckSender`s, each receiving a batch every
`step_s`, against one coordinator, while a probe measures how long a call waits in its
queue (a `ping`, the cheapest call: a lease asked then would wait as long)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._cpu import process_cpu_s
from benchmarks.elastic.common import pid_of

ROWS_PER_RANK = 100_000
BATCH = 16
RELAY_START_S = 120.0  # how long `ack_relay="node"` senders may wait for their relay


def take_relays(senders: list) -> None:
    """Flush each `AckSender` (nothing pending: it takes its relay once it runs) until
    every one took its node's relay, within `RELAY_START_S`."""
    deadline = time.time() + RELAY_START_S
    for sender in senders:
        while not sender.relay_token:
            if time.time() > deadline:
                raise RuntimeError(f"no relay taken within {RELAY_START_S} s")
            sender.flush(wait=True)
            time.sleep(0.01)


class _Ranks:
    """Simulated training loops in one process: one `AckSender` per rank, as an iterator
    has, each `add`ing one received batch of `BATCH` rows every `step_s`."""

    def __init__(self, coordinator, generation: int, firsts: list, interval_s: float) -> None:
        from rayshard.runtime.acks import AckSender

        self.senders = [
            (AckSender(coordinator, generation, rank, interval_s), first) for rank, first in firsts
        ]

    def run(self, seconds: float, step_s: float, take_relay: bool = False) -> dict:
        """Step every `step_s` for `seconds`, then stop the senders; with `take_relay`
        (`ack_relay="node"`), first one step whose answers send each sender to the
        relay, and the load starts once every sender took it."""
        steps = 0

        def step() -> None:
            nonlocal steps
            steps += 1
            for sender, first in self.senders:
                start = first + BATCH * (steps - 1)
                runs = np.array([[start, start + BATCH]], dtype=np.int64)
                sender.add(0, steps, runs, BATCH, 8 * BATCH, 0.0)

        if take_relay:
            step()  # the first answer asks for the relay
            take_relays([sender for sender, _ in self.senders])
        began = time.time()
        while time.time() - began < seconds:
            step()
            time.sleep(step_s)
        stopping = time.time()
        for sender, _ in self.senders:
            sender.stop()  # sends what is pending and waits until it is recorded
        groups = sum(sender.groups_sent for sender, _ in self.senders)
        asked = [sender.asked_s for sender, _ in self.senders]  # as the load ended
        return {"steps": steps, "stop_s": time.time() - stopping, "groups": groups, "asked": asked}


def run_ack_load(
    workdir: Path,
    ranks: int,
    seconds: float,
    step_s: float,
    interval_s: float,
    callers: int = 2,
    relay: str = "auto",
) -> dict:
    """`ranks` ranks of the `data` policy acknowledging for `seconds`, with `ack_relay`
    `relay`; the coordinator's queue wait (probe round trips every 0.25 s), how long the
    senders' final `stop()` took (what was still queued), and the CPU the coordinator and
    the relay (one: every rank runs on this node) spent per acknowledgement group."""
    import ray

    from rayshard.loader import Loader
    from rayshard.sources.parquet import ParquetSource

    path = workdir / "acks.parquet"
    ids = np.arange(ranks * ROWS_PER_RANK, dtype=np.int64)
    pq.write_table(pa.table({"id": ids}), path, row_group_size=ROWS_PER_RANK)
    loader = Loader(
        ParquetSource([str(path)], split_rows=ROWS_PER_RANK),
        batch_size=BATCH,
        name=f"acks-{uuid.uuid4().hex[:8]}",
        policy="data",
        ack_relay=relay,
    )
    coordinator = loader._coordinator
    try:
        group = [
            coordinator.register.remote(r, ranks, {"dp_rank": r, "dp_size": ranks, "group": [r]})
            for r in range(ranks)
        ]
        generation = ray.get(group)[-1]["generation"]
        started = ray.get([coordinator.start_epoch.remote(generation, r, 0) for r in range(ranks)])
        firsts = [(r, answer["plan"].ranges[0][0]) for r, answer in enumerate(started)]
        loops = [
            ray.remote(num_cpus=0, max_concurrency=2)(_Ranks).remote(
                coordinator, generation, firsts[i::callers], interval_s
            )
            for i in range(callers)
        ]
        ray.get([loop.__ray_ready__.remote() for loop in loops])
        pid = ray.get(coordinator.__ray_call__.remote(pid_of))
        cpu_before, began = process_cpu_s(pid), time.time()
        running = [loop.run.remote(seconds, step_s, relay == "node") for loop in loops]
        waits = []
        while ray.wait(running, num_returns=len(running), timeout=0.25)[1]:
            sent = time.time()
            ray.get(coordinator.ping.remote())
            waits.append((sent - began, time.time() - sent))
        loads = ray.get(running)
        wall = time.time() - began
        cpu = process_cpu_s(pid) - cpu_before
        described = ray.get(coordinator.describe.remote())
        relay_cpu = None
        if described["ack_relays"]:  # (asking for it when there is none would make one)
            _, handle = ray.get(coordinator.relay.remote(ray.get_runtime_context().get_node_id()))
            relay_cpu = process_cpu_s(ray.get(handle.__ray_call__.remote(pid_of)))
        consumers = described["consumers"]
        # every batch each rank received, recorded once its senders stopped
        recorded_all = all(
            consumers.get(rank, {}).get("batches") == load["steps"]
            for i, load in enumerate(loads)
            for rank, _ in firsts[i::callers]
        )
        for loop in loops:
            ray.kill(loop)
    finally:
        loader.shutdown()
    groups = sum(load["groups"] for load in loads)
    relay_calls = described["ack_relay_calls"]  # as the coordinator counted them
    during = [w for t, w in waits if t < seconds] or [w for _, w in waits]
    # the second half of the load: the queue once the senders took the coordinator's pace
    late = [w for t, w in waits if seconds / 2 <= t < seconds] or during
    return {
        "config": {
            "ranks": ranks,
            "seconds": seconds,
            "step_s": step_s,
            "ack_interval_s": interval_s,
            "callers": callers,
            "ack_relay": relay,
        },
        "offered_acks_per_s": ranks / max(step_s, interval_s),
        "steps_per_rank": [load["steps"] for load in loads],
        "recorded_all": recorded_all,
        "queue_wait_s_median": float(np.median(during)),
        "queue_wait_s_p90": float(np.percentile(during, 90)),
        "queue_wait_s_max": float(max(during)),
        "queue_wait_s_late_median": float(np.median(late)),
        "queue_wait_over_time": [(round(t, 1), round(w, 3)) for t, w in waits],
        "stop_s_max": max(load["stop_s"] for load in loads),
        "coordinator_cpu_share": cpu / wall,
        # groups the senders sent, those recorded through the relay, and the coordinator's
        # calls for them (each relayed call carries many groups)
        "groups": groups,
        "groups_relayed": described["acks_relayed"],
        "relay_calls": relay_calls,
        "coordinator_ack_calls": groups - described["acks_relayed"] + relay_calls,
        "coordinator_cpu_us_per_group": 1e6 * cpu / max(groups, 1),
        # the relay's whole life (it started with the load): its CPU share of the load
        "relay_cpu_share": None if relay_cpu is None else relay_cpu / wall,
        # the interval the coordinator asked its consumers for at the end (None: older code)
        "ack_interval_asked_s": described.get("ack_interval_asked_s"),
        # what the senders were last asked for (through a relay: the longer of its own
        # interval and the coordinator's), median over the ranks
        "senders_asked_s_median": float(np.median([a for load in loads for a in load["asked"]])),
    }
