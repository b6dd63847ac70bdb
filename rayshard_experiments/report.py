"""Write an experiment's results: CSV of per-second throughput, JSON of everything, a PNG
plot of throughput over time with the events marked, and a summary table."""

from __future__ import annotations

import csv
import json
import os
from collections import defaultdict

COLUMNS = ("second", "rank", "samples", "batches", "bytes", "stall_s")


def write_report(result: dict, out_dir: str) -> dict[str, str]:
    """Files written, by kind."""
    paths = {
        "csv": os.path.join(out_dir, "throughput.csv"),
        "json": os.path.join(out_dir, "experiment.json"),
        "png": os.path.join(out_dir, "throughput.png"),
    }
    with open(paths["csv"], "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(result["throughput"])
    with open(paths["json"], "w") as handle:
        json.dump(result, handle, indent=2, default=str)
    plot(result, paths["png"])
    return paths


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_rank: dict[int, dict[int, int]] = defaultdict(dict)
    for row in result["throughput"]:
        per_rank[row["rank"]][row["second"]] = row["samples"]
    seconds = range(max((r["second"] for r in result["throughput"]), default=0) + 1)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    total = [sum(per_rank[r].get(s, 0) for r in per_rank) for s in seconds]
    ax.plot(seconds, total, color="black", linewidth=2, label="all ranks")
    for rank in sorted(per_rank):
        ax.plot(seconds, [per_rank[rank].get(s, 0) for s in seconds], label=f"rank {rank}")
    for event in result["events"]:
        if event["event"] in ("add_node", "kill_node", "remove_node", "node_added", "node_removed"):
            ax.axvline(event["t"], color="red", linestyle="--", alpha=0.6)
            ax.annotate(
                event["event"],
                (event["t"], max(total, default=1)),
                rotation=90,
                fontsize=8,
                va="top",
                ha="right",
                color="red",
            )
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("samples / s")
    ax.set_title("rayshard elastic experiment: throughput and membership events")
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summary_table(result: dict) -> str:
    """Per rank: samples, batches, samples/s while active, stall share; per epoch audit."""
    ranks: dict[int, list] = defaultdict(lambda: [0, 0, 0.0, set()])
    for row in result["throughput"]:
        entry = ranks[row["rank"]]
        entry[0] += row["samples"]
        entry[1] += row["batches"]
        entry[2] += row["stall_s"]
        entry[3].add(row["second"])
    lines = [f"{'rank':>4} {'samples':>9} {'batches':>8} {'samples/s':>10} {'stall s':>8}"]
    for rank, (samples, batches, stall, seconds) in sorted(ranks.items()):
        rate = samples / max(len(seconds), 1)
        lines.append(f"{rank:>4} {samples:>9} {batches:>8} {rate:>10.0f} {stall:>8.2f}")
    lines.append("")
    lines.append(f"{'epoch':>5} {'seen':>8} {'lost':>6} {'duplicates':>10}")
    for epoch, audit in sorted(result["audit"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"{epoch:>5} {audit['seen']:>8} {audit['lost']:>6} {audit['duplicates']:>10}")
    events = [e for e in result["events"] if e["event"] != "rank_started"]
    lines.append("")
    lines.append("events: " + ", ".join(f"{e['event']}@{e['t']:.1f}s" for e in events))
    lines.append(
        f"re-served samples: {result['reserved_samples']}; elapsed "
        f"{result['elapsed_s']:.1f} s; completed: {result['completed']}"
    )
    return "\n".join(lines)
