"""The fake-multinode autoscaler mode end to end, in a subprocess so it does not touch the
session's Ray: the cluster starts with only a head; ranks demanded by the schedule make
Ray's autoscaler add worker nodes (the test adds none), a rank that leaves and the ranks
that finish leave idle nodes that the autoscaler removes; the audit shows no lost sample,
the CSV and PNG are written, and no process the run started is left."""

from __future__ import annotations

import csv
import os

import pytest

from rayshard.errors import ConfigError
from rayshard_experiments.schedule import parse_schedule
from tests.experiment.runner import run_experiment

IDLE_TIMEOUT_S = 4
SCHEDULE = f"""\
autoscaler: true
max_workers: 3
idle_timeout_s: {IDLE_TIMEOUT_S}
rows: 60000
batch_size: 100
epochs: 2
step_time_s: 0.04
initial_nodes: 1
node_cpus: 1
duration_s: 150
events:
  - {{at: 2, action: add_node}}
  - {{at: 4, action: add_node}}
  - {{at: 20, action: remove_node, node: 0}}
"""


def _processes_naming(text: str) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as handle:
                zombie = handle.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, IndexError):
            continue
        if text in cmdline and not zombie:
            found.append(f"{entry} {cmdline[:160]}")
    return found


def test_autoscaler_schedule_refuses_kill_node():
    with pytest.raises(ConfigError, match="kill_node event at 3 s is not supported"):
        parse_schedule({"autoscaler": True, "events": [{"at": 3, "action": "kill_node"}]})
    with pytest.raises(ConfigError, match="max_workers needs autoscaler: true"):
        parse_schedule({"max_workers": 2})
    schedule = parse_schedule({"autoscaler": True, "max_workers": 2, "idle_timeout_s": 3})
    assert schedule.autoscaler and schedule.max_workers == 2 and schedule.idle_timeout_s == 3


@pytest.mark.slow
def test_demand_scales_up_and_idle_nodes_scale_down(tmp_path):
    result, stdout, out = run_experiment(tmp_path, SCHEDULE)
    scaling = result["autoscaling"]

    # Nothing the run started is left: no process names its private Ray folder, which
    # is gone.
    assert scaling["temp_dir"].startswith("/tmp/rsas-")
    assert _processes_naming(scaling["temp_dir"]) == []
    assert not os.path.exists(scaling["temp_dir"])

    events = result["events"]
    print("events:", *events, "autoscaling:", scaling, sep="\n")  # shown if it fails
    at = {kind: [e for e in events if e["event"] == kind] for kind in {e["event"] for e in events}}
    # Scale-up on demand: three ranks demanded, three nodes added by the autoscaler, each
    # after the first demand; every rank started on one of them, one rank a node. On a
    # loaded machine Ray's autoscaler may launch a node beyond the demand and end it at
    # once (`max_workers`; seen in 2 of 7 full runs): such a spare node ran no rank, and
    # is gone by the end.
    assert len(at["rank_demanded"]) == 3
    added = {e["node_id"] for e in at["node_added"]}
    assert len(at["node_added"]) == len(added) == scaling["nodes_added"]
    assert min(e["t"] for e in at["node_added"]) > min(e["t"] for e in at["rank_demanded"])
    started = {e["node_id"] for e in at["rank_started"]}
    assert len(started) == 3 and started <= added
    removed = {e["node_id"] for e in at["node_removed"]}
    assert added - started <= removed, "a spare node was left"
    assert len(scaling["scale_up_s"]) == 3
    # Idle scale-down: the node of the rank that left goes first, while the others still
    # run; then the others after the ranks finished; each no sooner than the idle timeout.
    assert removed == added and scaling["nodes_removed"] == len(added)
    assert scaling["workers_left"] == 0
    assert len(scaling["scale_down_s"]) == 3
    assert all(d >= IDLE_TIMEOUT_S - 1 for d in scaling["scale_down_s"]), scaling
    # Causal order only: the rank leaves once it started; the run holds the other ranks
    # until the leaver's node is gone, so that node is the first removed, and it is
    # removed before the others are released (the recorder takes the driver's events in
    # the order they were sent).
    left = at["remove_node"][0]
    assert left["mode"] == "rank_leaves"
    assert scaling["not_scaled_down_in_run"] == []
    ranks_nodes_removed = [e for e in at["node_removed"] if e["node_id"] in started]
    first_removed = min(ranks_nodes_removed, key=lambda e: e["t"])
    leaver = next(e["node_id"] for e in at["rank_started"] if e["node"] == left["node"])
    assert first_removed["node_id"] == leaver
    released = at["ranks_released"][0]
    assert events.index(left) < events.index(first_removed) < events.index(released)

    assert result["completed"]
    assert {int(e) for e in result["audit"]} == {0, 1}
    for epoch, audit in result["audit"].items():
        assert audit["lost"] == 0, (epoch, audit)
        assert audit["seen"] >= 60000
    with open(out / "throughput.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and sum(int(r["samples"]) for r in rows) >= 120000
    assert (out / "throughput.png").stat().st_size > 10_000
    assert "lost" in stdout and "wrote" in stdout
