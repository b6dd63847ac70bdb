"""Issue 5: rayshard on a real multi-node Ray (`ray.cluster_utils.Cluster`), with real node
losses (`cluster.remove_node`, SIGKILL to a node's raylet and processes) and a SIGKILLed
coordinator process. No mocks.

The pytest session shares one local Ray (`ray_session`), so the scenarios run in a process
of their own with their own cluster (`python -m tests.multinode.scenarios <name>...`, see
scenarios.py), which prints one `RESULT_JSON:` line per scenario that its test asserts on.
The Ray Train scenario has a process and a cluster to itself; the others share one of each
(`shared_scenarios`: a cluster start is a large part of a scenario's cost), started once
for the whole pytest run, whichever xdist worker gets to them first. On failure the
scenario's part of the output is printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time

import pytest
from filelock import FileLock

from tests.multinode.scenarios import RESULT_PREFIX, SCENARIO_MARK, SHAREABLE
from tests.timeouts import SCENARIO_TIMEOUT_S, scenario_timeout_message

pytestmark = pytest.mark.slow
# A test of a shared scenario may wait for the scenarios run before its own (its own wait
# fails when no scenario finished for the scenario timeout).
shared_timeout = pytest.mark.timeout(len(SHAREABLE) * SCENARIO_TIMEOUT_S + 60)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def scenario_env() -> dict:
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    env.pop("RAY_ADDRESS", None)  # the scenarios make their own cluster
    return env


def run_scenario(name: str) -> dict:
    """Scenario `name` on a cluster of its own."""
    env = scenario_env()
    try:
        done = subprocess.run(
            [sys.executable, "-u", "-m", "tests.multinode.scenarios", name],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=SCENARIO_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as expired:
        out = (
            (expired.stdout or b"").decode(errors="replace")
            if isinstance(expired.stdout, bytes)
            else (expired.stdout or "")
        )
        err = (
            (expired.stderr or b"").decode(errors="replace")
            if isinstance(expired.stderr, bytes)
            else (expired.stderr or "")
        )
        print(_tail(out, err))
        pytest.fail(scenario_timeout_message(name))
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        print(_tail(done.stdout, done.stderr))
        last = lines[-1] if lines else ""
        pytest.fail(f"scenario {name} failed (exit {done.returncode}): {last}")
    result = json.loads(lines[-1][len(RESULT_PREFIX) :])
    result["_output"] = _tail(done.stdout, done.stderr)
    return result


class SharedRun:
    """The `SHAREABLE` scenarios in one process on one cluster, started once per pytest run
    by the first test that asks (the files in `folder`, shared by the xdist workers, say
    whether it was): `out`, `err` its output, `pid` its process, `rc` its exit status."""

    def __init__(self, folder: pathlib.Path) -> None:
        self.folder = folder
        self.process: subprocess.Popen | None = None  # where this worker started the run

    def launch(self) -> None:
        with FileLock(str(self.folder / "lock")):
            if (self.folder / "launched").exists():
                return
            command = shlex.join([sys.executable, "-u", "-m", "tests.multinode.scenarios"])
            names = shlex.join(SHAREABLE)
            out, err = (shlex.quote(str(self.folder / f)) for f in ("out", "err"))
            pid, rc = (shlex.quote(str(self.folder / f)) for f in ("pid", "rc"))
            script = (
                f"{command} {names} >{out} 2>{err} & echo $! >{pid}.tmp; mv {pid}.tmp {pid}; "
                f"wait $!; echo $? >{rc}.tmp; mv {rc}.tmp {rc}"
            )
            # Kept (not waited on: `rc` says when it ended, to every worker).
            self.process = subprocess.Popen(["sh", "-c", script], cwd=REPO_ROOT, env=scenario_env())
            (self.folder / "launched").touch()

    def result(self, name: str) -> dict:
        """Scenario `name`'s result, once its line is out. Fails when the run ends without
        it, or when no scenario finished for the scenario timeout (the run is killed)."""
        self.launch()
        seen, progress_at = -1, time.monotonic()
        while True:
            ended = (self.folder / "rc").exists()  # before reading: then all output is in
            results = self._results()
            if name in results:
                result = results[name]
                result["_output"] = _tail(*self._section(name))
                return result
            if ended:
                print(_tail(*self._section(name)))
                status = (self.folder / "rc").read_text().strip()
                pytest.fail(f"scenario {name}: the run ended (exit {status}) without its result")
            if len(results) > seen:
                seen, progress_at = len(results), time.monotonic()
            elif time.monotonic() - progress_at > SCENARIO_TIMEOUT_S:
                if (self.folder / "pid").exists():
                    pid = int((self.folder / "pid").read_text())
                    with contextlib.suppress(ProcessLookupError):  # it just ended
                        os.kill(pid, signal.SIGKILL)
                print(_tail(*self._section(name)))
                pytest.fail(scenario_timeout_message(name))
            time.sleep(1.0)  # the next look at the run's output

    def _read(self, stream: str) -> str:
        path = self.folder / stream
        return path.read_text(errors="replace") if path.exists() else ""

    def _results(self) -> dict[str, dict]:
        written = self._read("out").rpartition("\n")[0]  # whole lines only
        lines = [ln for ln in written.splitlines() if ln.startswith(RESULT_PREFIX)]
        results = (json.loads(ln[len(RESULT_PREFIX) :]) for ln in lines)
        return {result["scenario"]: result for result in results}

    def _section(self, name: str) -> tuple[str, str]:
        """The run's stdout and stderr from scenario `name`'s mark to the next mark."""

        def part(text: str) -> str:
            mark = f"{SCENARIO_MARK}{name}\n"
            if mark not in text:
                return text
            rest = text.split(mark, 1)[1]
            return rest.split(SCENARIO_MARK, 1)[0]

        return part(self._read("out")), part(self._read("err"))


@pytest.fixture(scope="session")
def shared_scenarios(tmp_path_factory) -> SharedRun:
    basetemp = tmp_path_factory.getbasetemp()
    # Under xdist each worker has its own basetemp in the run's shared one.
    root = basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp
    folder = root / "multinode-shared"
    folder.mkdir(exist_ok=True)
    return SharedRun(folder)


def _tail(stdout: str, stderr: str, keep: int = 12000) -> str:
    # Raylet state dumps are long and say nothing here: keep the rest.
    out = "\n".join(ln for ln in stdout.splitlines() if "[state-dump]" not in ln)
    return f"--- stdout (tail) ---\n{out[-keep:]}\n--- stderr (tail) ---\n{stderr[-keep:]}"


def check(result: dict, condition: bool, message: str) -> None:
    """Assert, printing the scenario's result and output first when it fails."""
    if not condition:
        print(result.pop("_output", ""))
        print(json.dumps(result, indent=1, default=str))
        pytest.fail(message)


