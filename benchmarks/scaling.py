"""How rayshard and the raw scan scale with dataset size and ranks: the loader benchmark
(`benchmarks/loader_bench.py`) at each (rows, ranks) pair, one table of warm rows/s,
steady rows/s and rayshard's ratio to the raw scan of the same pair; `rayshard_cpus` is
rayshard with each rank's task given cores // ranks CPUs, so as many reading threads.

    python -m benchmarks.scaling [--rows 1000000,4000000] [--ranks 1,2,4] [--epochs 3]

Writes `benchmarks/results/scaling.json`. On a machine with fewer cores than ranks, the
ranks share the cores: the table then shows the cost of more processes, not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from benchmarks._measure import format_table
from benchmarks._report import ROOT, write_json
from benchmarks.loader_bench import main as loader_bench

LOADERS = ("raw", "rayshard", "rayshard_cpus")
TABLE = (
    ("rows", "rows", ",d"),
    ("ranks", "ranks", "d"),
    ("raw rows/s", "raw", ",.0f"),
    ("rayshard rows/s", "rayshard", ",.0f"),
    ("vs raw", "vs_raw", ".2f"),
    ("rayshard steady rows/s", "rayshard_steady", ",.0f"),
    ("rayshard_cpus rows/s", "rayshard_cpus", ",.0f"),
    ("cpus vs raw", "cpus_vs_raw", ".2f"),
    ("rayshard peak PSS MB", "rayshard_pss", ",.0f"),
)


def _numbers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__)
    parser.add_argument("--rows", type=_numbers, default=[1_000_000, 4_000_000])
    parser.add_argument("--ranks", type=_numbers, default=[1, 2, 4])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/scaling.json")
    args = parser.parse_args(argv)
    table = []
    with tempfile.TemporaryDirectory(prefix="rayshard-scaling-") as scratch:
        for rows in args.rows:
            for ranks in args.ranks:
                out = Path(scratch) / f"{rows}-{ranks}.json"
                code = loader_bench(
                    [
                        f"--rows={rows}",
                        f"--ranks={ranks}",
                        f"--epochs={args.epochs}",
                        f"--loaders={','.join(LOADERS)}",
                        f"--json={out}",
                    ]
                )
                if code != 0:
                    print(f"scaling: rows={rows} ranks={ranks} failed", file=sys.stderr)
                    return code
                results = json.loads(out.read_text())["results"]
                raw, shard = results["raw"], results["rayshard"]
                cpus = results["rayshard_cpus"]
                table.append(
                    {
                        "rows": rows,
                        "ranks": ranks,
                        "raw": raw["rows_per_s"],
                        "rayshard": shard["rows_per_s"],
                        "vs_raw": shard["rows_per_s"] / raw["rows_per_s"],
                        "rayshard_steady": shard["steady_rows_per_s"],
                        "rayshard_cpus": cpus["rows_per_s"],
                        "cpus_vs_raw": cpus["rows_per_s"] / raw["rows_per_s"],
                        "rayshard_pss": shard["peak_pss_mb"],
                    }
                )
    print(format_table(table, TABLE))
    write_json(args.json, {"epochs": args.epochs, "results": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
