"""Benchmark of the dynamic policy: recovery after a rank dies, coordinator
throughput with many ranks, and the dynamic policy's epoch throughput next to `data`.
This file is the driver (arguments, tables, targets, JSON); the sections live in
`benchmarks/elastic/`.

    python benchmarks/elastic_bench.py [--quick] [--json PATH] [--only recovery,...]
        [--profile] [--py-spy PATH] [--recovery-ranks N] [--epoch-ranks N]
        [--ack-ranks N] [--ack-seconds S] [--step-s S] [--ack-relay MODE,MODE]
        [--core-ranks N,N]

recovery    3 ranks (`--recovery-ranks`; rank 1 is the victim) consume a `dynamic`
            loader (default Ray and loader settings; Parquet ids, batch 256, splits of
            1,024 rows, a simulated 20 ms training step). When
            the victim rank has received 8 batches its reader actor dies: `ray.kill`
            (mode `ray_kill`) or SIGKILL of its process (mode `sigkill`). Times, all
            `time.time()` on this one machine, measured from the kill:
              detect_s  until the coordinator records `rank_lost` (describe()["events"])
              relet_s   until the coordinator hands a surviving rank the first lease that
                        overlaps the dead rank's unacknowledged rows: the recovery time
              served_s  until a surviving consumer receives a batch holding one of them
            The coordinator's `trace()` records the time, the rank and the pieces of
            every lease, and the dead rank's unacknowledged rows (outstanding leases
            minus acknowledged samples) at the moment of release.
            Coverage of the epoch is checked (nothing lost; duplicates are the dead
            rank's received-but-unacknowledged batches).
throughput  the coordinator with 1,000 (`--ranks`) registered data-parallel ranks and splits of 16
            rows: `LeaseBook.lease`/`ack` in process; `Journal.append` of one lease
            entry in process; the real actor with `lease.remote` from caller actors
            (async, many calls in flight); and the library's batched call
            `lease(rank, count=100)` (the readers' path: up to `count` pieces in
            one round trip, each journaled); then `ack.remote`, one call per leased
            piece; the same once every rank took what its capacity leaves (an epoch's
            tail, no piece left to lease: each ack asks whether it ended the epoch);
            the same once a rank holding pieces left (churn: its rows went back);
            and the same calls to an actor whose `ack` does nothing. `--profile` samples the
            coordinator with py-spy during the per-call run and lists where time goes.
acks        `--ack-ranks` ranks (policy `data`), each a real `AckSender` (the
            iterators' default `ack_interval_s`, 0.1 s) receiving a batch every
            `--step-s`, for `--ack-seconds`, in 2 processes, against one coordinator:
            more acknowledgements offered than it records on this machine. A probe
            `ping` every 0.25 s measures how long a call waits in its queue (its
            median over the run, and over the second half: once the senders took
            the interval the coordinator asks for); the senders' final `stop()`
            waits for what is still queued. Run once per `--ack-relay` mode (default
            `off,auto`: straight, then the default, which relays once paced), with
            the groups sent and relayed, the coordinator's calls for them, its CPU
            per group, and the relay's CPU share (its whole life, its start too).
leases      the same ranks under `dynamic`, each a real `AckSender` that leases one
            piece of 4 batches through it (`AckSender.lease`: through its node's relay
            once it took one) whenever it holds none, and acknowledges a batch every
            `--step-s`, for `--ack-seconds`, once per `--ack-relay` mode: each lease's
            round trip, the coordinator's CPU and calls, and what went through the relay.
core        the coordinator's pure core (no Ray) through one `dynamic` epoch at
            `--core-ranks` ranks (default 1,000, 3,000 and 10,000; 4 row groups of
            32,768 rows per rank, one per lease, acknowledged 4 batches at a time):
            steady; one node's 8 ranks lost a third of the way in; the same with
            `straggler_timeout_s` on (every lease that finds nothing asks for
            stragglers). CPU per lease, ack and loss, and for registering and starting
            the epoch: the core's own cost, beside Ray's per-call cost.
busy        one rank reads two epochs (1.5M rows of id and a float; quick 100k; row groups
            of 32,768 rows) under `data` and under `dynamic` while caller actors keep
            0, 64 and 256 cheap calls (quick: 32) queued at the coordinator, as many
            ranks' acknowledgements do at scale: each `dynamic` lease call waits its
            turn in that queue (a row group per call while answers come quickly; fewer,
            larger calls asked earlier when they come late). A probe call measures the
            wait; the coordinator's trace counts the lease calls.
epoch       `policy="data"` and `policy="dynamic"` on the same Parquet data (x float32
            [128], label, id; row groups of 32,768 rows = the dynamic splits), 2 ranks
            (`--epoch-ranks`) as Ray tasks, batch 1024, numpy batches; each run reads 2
            epochs with a fresh loader and the second (warm) one is measured; runs
            alternate between the policies and the median is reported.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as `python benchmarks/elastic_bench.py`
    sys.path.insert(0, str(ROOT))


from benchmarks._measure import format_table  # noqa: E402
from benchmarks._report import start_local_ray, write_json  # noqa: E402
from benchmarks.elastic.ack_load import run_ack_load  # noqa: E402
from benchmarks.elastic.busy import run_busy  # noqa: E402
from benchmarks.elastic.coordinator_rate import run_throughput  # noqa: E402
from benchmarks.elastic.core_epoch import NODE_RANKS, run_core  # noqa: E402
from benchmarks.elastic.epochs import run_epoch  # noqa: E402
from benchmarks.elastic.lease_load import run_lease_load  # noqa: E402
from benchmarks.elastic.recovery import (  # noqa: E402
    RECOVERY,
    ray_health_check_settings,
    run_recovery,
)
from rayshard.config.parts import RELAY_MODES  # noqa: E402

ACK_INTERVAL_S = 0.1  # the iterators' default `ack_interval_s`
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "elastic_bench.json"
SECTIONS = ("recovery", "throughput", "acks", "leases", "core", "busy", "epoch")
KILL_MODES = ("ray_kill", "sigkill")
TARGETS = {"recovery_s": 5.0, "actor_leases_per_s": 10_000.0}
FEATURES = 128
ROW_BYTES = FEATURES * 4 + 8 + 8

# ---------------------------------------------------------------------------- driver


def start_ray(num_cpus: int) -> None:
    start_local_ray(num_cpus, "rayshard-elastic-bench")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/elastic_bench.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--repeats", type=int, help="recovery runs per kill mode (default 5)")
    parser.add_argument(
        "--recovery-ranks", type=int, default=3, help="ranks of the recovery runs (>= 2)"
    )
    parser.add_argument("--epoch-ranks", type=int, default=2, help="ranks of the epoch runs")
    parser.add_argument("--callers", type=int, default=2, help="caller processes (throughput)")
    parser.add_argument("--ranks", type=int, default=1000, help="registered ranks (throughput)")
    parser.add_argument("--inflight", type=int, default=64, help="calls in flight per caller")
    parser.add_argument(
        "--splits", type=int, help="pieces of the throughput epoch (default 200,000; quick 10,000)"
    )
    parser.add_argument(
        "--ack-ranks", type=int, help="ranks acknowledging (acks; default 400, quick 20)"
    )
    parser.add_argument(
        "--ack-seconds", type=float, help="how long they acknowledge (acks; default 20, quick 1)"
    )
    parser.add_argument(
        "--step-s", type=float, default=0.05, help="a rank's training step (acks; seconds)"
    )
    parser.add_argument(
        "--ack-relay",
        default="off,auto",
        help="ack_relay modes run in turn (acks; comma-separated, of auto, node, off)",
    )
    parser.add_argument(
        "--core-ranks", help="rank counts of the core runs (core; default 1000,3000,10000)"
    )
    parser.add_argument("--profile", action="store_true", help="py-spy the coordinator")
    parser.add_argument("--py-spy", default=shutil.which("py-spy"), help="py-spy executable")
    parser.add_argument("--ray-cpus", type=int, default=4, help="logical CPUs for ray.init")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write JSON")
    args = parser.parse_args(argv)
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown or not args.sections:
        parser.error(
            f"argument --only: invalid choice {','.join(unknown) or args.only!r} "
            f"(choose from {', '.join(SECTIONS)})"
        )
    for option, value in (
        ("--repeats", args.repeats),
        ("--epoch-ranks", args.epoch_ranks),
        ("--callers", args.callers),
        ("--inflight", args.inflight),
        ("--ack-ranks", args.ack_ranks),
        ("--ranks", args.ranks),
        ("--splits", args.splits),
        ("--ray-cpus", args.ray_cpus),
    ):
        if value is not None and value < 1:
            parser.error(f"Invalid value for '{option}': {value} is not in the range x>=1.")
    for option, value in (("--ack-seconds", args.ack_seconds), ("--step-s", args.step_s)):
        if value is not None and not value > 0:
            parser.error(f"Invalid value for '{option}': {value} is not in the range x>0.")
    if args.recovery_ranks < 2:  # rank 1 dies, another rank takes over its rows
        parser.error(
            f"Invalid value for '--recovery-ranks': {args.recovery_ranks} is not in the range x>=2."
        )
    if args.profile and not args.py_spy:
        parser.error("--profile needs py-spy: pip install py-spy, or pass --py-spy PATH")
    if args.repeats is None:
        args.repeats = 1 if args.quick else 5
    args.ack_relay = [m.strip() for m in args.ack_relay.split(",") if m.strip()]
    if not args.ack_relay or set(args.ack_relay) - set(RELAY_MODES):
        parser.error(f"Invalid value for '--ack-relay': {args.ack_relay} (of {RELAY_MODES})")
    if args.ack_ranks is None:
        args.ack_ranks = 20 if args.quick else 400
    if args.ack_seconds is None:
        args.ack_seconds = 1.0 if args.quick else 20.0
    try:
        args.core_ranks = [int(n) for n in (args.core_ranks or "").split(",") if n.strip()]
    except ValueError:
        parser.error(f"Invalid value for '--core-ranks': {args.core_ranks!r} (N,N,...)")
    if any(n < NODE_RANKS + 1 for n in args.core_ranks):
        parser.error(f"Invalid value for '--core-ranks': each must exceed {NODE_RANKS}")
    args.core_ranks = args.core_ranks or ([100] if args.quick else [1000, 3000, 10_000])
    return args


RECOVERY_TABLE = (
    ("kill", "mode", "s"),
    ("runs", "runs", "d"),
    ("detect med s", "detect_s_median", ".3f"),
    ("detect max s", "detect_s_max", ".3f"),
    ("relet med s", "relet_s_median", ".3f"),
    ("relet max s", "relet_s_max", ".3f"),
    ("served med s", "served_s_median", ".3f"),
    ("served max s", "served_s_max", ".3f"),
    ("unacked rows", "unacked_rows_median", ".0f"),
    ("lost", "missing", "d"),
    ("dup max", "duplicates_max", "d"),
)
THROUGHPUT_TABLE = (("path", "path", "s"), ("ops/s", "rate", ",.0f"), ("what", "what", "s"))
ACK_TABLE = (
    ("ranks", "ranks", "d"),
    ("ack_relay", "relay", "s"),
    ("offered acks/s", "offered_acks_per_s", ",.0f"),
    ("queue wait med s", "queue_wait_s_median", ".3f"),
    ("p90 s", "queue_wait_s_p90", ".3f"),
    ("max s", "queue_wait_s_max", ".3f"),
    ("late median s", "queue_wait_s_late_median", ".3f"),
    ("final stop() s", "stop_s_max", ".2f"),
    ("coordinator CPU", "coordinator_cpu_share", ".0%"),
    ("asked interval s", "ack_interval_asked_s", ".2f"),
    ("senders asked s", "senders_asked_s_median", ".2f"),
    ("groups", "groups", ",d"),
    ("relayed", "groups_relayed", ",d"),
    ("coordinator calls", "coordinator_ack_calls", ",d"),
    ("coord. CPU us/group", "coordinator_cpu_us_per_group", ".0f"),
    ("relay CPU", "relay_cpu_share", ".0%"),
)
LEASE_TABLE = (
    ("ranks", "ranks", "d"),
    ("ack_relay", "relay", "s"),
    ("leases", "leases", ",d"),
    ("relayed", "leases_relayed", ",d"),
    ("round trip med s", "lease_round_trip_s_median", ".3f"),
    ("p90 s", "lease_round_trip_s_p90", ".3f"),
    ("coordinator CPU", "coordinator_cpu_share", ".0%"),
    ("groups", "groups", ",d"),
    ("groups relayed", "groups_relayed", ",d"),
    ("coordinator calls", "coordinator_calls", ",d"),
    ("coord. CPU us/item", "coordinator_cpu_us_per_item", ".0f"),
    ("recorded all", "recorded", "s"),
)
CORE_TABLE = (
    ("ranks", "ranks", "d"),
    ("case", "case", "s"),
    ("leases", "leases", "d"),
    ("acks", "acks", "d"),
    ("us/lease", "lease_us", ".0f"),
    ("us/ack", "ack_us", ".0f"),
    ("ms/loss", "lost_ms", ".1f"),
    ("register+start s", "start_s", ".2f"),
    ("group restart s", "restart_s", ".2f"),
    ("requeued rows", "requeued_rows", "d"),
    ("complete", "complete", "s"),
)
BUSY_TABLE = (
    ("policy", "policy", "s"),
    ("calls queued", "inflight", "d"),
    ("queue wait s", "queue_wait_s", ".3f"),
    ("epoch 1 rows/s", "rows_per_s", ",.0f"),
    ("vs data", "vs_data", ".2f"),
    ("epoch 2 rows/s", "steady_rows_per_s", ",.0f"),
    ("vs data", "steady_vs_data", ".2f"),
    ("lease calls", "lease_calls", "d"),
    ("coverage", "coverage", "s"),
)
EPOCH_TABLE = (
    ("policy", "policy", "s"),
    ("rows/s", "rows_per_s", ",.0f"),
    ("min", "rows_per_s_min", ",.0f"),
    ("max", "rows_per_s_max", ",.0f"),
    ("vs data", "ratio_vs_data", ".3f"),
    ("coverage", "coverage", "s"),
)


def report_tables(results: dict) -> list[str]:
    out = []
    if "recovery" in results:
        out.append(format_table(list(results["recovery"]["summary"].values()), RECOVERY_TABLE))
    if "throughput" in results:
        t = results["throughput"]
        rows = [
            {
                "path": "LeaseBook.lease",
                "rate": t["lease_book"]["leases_per_s"],
                "what": "in process",
            },
            {"path": "LeaseBook.ack", "rate": t["lease_book"]["acks_per_s"], "what": "in process"},
            {"path": "Journal.append", "rate": t["journal_appends_per_s"], "what": "in process"},
            {
                "path": "Journal.compact",
                "rate": 1e3 / max(t["journal_compaction_ms"]),
                "what": "in process, a dynamic epoch of {splits:,} pieces: {ms} ms each".format(
                    splits=t["config"]["splits"],
                    ms=", ".join(f"{ms:.0f}" for ms in t["journal_compaction_ms"]),
                ),
            },
            {
                "path": "Journal restore",
                "rate": 1e3 / max(t["journal_restore_ms"]),
                "what": "read and loaded, as a restarted coordinator does: {ms} ms each".format(
                    ms=", ".join(f"{ms:.0f}" for ms in t["journal_restore_ms"]),
                ),
            },
            {
                "path": "actor start_epoch",
                "rate": 1e3 / t["epoch_start_ms"],
                "what": "the first rank's call, the lease book of {splits:,} pieces made: "
                "{ms:.0f} ms".format(splits=t["config"]["splits"], ms=t["epoch_start_ms"]),
            },
            {
                "path": "actor lease.remote",
                "rate": t["actor"]["leases_per_s"],
                "what": "{callers} callers x {inflight_per_caller} in flight".format(**t["config"]),
            },
            {
                "path": "actor relayed leases, {per_call} a call".format(**t["relayed_leases"]),
                "rate": t["relayed_leases"]["leases_per_s"],
                "what": "the same calls, as a node's relay forwards them "
                "({cpu_us_per_lease:.0f} us of CPU a lease)".format(**t["relayed_leases"]),
            },
            {
                "path": "actor lease(count=100)",
                "rate": t["batched"]["leases_per_s"],
                "what": "one call, up to 100 pieces for one rank",
            },
            {
                "path": "actor ack.remote",
                "rate": t["acks"]["acks_per_s"],
                "what": "one call per 16-row batch, {callers} callers x {inflight_per_caller} "
                "in flight".format(**t["config"]),
            },
            {
                "path": "actor relayed acks, {per_call} a call".format(**t["relayed_acks"]),
                "rate": t["relayed_acks"]["groups_per_s"],
                "what": "the same groups, as a node's relay forwards them "
                "({cpu_us_per_group:.0f} us of CPU a group)".format(**t["relayed_acks"]),
            },
            {
                "path": "actor ack.remote, tail",
                "rate": t["tail_acks"]["acks_per_s"],
                "what": "the same, once no piece is left to lease (an epoch's end)",
            },
            {
                "path": "actor ack.remote, after a loss",
                "rate": t["churn_acks"]["acks_per_s"],
                "what": "the same, once a rank holding pieces left (its rows requeued)",
            },
            {
                "path": "empty actor method",
                "rate": t["empty_actor"]["acks_per_s"],
                "what": "the same calls to an async method doing nothing (Ray's own cost)",
            },
        ]
        out.append(format_table(rows, THROUGHPUT_TABLE))
        if isinstance(t.get("profile"), dict):
            profile = t["profile"]
            out.append(f"coordinator profile (py-spy, {profile['samples']} samples, all threads):")
            out += [
                f"  self {p['self']:6.1%}  incl {p['inclusive']:6.1%}  {p['frame']}"
                for p in profile["top_self"]
            ]
            out.append("  rayshard frames, inclusive:")
            out += [
                f"  {share:6.1%}  {frame}"
                for frame, share in list(profile["coordinator_methods_inclusive"].items())[:8]
            ]
    if "acks" in results:
        rows = [
            {**run, "ranks": run["config"]["ranks"], "relay": run["config"]["ack_relay"]}
            for run in results["acks"]["runs"]
        ]
        out.append(format_table(rows, ACK_TABLE))
    if "leases" in results:
        rows = [
            {
                **run,
                "ranks": run["config"]["ranks"],
                "relay": run["config"]["ack_relay"],
                "recorded": str(run["recorded_all"]),
            }
            for run in results["leases"]["runs"]
        ]
        out.append(format_table(rows, LEASE_TABLE))
    if "core" in results:
        rows = [{**r, "complete": str(r["complete"])} for r in results["core"]["runs"]]
        out.append(format_table(rows, CORE_TABLE))
    if "busy" in results:
        rows = [
            {**r, "coverage": "ok" if r["coverage_ok"] else "FAILED"}
            for r in results["busy"]["runs"]
        ]
        out.append(format_table(rows, BUSY_TABLE))
    if "epoch" in results:
        rows = [
            {**r, "coverage": "ok" if r["coverage_ok"] else "FAILED"}
            for r in results["epoch"]["summary"].values()
        ]
        out.append(format_table(rows, EPOCH_TABLE))
    return out


def check_targets(results: dict) -> dict:
    checks = {}
    if "recovery" in results:
        worst = [row["relet_s_max"] for row in results["recovery"]["summary"].values()]
        value = None if None in worst else max(worst)
        checks["recovery_s"] = {
            "value": value,
            "target": TARGETS["recovery_s"],
            "met": value is not None and value <= TARGETS["recovery_s"],
        }
    if "throughput" in results:
        value = results["throughput"]["actor"]["leases_per_s"]
        checks["actor_leases_per_s"] = {
            "value": value,
            "target": TARGETS["actor_leases_per_s"],
            "met": value >= TARGETS["actor_leases_per_s"],
        }
        batched = results["throughput"].get("batched", {}).get("leases_per_s")
        if batched is not None:
            checks["actor_lease_many_per_s"] = {
                "value": batched,
                "target": TARGETS["actor_leases_per_s"],
                "met": batched >= TARGETS["actor_leases_per_s"],
            }
    return checks


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = {
        "recovery_rows": 15_000 if args.quick else RECOVERY["rows"],
        "splits": args.splits or (10_000 if args.quick else 200_000),
        "calls": 2_000 if args.quick else 20_000,
        "ack_calls": 500 if args.quick else 20_000,
        "epoch_rows": 30_000 if args.quick else 1_000_000,
        "epoch_repeats": 1 if args.quick else 3,
    }
    if set(args.sections) - {"core"}:
        start_ray(args.ray_cpus)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="rayshard-elastic-bench-") as tmp:
        workdir = Path(tmp)
        runners = {
            "recovery": lambda: {
                **run_recovery(workdir, args.repeats, sizes["recovery_rows"], args.recovery_ranks),
                "ray_health_checks": ray_health_check_settings(),
            },
            "throughput": lambda: run_throughput(
                workdir,
                sizes["splits"],
                sizes["calls"],
                args.callers,
                args.inflight,
                args.py_spy if args.profile else None,
                args.ranks,
                sizes["ack_calls"],
            ),
            **{
                section: lambda load=load: {
                    "runs": [
                        load(
                            workdir,
                            args.ack_ranks,
                            args.ack_seconds,
                            args.step_s,
                            ACK_INTERVAL_S,
                            relay=relay,
                        )
                        for relay in args.ack_relay
                    ]
                }
                for section, load in (("acks", run_ack_load), ("leases", run_lease_load))
            },
            "core": lambda: run_core(args.core_ranks),
            "busy": lambda: run_busy(
                workdir,
                100_000 if args.quick else 1_500_000,
                (32,) if args.quick else (0, 64, 256),
            ),
            "epoch": lambda: run_epoch(
                workdir, sizes["epoch_rows"], sizes["epoch_repeats"], args.epoch_ranks
            ),
        }
        for section in SECTIONS:
            if section in args.sections:
                began = time.time()
                results[section] = runners[section]()
                results[section]["section_seconds"] = time.time() - began
    print("\n\n".join(report_tables(results)))
    checks = check_targets(results)
    for key, check in checks.items():
        sign = "<=" if key == "recovery_s" else ">="
        value = "-" if check["value"] is None else f"{check['value']:,.3f}"
        print(
            f"{key}: {value} (target {sign} {check['target']:,}) "
            f"{'met' if check['met'] else 'MISSED'}"
        )
    report = {
        "config": {"quick": args.quick, "ray_cpus": args.ray_cpus, **sizes},
        "results": results,
        "targets": checks,
    }
    write_json(args.json, report)
    import ray

    ray.shutdown()
    lost = sum(r["missing"] for r in results.get("recovery", {}).get("runs", []))
    epoch_ok = all(s["coverage_ok"] for s in results.get("epoch", {}).get("summary", {}).values())
    core_ok = all(r["complete"] for r in results.get("core", {}).get("runs", []))
    busy_ok = all(r["coverage_ok"] for r in results.get("busy", {}).get("runs", []))
    return 0 if lost == 0 and epoch_ok and core_ok and busy_ok else 1


if __name__ == "__main__":
    sys.exit(main())
