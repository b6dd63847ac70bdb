"""A short elastic experiment end to end (one node added, one killed) on its own local
multi-node Ray, in a subprocess so it does not touch the session's Ray: the audit shows no
lost sample, and the CSV, JSON and PNG are written and non-empty. One initial node (one
node fewer to start): the rank of the node added at 2 s takes over the rows of the rank
killed at 4 s and finishes both epochs."""

from __future__ import annotations

import csv

import pytest

from tests.experiment.runner import run_experiment

pytestmark = pytest.mark.slow

SCHEDULE = """\
rows: 12000
batch_size: 100
epochs: 2
step_time_s: 0.04
initial_nodes: 1
node_cpus: 1
duration_s: 150
events:
  - {at: 2, action: add_node}
  - {at: 4, action: kill_node, node: 0}
"""


def test_short_experiment_loses_nothing(tmp_path):
    result, stdout, out = run_experiment(tmp_path, SCHEDULE)
    assert result["completed"]
    assert {int(e) for e in result["audit"]} == {0, 1}
    for epoch, audit in result["audit"].items():
        assert audit["lost"] == 0, (epoch, audit)
        assert audit["seen"] >= 12000
    kinds = [e["event"] for e in result["events"]]
    assert "add_node" in kinds and "kill_node" in kinds
    assert any(e["event"] == "rank_lost" for e in result["loader_events"])
    # The kill waited for the killed rank's first batch (the schedule's `at` is a lower
    # bound), so the loss took a rank holding work however late it started.
    (kill,) = [e for e in result["events"] if e["event"] == "kill_node"]
    assert kill["rank"] in result["delivered"]
    first_second = min(r["second"] for r in result["throughput"] if r["rank"] == kill["rank"])
    assert kill["t"] >= first_second
    with open(out / "throughput.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and sum(int(r["samples"]) for r in rows) >= 24000
    assert (out / "throughput.png").stat().st_size > 10_000
    assert "lost" in stdout and "wrote" in stdout
