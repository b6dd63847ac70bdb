"""Smoke test of the elastic benchmark: `python benchmarks/elastic_bench.py --quick` in a
subprocess (it starts its own local Ray) must write JSON with every section, positive
rates and times, and no lost sample after a rank's death. Smaller than `--quick` alone
where the size is not the point (fewer processes to start): 2 ranks in the recovery runs
(the victim and one survivor that takes its rows over), 1 caller actor and 100 registered
ranks for the coordinator's throughput, 1 rank in the epoch runs (one task process and its
watch actor instead of two)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmark_runs import run_benchmark


@pytest.mark.slow
def test_elastic_bench_quick_run(tmp_path: Path) -> None:
    out = tmp_path / "elastic_bench.json"
    command = [
        "benchmarks/elastic_bench.py",
        "--quick",
        "--recovery-ranks=2",
        "--epoch-ranks=1",
        "--callers=1",
        "--ranks=100",
        "--ack-relay=off,node",
        f"--json={out}",
    ]
    done = run_benchmark(*command)
    report = json.loads(out.read_text())
    results = report["results"]
    assert set(results) == {"recovery", "throughput", "acks", "leases", "core", "busy", "epoch"}

    recovery = results["recovery"]
    assert set(recovery["summary"]) == {"ray_kill", "sigkill"}
    assert recovery["config"]["world_size"] == 2
    for mode, row in recovery["summary"].items():
        assert row["runs"] >= 1, mode
        assert row["missing"] == 0, mode
        for key in ("detect_s_median", "relet_s_median", "served_s_median", "relet_s_max"):
            assert row[key] is not None and row[key] > 0, (mode, key, row)
    checks = recovery["ray_health_checks"]
    assert checks["health_check_period_ms"] > 0 and checks["health_check_failure_threshold"] > 0

    throughput = results["throughput"]
    assert throughput["lease_book"]["leases_per_s"] > 0
    assert throughput["lease_book"]["acks_per_s"] > 0
    assert throughput["journal_appends_per_s"] > 0
    assert len(throughput["journal_compaction_ms"]) == 3
    assert all(ms > 0 for ms in throughput["journal_compaction_ms"])
    assert len(throughput["journal_restore_ms"]) == 3
    assert all(ms > 0 for ms in throughput["journal_restore_ms"])
    assert throughput["epoch_start_ms"] > 0
    assert throughput["actor"]["leases_per_s"] > 0
    assert throughput["actor"]["leases"] == throughput["actor"]["calls"]
    assert throughput["config"]["callers"] == 1 and throughput["config"]["ranks"] == 100
    assert throughput["batched"]["leases_per_s"] > 0
    assert throughput["acks"]["acks_per_s"] > 0 and throughput["acks"]["calls"] > 0
    relayed = throughput["relayed_acks"]
    assert relayed["groups"] > 0 and relayed["groups_per_s"] > 0 and relayed["per_call"] == 8
    leases = throughput["relayed_leases"]  # every one-piece call relayed got its piece
    assert leases["leases"] == throughput["config"]["calls"] and leases["per_call"] == 8
    assert leases["leases_per_s"] > 0
    assert throughput["empty_actor"]["calls"] == throughput["acks"]["calls"]
    assert throughput["tail_acks"]["unleased_rows"] == 0  # the tail: nothing left to lease
    assert throughput["tail_acks"]["calls"] > 0 and throughput["tail_acks"]["acks_per_s"] > 0
    assert throughput["churn_acks"]["requeued_rows"] > 0  # the rank that left held work
    assert throughput["churn_acks"]["calls"] > 0

    runs = {run["config"]["ack_relay"]: run for run in results["acks"]["runs"]}
    assert set(runs) == {"off", "node"}  # the modes asked for, in one run
    for acks in runs.values():
        assert acks["config"]["ranks"] == 20
        assert min(acks["steps_per_rank"]) >= 1
        assert acks["recorded_all"]  # every received batch recorded once the senders stopped
        assert acks["queue_wait_s_max"] > 0
        assert 0 < acks["queue_wait_s_late_median"] <= acks["queue_wait_s_max"]
        assert acks["ack_interval_asked_s"] >= acks["config"]["ack_interval_s"]  # never shorter
        assert acks["groups"] >= 20  # each rank's final group at least
    assert runs["off"]["groups_relayed"] == 0 and runs["off"]["relay_cpu_share"] is None
    # through the relay (each sender's first group goes straight), as the coordinator
    # counted: each relayed call carries one group or more (how many depends on when they
    # arrive, so no count is asserted)
    relayed = runs["node"]
    assert relayed["groups_relayed"] > 0 and relayed["relay_cpu_share"] is not None
    assert 0 < relayed["relay_calls"] <= relayed["groups_relayed"] < relayed["groups"]

    leases = {run["config"]["ack_relay"]: run for run in results["leases"]["runs"]}
    assert set(leases) == {"off", "node"}
    for run in leases.values():  # each rank leased, and every received batch was recorded
        assert run["leases"] >= 20 and run["recorded_all"] and run["groups"] >= 20, run
        assert 0 < run["lease_round_trip_s_median"] <= run["lease_round_trip_s_p90"]
    assert leases["off"]["leases_relayed"] == 0 and leases["off"]["relay_calls"] == 0
    # once relayed, lease calls and groups share the relay's calls to the coordinator
    relayed = leases["node"]
    assert 0 < relayed["leases_relayed"] <= relayed["leases"]
    assert relayed["relay_calls"] <= relayed["leases_relayed"] + relayed["groups_relayed"]

    core = {run["case"]: run for run in results["core"]["runs"]}
    assert set(core) == {"steady", "node lost", "node lost, stragglers on", "group restarted"}
    for case, run in core.items():
        assert run["ranks"] == 100 and run["complete"], (case, run)  # every row acknowledged
        assert run["acks"] > 0 and run["leases"] > 0, (case, run)
    assert core["steady"]["requeued_rows"] == 0 and core["steady"]["lost_ranks"] == 0
    for case in ("node lost", "node lost, stragglers on"):  # the lost ranks' work went back
        assert core[case]["lost_ranks"] == 8 and core[case]["requeued_rows"] > 0, core[case]
    restarted = core["group restarted"]  # every rank's leases went back, and were read
    assert restarted["requeued_rows"] > 0 and restarted["restart_s"] > 0, restarted

    busy = results["busy"]["runs"]
    assert {(r["policy"], r["inflight"]) for r in busy} == {("data", 32), ("dynamic", 32)}
    for run in busy:  # every row once, whatever the coordinator's queue held
        assert run["coverage_ok"] and run["rows"] == 100_000, run
    assert all(r["pings"] > 0 for r in busy if r["inflight"])  # the queue was kept busy
    # `data` leases nothing; `dynamic` leased its 4 row groups in one call or more
    assert [r["lease_calls"] > 0 for r in busy] == [r["policy"] == "dynamic" for r in busy]

    assert results["epoch"]["config"]["world_size"] == 1
    epoch = results["epoch"]["summary"]
    for policy in ("data", "dynamic"):
        assert epoch[policy]["rows_per_s"] > 0, policy
        assert epoch[policy]["coverage_ok"], policy
    assert epoch["dynamic"]["ratio_vs_data"] > 0

    assert set(report["targets"]) == {"recovery_s", "actor_leases_per_s", "actor_lease_many_per_s"}
    assert "relet" in done.stdout and "LeaseBook.lease" in done.stdout  # the printed tables
    assert "offered acks/s" in done.stdout and "us/ack" in done.stdout
    assert "calls queued" in done.stdout


@pytest.mark.parametrize(
    ("flag", "value", "range_"),
    [
        ("--ranks", "0", "x>=1"),
        ("--splits", "-5", "x>=1"),
        ("--ray-cpus", "0", "x>=1"),
        ("--ack-seconds", "-1.0", "x>0"),
        ("--step-s", "0.0", "x>0"),
    ],
)
def test_bad_numbers_are_usage_errors_naming_the_flag(flag, value, range_, capsys):
    from benchmarks import elastic_bench

    with pytest.raises(SystemExit) as exited:
        elastic_bench.parse_args([flag, value])
    assert exited.value.code == 2
    assert f"'{flag}': {value} is not in the range {range_}" in capsys.readouterr().err
