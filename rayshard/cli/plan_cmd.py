"""`rayshard plan`: which shard and which sample ranges each rank reads in each epoch, for
counts given on the command line or for real Parquet files (`--data`, planned by the same
`assign` as the loader's)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from rayshard.core.sharding import ShardingPolicy, assign
from rayshard.errors import ConfigError
from rayshard.plan import DataLayout, EpochPlan, LastBatch, PlanConfig, Rotation, Uneven, plan_epoch

# The planning options are `PlanConfig` fields (all but `expected_world_size`: the plan is
# for --world-size), passed to `PlanConfig.resolve` by name; their defaults are its own
# (None: the `RAYSHARD_*` variable, else the default). tests/plan/test_cli_plan.py checks.
_DEFAULT = {f.name: f.default for f in dataclasses.fields(PlanConfig)}
NOT_PLANNING = (
    *("samples", "files", "rows_per_file", "data", "policy"),
    *("world_size", "epochs", "fmt", "shuffle", "shuffle_blocks"),
)
# The policies that plan every rank's share up front (the others decide at run time).
PLANNED_POLICIES = ("data", "file", "file_or_data")


def _choices(enum_cls) -> click.Choice:
    return click.Choice([m.value for m in enum_cls], case_sensitive=False)


@click.command("plan")
@click.option("--samples", type=click.IntRange(min=0), help="Number of samples N (sample-level).")
@click.option("--files", type=click.IntRange(min=0), help="Number of files F (file-level mode).")
@click.option(
    "--rows-per-file",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Rows in each file when --files is given.",
)
@click.option(
    "--data",
    help="Parquet files (a file, folder or glob, local or a URI, as ParquetSource takes): "
    "plan over their real row counts, as a loader over them would.",
)
@click.option(
    "--policy",
    type=click.Choice(PLANNED_POLICIES, case_sensitive=False),
    help="With --data: the loader's policy [default: data].",
)
@click.option("--world-size", type=click.IntRange(min=1), required=True, help="Ranks W.")
@click.option("--total-shards", type=click.IntRange(min=1), help="Shards S (default: W).")
@click.option("--rotation", type=_choices(Rotation), help="Shard rotation across epochs.")
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=_DEFAULT["batch_size"], show_default=True
)
@click.option("--last-batch", type=_choices(LastBatch), help="Policy for the last short batch.")
@click.option("--pad-last-batch/--no-pad-last-batch", default=None, help="Pad to equal batches.")
@click.option("--uneven", type=_choices(Uneven), help="Uneven-file policy (file mode).")
@click.option(
    "--equal-steps/--no-equal-steps",
    default=None,
    help="Ranks yield equal batch counts [default: RAYSHARD_EQUAL_STEPS, else on].",
)
@click.option("--seed", type=click.IntRange(min=0), help="Seed [default: RAYSHARD_SEED, else 0].")
@click.option("--epochs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--shuffle",
    is_flag=True,
    help="Plan as for a loader that shuffles (shuffle or shuffle_buffer): --last-batch drop "
    "then leaves out a window that moves with the epoch. The reading order of the pieces "
    "is not shown.",
)
@click.option(
    "--shuffle-blocks",
    type=click.IntRange(min=1),
    help="With --data: plan as for a loader with shuffle_blocks=K (the global shuffle: each "
    "rank reads its share of one sequence of the row groups, so its samples change with "
    "the epoch; implies --shuffle).",
)
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
def plan_command(
    samples: int | None,
    files: int | None,
    rows_per_file: int,
    data: str | None,
    policy: str | None,
    world_size: int,
    epochs: int,
    fmt: str,
    shuffle: bool,
    shuffle_blocks: int | None,
    **planning: Any,
) -> None:
    """Show which shard and sample ranges every rank reads in every epoch.

    In file mode (--files) `ranges` are file index ranges and `sample_ranges` the samples.
    """
    if sum(given is not None for given in (samples, files, data)) != 1:
        raise click.UsageError("give exactly one of '--samples', '--files' or '--data'")
    by_files = files is not None
    context = click.get_current_context()
    for name, flag in (("uneven", "--uneven"), ("rows_per_file", "--rows-per-file")):
        given = context.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
        data_files = data is not None and name == "uneven" and policy in ("file", "file_or_data")
        if given and not by_files and not data_files:
            raise click.UsageError(
                f"{flag} applies to file mode: give --files"
                + (", or --data with --policy file" if name == "uneven" else "")
                + (" (--data has its files' own row counts)" if data is not None else "")
            )
    if policy is not None and data is None:
        raise click.UsageError(
            "--policy applies to --data (with --samples the plan is the 'data' policy's, "
            "with --files the 'file' policy's)"
        )
    if shuffle_blocks is not None and (data is None or (policy or "data") != "data"):
        raise click.UsageError(
            "--shuffle-blocks applies to --data under the 'data' policy (as for the loader)"
        )
    shuffle = shuffle or shuffle_blocks is not None
    try:
        config = PlanConfig.resolve(explicit=planning)
        if data is not None:
            source = _parquet(data)
            effective, plans = _assigned(
                config, source, policy or "data", world_size, epochs, shuffle
            )
            if shuffle_blocks is not None:  # the loader's global shuffle, as `epoch_plan`
                plans = [_along_blocks(p, source, config.seed) for p in plans]
            by_files, layout = effective == "file", source.layout()
        else:
            layout = (
                DataLayout.of_files([rows_per_file] * files)
                if by_files
                else DataLayout.of_samples(samples)
            )
            plans = [
                plan_epoch(config, layout, world_size, e, by_files=by_files, shuffled=shuffle)
                for e in range(epochs)
            ]
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    document = {
        "config": config.to_dict(),
        "num_samples": layout.num_samples,
        "num_files": layout.num_files if by_files or data is not None else None,
        "shuffled": shuffle,
        **({"shuffle_blocks": shuffle_blocks} if shuffle_blocks is not None else {}),
        "epochs": [_epoch_json(p, by_files) for p in plans],
    }
    if data is not None:
        document["policy"] = effective
        rows = layout.file_rows
        document["files"] = [{"path": p, "rows": n} for p, n in zip(source.files, rows)]
    if fmt == "json":
        click.echo(json.dumps(document, indent=2))
    else:
        click.echo(_table(document, by_files))


def _parquet(data: str):
    from rayshard.sources.parquet import ParquetSource  # pyarrow's dataset modules: lazily

    return ParquetSource(data)


def _assigned(
    config: PlanConfig, source: Any, policy: str, world_size: int, epochs: int, shuffle: bool
) -> tuple[str, list[EpochPlan]]:
    """The effective policy (`file_or_data` resolves to one of the two) and each epoch's
    plan, from the loader's own `assign`."""
    assignments = [
        assign(ShardingPolicy.parse(policy), config, source, world_size, e, shuffled=shuffle)
        for e in range(epochs)
    ]
    return assignments[0].policy.value, [a.plan for a in assignments]


