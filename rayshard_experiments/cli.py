"""`rayshard-experiment`: run an elastic autoscaling experiment from a YAML schedule."""

from __future__ import annotations

import click

from rayshard.errors import ConfigError


@click.command("rayshard-experiment", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("schedule", type=click.Path(dir_okay=False))
@click.option(
    "--out",
    default="rayshard-output/experiment",
    show_default=True,
    help="Folder for throughput.csv, experiment.json and throughput.png.",
)
@click.option(
    "--address",
    default=None,
    help="Run on an existing cluster (e.g. 'auto'); node events are then skipped "
    "and the cluster's own autoscaling is observed.",
)
def experiment_command(schedule: str, out: str, address: str | None) -> None:
    """Train-shaped consumers over a dynamic loader while nodes join and leave."""
    from rayshard_experiments.report import summary_table, write_report
    from rayshard_experiments.runner import run_experiment
    from rayshard_experiments.schedule import load_schedule

    try:
        parsed = load_schedule(schedule)
    except ConfigError as error:
        raise click.BadParameter(str(error), param_hint="SCHEDULE") from error
    if parsed.autoscaler and address is not None:
        raise click.BadParameter(
            "autoscaler: true starts its own local cluster; drop --address", param_hint="--address"
        )
    result = run_experiment(parsed, out, address=address)
    paths = write_report(result, out)
    click.echo(summary_table(result))
    click.echo("wrote " + ", ".join(paths.values()))
    failed = [e for e in result["events"] if e["event"] == "rank_failed"]
    if failed:
        errors = "; ".join(f"rank {e['rank']}: {e['error']}" for e in failed)
        raise click.ClickException(f"experiment stopped: {errors}")
    lost = sum(a["lost"] for a in result["audit"].values())
    if lost or not result["completed"]:
        raise click.ClickException(f"experiment incomplete or lost {lost} samples")
