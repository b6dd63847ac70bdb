"""Multi-node scenarios of issue 5, in a process of their own with their own Ray cluster.

Run one from the repository root, or several of `SHAREABLE` in turn on one cluster (what
`test_multinode.py` does: a cluster start is a large part of a scenario's cost):

    PYTHONPATH=. python -m tests.multinode.scenarios <name> [<name>...]

Every scenario adds its worker nodes to a `ray.cluster_utils.Cluster` (a head and worker
nodes, all on this machine, each its own raylet), does real damage to it
(`cluster.remove_node` kills a node's raylet and every process on it; `os.kill(pid,
SIGKILL)` kills an actor's process) and prints one line `RESULT_JSON: {...}` (with its
name under "scenario") that `test_multinode.py` parses and asserts on. Between two
scenarios the cluster goes back to a bare head (`reset_cluster`). Nothing is mocked.

Placement: the head carries the custom resource `head`, worker node k the resource `nk`;
consumers and trainers ask for those resources so they land on the node we mean. The loader
is built on the driver (head), so its coordinator and journal are on the head; the audit
actor is pinned to the head too, so no id it holds is lost with a worker node.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

import ray
from ray.cluster_utils import Cluster

from tests.timeouts import EVENT_TIMEOUT_S, event_timeout_message

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULT_PREFIX = "RESULT_JSON: "

# Node-death detection: the GCS declares a node dead after `health_check_failure_threshold`
# failed health checks, one every `health_check_period_ms` (each may take up to
# `health_check_timeout_ms`). Ray's defaults (3000 ms period, 5 failures, 10000 ms timeout)
# would take ~15-30 s to notice a killed raylet; these make it ~3 s. A live raylet must
# leave 6 checks of 1 s unanswered to be taken for dead: with 3 checks of 0.5 s, a raylet
# starved on a loaded 2-core CI machine was once declared dead mid-scenario, and the
# scenario waited for its node's resources until its timeout. The names are those of the
# installed Ray (ray_config_def.h, seen as strings in core/src/ray/gcs/gcs_server).
FAST_HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 6,
}


# -- cluster plumbing ------------------------------------------------------------------------
def start_cluster(worker_nodes: int, *, head_cpus: int = 1, node_cpus: int = 1) -> tuple:
    """A head (resource `head`) and `worker_nodes` nodes (resources n1..nk), connected.
    When several scenarios share one cluster (`main` with several names), the head is the
    one already running (left bare by `reset_cluster`) and only the nodes are new."""
    shared = _CLUSTER.get("cluster")
    if shared is not None:
        if _CLUSTER["head_cpus"] != head_cpus:
            raise ValueError(
                f"head_cpus={head_cpus} but the shared cluster's head has "
                f"{_CLUSTER['head_cpus']}: run this scenario on its own"
            )
        nodes = {
            f"n{k}": shared.add_node(num_cpus=node_cpus, resources={f"n{k}": 100})
            for k in range(1, worker_nodes + 1)
        }
        shared.wait_for_nodes()
        return shared, nodes
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    env = {
        "PYTHONPATH": REPO_ROOT,  # workers on every node import `tests.*` from the repo
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        # Ray Train waits this long for a worker group it cannot place (after a node loss
        # its resource view may still count the dead node's CPUs): 60 s by default.
        "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "10",
        # Ray Train's controller polls workers (and takes their reports, one queued per
        # worker, `ray.train.report` blocks while it is full) every 2 s by default.
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    }
    os.environ.update(env)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": head_cpus,
            "resources": {"head": 100},
            "include_dashboard": False,
            "_system_config": FAST_HEALTH_CHECKS,
        },
    )
    _CLUSTER.update(cluster=cluster, head_cpus=head_cpus)
    nodes = {
        f"n{k}": cluster.add_node(num_cpus=node_cpus, resources={f"n{k}": 100})
        for k in range(1, worker_nodes + 1)
    }
    ray.init(
        address=cluster.address,
        log_to_driver=False,
        namespace="rayshard-multinode",  # workers inherit `env` from the nodes' raylets
    )
    cluster.wait_for_nodes()
    return cluster, nodes


def reset_cluster() -> None:
    """Back to a bare head after a scenario, for the next one on the same cluster: every
    worker node it left is removed, every node is dead in the GCS (those it killed too),
    and every actor it started has ended (their handles were the scenario's locals; the
    loaders' coordinators on the head end with them). Raises if one is still alive: a
    leftover node or actor would change the next scenario's placement or events."""
    cluster = _CLUSTER["cluster"]
    for node in list(cluster.worker_nodes):
        cluster.remove_node(node)
    gc.collect()  # handles held in reference cycles (a failed scenario's frames)
    wait_until(
        lambda: _safe(lambda: cluster.wait_for_nodes(timeout=1) or True),
        "the scenario's nodes to be gone",
    )
    try:
        wait_until(lambda: not alive_actors(), "the scenario's actors to end")
    except TimeoutError as error:
        raise TimeoutError(f"{error}; still alive: {alive_actors()}") from None


def alive_actors() -> list[str]:
    """Class names of this cluster's actors that have not ended."""
    return [
        actor["ActorClassName"]
        for actor in ray._private.state.actors().values()
        if actor["State"] != "DEAD"
    ]


def add_node(cluster: Cluster, nodes: dict, label: str, cpus: int = 1) -> Any:
    node = cluster.add_node(num_cpus=cpus, resources={label: 100})
    cluster.wait_for_nodes()
    nodes[label] = node
    return node


def remove_node(cluster: Cluster, nodes: dict, label: str) -> float:
    """Kill node `label` without grace (SIGKILL to its raylet and processes): a real node
    loss. Returns the wall time of the kill."""
    killed_at = time.time()
    cluster.remove_node(nodes.pop(label), allow_graceful=False)
    return killed_at


def node_id_of(label: str) -> str:
    for node in ray.nodes():
        if node["Alive"] and node["Resources"].get(label):
            return node["NodeID"]
    raise LookupError(label)


def node_labels() -> dict[str, str]:
    """Node id -> our label (head, n1, ...) of the alive nodes."""
    labels = {}
    for node in ray.nodes():
        if node["Alive"]:
            mine = [
                r for r in node["Resources"] if r == "head" or (r[0] == "n" and r[1:].isdigit())
            ]
            labels[node["NodeID"]] = mine[0] if mine else "?"
    return labels


def note(message: str) -> None:
    """Progress on stderr (the test prints it on failure)."""
    print(f"[scenario {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def emit(result: dict) -> None:
    print(RESULT_PREFIX + json.dumps(result, default=str), flush=True)


def event_times(loader: Any, kind: str) -> list[dict]:
    return [e for e in loader.stats()["events"] if e["event"] == kind]


def wait_until(predicate, what: str, poll: float = 0.05) -> float:
    """Wait for `predicate()` up to the suite's event timeout (tests/timeouts.py); returns
    the seconds it took, for the timeline (never asserted on)."""
    start = time.time()
    while not predicate():
        if time.time() - start > EVENT_TIMEOUT_S:
            raise TimeoutError(event_timeout_message(what))
        time.sleep(poll)
    return time.time() - start


def scratch(prefix: str) -> str:
    """A new folder for one scenario's files, inside this run's folder, which `main`
    removes at its end (the scenarios' data, journals and Train storage)."""
    if "folder" not in _SCRATCH:
        _SCRATCH["folder"] = tempfile.mkdtemp(prefix="rayshard-scenarios-")
    return tempfile.mkdtemp(prefix=prefix, dir=_SCRATCH["folder"])


def make_dataset(rows: list[int], row_group_size: int) -> str:
    from tests.runtime.helpers import write_parquet

    folder = scratch("rayshard-multinode-")
    return write_parquet(os.path.join(folder, "data"), rows, row_group_size=row_group_size)


# -- a consumer: one rank of a dynamic loader, on one node -----------------------------------
@ray.remote(num_cpus=0, max_concurrency=2)
class NodeConsumer:
    """Takes its iterator *inside* the actor (so its reader is placed on this node), then
    consumes one epoch with a delay per batch. Every batch's ids go to the audit as the
    iterator hands the batch over (its `collate_fn`), synchronously, before the loader counts
    it received and its acknowledgement can go out: a consumer killed at any point has in the
    audit every batch the coordinator may count as delivered to it (one audited and not yet
    acknowledged is served again: a duplicate, never a loss the audit cannot see).

    With `hold_after=n` it pauses after `n` batches until `release()`: the workload then
    outlasts the cue the scenario waits for (a joining rank's first batches), however
    slowly the new node starts."""

    def __init__(
        self, loader, audit, rank: int, world_size: int, delay: float, hold_after=None
    ) -> None:
        self.audit, self.rank, self.delay = audit, rank, delay
        self.iterator = loader.iterator(
            world_rank=rank, world_size=world_size, batch_format="numpy", collate_fn=self.audited
        )
        self.batches = 0
        self.samples = 0
        self.hold_after = hold_after
        self.gate = threading.Event()

    def release(self) -> None:
        self.gate.set()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def reader_node(self) -> str:
        """Node where this rank is read (it must be this consumer's node): this consumer's
        own when it reads for itself, else its reader actor's."""
        if self.iterator._local is not None:
            return self.node()
        reader_id = self.iterator._holds.reader._actor_id.hex()
        info = ray._private.state.actors(actor_id=reader_id)
        return info["Address"]["NodeID"]

    def progress(self) -> int:
        return self.batches

    def audited(self, batch: dict) -> dict:
        """The iterator's `collate_fn`: the batch's real ids into the audit, then the batch."""
        ray.get(self.audit.add.remote(self.iterator.epoch, batch["id"][~batch["_padded"]]))
        return batch

    def run(self) -> dict:
        for batch in self.iterator:
            self.batches += 1
            self.samples += int((~batch["_padded"]).sum())
            if self.batches == self.hold_after:
                self.gate.wait(EVENT_TIMEOUT_S)
            time.sleep(self.delay)
        return {"rank": self.rank, "batches": self.batches, "samples": self.samples}


def start_consumer(
    loader, audit, rank: int, world_size: int, label: str, delay: float, hold_after=None
):
    consumer = NodeConsumer.options(resources={label: 1}).remote(
        loader, audit, rank, world_size, delay, hold_after
    )
    return consumer, consumer.run.remote()


def head_audit(num_samples: int) -> Any:
    """The coverage audit, pinned to the head (it must outlive every worker node)."""
    from rayshard.runtime.audit import CoverageAudit

    return ray.remote(CoverageAudit).options(num_cpus=0, resources={"head": 1}).remote(num_samples)


def dynamic_loader(data: str, name: str, source: Any = None, **options) -> Any:
    """A `dynamic` loader over the Parquet files `data` (or over `source`, made from them)."""
    from rayshard.loader import Loader
    from rayshard.sources.parquet import ParquetSource

    journal = os.path.join(scratch("rayshard-journal-"), f"{name}.jsonl")
    return Loader(
        source if source is not None else ParquetSource(data),
        name=name,
        policy="dynamic",
        equal_steps=False,  # consumers are not in lockstep
        journal_path=journal,
        **options,
    )


def watch_actors(loader: Any) -> dict:
    """What watches the loader's consumer-read ranks: `stats()`'s counts, the nodes of the
    live `NodeWatch` actors (by label) and the `RankWatch` actors in its namespace."""
    labels = node_labels()
    coordinator = ray._private.state.actors(actor_id=loader._coordinator._actor_id.hex())
    owner = (coordinator["Address"]["IPAddress"], coordinator["Address"]["Port"])
    node_watches = [  # this coordinator's (an earlier loader's may be ending)
        labels.get(a["Address"]["NodeID"], "?")
        for a in ray._private.state.actors().values()
        if a["ActorClassName"].endswith("NodeWatch")
        and a["State"] == "ALIVE"
        and (a["OwnerAddress"]["IPAddress"], a["OwnerAddress"]["Port"]) == owner
    ]
    stats = loader.stats()
    rank_watches = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == loader.namespace and a["name"].startswith("rayshard-watch-")
    ]
    return {
        "watched_by_pid": stats["watched_by_pid"],
        "node_watches": stats["node_watches"],
        "node_watch_nodes": sorted(node_watches),
        "rank_watches": rank_watches,
    }


def relays_on(loader: Any, label: str) -> dict:
    """The acknowledgement relay of node `label`: the node its actor runs on (by label)
    and the groups and lease calls it forwarded. (Asked right after the epoch, well within
    the relay's idle time; had it been ended, the coordinator would make a new one, with
    no calls.)"""
    node = node_id_of(label)
    _, relay = ray.get(loader._coordinator.relay.remote(node))
    counts = ray.get(relay.counts.remote())
    actor = ray._private.state.actors(actor_id=relay._actor_id.hex())
    return {
        "runs_on": node_labels().get(actor["Address"]["NodeID"], "?"),
        "for": node_labels().get(counts["node"], "?"),
        "groups": counts["groups"],
        "leases": counts["leases"],
        "calls": counts["calls"],
    }


def reader_placement_probe(data: str, per_node: int, labels: tuple) -> dict:
    """Where readers land: a throwaway loader with `per_node` ranks on each of `labels`;
    returns {"ranks": n, "misplaced": [(rank, consumer node, reader node), ...]}."""
    loader = dynamic_loader(data, "probe", batch_size=8)
    world = per_node * len(labels)
    consumers = [  # no audit: they never run
        NodeConsumer.options(resources={label: 1}).remote(loader, None, rank, world, 0.0)
        for rank, label in enumerate(lab for lab in labels for _ in range(per_node))
    ]
    names = node_labels()
    where = [
        (rank, names[ray.get(c.node.remote())], names[ray.get(c.reader_node.remote())])
        for rank, c in enumerate(consumers)
    ]
    for consumer in consumers:  # their readers die with them (the readers' owners)
        ray.kill(consumer)
    loader.shutdown()
    return {"ranks": world, "misplaced": [w for w in where if w[1] != w[2]]}


# -- scenario 1: node loss and node join under the dynamic policy ----------------------------
def scenario_dynamic_node_churn() -> dict:
    """2 ranks on 2 nodes; node n2 is killed mid-epoch; node n3 joins and a new rank (2)
    starts there. Coverage must be exact (nothing lost), duplicates bounded."""
    rows, batch_size, delay, prefetch = 1200, 8, 0.25, 2
    data = make_dataset([300, 250, 350, 300], row_group_size=10)  # 120 splits of 10 rows
    cluster, nodes = start_cluster(2)
    # First (before the epoch under test starts): where do readers land, with two ranks on
    # one node? (The epoch below has one rank a node, on three nodes.)
    probe = reader_placement_probe(data, per_node=2, labels=("n1",))
    started = time.time()
    # every rank acknowledges through its node's relay: one dies with its node
    loader = dynamic_loader(
        data, "churn", batch_size=batch_size, prefetch_depth=prefetch, ack_relay="node"
    )
    audit = head_audit(rows)
    consumers = {}
    for rank, label in enumerate(["n1", "n2"]):
        # The survivor pauses after 12 batches until the joining rank has read: plenty
        # is left for it, whatever the machine's speed (1200 rows = 150 batches).
        hold = None if rank == 1 else 12
        consumers[rank] = (label, *start_consumer(loader, audit, rank, 2, label, delay, hold))
    t0 = time.time()
    consumer_start_s = {}
    for rank, (_, c, _) in consumers.items():  # first batch of each rank, from now
        wait_until(lambda c=c: ray.get(c.progress.remote()) >= 1, f"rank {rank} to start")
        consumer_start_s[rank] = round(time.time() - t0, 2)
    # Where each rank's consumer and reader are: a reader should be on its consumer's node.
    labels = node_labels()
    placement = {
        rank: {
            "consumer": labels[ray.get(c.node.remote())],
            "reader": labels[ray.get(c.reader_node.remote())],
        }
        for rank, (_, c, _) in consumers.items()
    }
    watches = watch_actors(loader)
    victim = consumers[1][1]
    # Early in the epoch, so that plenty is left for the rank that joins later.
    wait_until(lambda: ray.get(victim.progress.remote()) >= 3, "rank 1 to read 3 batches")
    seen_before_kill = sum(ray.get(audit.seen.remote()).values())
    progress_at_kill = {r: ray.get(c.progress.remote()) for r, (_, c, _) in consumers.items()}
    killed_at = remove_node(cluster, nodes, "n2")
    wait_until(lambda: event_times(loader, "rank_lost"), "rank_lost")
    lost_event = event_times(loader, "rank_lost")[0]
    add_started = time.time()
    add_node(cluster, nodes, "n3")
    newcomer, newcomer_run = start_consumer(loader, audit, 2, 3, "n3", delay)
    wait_until(lambda: ray.get(newcomer.progress.remote()) >= 1, "the new rank's first batch")
    joined_after_s = time.time() - add_started
    consumers[0][1].release.remote()
    labels = node_labels()
    placement[2] = {
        "consumer": labels[ray.get(newcomer.node.remote())],
        "reader": labels.get(ray.get(newcomer.reader_node.remote()), "dead node"),
    }
    outcomes, errors = {}, {}
    for rank, (_, _, run) in {**consumers, 2: ("n3", newcomer, newcomer_run)}.items():
        try:
            outcomes[rank] = ray.get(run, timeout=EVENT_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001 - the dead rank's consumer must fail
            errors[rank] = type(error).__name__
    report = ray.get(audit.report.remote())
    stats = loader.stats()
    events = [e["event"] for e in stats["events"]]
    result = {
        "relays": relays_on(loader, "n1"),
        "acks_relayed": stats["acks_relayed"],
        "rows": rows,
        "batch_size": batch_size,
        "prefetch_depth": prefetch,
        "placement": placement,
        "placement_probe": probe,
        "watches": watches,
        "killed_node": "n2",
        "seen_before_kill": seen_before_kill,
        "progress_at_kill": progress_at_kill,
        "consumer_start_s": consumer_start_s,
        "report": report,
        "outcomes": outcomes,
        "errors": errors,
        "events": events,
        "requeued_rows": lost_event.get("requeued_rows"),
        "lost_reason": lost_event.get("reason"),
        "loss_detected_s": round(lost_event["time"] - killed_at, 2),
        "new_rank_started_s": round(joined_after_s, 2),
        "epoch_s": round(time.time() - started, 2),
    }
    loader.shutdown()
    return result


# -- scenario 3: SIGKILL the coordinator's process mid-epoch, across nodes -------------------
def coordinator_pid(loader: Any) -> int:
    info = ray._private.state.actors(actor_id=loader._coordinator._actor_id.hex())
    return int(info["Pid"])


def scenario_coordinator_sigkill() -> dict:
    """2 ranks on 2 worker nodes, coordinator on the head. Its process gets SIGKILL mid-epoch
    (not `ray.kill`): Ray restarts it, it replays its journal, the epoch completes with
    nothing lost and nothing repeated. Then node n2 is killed: the restarted coordinator
    must still notice the reader's death (it re-watches the readers named in the journal)
    and requeue that rank's work."""
    rows, batch_size, delay = 800, 8, 0.1
    data = make_dataset([200, 200, 250, 150], row_group_size=10)
    cluster, nodes = start_cluster(2)
    started = time.time()
    loader = dynamic_loader(data, "ckill", batch_size=batch_size, prefetch_depth=2)
    audit = head_audit(rows)
    # Rank 1 holds after its 2nd batch (its node is killed later, so it never goes on):
    # it is still reading when node n2 dies, however fast the others get through the rest.
    consumers = {
        rank: (
            label,
            *start_consumer(
                loader, audit, rank, 2, label, delay, hold_after=2 if rank == 1 else None
            ),
        )
        for rank, label in enumerate(["n1", "n2"])
    }
    for rank, (_, c, _) in consumers.items():  # every rank is reading when it dies
        wait_until(lambda c=c: ray.get(c.progress.remote()) >= 2, f"rank {rank} to read")
    pid_before = coordinator_pid(loader)
    killed_at = time.time()
    os.kill(pid_before, signal.SIGKILL)
    # Back when it answers again, from a new process, with the event its replay records.
    wait_until(
        lambda: _safe(lambda: event_times(loader, "coordinator_restarted")),
        "the coordinator to come back",
        poll=0.1,
    )
    back_s = time.time() - killed_at
    pid_after = coordinator_pid(loader)
    progress_at_restart = {r: ray.get(c.progress.remote()) for r, (_, c, _) in consumers.items()}

    # Let them read on through the restarted coordinator, then lose node n2. Any rank's
    # progress is the cue: under load one rank may have little work left by now (a rank
    # that failed instead shows up in `errors` below, and the test asserts on those).
    def progressed() -> bool:
        now = {r: ray.get(c.progress.remote()) for r, (_, c, _) in consumers.items()}
        note(f"progress {now} (at the restart {progress_at_restart})")
        return sum(now.values()) >= sum(progress_at_restart.values()) + 5

    try:
        wait_until(progressed, "progress after the restart", poll=1.0)
    except TimeoutError:
        for rank, (_, _, run) in consumers.items():
            if ray.wait([run], timeout=0)[0]:
                try:
                    note(f"rank {rank} ended: {ray.get(run)}")
                except Exception as error:  # noqa: BLE001 - reported, then the timeout
                    note(f"rank {rank} failed: {error!r}"[:600])
        note(f"events: {[e['event'] for e in loader.stats()['events']]}")
        note(f"leases: {_safe(lambda: loader.stats().get('leases'))}")
        raise
    node_killed_at = remove_node(cluster, nodes, "n2")
    wait_until(lambda: event_times(loader, "rank_lost"), "rank_lost after the restart")
    lost_event = event_times(loader, "rank_lost")[0]
    outcomes, errors = {}, {}
    for rank, (_, _, run) in consumers.items():
        try:
            outcomes[rank] = ray.get(run, timeout=EVENT_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001 - rank 1 dies with its node
            errors[rank] = type(error).__name__
    report = ray.get(audit.report.remote())
    result = {
        "rows": rows,
        "batch_size": batch_size,
        "pid_before": pid_before,
        "pid_after": pid_after,
        "coordinator_back_s": round(back_s, 2),
        "progress_at_restart": progress_at_restart,
        "loss_detected_s": round(lost_event["time"] - node_killed_at, 2),
        "requeued_rows": lost_event.get("requeued_rows"),
        "report": report,
        "outcomes": outcomes,
        "errors": errors,
        "events": [e["event"] for e in loader.stats()["events"]],
        "epoch_s": round(time.time() - started, 2),
    }
    loader.shutdown()
    return result


def _safe(call):
    try:
        return call()
    except Exception:  # noqa: BLE001 - not reachable yet
        return None


# -- scenario 2: an elastic TorchTrainer, world size 2 -> 3 -> 1 across checkpoints ----------
MARKER_FILE = "multinode_marker.json"


class TrainLedger:
    """What the training workers received, batch by batch, tagged with the attempt (one
    worker group's life) and the attempt's batch counter; the checkpoints; and which
    checkpoint each attempt resumed from (read back from the checkpoint itself)."""

    def __init__(self) -> None:
        self.attempts: list[dict] = []
        self.batches: list[tuple] = []  # (attempt, rank, epoch, seq, ids)
        self.checkpoints: list[dict] = []
        self.stop_requested = False
        self.epochs_done = 0  # epochs the run finished (rank 0 of the last attempt says)

    def request_stop(self) -> None:
        """The scenario saw every cue it waits for: finish the current epoch, then stop."""
        self.stop_requested = True

    def keep_going(self, epoch: int, min_epochs: int) -> bool:
        return epoch < min_epochs or not self.stop_requested

    def finished(self, epochs: int) -> None:
        self.epochs_done = epochs

    def new_attempt(self, world_size: int, resumed_from: dict | None) -> int:
        self.attempts.append(
            {"world_size": world_size, "resumed_from": resumed_from, "started": time.time()}
        )
        return len(self.attempts) - 1

    def batch(self, attempt: int, rank: int, epoch: int, seq: int, ids: list) -> bool:
        """Record a batch; answers whether the scenario asked the run to stop (the workers
        then read the rest of their epoch without the per-batch delay)."""
        self.batches.append((attempt, rank, epoch, seq, list(ids)))
        return self.stop_requested

    def checkpoint(self, marker: dict) -> None:
        self.checkpoints.append({**marker, "time": time.time()})

    def progress(self) -> dict:
        return {
            "attempts": self.attempts,
            "checkpoints": self.checkpoints,
            "epochs_done": self.epochs_done,
        }

    def audit(self, num_samples: int, epochs: int) -> dict:
        """Per epoch: coverage of the ids the model received *up to the checkpoints*: the
        last attempt counts whole; each attempt before it in the resume chain counts up to
        the checkpoint its successor resumed from; batches after that (or of an attempt no
        one resumed from) were undone by the restart and are excluded."""
        from collections import Counter

        last = len(self.attempts) - 1
        limits: dict[int, float] = {last: float("inf")}
        chain = [last]
        attempt = last
        while self.attempts[attempt]["resumed_from"] is not None:
            marker = self.attempts[attempt]["resumed_from"]
            attempt = marker["attempt"]
            limits[attempt] = marker["seq"]
            chain.append(attempt)
        counts = {epoch: Counter() for epoch in range(epochs)}
        excluded = 0
        for a, _rank, epoch, seq, ids in self.batches:
            if seq <= limits.get(a, -1):
                counts[epoch].update(ids)
            else:
                excluded += len(ids)
        per_epoch = {}
        for epoch, counter in counts.items():
            per_epoch[epoch] = {
                "seen": sum(counter.values()),
                "distinct": len(counter),
                "lost": sum(1 for i in range(num_samples) if i not in counter),
                "duplicates": sum(n - 1 for n in counter.values()),
                "foreign": sum(1 for i in counter if not 0 <= i < num_samples),
            }
        return {
            "chain": list(reversed(chain)),
            "world_sizes": [a["world_size"] for a in self.attempts],
            "resumed_from": [a["resumed_from"] for a in self.attempts],
            "per_epoch": per_epoch,
            "excluded_after_checkpoint": excluded,
        }


def elastic_loop(config: dict) -> None:
    """Train worker: static rayshard iterator (resumed from Train's latest checkpoint),
    every batch's ids to the ledger, a checkpoint every `every` batches inside an epoch.
    It runs `epochs` epochs, and on until the scenario calls `request_stop()` (at most
    `max_epochs`). Every batch is also a step of a DDP model (its backward all-reduces:
    unequal step counts would hang). The run ends with a checkpoint of the finished
    loader."""
    from ray.train import Checkpoint
    from ray.train.collective import broadcast_from_rank_zero

    import rayshard.train
    from tests.runtime.train_loops import DdpModel

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    ledger = config["ledger"]
    resumed_from = None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with (
            checkpoint.as_directory() as folder,
            open(os.path.join(folder, MARKER_FILE)) as handle,
        ):
            resumed_from = json.load(handle)
    batches = rayshard.train.iterator(config["loader"], batch_format="numpy")
    model = DdpModel()
    attempt = ray.get(ledger.new_attempt.remote(world, resumed_from)) if rank == 0 else None
    attempt = broadcast_from_rank_zero(attempt)
    seq = 0

    def save(epoch: int) -> None:
        marker = {"attempt": attempt, "seq": seq, "epoch": epoch, "world_size": world}
        with tempfile.TemporaryDirectory() as folder:
            state = rayshard.train.save_state(batches, folder)
            with open(os.path.join(folder, MARKER_FILE), "w") as handle:
                json.dump(marker, handle)
            ray.train.report(
                {"attempt": attempt, "seq": seq, "epoch": epoch, "state_epoch": state["epoch"]},
                checkpoint=Checkpoint.from_directory(folder),
            )
        if rank == 0:  # reported (not necessarily registered yet: the driver's cue only)
            ray.get(ledger.checkpoint.remote({**marker, "state_epoch": state["epoch"]}))

    # The run lasts until the scenario saw its cues (then one more epoch boundary), not a
    # fixed number of epochs: a workload must outlast the events a test waits on. All
    # ranks decide together (rank 0 asks), so the group leaves at the same epoch.
    def keep_going() -> bool:
        verdict = ray.get(ledger.keep_going.remote(batches.epoch, config["epochs"]))
        return broadcast_from_rank_zero(verdict if rank == 0 else None)

    while keep_going() and batches.epoch < config.get("max_epochs", config["epochs"]):
        epoch = batches.epoch
        for batch in batches:
            seq += 1
            ids = batch["id"][~batch["_padded"]].tolist()
            model.step(batch)
            if not ray.get(ledger.batch.remote(attempt, rank, epoch, seq, ids)):
                time.sleep(config["delay"])  # the run must outlast the scenario's cues
            # Checkpoints only inside an epoch (never after its last batch), so every
            # resume re-plans the rest of an epoch on the new world size.
            if seq % config["every"] == 0 and batches.epoch == epoch:
                save(epoch)
    save(batches.epoch)
    if rank == 0:
        ray.get(ledger.finished.remote(batches.epoch))


def scenario_elastic_trainer() -> dict:
    """TorchTrainer with ScalingConfig(num_workers=(1, 3)) on 1-CPU nodes (the head has no
    CPU, so workers go to worker nodes only): it starts with 2 workers on n1, n2; after a
    checkpoint node n3 joins and Ray Train's elastic policy resizes to 3 (a restart from
    the latest checkpoint); after a checkpoint at 3, nodes n2 and n3 are killed and the
    group restarts with 1 worker, which finishes the run. Static policy `data`, shuffled;
    every batch is a step of a DDP model (equal steps after every re-plan on a new world
    size, or the all-reduce hangs); the run ends with a checkpoint of the finished loader."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2.api.config import ScalingConfig

    rows, batch_size = 480, 4
    data = make_dataset([160, 170, 150], row_group_size=16)
    cluster, nodes = start_cluster(2, head_cpus=0)
    started = time.time()
    import rayshard.train
    from rayshard.loader import Loader
    from rayshard.sources.parquet import ParquetSource

    journal = os.path.join(scratch("rayshard-journal-"), "elastic.jsonl")
    loader = Loader(
        ParquetSource(data),
        batch_size=batch_size,
        name="elastic",
        policy="data",
        shuffle=True,
        journal_path=journal,
    )
    ledger = ray.remote(TrainLedger).options(num_cpus=0, resources={"head": 1}).remote()
    trainer = TorchTrainer(
        elastic_loop,
        train_loop_config={
            "loader": loader,
            "ledger": ledger,
            "epochs": 1,
            "max_epochs": 40,  # a bound, not a plan: the run stops once the cues were seen
            "every": 4,
            "delay": 0.1,
        },
        scaling_config=ScalingConfig(
            num_workers=(1, 3),
            resources_per_worker={"CPU": 1},
            elastic_resize_monitor_interval_s=2.0,  # consider growing every 2 s (default 60)
        ),
        run_config=RunConfig(
            name="elastic",
            storage_path=scratch("rayshard-train-"),
            failure_config=FailureConfig(max_failures=4),
            checkpoint_config=CheckpointConfig(num_to_keep=None),
        ),
    )
    outcome: dict = {}

    def fit() -> None:
        try:
            result = trainer.fit()
            outcome["error"] = repr(result.error) if result.error else None
            outcome["state_epoch"] = (result.metrics or {}).get("state_epoch")
            if result.checkpoint is not None:
                with (
                    result.checkpoint.as_directory() as folder,
                    open(os.path.join(folder, rayshard.train.STATE_FILE)) as handle,
                ):
                    outcome["final_state"] = json.load(handle)
        except BaseException as error:  # noqa: BLE001 - reported
            outcome["error"] = repr(error)

    runner = threading.Thread(target=fit, daemon=True)
    runner.start()

    def checkpoints_at(world: int, count: int = 1) -> list:
        """Cue: `count` checkpoints reported at this world size. A worker's reports queue
        one deep, so once its n-th report returned the (n-1)-th was taken by Train's
        controller: a checkpoint at this world size is registered."""
        progress = ray.get(ledger.progress.remote())
        found = [c for c in progress["checkpoints"] if c["world_size"] == world]
        return found if len(found) >= count else []

    timeline = {}
    note("fit started")
    timeline["first_ckpt_at_2_s"] = wait_until(lambda: checkpoints_at(2, 2), "checkpoints at 2")
    note("checkpoint at 2: adding n3")
    t = time.time()
    add_node(cluster, nodes, "n3")
    timeline["node_added_at_s"] = round(t - started, 2)
    timeline["grown_to_3_after_s"] = round(
        wait_until(lambda: checkpoints_at(3, 3), "checkpoints at 3"), 2
    )
    note("checkpoint at 3: removing n3, n2")
    t = time.time()
    remove_node(cluster, nodes, "n3")
    remove_node(cluster, nodes, "n2")
    timeline["nodes_removed_at_s"] = round(t - started, 2)
    timeline["shrunk_to_1_after_s"] = round(
        wait_until(lambda: checkpoints_at(1), "a checkpoint at 1"), 2
    )
    note(f"timeline {timeline}")
    ray.get(ledger.request_stop.remote())
    runner.join(EVENT_TIMEOUT_S)
    if runner.is_alive():
        progress = ray.get(ledger.progress.remote())
        note(f"fit still running: attempts {progress['attempts']}")
        note(f"checkpoints {progress['checkpoints'][-5:]}")
        note(f"loader {loader.stats()}")
    epochs = ray.get(ledger.progress.remote())["epochs_done"]
    audit = ray.get(ledger.audit.remote(rows, epochs))
    result = {
        "rows": rows,
        "batch_size": batch_size,
        "epochs": epochs,
        "fit_error": outcome.get("error", "fit did not return"),
        "final_state_epoch": outcome.get("state_epoch"),
        "final_state": outcome.get("final_state"),
        "audit": audit,
        "checkpoints": [
            {k: c[k] for k in ("attempt", "epoch", "seq", "state_epoch")}
            for c in ray.get(ledger.progress.remote())["checkpoints"]
        ],
        "timeline": timeline,
        "loader_events": [{k: e[k] for k in e if k != "time"} for e in loader.stats()["events"]],
        "run_s": round(time.time() - started, 2),
    }
    loader.shutdown()
    return result


# -- a rank that comes back on a replacement node under the same rank number -----------------
def scenario_rank_rejoins_same_number() -> dict:
    """Ranks 0 (head: it only has to survive) and 1 (n1); n1 is killed; a replacement node
    n2 joins and a consumer there takes rank 1 again (as a restarted worker keeps its
    rank); then n2 is killed too.
    Expected: the second loss is noticed like the first (rank_lost), rank 1's leases go
    back to the queue and rank 0 finishes the epoch with nothing lost."""
    rows, batch_size, delay = 600, 8, 0.2
    data = make_dataset([300, 300], row_group_size=10)
    cluster, nodes = start_cluster(1)
    started = time.time()
    loader = dynamic_loader(data, "rejoin", batch_size=batch_size, prefetch_depth=2)
    audit = head_audit(rows)
    # Rank 0 pauses after 10 batches until rank 1 came back and read: its work must still
    # be there for the second loss to matter, however slowly n2 starts.
    first, first_run = start_consumer(loader, audit, 0, 2, "head", delay, hold_after=10)
    second, _ = start_consumer(loader, audit, 1, 2, "n1", delay)
    wait_until(lambda: ray.get(second.progress.remote()) >= 4, "rank 1 to read")
    remove_node(cluster, nodes, "n1")
    wait_until(lambda: len(event_times(loader, "rank_lost")) >= 1, "the first rank_lost")
    add_node(cluster, nodes, "n2")
    again, _ = start_consumer(loader, audit, 1, 2, "n2", delay)
    wait_until(lambda: ray.get(again.progress.remote()) >= 3, "rank 1 (again) to read")
    killed_at = remove_node(cluster, nodes, "n2")
    first.release.remote()
    try:
        noticed_s = wait_until(
            lambda: len(event_times(loader, "rank_lost")) >= 2, "the second rank_lost"
        )
    except TimeoutError:
        noticed_s = None
    note(f"second loss noticed after {noticed_s} s")
    try:
        rank0 = ray.get(first_run, timeout=EVENT_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 - reported
        rank0 = {"error": type(error).__name__}
    stats = loader.stats()
    result = {
        "rows": rows,
        "batch_size": batch_size,
        "second_loss_noticed_s": noticed_s,
        "rank0": rank0,
        "report": ray.get(audit.report.remote()),
        "events": [e["event"] for e in stats["events"]],
        "ranks": stats["ranks"],
        "leases": stats["leases"],
        "killed_at": killed_at,
        "epoch_s": round(time.time() - started, 2),
    }
    loader.shutdown()
    return result


# -- scenario 5: transform and reader workers on a CPU-only node ------------------------------
def tag_node(batch: dict, ctx: Any) -> dict:
    """A transform that records which node ran it."""
    batch["node"] = [ray.get_runtime_context().get_node_id()] * len(batch["id"])
    return batch


def scenario_workers_on_cpu_node() -> dict:
    """Two loaders in turn, each one epoch of one rank consumed by the driver, on the head
    (dynamic), with `transform_resources` naming node n1 (a CPU-only node, resource `n1`):
    `transform`: the rank's 2 transform workers run there, its reader stays on the head;
    `readers`: `reader_workers=2` read the pieces and run the transform there, the reader
    again on the head."""
    from tests.runtime.reading_fns import READ_NODE, NodeStampedSource

    start_cluster(worker_nodes=1, head_cpus=1, node_cpus=2)
    data = make_dataset([120, 80], row_group_size=20)
    on_n1 = {"CPU": 1, "n1": 1}
    transform = dynamic_loader(
        data,
        "prep",
        batch_size=10,
        transform=tag_node,
        transform_workers=2,
        transform_resources=on_n1,
    )
    result = {"transform": one_rank_on_head(transform, 200)}
    readers = dynamic_loader(
        data,
        "readers",
        source=NodeStampedSource(data),
        batch_size=10,
        transform=lambda batch, ctx: {**tag_node(batch, ctx), "read": batch[READ_NODE]},
        reader_workers=2,
        transform_resources=on_n1,
    )
    result["readers"] = one_rank_on_head(readers, 200)
    return result


def one_rank_on_head(loader: Any, rows: int) -> dict:
    """One epoch of `loader` as rank 0 of 1, consumed and audited by this driver (on the
    head): the nodes its batches were transformed on and, where they say, read on; its
    reader's node; the audit."""
    from rayshard.runtime.audit import CoverageAudit

    audit = CoverageAudit(rows)  # here, not an actor: one consumer, in this process
    iterator = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    nodes: set[str] = set()
    read: set[str] = set()  # where the rows were read, when a batch says ("read")
    for batch in iterator:
        real = ~batch["_padded"]
        audit.add(0, batch["id"][real])
        nodes.update(node for node, keep in zip(batch["node"], real) if keep)
        read.update(node for node, keep in zip(batch.get("read", ()), real) if keep)
    names = node_labels()
    reader = ray._private.state.actors(actor_id=iterator._holds.reader._actor_id.hex())
    result = {
        "transform_nodes": sorted({names.get(node, node) for node in nodes}),
        "read_nodes": sorted({names.get(node, node) for node in read}),
        "reader_node": names[reader["Address"]["NodeID"]],
        "audit": audit.report(),
    }
    loader.shutdown()
    return result


SCENARIOS = {
    "dynamic_node_churn": scenario_dynamic_node_churn,
    "coordinator_sigkill": scenario_coordinator_sigkill,
    "elastic_trainer": scenario_elastic_trainer,
    "rank_rejoins_same_number": scenario_rank_rejoins_same_number,
    "workers_on_cpu_node": scenario_workers_on_cpu_node,
}


# Scenarios that can run one after another on one cluster (a head with one CPU).
SHAREABLE = (
    "dynamic_node_churn",
    "coordinator_sigkill",
    "rank_rejoins_same_number",
    "workers_on_cpu_node",
)
SCENARIO_MARK = "SCENARIO_BEGIN: "  # on stdout and stderr before each scenario's output


def main(argv: list[str]) -> int:
    """One scenario on its own cluster, or several of `SHAREABLE` in turn on one cluster
    (the nodes of each are gone, and its actors ended, before the next starts). Prints
    each scenario's result line, tagged with its name; a scenario that raises reports the
    error and its traceback, and the next ones still run on the same cluster unless the
    cluster cannot be brought back to a bare head."""
    known = argv and all(name in SCENARIOS for name in argv) and len(set(argv)) == len(argv)
    if not known or (len(argv) > 1 and not set(argv) <= set(SHAREABLE)):
        print(f"usage: python -m tests.multinode.scenarios {{{','.join(SCENARIOS)}}}")
        print(f"   or: python -m tests.multinode.scenarios NAME... (of {', '.join(SHAREABLE)})")
        return 2
    sys.path.insert(0, REPO_ROOT)
    failed = 0
    broken = None  # why the cluster cannot serve the next scenario
    try:
        for name in argv:
            print(SCENARIO_MARK + name, flush=True)
            print(SCENARIO_MARK + name, file=sys.stderr, flush=True)
            if broken is not None:
                emit({"scenario": name, "error": f"not run: {broken}"})
                failed += 1
                continue
            result = run_one(name)
            if len(argv) > 1 and name != argv[-1]:
                try:
                    reset_cluster()
                except Exception as error:  # noqa: BLE001 - reported
                    traceback.print_exc()
                    broken = f"the cluster was not bare again after {name}: {error!r}"
                    result.setdefault("error", broken)
            failed += bool(result.get("error"))
            emit(result)
        return 1 if failed else 0
    finally:
        # Shut down hard-killed clusters without waiting on anything that may hang.
        done = threading.Event()

        def shutdown():
            try:
                ray.shutdown()
            finally:
                done.set()

        threading.Thread(target=shutdown, daemon=True).start()
        done.wait(30)
        cluster = _CLUSTER.get("cluster")
        if cluster is not None:
            cluster.shutdown()
        if "folder" in _SCRATCH:
            shutil.rmtree(_SCRATCH.pop("folder"), ignore_errors=True)


def run_one(name: str) -> dict:
    """Scenario `name`'s result, or its error with the traceback."""
    started = time.time()
    try:
        result = SCENARIOS[name]()
    except Exception as error:  # noqa: BLE001 - reported to the test
        traceback.print_exc()
        result = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
    return {"scenario": name, **result, "scenario_s": round(time.time() - started, 2)}


_CLUSTER: dict[str, Any] = {}
_SCRATCH: dict[str, str] = {}  # "folder": this run's scratch folder, once made

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