def _along_blocks(plan: EpochPlan, source: Any, seed: int) -> EpochPlan:
    from rayshard.core.shuffle_blocks import along_sequence, global_sequence

    return along_sequence(plan, global_sequence(source.splits(), seed, plan.epoch))


def _epoch_json(plan: EpochPlan, by_files: bool) -> dict:
    out = plan.to_dict()
    for rank in out["ranks"]:
        if by_files:
            rank["sample_ranges"] = rank["ranges"]
            rank["ranges"] = rank.pop("files")
    return out


def _table(document: dict, by_files: bool) -> str:
    unit = "file ranges" if by_files else "sample ranges"
    header = ("epoch", "rank", "shard", unit, "samples", "padded", "dropped", "batches")
    rows = [header]
    for epoch in document["epochs"]:
        for rank in epoch["ranks"]:
            spans = " ".join(f"[{a},{b})" for a, b in rank["ranges"]) or "-"
            shard = "all" if rank["shard"] is None else str(rank["shard"])
            rows.append(
                (
                    str(epoch["epoch"]),
                    str(rank["rank"]),
                    shard,
                    spans,
                    str(rank["samples"]),
                    str(rank["padded"]),
                    str(rank["dropped"]),
                    str(rank["batches"]),
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    cfg = document["config"]
    title = (
        f"{document['num_samples']} samples"
        + (f" in {document['num_files']} files" if document["num_files"] is not None else "")
        + (f", policy={document['policy']}" if "policy" in document else "")
        + f", rotation={cfg['rotation']}, batch_size={cfg['batch_size']}, "
        f"last_batch={cfg['last_batch']}, pad_last_batch={cfg['pad_last_batch']}"
        + (", shuffled" if document["shuffled"] else "")
        + (f" in blocks of {document['shuffle_blocks']}" if "shuffle_blocks" in document else "")
    )
    named = [
        f"file {i}: {f['path']} ({f['rows']} rows)" for i, f in enumerate(document.get("files", []))
    ]
    return "\n".join([title, *lines, *named])