@shared_timeout
def test_dynamic_node_loss_and_join_exact_coverage(shared_scenarios):
    """Dynamic mode: 2 ranks on 2 nodes; one node is killed mid-epoch, a node is added and a
    new rank starts there. Nothing is lost, duplicates are bounded by the dead rank's
    in-flight window, the new rank takes splits, and the events say so."""
    r = shared_scenarios.result("dynamic_node_churn")
    print({k: v for k, v in r.items() if k != "_output"})
    check(r, not r.get("error"), f"scenario error: {r.get('error')}")
    report = r["report"]
    check(r, list(report) == ["0"], f"epochs audited: {list(report)}")
    epoch = report["0"]
    check(r, epoch["lost"] == 0 and epoch["distinct"] == r["rows"], f"samples lost: {epoch}")
    # Only batches the dead rank received whose acknowledgement never reached the
    # coordinator can be served twice: at most its prefetch window (depth + the batch in
    # hand) of batches, per lost rank.
    lost_ranks = [rank for rank, p in r["placement"].items() if r["killed_node"] in p.values()]
    bound = len(lost_ranks) * (r["prefetch_depth"] + 1) * r["batch_size"]
    check(r, epoch["duplicates"] <= bound, f"duplicates {epoch['duplicates']} > {bound}")
    # Readers live on their consumer's node (hard affinity): the node loss takes exactly
    # the rank placed on it, nobody else.
    check(
        r,
        all(p["consumer"] == p["reader"] for p in r["placement"].values()),
        f"a reader is not on its consumer's node: {r['placement']}",
    )
    check(r, not r["placement_probe"]["misplaced"], f"probe: {r['placement_probe']}")
    # The coordinator (on the head) watches each rank's process by its pid, through the
    # `NodeWatch` of that rank's node: one per node, no `RankWatch` actor at all.
    watches = r["watches"]
    check(r, watches["watched_by_pid"] == 2, f"ranks watched by pid: {watches}")
    check(r, watches["node_watch_nodes"] == ["n1", "n2"], f"node watches: {watches}")
    check(r, watches["node_watches"] == 2 and not watches["rank_watches"], f"{watches}")
    check(r, sorted(r["errors"]) == ["1"], f"ranks that failed: {r['errors']} (only 1 died)")
    check(r, sorted(r["outcomes"]) == ["0", "2"], f"finished: {r['outcomes']}")
    check(r, r["outcomes"]["2"]["samples"] > 0, "the new rank received no splits")
    events = r["events"]
    check(r, "rank_lost" in events and "rank_joined" in events, f"events: {events}")
    check(
        r,
        "rank_joined" in events[events.index("rank_lost") :],
        f"no rank joined after the loss: {events}",
    )
    check(r, r["lost_reason"] == "reader died", f"rank lost because {r['lost_reason']}")
    # `ack_relay="node"`: the surviving rank's groups and lease calls went through a relay
    # on its node (the lost rank's through n2's, which died with it)
    relay = r["relays"]
    check(r, relay["runs_on"] == relay["for"] == "n1", f"n1's relay: {relay}")
    check(r, 0 < relay["calls"] <= relay["groups"] + relay["leases"], f"n1's relay: {relay}")
    check(r, relay["leases"] > 0, f"no lease call went through n1's relay: {relay}")
    check(r, r["acks_relayed"] >= relay["groups"], f"relayed: {r['acks_relayed']}, {relay}")


