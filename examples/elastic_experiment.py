"""rayshard elastic experiment: nodes join and leave on a schedule while train-shaped
consumers read through a dynamic loader; writes CSV, JSON and a PNG plot and prints a
summary with the coverage audit.

Locally (a `ray.cluster_utils.Cluster` on this machine):
    python examples/elastic_experiment.py examples/elastic_schedule.yaml
On a cluster (node events skipped; the cluster's autoscaling is observed):
    ray submit cluster.yaml examples/elastic_experiment.py -- --address auto
"""

from __future__ import annotations

import os
import sys

import click

from rayshard_experiments.cli import experiment_command

PROG = "elastic_experiment.py"
DEFAULT_SCHEDULE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_schedule.yaml")


def with_default_schedule(args: list[str]) -> list[str]:
    """`args` with the example's schedule first when they name none (no positional
    argument, wherever the options are: `--out X schedule.yaml` keeps its own)."""
    try:
        context = experiment_command.make_context(PROG, list(args), resilient_parsing=True)
    except click.UsageError:
        return args  # a mistake in the options: the command's own parse reports it
    return args if context.params.get("schedule") else [DEFAULT_SCHEDULE, *args]


if __name__ == "__main__":
    experiment_command.main(args=with_default_schedule(sys.argv[1:]), prog_name=PROG)
