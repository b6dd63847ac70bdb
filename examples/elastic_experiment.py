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

from rayshard_experiments.cli import experiment_command

if __name__ == "__main__":
    default = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_schedule.yaml")
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        args = [default, *args]
    experiment_command.main(args=args, prog_name="elastic_experiment.py")