def test_elastic_torch_trainer_2_3_1_exact_relative_to_checkpoints():
    """A TorchTrainer with num_workers=(1, 3): 2 workers, a node joins -> 3, two nodes are
    killed -> 1; static policy, shuffled, a DDP step per batch; checkpoints mid-epoch. Over
    each epoch, the ids the model received up to the checkpoints the run resumed from cover
    the epoch exactly once; the killed nodes' ranks are noticed as lost; the run's last
    checkpoint holds the finished loader (the next epoch, nothing consumed)."""
    r = run_scenario("elastic_trainer")
    print({k: v for k, v in r.items() if k not in ("_output", "checkpoints")})
    check(r, not r.get("error"), f"scenario error: {r.get('error')}")
    check(r, r["fit_error"] is None, f"fit failed: {r['fit_error']}")
    audit = r["audit"]
    sizes_on_chain = [audit["world_sizes"][a] for a in audit["chain"]]
    check(r, sizes_on_chain == [2, 3, 1], f"world sizes along the resume chain: {sizes_on_chain}")
    # At least one resume is from a checkpoint taken inside an epoch (its loader state
    # points into that epoch), so the rest of an epoch is re-planned on a new world size.
    # Where exactly the resizes land depends on how fast Ray Train restarts (machine load).
    resumes = [audit["resumed_from"][a] for a in audit["chain"][1:]]
    inside = [
        m
        for m in resumes
        if any(
            c["attempt"] == m["attempt"] and c["seq"] == m["seq"] and c["state_epoch"] == m["epoch"]
            for c in r["checkpoints"]
        )
    ]
    check(r, len(inside) >= 1, f"no resume from inside an epoch: {resumes}")
    check(r, r["epochs"] >= 1, f"the run finished no epoch: {r['epochs']}")
    for epoch in range(r["epochs"]):
        row = audit["per_epoch"][str(epoch)]
        check(
            r,
            row["lost"] == 0 and row["duplicates"] == 0 and row["seen"] == r["rows"],
            f"epoch {epoch} not covered exactly once relative to the checkpoints: {row}",
        )
    events = [e["event"] for e in r["loader_events"]]
    check(r, events.count("new_generation") >= 2, f"loader events: {events}")
    check(r, "rank_lost" in events, f"no rank_lost after the nodes were killed: {events}")
    # fit() returned the run's last checkpoint, taken after the loop's last epoch.
    state = r["final_state"]
    last = r["final_state_epoch"]
    check(r, last == r["epochs"], f"the last report's state epoch is {last}")
    check(r, state is not None and state["epoch"] == r["epochs"], f"final state {state}")
    check(r, state["consumed"] == [], f"final state still has consumed rows: {state}")


@shared_timeout
def test_coordinator_sigkill_mid_epoch_then_node_loss(shared_scenarios):
    """The coordinator's process is SIGKILLed mid-epoch (ranks on 2 worker nodes, the
    coordinator on the head): Ray restarts it from its journal and nothing is lost or
    repeated; a node killed afterwards is still noticed by the restarted coordinator."""
    r = shared_scenarios.result("coordinator_sigkill")
    print({k: v for k, v in r.items() if k != "_output"})
    check(r, not r.get("error"), f"scenario error: {r.get('error')}")
    check(r, r["pid_after"] != r["pid_before"], "the coordinator runs in the same process")
    events = r["events"]
    check(r, "coordinator_restarted" in events, f"events: {events}")
    check(
        r,
        "rank_lost" in events[events.index("coordinator_restarted") :],
        f"the restarted coordinator did not notice the node loss: {events}",
    )
    epoch = r["report"]["0"]
    check(r, epoch["lost"] == 0 and epoch["distinct"] == r["rows"], f"samples lost: {epoch}")
    # The restart itself repeats nothing; the later node loss at most one in-flight window.
    check(r, epoch["duplicates"] <= 3 * r["batch_size"], f"duplicates: {epoch}")
    check(r, sorted(r["errors"]) == ["1"], f"ranks that failed: {r['errors']} (only 1 died)")


@shared_timeout
def test_rank_rejoining_under_same_number_is_watched_again(shared_scenarios):
    """Rank 1 dies with its node, comes back on a replacement node as rank 1, and dies
    again: the second loss must be noticed and the epoch must still complete."""
    r = shared_scenarios.result("rank_rejoins_same_number")
    print({k: v for k, v in r.items() if k != "_output"})
    check(r, not r.get("error"), f"scenario error: {r.get('error')}")
    check(
        r,
        r["second_loss_noticed_s"] is not None,
        f"second death of rank 1 never noticed: events {r['events']}, leases {r['leases']}",
    )
    check(r, "error" not in r["rank0"], f"rank 0 did not finish: {r['rank0']}")
    epoch = r["report"]["0"]
    check(r, epoch["lost"] == 0, f"samples lost: {epoch}")


@shared_timeout
def test_transform_and_reader_workers_run_on_a_cpu_only_node_with_exact_coverage(shared_scenarios):
    """`transform_resources` sends a rank's transform workers, or with `reader_workers=2`
    its reader workers (which read the pieces and transform them), to another node (a
    CPU-only node here) while its reader stays on the consumer's node; both epochs exact.
    One cluster for both loaders (a cluster start is most of such a scenario's cost)."""
    r = shared_scenarios.result("workers_on_cpu_node")
    check(r, not r.get("error"), f"scenario error: {r.get('error')}")
    transform, readers = r["transform"], r["readers"]
    check(r, transform["transform_nodes"] == ["n1"], f"transformed on {transform}")
    check(r, transform["reader_node"] == "head", f"reader on {transform['reader_node']}")
    check(r, readers["read_nodes"] == ["n1"], f"read on {readers['read_nodes']}")
    check(r, readers["transform_nodes"] == ["n1"], f"transformed on {readers}")
    check(r, readers["reader_node"] == "head", f"reader on {readers['reader_node']}")
    for name, part in (("transform", transform), ("readers", readers)):
        epoch = part["audit"]["0"]
        check(r, epoch["lost"] == 0 and epoch["duplicates"] == 0, f"{name} coverage: {epoch}")
